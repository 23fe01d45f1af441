"""The oracle: one decoder layer as a textbook, single-device, float64 computation. No plan, no TP.

    prefix  = prefix + delta                                    (previous layer's MLP output)
    h       = AttnResMix(blocks + [prefix]);  [snapshot prefix, reset]
    prefix += Attn(RMSNorm(h))                                  KDA or MLA (non-absorbed form)
    h2      = AttnResMix(blocks + [prefix])
    delta   = FFN(RMSNorm(h2))                                  latent MoE + shared, or dense

Both plans are checked against this. It uses the `*_reference` form of every op (loops allowed),
the full weights, and the non-absorbed MLA, so it shares no code path with the plans' kernels
beyond the op definitions themselves.

Dimension legend: M tokens (B sequences x T tokens), D hidden, N heads, H head dim, L latent.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np

from simulator.config import ModelConfig
from simulator.ops import experts as ex
from simulator.ops import kda as kda_ops
from simulator.ops import mla as mla_ops
from simulator.fast.packed import BF16Weight, MXFP4Weight
from simulator.ops.norm import attn_res_mix_reference, rms_norm_reference
from simulator.ops.pointwise import sigmoid
from simulator.ops.router import Routing, route_reference
from simulator.state import DecodeShape, LayerIO, LayerState, block_boundary
from simulator.weights import LayerWeights

F64 = np.float64


def reference_layer(cfg: ModelConfig, layer: int, shape: DecodeShape, w: LayerWeights, io: LayerIO,
                    state: LayerState) -> tuple[LayerIO, LayerState, dict]:
    eps = cfg.rms_norm_eps
    W = lambda name: _weight(w, name)  # noqa: E731
    blocks = [b.astype(F64) for b in io.blocks]
    prefix = io.prefix.astype(F64) + io.delta.astype(F64)
    h = attn_res_mix_reference(blocks + [prefix], W("attn_res_norm"), W("attn_res_proj"), eps)
    if block_boundary(cfg, layer):
        blocks.append(prefix)
        prefix = np.zeros_like(prefix)
    x = rms_norm_reference(h, W("input_norm"), eps)
    if cfg.attn_kinds[layer] == "kda":
        a, new_state = kda_reference(cfg, shape, W, x, state)
    else:
        a, new_state = mla_reference(cfg, shape, W, x, state)
    prefix = prefix + a
    h2 = attn_res_mix_reference(blocks + [prefix], W("mlp_res_norm"), W("mlp_res_proj"), eps)
    x2 = rms_norm_reference(h2, W("post_attn_norm"), eps)
    diag: dict = {}
    if layer < cfg.first_k_dense:
        m = ex.mlp_reference(x2, W("dense.w_gate"), W("dense.w_up"), W("dense.w_down"), cfg)
    else:
        m = moe_reference(cfg, w, W, x2, diag)
    return LayerIO(prefix=prefix, delta=m, blocks=blocks), new_state, diag


def kda_reference(cfg: ModelConfig, shape: DecodeShape, W, x: np.ndarray, state: LayerState) -> tuple[np.ndarray, LayerState]:
    B, T = shape.batch, shape.tokens_per_seq
    bt = lambda y: y.reshape(B, T, -1)  # noqa: E731   [M, n] -> [B, T, n]
    qkv = np.concatenate([x @ W(f"kda.w_{p}") for p in "qkv"], axis=-1)  # [M, 3C]
    conv_w = np.concatenate([W(f"kda.conv_{p}") for p in "qkv"], axis=0)  # [3C, W]
    z = (x @ W("kda.w_fa")) @ W("kda.w_fb")  # [M, C]
    # the state as float64 without a copy of its own when it is one: kda_decode_reference updates a copy (at
    # batch 64 the state is 0.5 GB, and a second copy cost ~1 s and 0.5 GB of peak)
    out, s, hist = kda_ops.kda_decode_reference(
        bt(qkv), conv_w, np.asarray(state["kda.conv"], F64), bt(z), W("kda.dt_bias"), W("kda.a_log"),
        bt(x @ W("kda.w_b")), bt(x @ W("kda.w_g")), W("kda.o_norm"), np.asarray(state["kda.state"], F64),
        lower_bound=cfg.gate_lower_bound, eps=cfg.rms_norm_eps)
    return out.reshape(B * T, -1) @ W("kda.w_o"), {"kda.state": s, "kda.conv": hist}


def mla_reference(cfg: ModelConfig, shape: DecodeShape, W, x: np.ndarray, state: LayerState) -> tuple[np.ndarray, LayerState]:
    B, T = shape.batch, shape.tokens_per_seq
    N = cfg.mla_heads
    lkv, ctx = cfg.kv_lora_rank, shape.context
    c_q, c_kv, k_pe = mla_ops.mla_qkv_a_norm(x @ W("mla.w_qa"), x @ W("mla.w_kva"), W("mla.q_a_norm"),
                                             W("mla.kv_a_norm"), lkv, cfg.mla_lora_eps)
    cache, lengths = state["mla.cache"].astype(F64), state["mla.lengths"]
    old_pe = cache[:, :ctx, lkv:]
    theta = None if cfg.mla_nope else cfg.rope_theta
    if theta is not None:  # the cache holds rotated k_pe; the textbook form rotates inside attention
        old_pe = mla_ops.rope(old_pe, -np.broadcast_to(np.arange(ctx), (B, ctx)), theta, cfg.rope_scaling)
    c_kv_all = np.concatenate([cache[:, :ctx, :lkv], c_kv.reshape(B, T, lkv)], axis=1)  # [B, S, Lkv]
    k_pe_all = np.concatenate([old_pe, k_pe.reshape(B, T, -1)], axis=1)  # [B, S, R]
    w_uk = W("mla.w_uk").reshape(lkv, N, cfg.qk_nope_dim).transpose(1, 2, 0)  # [N, Dn, Lkv]
    w_uv = W("mla.w_uv").reshape(lkv, N, cfg.v_head_dim).transpose(1, 0, 2)  # [N, Lkv, Dv]
    o = mla_ops.mla_attention_reference(c_q.reshape(B, T, -1), c_kv_all, k_pe_all, W("mla.w_qb"), w_uk, w_uv,
                                        lengths, cfg.mla_softmax_scale, rope_theta=theta,
                                        rope_scaling=cfg.rope_scaling)
    o = o.reshape(B * T, N * cfg.v_head_dim)  # [M, N Dv]
    if cfg.mla_output_gate:
        o = o * sigmoid(x @ W("mla.w_g"))
    new_pe = k_pe.reshape(B, T, -1)
    if theta is not None:
        new_pe = mla_ops.rope(new_pe, lengths[:, None] + np.arange(T)[None, :], theta, cfg.rope_scaling)
    new_cache = cache.copy()
    new_cache[:, ctx:ctx + T] = np.concatenate([c_kv.reshape(B, T, lkv), new_pe], axis=-1)
    return o @ W("mla.w_o"), {"mla.cache": new_cache, "mla.lengths": lengths + T}


def _weight(w: LayerWeights, name: str):
    """A weight in float64: a bf16 matrix as `BF16Weight(form="reference")`, whose products widen 8 MB
    chunks (no float64 copy of a 1.9 GB weight), anything else as a float64 array."""
    held = w.held(name)
    if held.ndim == 2 and held.dtype == ml_dtypes.bfloat16:
        return BF16Weight((held.view(np.uint16),), np.dtype(F64), form="reference")
    return w.get(name, F64)


def _experts(w: LayerWeights):
    """e -> expert e's (w_gate, w_up, w_down) in float64: packed MXFP4 parts multiplied by dequantizing
    one row of W^T at a time (no 88 MB float64 copy of a full-size part), or float64 arrays."""
    if not w.packs_experts:
        return lambda e: w.expert(e, F64)
    return lambda e: tuple(MXFP4Weight(*q, form="reference") for q in w.expert_packed(e))


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
    routing = route_reference(x2 @ W("router.w"), W("router.bias"), cfg)
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
