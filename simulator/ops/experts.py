"""Gated MLPs: SiTU-GLU / SiLU-GLU, the shared MLP, the dense FFN and the routed (latent) experts.

    SiTU-GLU(g, u) = [b1 tanh(g / b1) sigmoid(g)] * [b2 tanh(u / b2)]     (Kimi K3: b1 = 4, b2 = 25)
    SiLU-GLU(g, u) = g sigmoid(g) * u                                       (DeepSeek-V3, Qwen3, Mixtral)
    SwiGLU-OAI     = g' sigmoid(a g') * (u' + 1), g' = min(g, l), u' = clip(u, -l, l)   (gpt-oss: a 1.702, l 7)
    MLP(x)         = GLU(x @ w_gate, x @ w_up) @ w_down       (+ b_gate, b_up, b_down where the model has them)

Routed experts on token t with routing (idx, weight):
    y_t = sum_j weight[t, j] * MLP_{idx[t, j]}(z_t)          z = x (classic) or x @ W_latent_down (latent)

Under TP every expert is sharded: rank r holds F/P columns of w_gate / w_up and the matching F/P rows
of w_down, so each rank produces a partial y that an all-reduce completes (the GLU is elementwise in
F, so sharding F is exact).

The GPU runs routed experts as FC1 (gate+up GEMM, activation in its epilogue), FC2 (down GEMM, one output
row per (token, slot)) and a finalize (weighted sum over slots), or FC2 and the finalize fused in one pass.

Dimension legend: M tokens, Din expert input width (L for latent MoE, D otherwise), F expert hidden,
k active experts, P TP degree.
"""

from __future__ import annotations

from typing import Callable, Collection

import numpy as np
import numpy.typing as npt

from simulator.config import ModelConfig
from simulator.dtypes import Array
from simulator.ops.collectives import all_gather, all_reduce_one_shot, reduce_scatter
from simulator.ops.norm import rms_norm
from simulator.ops.pointwise import sigmoid, sigmoid_exp
from simulator.ops.replaceable import replaceable

ExpertFn = Callable[[int], tuple[Array, ...]]  # e -> the parts of expert e's TP shard a kernel declares


def glu(g: Array, u: Array, cfg: ModelConfig) -> Array:
    """The gated activation named by `cfg.hidden_act`; g, u [M, F] -> [M, F]."""
    if cfg.hidden_act == "swiglu_oai":
        g, u = np.minimum(g, cfg.swiglu_limit), np.clip(u, -cfg.swiglu_limit, cfg.swiglu_limit)
        return g * sigmoid(cfg.swiglu_alpha * g) * (u + 1)
    sig = sigmoid(g)
    if cfg.hidden_act == "situ":
        b1, b2 = cfg.situ_beta, cfg.situ_linear_beta
        return (b1 * np.tanh(g / b1) * sig) * (b2 * np.tanh(u / b2))
    return g * sig * u


def glu_product(gu: Array, cfg: ModelConfig) -> Array:
    """`glu` as the kernels run it (the activation kernel's op), on the gate+up product: [..., 2F] = [gate | up]
    -> [..., F]. The same formula and order of products, with `sigmoid_exp` (one SIMD exp, not logaddexp's
    scalar loop) and in place on its temporaries: ~3x faster than `glu` on FC1's output at batch 1, within a
    few ulp of it (the float64 reference keeps `glu`)."""
    g, u = np.split(gu, 2, axis=-1)
    if cfg.hidden_act == "swiglu_oai":
        g, u = np.minimum(g, cfg.swiglu_limit), np.clip(u, -cfg.swiglu_limit, cfg.swiglu_limit)
        h = sigmoid_exp(cfg.swiglu_alpha * g)
        h *= g
        h *= u + 1
        return h
    h = sigmoid_exp(g)
    if cfg.hidden_act == "situ":
        gate, up = np.tanh(g / cfg.situ_beta), np.tanh(u / cfg.situ_linear_beta)
        gate *= cfg.situ_beta
        gate *= h
        up *= cfg.situ_linear_beta
        gate *= up
        return gate
    h *= g
    h *= u
    return h


def mlp_reference(x: Array, w_gate: Array, w_up: Array, w_down: Array, cfg: ModelConfig,
                  *bias: Array) -> Array:
    """Gated MLP in float64, cast back; `bias` = (b_gate, b_up, b_down) for a model with expert biases.
    x [M, Din] -> [M, Dout]. A float32 weight is promoted by the product itself; a packed one multiplies
    in float64."""
    x64 = x.astype(np.float64)
    b_gate, b_up, b_down = (np.asarray(b, np.float64) for b in bias) if bias else (0.0, 0.0, 0.0)
    h = glu(x64 @ w_gate + b_gate, x64 @ w_up + b_up, cfg)  # [M, F]
    return (h @ w_down + b_down).astype(x.dtype)


