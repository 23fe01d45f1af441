"""Router: sigmoid scores, selection-only bias, (grouped) top-k, renormalisation, selection margin.

    logits = x @ W_r                     [M, E]   FP32 logits (vLLM's GateLinear out_dtype fp32)
    scores = sigmoid(logits)             [M, E]   (softmax for routers that say so)
    chosen = topk(scores + bias, k)      [M, k]   bias only *selects* (aux-loss-free balancing)
    weight = scores[chosen] / (sum + 1e-20) * routed_scaling_factor

Grouped top-k (DeepSeek-V3): experts are split into G groups; a group's score is the sum of its two
best biased scores; only the best `topk_group` groups stay eligible. Kimi K3 has G = 1 (plain top-k).

Tie-break (documented, deterministic): among equal biased scores the lower expert index wins; among
equal group scores the lower group index wins. A stable sort on the negated score does exactly this.

The selection margin of a token is the gap between the k-th and (k+1)-th eligible biased score
(and between the last selected and first rejected group). A rounding error larger than the margin
can flip the selection; the check report counts flips and shows their margins.

Dimension legend: M tokens, E routed experts, k active experts, G groups.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from simulator.config import ModelConfig
from simulator.dtypes import Array
from simulator.ops.collectives import all_gather
from simulator.ops.pointwise import sigmoid
from simulator.ops.replaceable import replaceable


class Routing(NamedTuple):
    topk_idx: npt.NDArray[np.int64]  # [M, k] ordered best first
    topk_weight: Array  # [M, k]
    margin: Array  # [M] selection margin in biased-score units


def router_scores(logits: Array, act: str) -> Array:
    if act == "softmax":
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return sigmoid(logits)


def _group_mask(biased: Array, cfg: ModelConfig) -> tuple[npt.NDArray[np.bool_], Array]:
    """Eligible experts [M, E] and the group-selection margin [M]."""
    m, e = biased.shape
    if cfg.n_group == 1:
        return np.ones((m, e), dtype=bool), np.full(m, np.inf)
    grouped = biased.reshape(m, cfg.n_group, e // cfg.n_group)  # [M, G, E/G]
    group_score = -np.sort(-grouped, axis=-1)[..., :2].sum(axis=-1)  # [M, G]
    order = np.argsort(-group_score, axis=-1, kind="stable")  # [M, G]
    keep = order[:, :cfg.topk_group]  # [M, g]
    ranked = np.take_along_axis(group_score, order, axis=-1)
    margin = (ranked[:, cfg.topk_group - 1] - ranked[:, cfg.topk_group]
              if cfg.topk_group < cfg.n_group else np.full(m, np.inf))
    mask = np.zeros((m, cfg.n_group), dtype=bool)
    np.put_along_axis(mask, keep, True, axis=-1)
    return np.repeat(mask, e // cfg.n_group, axis=-1), margin


def _combine(scores: Array, idx: npt.NDArray[np.int64], cfg: ModelConfig) -> Array:
    w = np.take_along_axis(scores, idx, axis=-1)  # [M, k]
    if cfg.renormalize:
        w = w / (w.sum(axis=-1, keepdims=True) + 1e-20)
    return w * cfg.routed_scaling_factor


# ===================================================================== reference
def route_reference(logits: Array, bias: Array, cfg: ModelConfig) -> Routing:
    """Full stable sort of the biased scores, float64; the oracle."""
    scores = router_scores(logits.astype(np.float64), cfg.router_act)  # [M, E]
    biased = scores + bias.astype(np.float64)
    eligible, group_margin = _group_mask(biased, cfg)
    masked = np.where(eligible, biased, -np.inf)
    order = np.argsort(-masked, axis=-1, kind="stable")  # [M, E]
    idx = order[:, :cfg.top_k]  # [M, k]
    ranked = np.take_along_axis(masked, order[:, :cfg.top_k + 1], axis=-1)
    gap = ranked[:, cfg.top_k - 1] - ranked[:, cfg.top_k] if cfg.top_k < masked.shape[1] else np.full(len(idx), np.inf)
    margin = np.minimum(np.where(np.isfinite(gap), gap, np.inf), group_margin)
    return Routing(idx, _combine(scores, idx, cfg).astype(logits.dtype), margin)


# ===================================================================== fused
def route_fused(logits: Array, bias: Array, cfg: ModelConfig) -> Routing:
    """One pass in the logits' dtype (FP32 on the GPU): sigmoid + bias + selection + renormalise.
    Reads the [M, E] FP32 logits once and writes [M, k] ids and weights; an unfused router also
    writes and re-reads the score and biased-score buffers (2 x M x E x 4 B each way). Selection
    uses the same stable order as the reference, so ties break identically (lower index wins)."""
    scores = router_scores(logits, cfg.router_act)  # [M, E]
    biased = scores + bias.astype(logits.dtype)
    eligible, group_margin = _group_mask(biased, cfg)
    masked = np.where(eligible, biased, -np.inf)
    k = cfg.top_k
    order = top_order(masked, k + 1)  # [M, k+1]
    ranked = np.take_along_axis(masked, order, axis=-1)
    gap = ranked[:, k - 1] - ranked[:, k] if order.shape[1] > k else np.full(len(order), np.inf)
    margin = np.minimum(np.where(np.isfinite(gap), gap, np.inf), group_margin)
    idx = order[:, :k]
    return Routing(idx, _combine(scores, idx, cfg), margin)


def route_unbiased(logits: Array, *, cfg: ModelConfig) -> Routing:
    """`route_fused` for a router with no selection bias (softmax top-k: Qwen3-MoE, Mixtral, gpt-oss)."""
    return route_fused(logits, np.zeros(logits.shape[-1], logits.dtype), cfg)


@replaceable
def top_order(masked: Array, n: int) -> npt.NDArray[np.int64]:
    """First n of the stable descending order (lower index first among equals).   [M, E] -> [M, n]"""
    return np.argsort(-masked, axis=-1, kind="stable")[:, :n]


def route_flops(M: int, E: int) -> int:
    """Per logit: sigmoid (exp, add, divide: counted 3) and the bias add (1); selection is comparisons."""
    return 4 * M * E


def allgather_topk(logit_shards: list[Array], z_shards: list[Array], biases: list[Array], *,
                   cfg: ModelConfig) -> tuple[list[Array], ...]:
    """All ranks: gather the [M, E/P] logit and [M, L/P] latent shards, then `route_fused` on the full
    logits on every rank (identical inputs, identical choice).  -> z, idx, weight, margin (P x each)"""
    logits, latent = all_gather(logit_shards), all_gather(z_shards)  # P x [M, E], P x [M, L]
    routed = [route_fused(lg, bias, cfg) for lg, bias in zip(logits, biases)]
    return latent, [r.topk_idx for r in routed], [r.topk_weight for r in routed], [r.margin for r in routed]
