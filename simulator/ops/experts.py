"""Gated MLPs: SiTU-GLU / SiLU-GLU, the shared MLP, the dense FFN and the routed (latent) experts.

    SiTU-GLU(g, u) = [b1 tanh(g / b1) sigmoid(g)] * [b2 tanh(u / b2)]     (Kimi K3: b1 = 4, b2 = 25)
    SiLU-GLU(g, u) = g sigmoid(g) * u                                       (DeepSeek-V3)
    MLP(x)         = GLU(x @ w_gate, x @ w_up) @ w_down

Routed experts on token t with routing (idx, weight):
    y_t = sum_j weight[t, j] * MLP_{idx[t, j]}(z_t)          z = x (classic) or x @ W_latent_down (latent)

Under TP every expert is sharded: rank r holds F/P columns of w_gate / w_up and the matching F/P rows
of w_down, so each rank produces a partial y that an all-reduce completes (the GLU is elementwise in
F, so sharding F is exact).

Dimension legend: M tokens, Din expert input width (L for latent MoE, D otherwise), F expert hidden,
k active experts, P TP degree.

The unfused GPU path runs routed experts as FC1 (gate+up GEMM with the activation in its epilogue),
FC2 (down GEMM, one output row per (token, slot)) and a finalize kernel (weighted sum over slots).
The fused form does FC2 and the finalize in one pass and never writes the [M, k, Din] slot outputs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import numpy.typing as npt

from simulator.config import ModelConfig
from simulator.dtypes import Array

ExpertFn = Callable[[int], tuple[Array, Array, Array]]  # e -> (w_gate [Din, F/P], w_up, w_down [F/P, Din])


def glu(g: Array, u: Array, cfg: ModelConfig) -> Array:
    """The gated activation named by `cfg.hidden_act`."""
    sig = 0.5 * (1.0 + np.tanh(0.5 * g))  # sigmoid without overflow for large |g|
    if cfg.hidden_act == "situ":
        b1, b2 = cfg.situ_beta, cfg.situ_linear_beta
        return (b1 * np.tanh(g / b1) * sig) * (b2 * np.tanh(u / b2))
    return g * sig * u


def mlp_reference(x: Array, w_gate: Array, w_up: Array, w_down: Array, cfg: ModelConfig) -> Array:
    """Gated MLP in float64, cast back.   x [M, Din] -> [M, Dout]"""
    x64 = x.astype(np.float64)
    h = glu(x64 @ w_gate.astype(np.float64), x64 @ w_up.astype(np.float64), cfg)  # [M, F]
    return (h @ w_down.astype(np.float64)).astype(x.dtype)


# ===================================================================== reference
def routed_experts_reference(z: Array, topk_idx: npt.NDArray[np.int64], topk_weight: Array,
                             expert: ExpertFn, cfg: ModelConfig) -> Array:
    """Token by token, slot by slot, float64: y_t = sum_j w_tj MLP_e(z_t).   [M, Din] -> [M, Din]"""
    y = np.zeros(z.shape, dtype=np.float64)
    for t in range(z.shape[0]):
        for j, e in enumerate(topk_idx[t]):
            w_gate, w_up, w_down = expert(int(e))
            y[t] += float(topk_weight[t, j]) * mlp_reference(z[t:t + 1], w_gate, w_up, w_down, cfg)[0]
    return y.astype(z.dtype)


# ===================================================================== unfused kernels (standard plan)
def expert_fc1(z: Array, topk_idx: npt.NDArray[np.int64], expert: ExpertFn, cfg: ModelConfig) -> Array:
    """FC1: gate+up GEMM per selected expert, activation in the epilogue.   [M, Din] -> [M, k, F/P]"""
    m, k = topk_idx.shape
    out = None
    for e, rows, slots in _groups(topk_idx):
        w_gate, w_up, _ = expert(e)
        h = glu(z[rows] @ w_gate, z[rows] @ w_up, cfg)  # [n_e, F/P]
        if out is None:
            out = np.zeros((m, k, h.shape[1]), dtype=z.dtype)
        out[rows, slots] = h
    return out


def expert_fc2(h: Array, topk_idx: npt.NDArray[np.int64], expert: ExpertFn) -> Array:
    """FC2: down GEMM per selected expert, one output row per (token, slot).   [M, k, F/P] -> [M, k, Din]"""
    out = None
    for e, rows, slots in _groups(topk_idx):
        y = h[rows, slots] @ expert(e)[2]  # [n_e, Din]
        if out is None:
            out = np.zeros(topk_idx.shape + (y.shape[1],), dtype=h.dtype)
        out[rows, slots] = y
    return out


def expert_finalize(y: Array, topk_weight: Array) -> Array:
    """Weighted sum over the k slots.   [M, k, Din] -> [M, Din]"""
    return np.einsum("mk,mkd->md", topk_weight.astype(y.dtype), y)


# ===================================================================== fused
def routed_experts_fused(z: Array, topk_idx: npt.NDArray[np.int64], topk_weight: Array,
                         expert: ExpertFn, cfg: ModelConfig) -> Array:
    """Grouped by expert: one GEMM over each expert's tokens, FC2 with the routing weight and the
    scatter-add in its epilogue. Never writes the [M, k, F/P] activations nor the [M, k, Din] slot
    outputs: at M = 8, k = 16, Din = 3584 that is 2 x 0.9 MB of bf16 not written and not re-read."""
    y = np.zeros(z.shape, dtype=z.dtype)
    for e, rows, slots in _groups(topk_idx):
        w_gate, w_up, w_down = expert(e)
        h = glu(z[rows] @ w_gate, z[rows] @ w_up, cfg)  # [n_e, F/P]
        np.add.at(y, rows, topk_weight[rows, slots, None].astype(z.dtype) * (h @ w_down))
    return y


def _groups(topk_idx: npt.NDArray[np.int64]):
    """(expert, token rows, slot columns) for every expert selected at least once, in expert order."""
    flat = topk_idx.ravel()
    order = np.argsort(flat, kind="stable")
    experts, starts = np.unique(flat[order], return_index=True)
    bounds = list(starts[1:]) + [len(flat)]
    k = topk_idx.shape[1]
    for e, lo, hi in zip(experts, starts, bounds):
        pos = order[lo:hi]
        yield int(e), pos // k, pos % k


def expected_unique_experts(tokens: int, num_experts: int, top_k: int) -> float:
    """U(M) = E (1 - (1 - k/E)^M): distinct experts touched by M tokens under uniform routing."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
