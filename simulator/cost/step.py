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

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

from simulator.config import ModelConfig
from simulator.cost.timeline import Timeline, makespan_us, schedule
from simulator.errors import UserError
from simulator.hardware import HardwareProfile
from simulator.ops.experts import UNIFORM, RoutingStats
from simulator.plans import specialized, standard
from simulator.plans.builders import BUILDERS
from simulator.plans.head import draft_head_plan, head_plan
from simulator.plans.kernel import DecodeShape, Plan



@lru_cache(maxsize=256)
def representative_layer(cfg: ModelConfig, layer_type: str) -> int:
    """The median layer of a type: its AttnRes source count is the type's typical one."""
    layers = [i for i in range(cfg.num_layers) if cfg.layer_type(i) == layer_type]
    if not layers:
        raise UserError(f"model '{cfg.name}' has no layer of type '{layer_type}'.")
    return layers[len(layers) // 2]


@lru_cache(maxsize=4096)  # plans are immutable and pure in their (hashable) arguments: sweeps reuse them
def build_plan(cfg: ModelConfig, variant: str, tp: int, shape: DecodeShape, layer_type: str,
               fusions: frozenset[str] | None = None, layer: int | None = None) -> Plan:
    if variant not in BUILDERS:
        raise UserError(f"variant '{variant}' is not one of {', '.join(BUILDERS)}.")
    index = representative_layer(cfg, layer_type) if layer is None else layer
    if variant == "specialized":
        return specialized.build(cfg, tp, shape, layer_type, index, fusions=fusions)
    return standard.build(cfg, tp, shape, layer_type, index)


def layer_timeline(cfg: ModelConfig, hw: HardwareProfile, variant: str, tp: int, shape: DecodeShape,
                   layer_type: str, fusions: frozenset[str] | None = None) -> Timeline:
    return schedule(build_plan(cfg, variant, tp, shape, layer_type, fusions), hw)


def drafter_plans(drafter: ModelConfig, tp: int, batch: int, draft_tokens: int, context: int,
                  drafting: str, taps: int) -> tuple[list[Plan], int]:
    """(plans of one drafting forward, how many forwards) for the drafter's dense layers + its head."""
    m_tokens = batch * draft_tokens if drafting == "block" else batch
    shape = DecodeShape(m_tokens, 1, context)
    layers = [standard.build(drafter, tp, shape, "dense", i) for i in range(drafter.num_layers)]
    head = draft_head_plan(drafter, tp, shape, taps)
    return layers + [head], (1 if drafting == "block" else draft_tokens)


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
        raise UserError(f"--acceptance-length = {acceptance_length} must lie in [1, draft tokens + 1 = {draft_tokens + 1}] "
                        "(tokens emitted per verify step, bonus token included).")
    return float(acceptance_length)


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
    """The step of one variant. `makespan` prices one plan: `makespan_us`, or a function returning an array
    of uncertainty draws (cost/uncertainty.py), in which case every time in the estimate is that array."""
    accept = validate_speculation(draft_tokens, acceptance_length)
    shape = DecodeShape(batch, 1 + draft_tokens, context, routing)
    breakdown, per_layer, kernels = {}, {}, 0
    for layer_type, count in cfg.layer_counts().items():
        if count:
            plan = build_plan(cfg, variant, tp, shape, layer_type, fusions)
            per_layer[layer_type] = makespan(plan, hw)
            breakdown[f"{layer_type}_layers"] = count * per_layer[layer_type]
            kernels += count * len(plan)
    head = head_plan(cfg, tp, shape, variant, variant == "specialized" and (fusions is None or "pdl_prefetch" in fusions))
    breakdown["head"] = makespan(head, hw)
    kernels += len(head)
    if draft_tokens:
        dcfg, drafting, taps = load_drafter(drafter)
        if (dcfg.hidden_size, dcfg.vocab_size) != (cfg.hidden_size, cfg.vocab_size):
            raise UserError(f"drafter '{dcfg.name}' (hidden {dcfg.hidden_size}, vocab {dcfg.vocab_size}) does not match "
                            f"model '{cfg.name}' (hidden {cfg.hidden_size}, vocab {cfg.vocab_size}); pass --drafter.")
        plans, repeats = drafter_plans(dcfg, tp, batch, draft_tokens, context, drafting, taps)
        breakdown["draft"] = repeats * sum(makespan(p, hw) for p in plans)
        kernels += repeats * sum(len(p) for p in plans)
    return StepEstimate(variant, sum(breakdown.values()), accept, batch, breakdown, per_layer, kernels)
