"""Fusion ablation: what does each fusion of the specialized plan buy, per layer and per step?

Three views of the same question, because fusions interact (PDL prefetch hides more once the
collectives are fused; the split router only saves bytes if the latent tail is sharded too):

- **add one**    standard + f alone:              saving = T(standard) - T({f})
- **remove one** specialized without f:           saving = T(specialized - {f}) - T(specialized)
- **waterfall**  fusions switched on one after another in `ORDER`; the steps add up exactly to
                 T(standard) - T(specialized), so a chart of them explains the whole gap.

Per layer: the layer timeline of one layer type (default: the KDA + MoE layer of the trace). Per step:
the whole decode step (every layer type x its count + head + drafting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.config import ModelConfig
from simulator.cost.step import build_plan, estimate_step
from simulator.cost.timeline import Makespan, makespan_us
from simulator.hardware import HardwareProfile
from simulator.routing import UNIFORM, RoutingStats
from simulator.plans.kernel import DecodeShape
from simulator.plans.specialized import FUSIONS
from simulator.plans.standard import arch_of

# Waterfall order: the order FUSIONS lists them (the plan's docstring table, tests/test_plans.py holds the two
# equal): the attention side of the layer, the MoE tail, then the launch machinery.
ORDER = tuple(FUSIONS)


@dataclass(frozen=True)
class AblationRow:
    fusion: str
    add_one_layer_us: float  # saving when only this fusion is added to standard
    remove_one_layer_us: float  # loss when only this fusion is removed from specialized
    waterfall_layer_us: float  # saving at its place in ORDER
    add_one_step_ms: float
    remove_one_step_ms: float
    waterfall_step_ms: float
    kernels_saved: int  # standard kernel count minus the count with only this fusion


def _layer_us(cfg: ModelConfig, hw: HardwareProfile, tp: int, shape: DecodeShape, layer: str,
              fusions: frozenset[str], makespan: Makespan) -> tuple[float, int]:
    plan = build_plan(cfg, "specialized", tp, shape, layer, fusions, arch=arch_of(hw))
    return makespan(plan, hw), len(plan)


def _step_ms(cfg: ModelConfig, hw: HardwareProfile, tp: int, shape: DecodeShape, draft_tokens: int,
             acceptance: float | None, fusions: frozenset[str], makespan: Makespan) -> float:
    return estimate_step(cfg, hw, "specialized", tp, shape.batch, shape.context, draft_tokens, acceptance,
                         fusions=fusions, routing=shape.routing, makespan=makespan).step_us / 1000


def ablate(cfg: ModelConfig, hw: HardwareProfile, tp: int, batch: int, tokens_per_seq: int, context: int,
           layer: str = "kda", acceptance_length: float | None = None,
           routing: RoutingStats = UNIFORM, makespan: Makespan = makespan_us) -> dict[str, Any]:
    """Every view for every fusion; the step uses `tokens_per_seq - 1` draft tokens. `makespan` says which
    event loop schedules (a sweep passes the compiled one, `fastsim.makespan_us`)."""
    shape = DecodeShape(batch, tokens_per_seq, context, routing)
    draft = tokens_per_seq - 1
    acceptance_length = acceptance_length if draft else None  # no drafts: one token per step
    none, every = frozenset(), frozenset(FUSIONS)
    lay = lambda f: _layer_us(cfg, hw, tp, shape, layer, f, makespan)  # noqa: E731
    stp = lambda f: _step_ms(cfg, hw, tp, shape, draft, acceptance_length, f, makespan)  # noqa: E731
    (base_l, base_k), (full_l, full_k) = lay(none), lay(every)
    base_s, full_s = stp(none), stp(every)
    rows, on = [], frozenset()
    for f in ORDER:
        before_l, before_s = lay(on)[0], stp(on)
        on = on | {f}
        only_l, only_k = lay(frozenset({f}))
        rows.append(AblationRow(
            f, base_l - only_l, lay(every - {f})[0] - full_l, before_l - lay(on)[0],
            base_s - stp(frozenset({f})), stp(every - {f}) - full_s, before_s - stp(on), base_k - only_k))
    return {
        "metric": "savings of each fusion: layer time (µs, one KDA+MoE layer by default) and decode-step time (ms)",
        "model": cfg.name, "hardware": hw.name, "kernel_set": hw.kernels, "tp": tp, "batch": batch,
        "tokens_per_seq": tokens_per_seq, "context": context, "layer": layer, "draft_tokens": draft,
        "standard": {"layer_us": round(base_l, 3), "step_ms": round(base_s, 4), "kernel_count": base_k},
        "specialized": {"layer_us": round(full_l, 3), "step_ms": round(full_s, 4), "kernel_count": full_k},
        "fusions": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in vars(r).items()} for r in rows],
    }


def waterfall(doc: dict[str, Any], level: str = "layer") -> list[tuple[str, float]]:
    """[("standard", T0), (fusion, -saving), ...]: the steps end exactly at the specialized total."""
    key, unit = ("waterfall_layer_us", "layer_us") if level == "layer" else ("waterfall_step_ms", "step_ms")
    return [("standard", doc["standard"][unit])] + [(r["fusion"], -r[key]) for r in doc["fusions"]]
