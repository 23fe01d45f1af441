"""The oracle: one decoder layer as a textbook, single-device, float64 computation. No plan, no TP.

    prefix  = prefix + delta                                    (previous layer's MLP output)
    h       = AttnResMix(blocks + [prefix]);  [snapshot prefix, reset]      (a plain residual: h = prefix)
    prefix += Attn(RMSNorm(h))                                  the kind's entry (KDA; MLA non-absorbed)
    h2      = AttnResMix(blocks + [prefix])                                 (a plain residual: h2 = prefix)
    delta   = FFN(RMSNorm(h2))                                  latent MoE + shared, or dense

Both plans are checked against this. It uses the `*_reference` form of every op (loops allowed),
the full weights, and each attention kind's reference (simulator/attention/<kind>.py; MLA in its
non-absorbed form), so it shares no code path with the plans' kernels beyond the op definitions themselves.

Dimension legend: M tokens (B sequences x T tokens), D hidden, N heads, H head dim, L latent.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np

from simulator import attention
from simulator.config import ModelConfig
from simulator.ops import experts as ex
from simulator.fast.packed import BF16Weight, MXFP4Weight
from simulator.ops.norm import attn_res_mix_reference, rms_norm_reference
from simulator.ops.router import Routing, route_reference
from simulator.state import DecodeShape, LayerIO, LayerState, block_boundary
from simulator.weights import LayerWeights

F64 = np.float64


def reference_layer(cfg: ModelConfig, layer: int, shape: DecodeShape, w: LayerWeights, io: LayerIO,
                    state: LayerState) -> tuple[LayerIO, LayerState, dict]:
    eps = cfg.rms_norm_eps
    W = lambda name: _weight(w, name)  # noqa: E731
    attn_res = cfg.residual == "attn_res"
    blocks = [b.astype(F64) for b in io.blocks]
    prefix = io.prefix.astype(F64) + io.delta.astype(F64)
    h = attn_res_mix_reference(blocks + [prefix], W("attn_res_norm"), W("attn_res_proj"), eps) if attn_res else prefix
    if block_boundary(cfg, layer):
        blocks.append(prefix)
        prefix = np.zeros_like(prefix)
    x = rms_norm_reference(h, W("input_norm"), eps)
    a, new_state = attention.kind(cfg.attn_kinds[layer]).reference(cfg, layer, shape, W, x, state)
    if cfg.o_proj_bias:
        a = a + W("o_proj.bias")
    prefix = prefix + a
    h2 = attn_res_mix_reference(blocks + [prefix], W("mlp_res_norm"), W("mlp_res_proj"), eps) if attn_res else prefix
    x2 = rms_norm_reference(h2, W("post_attn_norm"), eps)
    diag: dict = {}
    if layer < cfg.first_k_dense:
        m = ex.mlp_reference(x2, W("dense.w_gate"), W("dense.w_up"), W("dense.w_down"), cfg)
    else:
        m = moe_reference(cfg, w, W, x2, diag)
    return LayerIO(prefix=prefix, delta=m, blocks=blocks), new_state, diag


def _weight(w: LayerWeights, name: str):
    """A weight in float64: a bf16 matrix as `BF16Weight(form="reference")`, whose products widen 8 MB
    chunks (no float64 copy of a 1.9 GB weight), anything else as a float64 array."""
    held = w.held(name)
    if held.ndim == 2 and held.dtype == ml_dtypes.bfloat16:
        return BF16Weight((held.view(np.uint16),), np.dtype(F64), form="reference")
    return w.get(name, F64)


def _experts(w: LayerWeights):
    """e -> expert e's (w_gate, w_up, w_down) in float64: packed MXFP4 parts multiplied by dequantizing
    one row of W^T at a time (no 88 MB float64 copy of a full-size part), or float64 arrays; then its
    (b_gate, b_up, b_down) where the model has expert biases."""
    if not w.packs_experts:
        parts = lambda e: w.expert(e, F64)  # noqa: E731
    else:
        parts = lambda e: tuple(MXFP4Weight(*q, form="reference") for q in w.expert_packed(e))  # noqa: E731
    if not w.cfg.expert_bias:
        return parts
    bias = [w.get(f"expert_bias.{p}", F64) for p in ("gate", "up", "down")]
    return lambda e: parts(e) + tuple(b[e] for b in bias)


REFERENCE_THREADS = 8  # at most; the experts of a streamed chunk are independent products (the dequantize
# kernel and einsum's loop release the GIL), and each is computed whole on one thread


def _routed_experts(w: LayerWeights, z: np.ndarray, routing: Routing, cfg: ModelConfig) -> np.ndarray:
    """`ex.routed_experts_reference` with the touched experts streamed a chunk at a time (each drawn
    once, on all cores; memory holds a chunk): the slot outputs expert by expert, then the weighted sum."""
    expert = _experts(w)
    slots = np.zeros(routing.topk_idx.shape + (z.shape[1],), dtype=z.dtype)  # [M, k, Din]
    # threads only over packed experts, which a chunk holds read-only; float experts come from the weight
    # store's bounded copy cache, whose bookkeeping is not thread-safe
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = max(1, min(REFERENCE_THREADS, cores)) if w.packs_experts else 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for chunk in w.stream_experts(np.unique(routing.topk_idx)):
            # the chunk's experts dealt round-robin to the threads; each expert fills its own (row, slot)
            # entries, computed as on one thread, so the bits do not depend on the thread count
            share = [chunk[i::workers] for i in range(workers)]
            list(pool.map(lambda mine: ex.expert_outputs_reference(z, routing.topk_idx, expert, cfg, only=mine,
                                                                   out=slots), [s for s in share if s]))
    return ex.routed_sum_reference(slots, routing.topk_weight)


def moe_reference(cfg: ModelConfig, w: LayerWeights, W, x2: np.ndarray, diag: dict) -> np.ndarray:
    logits = x2 @ W("router.w") + (W("router.logit_bias") if cfg.router_logit_bias else 0.0)
    routing = route_reference(logits, W("router.bias") if cfg.selection_bias else np.zeros(cfg.num_experts), cfg)
    diag["topk_idx"], diag["margin"] = routing.topk_idx, routing.margin
    if cfg.latent_dim:
        z = x2 @ W("latent.w_down")  # [M, L]
        y = _routed_experts(w, z, routing, cfg)
        if cfg.latent_norm:
            y = rms_norm_reference(y, W("latent.norm"), cfg.rms_norm_eps)
        y = y @ W("latent.w_up")  # [M, D]
    else:
        y = _routed_experts(w, x2, routing, cfg)
    if cfg.num_shared_experts:
        y = y + ex.mlp_reference(x2, W("shared.w_gate"), W("shared.w_up"), W("shared.w_down"), cfg)
    return y
