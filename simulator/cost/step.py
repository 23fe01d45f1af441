"""Decode step: per-layer-type cost x layer counts + the model head, with speculative decoding.

    T_step = sum_{type in kda, mla, dense} n_type * T_layer(type, M) + T_head(M) + T_draft

with M = batch x (1 + draft tokens) tokens in the verify forward. The head is the embedding lookup
(vocab-parallel, so one all-reduce), the final AttnRes mix over every block snapshot + the final
RMSNorm, the vocab-sharded LM head and greedy sampling (local argmax + an all-gather of the winners).

Speculative decoding (draft length d, mean acceptance length a):
- a is vLLM's *mean acceptance length*: tokens emitted per verify step per sequence, bonus token
  included, so 1 <= a <= d + 1 (a = 1 without speculation).
- the drafter (its own config, e.g. models/dspark-k3.json) is costed with the same dense-layer plans:
  'block' drafting proposes all d tokens in one forward of M = batch x d tokens; 'autoregressive'
  drafting runs d forwards of M = batch. It reads the target's LM head for its own logits. The
  drafter is identical in both variants (the published change leaves it untouched).

    tokens/s (aggregate) = batch x a / T_step        tokens/s per user = a / T_step

Dimension legend: M tokens per forward, D hidden, V vocab, P TP degree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from typing import Any, Callable

from simulator import attention
from simulator.config import ModelConfig
from simulator.cost.timeline import Makespan, Timeline, makespan_us, schedule
from simulator.errors import UserError
from simulator.hardware import HardwareProfile
from simulator.routing import UNIFORM, RoutingStats
from simulator.plans import specialized, standard
from simulator.plans.builders import BUILDERS
from simulator.cost.head import draft_head_plan, head_plan
from simulator.plans.kernel import DecodeShape, Plan
from simulator.state import block_boundary, blocks_before



@lru_cache(maxsize=256)
def representative_layer(cfg: ModelConfig, layer_type: str) -> int:
    """The median layer of a type: its AttnRes source count is the type's typical one."""
    layers = [i for i in range(cfg.num_layers) if cfg.layer_type(i) == layer_type]
    if not layers:
        raise UserError(f"model '{cfg.name}' has no layer of type '{layer_type}'.")
    return layers[len(layers) // 2]


@lru_cache(maxsize=256)
def layer_groups(cfg: ModelConfig, layer_type: str) -> tuple[tuple[int, int], ...]:
    """(representative layer, layer count) of each attention window among a type's layers: gpt-oss alternates
    banded (128-token) and full attention, whose decode kernels differ; one group, the median layer, where every
    layer of the type attends alike (every model but the sliding-window ones)."""
    layers = [i for i in range(cfg.num_layers) if cfg.layer_type(i) == layer_type]
    windows = sorted({cfg.gqa_window(i) for i in layers})
    if len(windows) < 2:
        return ((representative_layer(cfg, layer_type), len(layers)),)
    groups = [[i for i in layers if cfg.gqa_window(i) == w] for w in windows]
    return tuple((mine[len(mine) // 2], len(mine)) for mine in groups)


def build_plan(cfg: ModelConfig, variant: str, tp: int, shape: DecodeShape, layer_type: str,
               fusions: frozenset[str] | None = None, layer: int | None = None, arch: str = "sm100") -> Plan:
    """The plan of one layer; one object per distinct plan (the default fusions asked for by name or as None
    build the same), so pricings that remember plans by identity (the uncertainty draws) price it once."""
    if variant == "specialized":
        fusions = specialized.resolve_fusions(fusions)
    return _build_plan(cfg, variant, tp, shape, layer_type, fusions if variant == "specialized" else None, layer, arch)


@lru_cache(maxsize=4096)  # plans are immutable and pure in their (hashable) arguments: sweeps reuse them
def _build_plan(cfg: ModelConfig, variant: str, tp: int, shape: DecodeShape, layer_type: str,
                fusions: frozenset[str] | None, layer: int | None, arch: str = "sm100") -> Plan:
    if variant not in BUILDERS:
        raise UserError(f"variant '{variant}' is not one of {', '.join(BUILDERS)}.")
    index = representative_layer(cfg, layer_type) if layer is None else layer
    if variant == "specialized":
        return specialized.build(cfg, tp, shape, layer_type, index, fusions=fusions)
    return standard.build(cfg, tp, shape, layer_type, index, arch=arch)


def layer_us(cfg: ModelConfig, hw: HardwareProfile, variant: str, tp: int, shape: DecodeShape, layer_type: str,
             fusions: frozenset[str] | None = None, makespan: Makespan = makespan_us,
             layer: int | None = None) -> tuple[float, int]:
    """(makespan in µs, kernel count) of one layer's plan on one GPU (layer index `layer`, else the type's
    representative), shared by every shape that builds the same plan (`plan_shape`): a sweep's points differ
    in hardware, acceptance length or context far more often than in the kernels of a KDA layer."""
    return _layer_us(cfg, hw, variant, tp, plan_shape(cfg, shape, layer_type), layer_type, fusions, makespan, layer)


def _layer(cfg: ModelConfig, hw: HardwareProfile, variant: str, tp: int, shape: DecodeShape, layer_type: str,
           fusions: frozenset[str] | None,
           makespan: Callable[[Plan, HardwareProfile], Any] = makespan_us, layer: int | None = None,
           ) -> tuple[Any, int]:
    """The plan of the shape's `plan_shape`: one object for every shape that builds the same kernels, so a
    pricing that remembers plans (the uncertainty draws do, by identity) prices it once."""
    plan = build_plan(cfg, variant, tp, plan_shape(cfg, shape, layer_type), layer_type, fusions, layer,
                      arch=standard.arch_of(hw))
    return makespan(plan, hw), len(plan)


_layer_us = lru_cache(maxsize=8192)(_layer)


def plan_shape(cfg: ModelConfig, shape: DecodeShape, layer_type: str) -> DecodeShape:
    """The shape with what a layer's kernels do not read set to one value: the context reaches only a layer
    whose attention reads a cache (MLA; the registry entry's `reads_context`), the routing only a layer with
    routed experts, and the draft correlation only a verify of more than one token per sequence
    (tests/test_cost_model.py builds both and compares)."""
    reads = attention.kind(cfg.attn_kinds[representative_layer(cfg, layer_type)]).reads_context
    routing = shape.routing if layer_type != "dense" else UNIFORM
    if shape.tokens_per_seq == 1:
        routing = RoutingStats(routing.skew, 0.0)
    return DecodeShape(shape.batch, shape.tokens_per_seq, shape.context if reads else 0, routing)


def _head(cfg: ModelConfig, hw: HardwareProfile, tp: int, shape: DecodeShape, variant: str, pdl: bool,
          makespan: Callable[[Plan, HardwareProfile], Any] = makespan_us) -> tuple[Any, int]:
    """(makespan, kernel count) of the model head, `shape` as `head_shape` gives it."""
    plan = head_plan(cfg, tp, shape, variant, pdl)
    return makespan(plan, hw), len(plan)


def head_shape(shape: DecodeShape) -> DecodeShape:
    """The shape with only what the head reads, its tokens (embedding rows, LM head, sampling): one head plan
    per batch and draft length, not per context and routing as well (a sweep prices each one under 100 draws)."""
    return DecodeShape(shape.batch, shape.tokens_per_seq, 0)


def _draft(drafter: ModelConfig, hw: HardwareProfile, tp: int, batch: int, draft_tokens: int, context: int,
           drafting: str, taps: int, makespan: Callable[[Plan, HardwareProfile], Any] = makespan_us) -> tuple[Any, int]:
    """(time, kernel count) of all drafting forwards of one step."""
    plans, repeats = drafter_plans(drafter, tp, batch, draft_tokens, context, drafting, taps)
    return repeats * sum(makespan(p, hw) for p in plans), repeats * sum(len(p) for p in plans)


head_us = lru_cache(maxsize=8192)(_head)  # a sweep's points share heads and drafters across their other axes
draft_us = lru_cache(maxsize=8192)(_draft)


def layer_timeline(cfg: ModelConfig, hw: HardwareProfile, variant: str, tp: int, shape: DecodeShape,
                   layer_type: str, fusions: frozenset[str] | None = None,
                   makespan: Makespan = makespan_us) -> Timeline:
    return schedule(build_plan(cfg, variant, tp, shape, layer_type, fusions, arch=standard.arch_of(hw)), hw,
                    makespan.loop)


def layer_signature(cfg: ModelConfig, layer: int) -> tuple:
    """All a plan reads of its layer's index (through `plans.common.Dims`: the layer's type and attention, its
    AttnRes snapshots and boundary, a GQA layer's window, and whether it is the first GQA layer, whose rotary table
    gpt-oss's step casts before it): layers with equal signatures build equal plans at every shape and TP (a test
    builds them), so a caller may build one and reuse it (a drafter's five dense layers, `drafter_plans`)."""
    return (cfg.layer_type(layer), cfg.attn_kinds[layer], blocks_before(cfg, layer), block_boundary(cfg, layer),
            cfg.gqa_window(layer), cfg.attn_kinds[layer] == "gqa" and layer == 0)


@lru_cache(maxsize=1024)  # the same plan objects for the same drafting: pricings that remember plans hit
def drafter_plans(drafter: ModelConfig, tp: int, batch: int, draft_tokens: int, context: int,
                  drafting: str, taps: int) -> tuple[tuple[Plan, ...], int]:
    """(plans of one drafting forward, how many forwards) for the drafter's dense layers + its head."""
    m_tokens = batch * draft_tokens if drafting == "block" else batch
    shape = DecodeShape(m_tokens, 1, context)
    built: dict[tuple, Plan] = {}  # layers of one signature build one plan: built once, and one object, so
    # pricings that remember plans by identity (the uncertainty draws) schedule it once, not once a layer
    layers = []
    for i in range(drafter.num_layers):
        sig = layer_signature(drafter, i)
        if sig not in built:
            built[sig] = standard.build(drafter, tp, shape, "dense", i)
        layers.append(built[sig])
    head = _draft_head_plan(drafter, tp, head_shape(shape), taps)
    return tuple(layers) + (head,), (1 if drafting == "block" else draft_tokens)


_draft_head_plan = lru_cache(maxsize=1024)(draft_head_plan)  # one object per head shape, as `head_plan`


# ---------------------------------------------------------------------------------------
# the step
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepEstimate:
    variant: str
    step_us: float
    tokens_per_step: float  # per sequence: the acceptance length
    batch: int
    breakdown_us: dict[str, float] = field(default_factory=dict)
    layer_us: dict[str, float] = field(default_factory=dict)
    kernels_per_step: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.tokens_per_step / (self.step_us * 1e-6)

    @property
    def tokens_per_s_per_user(self) -> float:
        return self.tokens_per_step / (self.step_us * 1e-6)


def validate_speculation(draft_tokens: int, acceptance_length: float | None) -> float:
    if draft_tokens < 0:
        raise UserError(f"--draft-tokens = {draft_tokens} must be 0 or more.")
    if acceptance_length is None:
        return float(draft_tokens + 1) if draft_tokens else 1.0
    if not 1.0 <= acceptance_length <= draft_tokens + 1:
        raise UserError(f"--acceptance-length = {acceptance_length} must lie in [1, draft tokens + 1 = "
                        f"{draft_tokens + 1}] "
                        "(tokens emitted per verify step, bonus token included).")
    return float(acceptance_length)


@lru_cache(maxsize=64)  # a sweep asks for the same drafter at every point: parse its JSON once
def load_drafter(name_or_path: str) -> tuple[ModelConfig, str, int]:
    from simulator.config import load_model
    cfg = load_model(name_or_path)
    if cfg.has_moe:
        raise UserError(f"drafter '{cfg.name}' has MoE layers; moe-sim costs dense drafters only.")
    return cfg, cfg.drafting, cfg.target_taps


def estimate_step(cfg: ModelConfig, hw: HardwareProfile, variant: str, tp: int, batch: int, context: int,
                  draft_tokens: int = 0, acceptance_length: float | None = None, drafter: str = "dspark-k3",
                  fusions: frozenset[str] | None = None, routing: RoutingStats = UNIFORM,
                  makespan: Callable[[Plan, HardwareProfile], Any] = makespan_us) -> StepEstimate:
    """The step of one variant. `makespan` prices one plan: a `Makespan` (each layer, head and drafting
    forward then priced once per plan shape and GPU, across calls, and the step's times once per argument
    but the acceptance length), or a function returning an array of uncertainty draws
    (cost/uncertainty.py), in which case every time in the estimate is that array."""
    accept = validate_speculation(draft_tokens, acceptance_length)
    args = (cfg, hw, variant, tp, batch, context, draft_tokens, drafter, fusions, routing, makespan)
    step = step_times(*args) if isinstance(makespan, Makespan) else _step(*args)  # draws are never remembered
    return replace(step, tokens_per_step=accept, breakdown_us=dict(step.breakdown_us), layer_us=dict(step.layer_us))


def _step(cfg: ModelConfig, hw: HardwareProfile, variant: str, tp: int, batch: int, context: int, draft_tokens: int,
          drafter: str, fusions: frozenset[str] | None, routing: RoutingStats,
          makespan: Callable[[Plan, HardwareProfile], Any]) -> StepEstimate:
    """`estimate_step` but its tokens per step (left at 1): no time depends on the acceptance length, so a
    sweep's points that differ in it alone (5 of 10 neighbours in benchmarks/bench_sweep.py) share one
    `step_times` (~45 µs of lookups and sums a variant)."""
    cached = isinstance(makespan, Makespan)  # draws are never cached: the same function may draw anew
    layer = partial(layer_us if cached else _layer, makespan=makespan)
    head = partial(head_us if cached else _head, makespan=makespan)
    draft = partial(draft_us if cached else _draft, makespan=makespan)
    shape = DecodeShape(batch, 1 + draft_tokens, context, routing)
    breakdown, per_layer, kernels = {}, {}, 0
    for layer_type, count in cfg.layer_counts().items():
        if not count:
            continue
        groups = layer_groups(cfg, layer_type)
        if len(groups) == 1:  # every model but the sliding-window ones: the type's representative layer
            per_layer[layer_type], n = layer(cfg, hw, variant, tp, shape, layer_type, fusions)
            breakdown[f"{layer_type}_layers"], kernels = count * per_layer[layer_type], kernels + count * n
            continue
        total: Any = 0.0
        for index, n_layers in groups:
            t, n = layer(cfg, hw, variant, tp, shape, layer_type, fusions, layer=index)
            total, kernels = total + n_layers * t, kernels + n_layers * n
        breakdown[f"{layer_type}_layers"], per_layer[layer_type] = total, total / count  # the mean layer
    pdl = variant == "specialized" and (fusions is None or "pdl_prefetch" in fusions)
    breakdown["head"], n = head(cfg, hw, tp, head_shape(shape), variant, pdl)
    kernels += n
    if draft_tokens:
        dcfg, drafting, taps = load_drafter(drafter)
        if (dcfg.hidden_size, dcfg.vocab_size) != (cfg.hidden_size, cfg.vocab_size):
            raise UserError(f"drafter '{dcfg.name}' (hidden {dcfg.hidden_size}, vocab {dcfg.vocab_size}) does not "
                            f"match "
                            f"model '{cfg.name}' (hidden {cfg.hidden_size}, vocab {cfg.vocab_size}); pass --drafter.")
        breakdown["draft"], n = draft(dcfg, hw, tp, batch, draft_tokens, context, drafting, taps)
        kernels += n
    return StepEstimate(variant, sum(breakdown.values()), 1.0, batch, breakdown, per_layer, kernels)


step_times = lru_cache(maxsize=8192)(_step)  # central values, plain numbers: remembered like `layer_us`

