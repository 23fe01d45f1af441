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

Makespan, both sides: first kernel start to last kernel end of one layer (the model's layer_us also
counts the launch gap before its first kernel; this one does not, so both are measured the same way).
Error = (measured - model) / model.
"""

from __future__ import annotations

import fnmatch
import re
import statistics
import tomllib
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from simulator.config import ModelConfig
from simulator.cost.timeline import Timeline, schedule
from simulator.errors import UserError
from simulator.hardware import HardwareProfile
from simulator.plans.kernel import DecodeShape, Plan
from simulator.report.trace_reader import KernelEvent, KernelTrace, by_stream, short

PATTERNS_FILE = Path(__file__).with_name("kernel_patterns.toml")
LAYER_PREFIX = re.compile(r"^(?:L\d+|head)\.")  # moe-sim step traces key kernels "L5.o_proj"
MAX_SIGNATURES = 20  # distinct layer shapes aligned against the plan (the most frequent ones)
MAX_LAYER_KERNELS = 5000  # a decode layer launches tens of kernels; a longer span is no layer

Stream = tuple[Any, Any]
Signature = tuple[tuple[Stream, tuple[str, ...]], ...]  # per stream: the labels of one layer, in order


# ============================================================================ the pattern table


@dataclass(frozen=True)
class Engine:
    """One entry of the pattern table: how an engine names the plan's kernels."""

    name: str
    about: str
    variant: str | None
    match_on: str  # "name" | "key"
    plan_keys: tuple[str, ...] | None
    patterns: dict[str, tuple[re.Pattern[str], ...]]
    part_of_previous: tuple[re.Pattern[str], ...] = ()  # second launches of one plan kernel (split-K reduce)


def load_engine(name: str, path: str | Path | None = None) -> Engine:
    """The engine `name` from the bundled table, or from a user's `--patterns` file of the same shape."""
    source, table = load_table(path)
    engines = table.get("engine", {})
    if name not in engines:
        raise UserError(f"engine '{short(name)}' is not in {source}; it has {', '.join(engines) or 'no engines'}.")
    entry = engines[name]
    patterns = {key: tuple(compile_pattern(p, source, name) for p in string_list(pats, source))
                for key, pats in entry.get("patterns", {}).items()}
    keys = entry.get("plan_keys")
    parts = tuple(compile_pattern(p, source, name) for p in string_list(entry.get("part_of_previous", []), source))
    return Engine(name, str(entry.get("about", "")), entry.get("variant"), str(entry.get("match_on", "name")),
                  tuple(string_list(keys, source)) if keys is not None else None, patterns, parts)