# ===================================================================== reference
def routed_experts_reference(z: Array, topk_idx: npt.NDArray[np.int64], topk_weight: Array,
                             expert: ExpertFn, cfg: ModelConfig) -> Array:
    """Token by token, slot by slot, float64: y_t = sum_j w_tj MLP_e(z_t).   [M, Din] -> [M, Din]"""
    return routed_sum_reference(expert_outputs_reference(z, topk_idx, expert, cfg), topk_weight)


def expert_outputs_reference(z: Array, topk_idx: npt.NDArray[np.int64], expert: ExpertFn, cfg: ModelConfig, *,
                             only: Collection[int] | None = None, out: Array | None = None) -> Array:
    """MLP_e(z_t) for every (token t, slot j) choosing e, in float64, expert by expert: the rows that
    chose e together (a packed expert's reference product still takes them one row at a time, sharing
    each dequantized row of W^T: fast.packed.mxfp4_weight_reference).   [M, Din] -> [M, k, Din].
    `only` / `out`: run only the experts in `only` and continue `out` (the reference streams the experts a
    chunk at a time, reference._routed_experts)."""
    if out is None:
        out = np.zeros(topk_idx.shape + (z.shape[1],), dtype=z.dtype)  # [M, k, Din]
    for e, rows, slots in _groups(topk_idx, only):
        parts = expert(e)  # (w_gate, w_up, w_down) [+ (b_gate, b_up, b_down)]
        out[rows, slots] = mlp_reference(z[rows], *parts[:3], cfg, *parts[3:])  # [n_e, Din]
    return out


def routed_sum_reference(slots: Array, topk_weight: Array) -> Array:
    """y_t = sum_j w_tj slots[t, j], token by token in slot order, float64, cast back.   [M, k, Din] -> [M, Din]"""
    y = np.zeros((slots.shape[0], slots.shape[2]), dtype=np.float64)
    for t in range(slots.shape[0]):
        for j in range(slots.shape[1]):
            y[t] += float(topk_weight[t, j]) * slots[t, j]
    return y.astype(slots.dtype)


# ===================================================================== unfused kernels (standard plan)
@replaceable
def expert_fc1(z: Array, topk_idx: npt.NDArray[np.int64], expert: ExpertFn, *bias: Array,
               cfg: ModelConfig) -> Array:
    """FC1: gate+up GEMM per selected expert, activation in the epilogue; expert(e) = (w_gate, w_up);
    `bias`: [E, 2F/P] = [b_gate | b_up] rows added before the activation (gpt-oss).   [M, Din] -> [M, k, F/P]"""
    groups = list(_groups(topk_idx))
    gu = np.concatenate([np.concatenate([z[rows] @ w for w in expert(e)], axis=1) for e, rows, _ in groups])
    if bias:
        gu += bias_rows(bias[0], groups, gu.dtype)
    return _scatter(glu_product(gu, cfg), groups, topk_idx.shape, z.dtype)


@replaceable
def expert_fc2(h: Array, topk_idx: npt.NDArray[np.int64], expert: ExpertFn, *bias: Array) -> Array:
    """FC2: down GEMM per selected expert, one output row per (token, slot); expert(e) = (w_down,);
    `bias`: [E, Din] rows added to each product (rank 0's; zeros on the others).   [M, k, F/P] -> [M, k, Din]"""
    groups = list(_groups(topk_idx))
    y = np.concatenate([h[rows, slots] @ expert(e)[0] for e, rows, slots in groups])  # [rows of all groups, Din]
    if bias:
        y += bias_rows(bias[0], groups, y.dtype)
    return _scatter(y, groups, topk_idx.shape, h.dtype)


def bias_rows(bias: Array, groups: list, dtype: np.dtype) -> Array:
    """Each group's expert bias row, once per row of the group, in group order.   [E, N] -> [rows, N]"""
    return np.concatenate([np.broadcast_to(bias[e].astype(dtype), (len(rows), bias.shape[1]))
                           for e, rows, _ in groups])


def _scatter(values: Array, groups: list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]],
             shape: tuple[int, ...], dtype: np.dtype) -> Array:
    """The groups' rows of `values`, group after group, at their (token, slot) of a zero [M, k, N]."""
    out = np.zeros(shape + (values.shape[1],), dtype=dtype)
    out[np.concatenate([g[1] for g in groups]), np.concatenate([g[2] for g in groups])] = values
    return out


