"""`moe-sim compare-trace`: a measured GPU profile of decode layers against the plan, kernel by kernel.

Pipeline (each step a function below):
1. read the kernel events (`trace_reader.read_kernels`, streaming);
2. label each event: its name, or for moe-sim's own traces its plan key; classify each distinct label
   once against the engine's pattern table (kernel_patterns.toml): the set of plan kernels it could be;
3. cut each process's kernels into layers at the ANCHOR, the first plan kernel that some label
   identifies alone, moved back over the plan kernels before it that the trace shows; a layer is the
   span from one cut to the next. Its SIGNATURE is the name sequence on each stream. Layers sharing a
   signature are repeats of one layer; the signature the plan matches best (then the most frequent)
   is the layer compared, so a step trace compared with --layer mla keeps only its MLA layers;
4. align the signature with the plan per stream, longest common subsequence in plan order (the
   busiest stream first, then the next one against the plan kernels left): a measured kernel with no
   partner is unmatched_measured, a plan kernel with none unmatched_plan;
5. take the median over layers of each measured kernel's duration and of the gap since the previous
   kernel on its stream, and put them beside the model's timeline of the same configuration. A kernel
   the engine's `part_of_previous` patterns name (cuBLASLt's split-K reduce) is a second launch of the
   plan kernel before it: that kernel is measured from its first start to its last end.

Step 1 is trace_reader.py; the pattern table and step 2 trace_patterns.py; steps 3 and 4 trace_layers.py;
what the trace is (its engine when --engine is not given, whether its steps are decode steps)
trace_detect.py; step 5 and the whole command here. Beside the one layer, the whole step's coverage (every
layer's plan and the head aligned with the trace, trace_step.py): how many of the step's kernels match.

Makespan, both sides: first kernel start to last kernel end of one layer (the model's layer_us also
counts the launch gap before its first kernel; this one does not, so both are measured the same way).
Error = (measured - model) / model.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable

from simulator.config import ModelConfig
from simulator.cost.timeline import Timeline, schedule
from simulator.cost.uncertainty import DEFAULT_LEVEL, kernel_families, residuals_of
from simulator.errors import UserError
from simulator.hardware import HardwareProfile
from simulator.plans.kernel import DecodeShape, Plan
from simulator.plans.standard import arch_of
from simulator.report.trace_detect import closest_engine, detect_engine, step_check
from simulator.report.trace_layers import LayerShape, NoMatch, Signature, best_layer
from simulator.report.trace_patterns import (  # noqa: F401  (engine_names, load_table: this module's API too)
    Classifier, Engine, engine_names, load_engine, load_table, partial_plan)
from simulator.report.trace_reader import KernelTrace, read_kernels
from simulator.report.trace_step import step_coverage, step_plan


# ============================================================================ the comparison


def compare(trace: KernelTrace, plan: Plan, timeline: Timeline, classify: Classifier,
            left_out: Callable[[Signature], str | None] = lambda sig: None) -> dict[str, Any]:
    """The comparison document: per kernel model vs measured, unmatched on both sides, makespans."""
    shape, pairs = best_layer(trace, classify, left_out)
    gaps = model_gaps(timeline)
    rows, unmatched_measured, folded, layer = [], [], [], []
    for s, (stream, labels) in enumerate(shape.signature):
        home = _home_stream(pairs, s, timeline) or f"measured {stream}"
        parts = _parts_of_previous(pairs, s, labels, classify.engine)
        for pos, label in enumerate(labels):
            j, name = pairs.get((s, pos)), shape.layers[0][s][pos].name
            layer.append({"name": name, "plan": timeline.spans[j].key if j is not None else None, "stream": home,
                          "start_us": round(_start(shape, s, pos), 3),
                          "duration_us": round(shape.median(s, pos, "dur") or 0.0, 3)})
            if j is None:
                (folded if pos in parts["folded"] else unmatched_measured).append(name)
                continue
            span = timeline.spans[j]
            last = parts["last"].get(pos, pos)
            measured = shape.median(s, pos, "dur") or 0.0
            if last > pos:  # the plan kernel ran as several launches: first start to last end
                measured = statistics.median(layer_[s][last].end - layer_[s][pos].ts for layer_ in shape.layers)
            rows.append({"plan": span.key, "measured": name, "stream": span.stream, "measured_stream": str(stream),
                         "launches": last - pos + 1,
                         "model_us": round(span.duration_us, 3), "measured_us": round(measured, 3),
                         "error_pct": _pct(measured, span.duration_us),
                         "model_gap_us": _round(gaps[j] if pos > 0 else None),
                         "measured_gap_us": _round(shape.median(s, pos, "gap")),
                         "launch_error_pct": _launch_error(gaps[j] if pos > 0 else None, span.duration_us,
                                                           shape.median(s, pos, "gap"), measured),
                         "kind": span.kind, "bound": span.bound})
    rows.sort(key=lambda r: [s.key for s in timeline.spans].index(r["plan"]))
    matched = {r["plan"] for r in rows}
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    model_span = timeline.layer_us - min(s.start_us for s in timeline.spans)
    return {
        "matched": len(rows), "unmatched_measured": unmatched_measured, "folded_measured": folded,
        "unmatched_plan": [s.key for s in timeline.spans if s.key not in matched],
        "median_abs_pct_error": round(statistics.median(errors), 3) if errors else None,
        "median_abs_launch_error_pct": _median_of(abs(r["launch_error_pct"]) for r in rows
                                                  if r["launch_error_pct"] is not None),
        "layers_found": len(shape.layers), "measured_streams": [str(stream) for stream, _ in shape.signature],
        "kernels": rows,
        "makespan_us": {"measured": round(shape.makespan(), 3), "model": round(model_span, 3)},
        "makespan_error_pct": _pct(shape.makespan(), model_span),
        "launch_gap_median_us": {"measured": _median_of(r["measured_gap_us"] for r in rows),
                                 "model": _median_of(r["model_gap_us"] for r in rows)},
        "kernel_events_read": len(trace.kernels), "trace_events_read": trace.events_read,
        "measured_layer": layer,
    }


def _launch_error(model_gap: float | None, model_us: float, measured_gap: float | None,
                  measured_us: float) -> float | None:
    """% error of one launch, the idle gap before it plus its duration: the model charges PDL's whole
    boundary as gap (the launch ramp included) where a profiler counts the ramp inside the kernel, so a
    short kernel's duration alone reads far off while its launch agrees (cost-model.md §1.6)."""
    if model_gap is None or measured_gap is None:
        return None
    return _pct(measured_gap + measured_us, model_gap + model_us)