def load_table(path: str | Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The pattern table as TOML data: the bundled one, or a user's `--patterns` file."""
    source = Path(path) if path else PATTERNS_FILE
    try:
        return source, tomllib.loads(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read the pattern table {source}: {short(str(exc), 120)}.") from None


def engine_names(path: str | Path | None = None) -> list[str]:
    """The engines of the bundled pattern table (or of a user's `--patterns` file), in table order."""
    return list(load_table(path)[1].get("engine", {}))


def string_list(value: Any, source: Path) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{source}: patterns and plan_keys must be lists of strings, not {short(repr(value))}.")
    return value


def compile_pattern(pattern: str, source: Path, engine: str) -> re.Pattern[str]:
    text = fnmatch.translate(pattern[5:]) if pattern.startswith("glob:") else pattern
    try:
        return re.compile(text, re.IGNORECASE)
    except re.error as exc:
        raise UserError(f"{source}: engine '{engine}' pattern '{short(pattern)}' is not a valid regex ({exc}).") from None


def partial_plan(plan: Plan, keys: tuple[str, ...] | None) -> Plan:
    """The plan restricted to `keys` (a partial layer), dependencies on left-out kernels dropped."""
    if keys is None:
        return plan
    known = [k.key for k in plan]
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise UserError(f"plan key(s) {', '.join(unknown)} are not in the {plan.variant} {plan.layer} plan "
                        f"({', '.join(known)}).")
    kept = [replace(k, deps=tuple(d for d in k.deps if d in keys)) for k in plan if k.key in keys]
    return replace(plan, kernels=tuple(kept))


class Classifier:
    """Label -> the plan indices it could be, computed once per distinct label."""

    def __init__(self, engine: Engine, plan: Plan) -> None:
        self.engine, self.plan = engine, plan
        self.keys = [k.key for k in plan]
        self.names = [k.name for k in plan]
        self._cache: dict[str, frozenset[int]] = {}

    def label(self, k: KernelEvent) -> str:
        if self.engine.match_on == "key" and k.key is not None:
            return LAYER_PREFIX.sub("", k.key)
        return k.name

    def __call__(self, label: str) -> frozenset[int]:
        hit = self._cache.get(label)
        if hit is None:
            hit = self._cache[label] = frozenset(self._match(label))
        return hit

    def _match(self, label: str) -> list[int]:
        if self.engine.match_on == "key":
            return [i for i, (key, name) in enumerate(zip(self.keys, self.names)) if label in (key, name)]
        pats = self.engine.patterns
        return [i for i, key in enumerate(self.keys) if any(p.search(label) for p in pats.get(key, ()))]


# ============================================================================ layers


@dataclass
class LayerShape:
    """Every layer of one signature: per stream, per position, the durations and gaps over layers."""

    signature: Signature
    layers: list[list[list[KernelEvent]]]  # [layer][stream][position]

    def median(self, stream: int, pos: int, what: str) -> float | None:
        values = [_measure(layer[stream], pos, what) for layer in self.layers]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def makespan(self) -> float:
        return statistics.median(max(k.end for s in layer for k in s) - min(k.ts for s in layer for k in s)
                                 for layer in self.layers)


def _measure(kernels: list[KernelEvent], pos: int, what: str) -> float | None:
    if what == "dur":
        return kernels[pos].dur
    return kernels[pos].ts - kernels[pos - 1].end if pos > 0 else None  # the gap on the same stream


def layer_shapes(kernels: list[KernelEvent], classify: Classifier) -> list[LayerShape]:
    """One process's kernels cut into layers and grouped by signature, most frequent first."""
    merged = sorted(kernels, key=lambda k: (k.ts, str(k.stream)))
    labels = [classify.label(k) for k in merged]
    cuts = _cuts(labels, classify)
    groups: dict[Signature, list[list[list[KernelEvent]]]] = {}
    for lo, hi in zip(cuts, cuts[1:] + [len(merged)]):
        streams = by_stream(merged[lo:hi])
        order = sorted(streams, key=str)
        sig = tuple((s, tuple(classify.label(k) for k in streams[s])) for s in order)
        groups.setdefault(sig, []).append([streams[s] for s in order])
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    return [LayerShape(sig, layers) for sig, layers in ranked[:MAX_SIGNATURES]]


def _cuts(labels: list[str], classify: Classifier) -> list[int]:
    """Where layers start: each anchor, moved back over the kernels that could be plan kernels before it.

    Walking back from an anchor stops after as many such kernels as the trace shows plan kernels before
    the anchor, or at the previous anchor; kernels no pattern fits are stepped over, not counted.
    """
    cands = [classify(label) for label in labels]
    unique = {next(iter(c)) for c in set(cands) if len(c) == 1}
    if not unique:
        return [0]
    anchor = min(unique)
    before = sum(1 for j in set().union(*set(cands)) if j < anchor)
    cuts, previous = [], -1
    for i in (i for i, c in enumerate(cands) if c == frozenset({anchor})):
        cut, need = i, before
        for k in range(i - 1, previous, -1):
            if need == 0:
                break
            if any(j < anchor for j in cands[k]):
                cut, need = k, need - 1
        cuts.append(cut)
        previous = i
    return cuts


# ============================================================================ alignment


def align(shape: LayerShape, classify: Classifier) -> dict[tuple[int, int], int]:
    """(stream index, position) -> plan index: per stream, busiest first, an LCS in plan order."""
    free = list(range(len(classify.plan)))
    pairs: dict[tuple[int, int], int] = {}
    order = sorted(range(len(shape.signature)), key=lambda s: -len(shape.signature[s][1]))
    for s in order:
        labels = shape.signature[s][1]
        for pos, j in _lcs([classify(label) for label in labels], free):
            pairs[(s, pos)] = j
        free = [j for j in free if j not in pairs.values()]
    return pairs


def _lcs(cands: list[frozenset[int]], plan: list[int]) -> list[tuple[int, int]]:
    """Longest common subsequence of measured kernels and plan indices (a match: j in the candidates)."""
    n, m = len(cands), len(plan)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            table[i][j] = (table[i + 1][j + 1] + 1 if plan[j] in cands[i]
                           else max(table[i + 1][j], table[i][j + 1]))
    out, i, j = [], 0, 0
    while i < n and j < m:
        if plan[j] in cands[i] and table[i][j] == table[i + 1][j + 1] + 1:
            out.append((i, plan[j]))
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


# ============================================================================ the comparison


class NoMatch(UserError):
    """No layer of the trace matches the engine's patterns (the caller may name a closer engine)."""


def best_layer(trace: KernelTrace, classify: Classifier,
               left_out: Callable[[Signature], str | None] = lambda sig: None) -> tuple[LayerShape, dict[tuple[int, int], int]]:
    """Over processes and signatures: the layer the plan matches best, then the most repeated. Signatures
    `left_out` gives a reason for (a prefill or mixed layer) and spans over MAX_LAYER_KERNELS (no layer
    boundary found: the alignment is O(n x plan)) are not candidates."""
    best: tuple[tuple[int, int, int], LayerShape, dict] | None = None
    pids: dict[Any, list[KernelEvent]] = {}
    for k in trace.kernels:
        pids.setdefault(k.stream[0], []).append(k)
    longest, reasons = 0, []
    for kernels in pids.values():
        for shape in layer_shapes(kernels, classify):
            size = sum(len(labels) for _, labels in shape.signature)
            longest = max(longest, size)
            reason = left_out(shape.signature) if size <= MAX_LAYER_KERNELS else "too long"
            if reason:
                reasons.append(reason)
                continue
            pairs = align(shape, classify)
            score = (len(pairs), -(size - len(pairs)), len(shape.layers))
            if best is None or score > best[0]:
                best = (score, shape, pairs)
    if best is None and any(r != "too long" for r in reasons):
        raise UserError(f"{trace.path}: {next(r for r in reasons if r != 'too long')}, so it is not a decode step and "
                        "is not compared as one; profile decode steps only.")
    if best is None and longest > MAX_LAYER_KERNELS:
        raise UserError(f"{trace.path}: its kernels do not split into layers ({longest:,} kernels run without "
                        f"the '{classify.engine.name}' engine's layer boundary); is it a decode trace of this "
                        "model and layer type?")
    if best is None or not best[2]:
        names = sorted({k.name for k in trace.kernels})
        raise NoMatch(f"{trace.path}: none of its {len(names):,} kernel names (e.g. '{short(names[0])}') matches "
                      f"the '{classify.engine.name}' patterns of the {classify.plan.variant} plan")
    return best[1], best[2]


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
                         "kind": span.kind, "bound": span.bound})
    rows.sort(key=lambda r: [s.key for s in timeline.spans].index(r["plan"]))
    matched = {r["plan"] for r in rows}
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    model_span = timeline.layer_us - min(s.start_us for s in timeline.spans)
    return {
        "matched": len(rows), "unmatched_measured": unmatched_measured, "folded_measured": folded,
        "unmatched_plan": [s.key for s in timeline.spans if s.key not in matched],
        "median_abs_pct_error": round(statistics.median(errors), 3) if errors else None,
        "layers_found": len(shape.layers), "measured_streams": [str(stream) for stream, _ in shape.signature],
        "kernels": rows,
        "makespan_us": {"measured": round(shape.makespan(), 3), "model": round(model_span, 3)},
        "makespan_error_pct": _pct(shape.makespan(), model_span),
        "launch_gap_median_us": {"measured": _median_of(r["measured_gap_us"] for r in rows),
                                 "model": _median_of(r["model_gap_us"] for r in rows)},
        "kernel_events_read": len(trace.kernels), "trace_events_read": trace.events_read,
        "measured_layer": layer,
    }


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
                  plan_keys: tuple[str, ...] | None = None, console: Any = None) -> tuple[dict[str, Any], Timeline]:
    """Read `path`, find its engine (unless named) and its decode layers, build the plan of the same
    configuration and compare; the doc and the model timeline."""
    from simulator.report.trace_detect import closest_engine, detect_engine, step_check
    from simulator.report.trace_reader import read_kernels

    trace = read_kernels(path, console)
    plans = _PlanMaker(cfg, tp, shape, layer_type, variant, plan_keys)
    step = step_check(trace, shape, patterns)
    detected = None
    if engine is None:
        detected = detect_engine(trace, plans, patterns)
        engine = detected["chosen"]
    eng = load_engine(engine, patterns)
    plan = plans(eng)
    timeline = schedule(plan, hw)
    doc = {"trace": str(path), "engine": eng.name, "model": cfg.name, "hardware": hw.name, "tp": tp,
           "batch": shape.batch, "tokens_per_seq": shape.tokens_per_seq, "context": shape.context,
           "layer": layer_type, "variant": plan.variant, "plan_keys": [k.key for k in plan]}
    if detected:
        doc["engine_detected"] = detected
    try:
        doc |= compare(trace, plan, timeline, Classifier(eng, plan), step.left_out)
    except NoMatch as exc:
        raise UserError(f"{exc}; {closest_engine(trace, plans, patterns, eng.name)}") from None
    doc["step"] = step.summary()
    return doc, timeline


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

    def __call__(self, eng: Engine) -> Plan:
        from simulator.cost.step import build_plan
        chosen = self.variant or eng.variant or "standard"
        plan = build_plan(self.cfg, chosen, self.tp, self.shape, self.layer_type)
        return partial_plan(plan, self.plan_keys or eng.plan_keys)

