"""Library functions behind `moe-sim layer`, `step` and `trace`: plain dicts that the CLI prints as a
table or as JSON. Every number travels with its metric and its conditions.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from simulator.config import ModelConfig
from simulator.cost.memory import memory_per_gpu, shortfall
from simulator.cost.step import StepEstimate, build_plan, estimate_step, representative_layer, validate_speculation
from simulator.cost.timeline import Makespan, Span, Timeline, makespan_us, schedule
from simulator.cost.uncertainty import (IntervalSpec, Uncertainty, kernel_duration_draws, plan_draws, schedule_plans,
                                        uncertainty_for)
from simulator.hardware import HardwareProfile
from simulator.routing import UNIFORM, RoutingStats
from simulator.cost.head import head_plan
from simulator.plans import VARIANTS
from simulator.plans.kernel import DecodeShape
from simulator.plans.specialized import resolve_fusions
from simulator.plans.standard import arch_of

LAYER_METRIC = "one decoder layer on one TP rank: makespan of the scheduled kernel timeline (CUDA-graph replay)"
STEP_METRIC = ("decode step (one verify forward + drafting), prefill excluded: step time = inter-token latency "
               "per verify step; tokens/s aggregate over the batch and per user (sequence)")


def variants_of(variant: str) -> tuple[str, ...]:
    return VARIANTS if variant == "both" else (variant,)


def capacity(cfg: ModelConfig, hw: HardwareProfile, tp: int, shape: DecodeShape) -> dict[str, Any]:
    """Memory per GPU by part (GB) against HBM; a misfit is stated at a report's top level (`fit_keys`)
    and is a skipped row in a sweep."""
    return memory_per_gpu(cfg, hw.hbm_capacity, tp, shape).as_gb()


def fit_keys(cfg: ModelConfig, hw: HardwareProfile, tp: int, shape: DecodeShape) -> dict[str, Any]:
    """The top-level keys of a report about memory: `fits_in_hbm`, the parts, and when it does not fit one
    sentence saying by how much and what would (the times shown are still the TP layout's)."""
    gb = capacity(cfg, hw, tp, shape)
    keys: dict[str, Any] = {"fits_in_hbm": bool(gb["fits"]), "memory_gb": gb}
    if not gb["fits"]:
        keys["does_not_fit"] = (f"{cfg.name} at TP{tp} on {hw.name} {shortfall(gb)}: this layout needs pipeline "
                                "parallelism, more GPUs or a smaller batch or context (the times shown are the TP "
                                "layout's, as if it fitted)")
    return keys


def default_layer(cfg: ModelConfig) -> str:
    """The model's own layer type: the one most of its layers have (KDA for Kimi K3, MLA for DeepSeek-V3)."""
    counts = cfg.layer_counts()
    return max(counts, key=counts.__getitem__)


# Speculative decoding's default acceptance. A chain of d drafts, each accepted with probability ALPHA
# given its predecessor was, emits a = (1 - ALPHA^(d+1)) / (1 - ALPHA) tokens per verify step, the bonus
# token included (Leviathan et al. 2023, eq. 1). ALPHA = 0.85 is the low end of the 85-90 % at which
# DeepSeek-V3's MTP draft token is accepted (DeepSeek-V3 report, section 5.4.3); docs/sources.md §7.6.
DRAFT_ACCEPTANCE = 0.85
ACCEPTANCE_SOURCE = ("assumed: each draft accepted with probability 0.85 given the one before (DeepSeek-V3's "
                     "measured 85-90 %; docs/sources.md); --acceptance-length, or a scenario's acceptance_length, "
                     "sets your own")


def acceptance(draft_tokens: int, acceptance_length: float | None) -> tuple[float, str]:
    """The mean acceptance length a step uses and where it comes from: the user's, or the cited default."""
    if not draft_tokens:
        return 1.0, "no speculative decoding: one token per sequence per step"
    if acceptance_length is not None:
        return float(acceptance_length), "given with --acceptance-length"
    a = (1 - DRAFT_ACCEPTANCE ** (draft_tokens + 1)) / (1 - DRAFT_ACCEPTANCE)
    return round(a, 4), ACCEPTANCE_SOURCE


def _span_row(span: Span) -> dict[str, Any]:
    c = span.cost
    return {"key": span.key, "name": span.name, "stream": span.stream, "kind": span.kind,
            "start_us": round(span.start_us, 3), "duration_us": round(span.duration_us, 3),
            "alone_us": round(c.duration_us, 3), "launch_gap_us": round(span.launch_us, 3),
            "bytes": int(span.bytes), "flops": int(span.flops), "bound": span.bound,
            "achieved_gbps": round(span.bytes / span.duration_us * 1e-3, 1) if span.duration_us > 0 else 0.0,
            "fraction_of_hbm_peak": round(span.bytes / span.duration_us * 1e6 / c.peak_bandwidth, 3)
            if span.duration_us > 0 else 0.0, "prefetched_bytes": int(span.prefetched_bytes),
            "algorithm": c.algorithm or None}


def layer_timelines(cfg: ModelConfig, hw: HardwareProfile, tp: int, shape: DecodeShape, layer_type: str,
                    variant: str, fusions: frozenset[str] | None = None,
                    makespan: Makespan = makespan_us) -> dict[str, Timeline]:
    return {v: schedule(build_plan(cfg, v, tp, shape, layer_type, fusions, arch=arch_of(hw)), hw, makespan.loop)
            for v in variants_of(variant)}


def layer_report(cfg: ModelConfig, hw: HardwareProfile, tp: int, shape: DecodeShape, layer_type: str,
                 variant: str = "both", fusions: frozenset[str] | None = None,
                 interval: IntervalSpec | None = None, makespan: Makespan = makespan_us) -> dict[str, Any]:
    """One layer's report; `makespan` says which event loops schedule the central values and the draws (a
    sweep passes the compiled ones, `fastsim.makespan_us`)."""
    tls = layer_timelines(cfg, hw, tp, shape, layer_type, variant, fusions, makespan)
    doc: dict[str, Any] = {
        "metric": LAYER_METRIC, "model": cfg.name, "hardware": hw.name, "kernel_set": hw.kernels, "tp": tp,
        "batch": shape.batch, "tokens_per_seq": shape.tokens_per_seq, "tokens": shape.tokens, "context": shape.context,
        "layer": layer_type, "layer_index": representative_layer(cfg, layer_type),
        "fusions": sorted(fusions if fusions is not None else resolve_fusions()),
        **fit_keys(cfg, hw, tp, shape),
        "variants": {v: {"kernel_count": tl.kernel_count, "layer_us": round(tl.layer_us, 3),
                         "floor_us": round(tl.floor_us, 3), "hbm_bytes": int(tl.hbm_bytes),
                         "kernels": [_span_row(s) for s in tl.spans]} for v, tl in tls.items()},
    }
    if len(tls) == 2:
        doc["speedup"] = round(tls["standard"].layer_us / tls["specialized"].layer_us, 4)
    if interval is not None:
        unc = uncertainty_for(hw, interval)
        plans = {v: build_plan(cfg, v, tp, shape, layer_type, fusions, arch=arch_of(hw)) for v in tls}
        schedule_plans(list(plans.values()), unc.sample, makespan.draws)  # both variants in one loop
        draws = {v: plan_draws(p, unc.sample) for v, p in plans.items()}
        wanted: Wanted = []
        for v, d in draws.items():
            spans = kernel_duration_draws(plans[v], unc.sample)
            wanted += [(doc["variants"][v], "layer_us_interval", d, 3)] + [
                (row, "duration_us_interval", spans[:, i], 3) for i, row in enumerate(doc["variants"][v]["kernels"])]
        _interval_keys(doc, unc, draws, wanted)
    return doc


Wanted = list[tuple[dict[str, Any], str, Any, int]]  # (where, key, draws [N], digits) of each interval a report shows


def _interval_keys(doc: dict[str, Any], unc: Uncertainty, draws: dict[str, Any], wanted: Wanted) -> None:
    """The interval's description, then each wanted `where[key] = [low, high]` and the speedup's from the
    per-draw ratio (both variants priced under the same draw), all quantiles taken at once."""
    doc["interval"] = unc.describe()
    if len(draws) == 2:
        wanted = wanted + [(doc, "speedup_interval", draws["standard"] / draws["specialized"], 4)]
    for (where, key, _, _), bounds in zip(wanted, unc.intervals([w[2] for w in wanted], [w[3] for w in wanted])):
        where[key] = bounds


def _step_row(est: StepEstimate) -> dict[str, Any]:
    return {"step_ms": round(est.step_us / 1000, 4), "ms_per_token": round(est.step_us / 1000 / est.tokens_per_step, 4),
            "tokens_per_s": round(est.tokens_per_s, 2),
            "tokens_per_s_per_user": round(est.tokens_per_s_per_user, 2),
            "breakdown_ms": {k: round(v / 1000, 4) for k, v in est.breakdown_us.items()},
            "layer_us": {k: round(v, 3) for k, v in est.layer_us.items()}, "kernels_per_step": est.kernels_per_step}


def step_report(cfg: ModelConfig, hw: HardwareProfile, tp: int, batch: int, context: int, draft_tokens: int = 0,
                acceptance_length: float | None = None, variant: str = "both", drafter: str = "dspark-k3",
                fusions: frozenset[str] | None = None, routing: RoutingStats = UNIFORM,
                bracket: bool = False, interval: IntervalSpec | None = None,
                makespan: Makespan = makespan_us) -> dict[str, Any]:
    """One step's report; `makespan` says which event loop schedules the central values (a sweep passes the
    compiled one, `fastsim.makespan_us`). Without an acceptance length, speculation assumes `acceptance`'s
    cited default, and the report says so."""
    validate_speculation(draft_tokens, acceptance_length)  # a bad value is named as the user gave it
    acceptance_length, assumption = acceptance(draft_tokens, acceptance_length)
    ests = {v: estimate_step(cfg, hw, v, tp, batch, context, draft_tokens, acceptance_length, drafter, fusions,
                             routing, makespan) for v in variants_of(variant)}
    first = next(iter(ests.values()))
    doc: dict[str, Any] = {
        "metric": STEP_METRIC, "model": cfg.name, "hardware": hw.name, "kernel_set": hw.kernels, "tp": tp,
        "batch": batch, "context": context, "draft_tokens": draft_tokens, "acceptance_length": first.tokens_per_step,
        "drafter": drafter if draft_tokens else None,
        "speculation": {"draft_tokens": draft_tokens, "drafter": drafter if draft_tokens else None,
                        "acceptance_length": first.tokens_per_step, "assumption": assumption},
        "layer_counts": cfg.layer_counts(),
        **fit_keys(cfg, hw, tp, DecodeShape(batch, 1 + draft_tokens, context)),
        "variants": {v: _step_row(e) for v, e in ests.items()},
    }
    doc["routing"] = {"expert_skew": routing.skew, "draft_correlation": routing.draft_correlation}
    if len(ests) == 2:
        doc["speedup"] = round(ests["standard"].step_us / ests["specialized"].step_us, 4)
    if interval is not None:
        times = step_time_draws(cfg, hw, tp, batch, context, draft_tokens, tuple(ests), drafter, fusions, routing,
                                interval)
        wanted: Wanted = []
        for v, us in times.items():
            row, d = doc["variants"][v], StepEstimate(v, us, first.tokens_per_step, batch)
            wanted += [(row, "step_ms_interval", d.step_us / 1000, 4),
                       (row, "tokens_per_s_interval", d.tokens_per_s, 2),
                       (row, "tokens_per_s_per_user_interval", d.tokens_per_s_per_user, 2)]
        _interval_keys(doc, uncertainty_for(hw, interval), times, wanted)
    if bracket:
        ends = routing_bracket_ends(routing)
        doc["routing_bracket"] = {
            name: {"expert_skew": r.skew, "draft_correlation": r.draft_correlation,
                   "variants": {v: _step_row(estimate_step(cfg, hw, v, tp, batch, context, draft_tokens,
                                                           acceptance_length, drafter, fusions, r, makespan))
                                for v in variants_of(variant)}}
            for name, r in ends.items()}
    return doc


@lru_cache(maxsize=1024)
def step_time_draws(cfg: ModelConfig, hw: HardwareProfile, tp: int, batch: int, context: int, draft_tokens: int,
                    variants: tuple[str, ...], drafter: str, fusions: frozenset[str] | None, routing: RoutingStats,
                    spec: IntervalSpec) -> dict[str, Any]:
    """Each variant's step time (µs) under the draws of `uncertainty_for(hw, spec)`, [N] read-only. Remembered:
    the acceptance length, not an argument, moves no time (it scales the tokens a step emits), so the points
    of a sweep that differ in it alone (five of every ten neighbours in benchmarks/bench_sweep.py, whose
    second-innermost axis it is) price the draws once: ~0.2 ms of estimate_step on arrays, both variants."""
    unc = uncertainty_for(hw, spec)
    times = unc.price(lambda makespan: {
        v: estimate_step(cfg, hw, v, tp, batch, context, draft_tokens, None, drafter, fusions, routing,
                         makespan=makespan).step_us for v in variants})
    for us in times.values():
        us.flags.writeable = False
    return times


# The concentrated end of the routing bracket when the user names none: the most skewed router of the
# published power-law fits (Qwen3-235B, s = 1.2; DeepSeek-V3 is 1.01; AIConfigurator
# docs/POWER_LAW_DISTRIBUTION.md) and half of a draft token's routing repeating its predecessor (an
# assumption: no measured value for Kimi K3 or DSpark is public).
CONCENTRATED = RoutingStats(skew=1.2, draft_correlation=0.5)


def routing_bracket_ends(routing: RoutingStats) -> dict[str, RoutingStats]:
    """Uniform independent routing (the most experts, an upper bound) against the user's routing, or
    against CONCENTRATED when the user kept the uniform default."""
    return {"uniform": UNIFORM, "concentrated": CONCENTRATED if routing == UNIFORM else routing}


def step_timeline(cfg: ModelConfig, hw: HardwareProfile, variant: str, tp: int, shape: DecodeShape,
                  fusions: frozenset[str] | None = None) -> Timeline:
    """Every layer of the stack, then the head, laid end to end (each type's representative timeline)."""
    per_type = {t: schedule(build_plan(cfg, variant, tp, shape, t, fusions, arch=arch_of(hw)), hw)
                for t, n in cfg.layer_counts().items() if n}
    spans: list[Span] = []
    offset = 0.0
    order = [cfg.layer_type(i) for i in range(cfg.num_layers)] + ["head"]
    head = schedule(head_plan(cfg, tp, shape, variant), hw)
    for i, layer_type in enumerate(order):
        tl = head if layer_type == "head" else per_type[layer_type]
        prefix = "head" if layer_type == "head" else f"L{i}"
        spans += [replace(s, key=f"{prefix}.{s.key}", start_us=s.start_us + offset, end_us=s.end_us + offset,
                          prefetch_start_us=None if s.prefetch_start_us is None else s.prefetch_start_us + offset,
                          prefetch_end_us=None if s.prefetch_end_us is None else s.prefetch_end_us + offset)
                  for s in tl.spans]
        offset += tl.layer_us
    floor = sum(per_type[t].floor_us for t in order if t != "head") + head.floor_us
    return Timeline(f"{variant} decode step TP{tp} M={shape.tokens}", hw.name, tuple(spans), floor)