def _parts_of_previous(pairs: dict[tuple[int, int], int], s: int, labels: tuple[str, ...],
                       engine: Engine) -> dict[str, Any]:
    """Unmatched kernels that the engine's `part_of_previous` patterns name as a second launch of the matched
    kernel just before them on the stream (cuBLASLt's split-K reduce after its GEMM): folded into it."""
    out: dict[str, Any] = {"folded": set(), "last": {}}
    owner = None
    for pos, label in enumerate(labels):
        if (s, pos) in pairs:
            owner = pos
        elif owner is not None and any(p.search(label) for p in engine.part_of_previous):
            out["folded"].add(pos)
            out["last"][owner] = pos
        else:
            owner = None
    return out


def _home_stream(pairs: dict[tuple[int, int], int], s: int, timeline: Timeline) -> str | None:
    """The plan stream most of a measured stream's matched kernels belong to."""
    homes = Counter(timeline.spans[j].stream for (t, _), j in pairs.items() if t == s)
    return homes.most_common(1)[0][0] if homes else None


def model_gaps(timeline: Timeline) -> list[float | None]:
    """Per span: idle time since the previous kernel on its stream ends (None for a stream's first)."""
    last: dict[str, float] = {}
    out: list[float | None] = []
    for span in timeline.spans:
        out.append(span.start_us - last[span.stream] if span.stream in last else None)
        last[span.stream] = span.end_us
    return out


def _start(shape: LayerShape, s: int, pos: int) -> float:
    """Median start of a kernel relative to its layer's first kernel."""
    return statistics.median(layer[s][pos].ts - min(k.ts for st in layer for k in st) for layer in shape.layers)


def _pct(measured: float, model: float) -> float | None:
    return round((measured - model) / model * 100.0, 3) if model > 0 else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _median_of(values: Any) -> float | None:
    xs = [v for v in values if v is not None]
    return round(statistics.median(xs), 3) if xs else None