def expert_finalize(y: Array, topk_weight: Array) -> Array:
    """Weighted sum over the k slots.   [M, k, Din] -> [M, Din]"""
    return np.einsum("mk,mkd->md", topk_weight.astype(y.dtype), y)


# ===================================================================== fused
@replaceable
def expert_fc2_finalize(h: Array, topk_idx: npt.NDArray[np.int64], topk_weight: Array, expert: ExpertFn,
                        *bias: Array) -> Array:
    """FC2 with the routing weight and the scatter-add in its epilogue; expert(e) = (w_down,); `bias` as FC2's.
    [M, k, F/P] -> [M, Din]. Never writes the [M, k, Din] slot outputs: at M = 8, k = 16, Din = 3584
    that is 0.9 MB of bf16 not written and not re-read, and one launch fewer. The adds into a token's
    row run in expert order, each product rounded to h's dtype before its add."""
    out = None
    for e, rows, slots in _groups(topk_idx):
        y = h[rows, slots] @ expert(e)[0]  # [n_e, Din]; a token picks an expert once: rows are distinct
        if bias:
            y += bias[0][e].astype(y.dtype)
        out = np.zeros((h.shape[0], y.shape[1]), dtype=h.dtype) if out is None else out
        out[rows] += topk_weight[rows, slots].astype(h.dtype)[:, None] * y
    return out


def _groups(topk_idx: npt.NDArray[np.int64], only: Collection[int] | None = None):
    """(expert, token rows, slot columns) for every expert selected at least once (and in `only`, when
    given), in expert order."""
    flat = topk_idx.ravel()
    order = np.argsort(flat, kind="stable")
    experts, starts = np.unique(flat[order], return_index=True)
    rows, slots = np.divmod(order, topk_idx.shape[1])  # once, each group a slice: not two divisions a group
    wanted = None if only is None else set(only)  # np.isin took ~25 us at batch 1
    for e, lo, hi in zip(experts.tolist(), starts.tolist(), starts[1:].tolist() + [len(flat)]):
        if wanted is None or e in wanted:
            yield e, rows[lo:hi], slots[lo:hi]


# ===================================================================== dense kernels of the plans
def linear_glu(x: Array, w_gate_up: Array, *, cfg: ModelConfig) -> Array:
    """Gate+up GEMM with the activation in its epilogue: [M, D] @ [D, 2F] -> [M, F]; the [M, 2F]
    gate/up output is never written (2 x M x 2F x 2 B saved) and one launch fewer."""
    return glu_product(x @ w_gate_up, cfg)


def glu_flops(M: int, F: int, act: str) -> int:
    """Per hidden element, transcendentals counted as one: SiLU-GLU g sigmoid(g) u = sigmoid (3: exp, add,
    divide) + 2 multiplies = 5; SiTU-GLU adds b1 tanh(g / b1) and b2 tanh(u / b2) (3 each) = 11; SwiGLU-OAI
    adds the two clamps, a * g and u + 1 (1 each) = 9."""
    return {"situ": 11, "swiglu_oai": 9}.get(act, 5) * M * F


def finalize_flops(M: int, k: int, Din: int) -> int:
    """Weighted sum over the k slots: one multiply-add per slot element."""
    return 2 * M * k * Din


# ===================================================================== latent tail collectives
def allreduce_rmsnorm_reducescatter(z_parts: list[Array], shared_parts: list[Array], norm_w: list[Array],
                                    *, eps: float) -> tuple[list[Array], list[Array]]:
    """All ranks: AR(routed latent partials) + RMSNorm, RS(shared partials): P x [M, L], P x [M, D]
    -> P x [M, L] normed, P x [M, D/P] shared slice. One collective kernel instead of concat + AR +
    norm: the [M, L + D] concat buffer is never written."""
    z = [rms_norm(total, w, eps) for total, w in zip(all_reduce_one_shot(z_parts), norm_w)]
    return z, reduce_scatter(shared_parts)


def linear_add_allgather(xs: list[Array], shared_slices: list[Array], w_up: list[Array]) -> list[Array]:
    """All ranks: u_r = x_r @ W_up[:, D/P slice] + shared slice r, all-gathered (multicast store):
    P x [M, L] -> P x [M, D]. The replicated [L, D] up-projection becomes a 1/P shard per rank."""
    return all_gather([x @ w + s for x, s, w in zip(xs, shared_slices, w_up)])