def compare_trace(path: str, cfg: ModelConfig, hw: HardwareProfile, tp: int, shape: DecodeShape, layer_type: str,
                  variant: str | None = None, engine: str | None = None, patterns: str | None = None,
                  plan_keys: tuple[str, ...] | None = None, console: Any = None,
                  layer: int | None = None, with_kernels: Callable[[str], HardwareProfile] | None = None,
                  ) -> tuple[dict[str, Any], Timeline]:
    """Read `path`, find its engine (unless named) and its decode layers, build the plan of the same
    configuration (of layer index `layer`, else the layer type's representative) and compare; the doc and the
    model timeline. `with_kernels`: the profile pricing with another measured kernel set, called with the
    engine's own (`kernel_set` in the pattern table) when the user named none: a trace of the GPU suite's
    kernels is priced with the suite's laws, not the production set's."""
    if layer is not None and not 0 <= layer < cfg.num_layers:
        raise UserError(f"--layer-index {layer} is not a layer of '{cfg.name}' (0 to {cfg.num_layers - 1}).")
    trace = read_kernels(path, console)
    plans = _PlanMaker(cfg, tp, shape, layer_type, variant, plan_keys, arch_of(hw), layer)
    step = step_check(trace, shape, patterns)
    detected = None
    if engine is None:
        detected = detect_engine(trace, plans, patterns)
        engine = detected["chosen"]
    eng = load_engine(engine, patterns)
    if with_kernels is not None and eng.kernel_set and eng.kernel_set != hw.kernels:
        hw = with_kernels(eng.kernel_set)
    plan = plans(eng)
    timeline = schedule(plan, hw)
    doc = {"trace": str(path), "engine": eng.name, "model": cfg.name, "hardware": hw.name, "kernel_set": hw.kernels,
           "tp": tp,
           "batch": shape.batch, "tokens_per_seq": shape.tokens_per_seq, "context": shape.context,
           "layer": layer_type, "variant": plan.variant, "plan_keys": [k.key for k in plan]}
    if detected:
        doc["engine_detected"] = detected
    try:
        found = compare(trace, plan, timeline, Classifier(eng, plan), step.left_out)
        if len(found["measured_streams"]) == 1 and len(plan.streams) > 1:
            # the engine ran the layer on one stream: the model's side-stream overlap never happened there
            plan = one_stream(plan)
            timeline = schedule(plan, hw)
            found = compare(trace, plan, timeline, Classifier(eng, plan), step.left_out)
            found["model_streams"] = "one stream, as the trace ran (the plan's side streams serialised)"
        doc |= found | family_intervals(found["kernels"], plan, hw)
        doc["step_coverage"] = step_coverage(trace, step_plan(cfg, plan.variant, tp, shape, arch_of(hw)), eng)
    except NoMatch as exc:
        raise UserError(f"{exc}; {closest_engine(trace, plans, patterns, eng.name)}") from None
    doc["step"] = step.summary()
    return doc, timeline


def family_intervals(rows: list[dict[str, Any]], plan: Plan, hw: HardwareProfile,
                     level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    """Each matched kernel held to its family's interval: the law x exp(residual quantiles) that `step`'s
    intervals draw from (`uncertainty.residuals_of`), each bound moved out by the machine spread (the trace
    ran on another GPU than the kernel rows: `uncertainty.machine_spread`, absolute, so it matters for short
    kernels only). The error checked is the per-launch one (idle gap + duration, what the law predicts), the
    duration's for a stream's first kernel. Adds family, interval and inside to each row; returns the count
    inside."""
    res = residuals_of(hw)
    inside = checked = 0
    for r in rows:
        fam, _ = kernel_families(plan.kernel(r["plan"]))
        per_launch = r["launch_error_pct"] is not None
        err = r["launch_error_pct"] if per_launch else r["error_pct"]
        r["family"] = fam
        if fam is None or fam not in res.fitted or err is None:
            r["interval_pct"], r["inside_interval"] = None, None
            continue
        lo, hi = res.interval_pct(fam, level)
        model_us = r["model_us"] + (r["model_gap_us"] if per_launch else 0.0)
        spread = 100 * res.machine_us / model_us if model_us > 0 else 0.0
        lo, hi = lo - spread, hi + spread
        r["interval_pct"] = [round(lo, 1), round(hi, 1)]
        r["inside_interval"] = bool(lo <= err <= hi)
        inside, checked = inside + r["inside_interval"], checked + 1
    return {"interval_level": level, "inside_family_interval": {"inside": inside, "checked": checked},
            "interval_source": res.source}


def one_stream(plan: Plan) -> Plan:
    """The plan as a one-stream engine issues it: every kernel on the main stream in plan order (which
    already orders each kernel after what it waits for), so no cross-stream waits are left."""
    return replace(plan, kernels=tuple(replace(k, stream="main", deps=()) for k in plan))


@dataclass
class _PlanMaker:
    """The plan an engine's traces are compared with: its variant (unless --variant), its plan keys
    (unless --plan-keys), built once per variant."""

    cfg: ModelConfig
    tp: int
    shape: DecodeShape
    layer_type: str
    variant: str | None
    plan_keys: tuple[str, ...] | None
    arch: str = "sm100"  # the stock path the GPU runs (plans.standard.arch_of)
    layer: int | None = None  # the layer index whose plan is compared (None: the type's representative)

    def __call__(self, eng: Engine) -> Plan:
        from simulator.cost.step import build_plan
        chosen = self.variant or eng.variant or "standard"
        plan = build_plan(self.cfg, chosen, self.tp, self.shape, self.layer_type, layer=self.layer, arch=self.arch)
        return partial_plan(plan, self.plan_keys or eng.plan_keys)

