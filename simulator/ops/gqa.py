"""Grouped-query attention (GQA) for decode: projection, QK-norm, RoPE, a paged KV cache, attention with a
sliding window and attention sinks (gpt-oss, Qwen3-MoE, Mixtral).

    q, k, v  = x W_q (+ b_q), x W_k (+ b_k), x W_v (+ b_v)         Nq query heads, Nkv = Nq / G key/value heads
    q, k     = RMSNorm_H(q) w_q, RMSNorm_H(k) w_k                   optional, per head (Qwen3)
    q, k     = RoPE(q, pos), RoPE(k, pos)                           half layout, YaRN when configured
    cache    <- k, v at slots block_table[b, pos // BS] x BS + pos % BS      (the paged cache, K stored rotated)
    o_h      = sum_s softmax_s(q_h . k_{s, h // G} scale ; sink_h) v_{s, h // G}
               over s in (pos - W, pos] (the window W; all s <= pos when W = 0)

A sink is one learned logit per head that joins the softmax's denominator and contributes no value
(gpt-oss, following "Efficient Streaming Language Models with Attention Sinks", Xiao et al. 2023).
The cache is paged as vLLM pages it: a pool of blocks [NB, BS, Nkv, H] for K and for V, and each sequence's
block table naming the pool blocks that hold its positions in order.

Dimension legend: M tokens (B sequences x T tokens), D hidden, Nq / Nkv query / key-value heads on this
rank, G = Nq / Nkv, H head dim, S cached positions, NB pool blocks, BS positions per block, W window.
"""

from __future__ import annotations

import numpy as np

from simulator.config import RopeScaling
from simulator.dtypes import Array
from simulator.ops.mla import rope


def qkv_proj(x: Array, w: Array, *bias: Array, heads: int, kv_heads: int, head_dim: int) -> tuple[Array, ...]:
    """x [M, D] @ [W_q | W_k | W_v] (+ [b_q | b_k | b_v]) -> q [M, Nq, H], k [M, Nkv, H], v [M, Nkv, H]."""
    y = x @ w
    if bias:
        y = y + bias[0]
    M = y.shape[0]
    q, k, v = np.split(y, [heads * head_dim, (heads + kv_heads) * head_dim], axis=-1)
    return q.reshape(M, heads, head_dim), k.reshape(M, kv_heads, head_dim), v.reshape(M, kv_heads, head_dim)


def head_rms_norm(x: Array, w: Array, eps: float) -> Array:
    """RMSNorm over each head's H values.   x [M, N, H], w [H]"""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.astype(x.dtype)


def qk_norm(q: Array, k: Array, wq: Array, wk: Array, *, eps: float) -> tuple[Array, Array]:
    return head_rms_norm(q, wq, eps), head_rms_norm(k, wk, eps)


def positions(lengths: Array, tokens: int) -> Array:
    """[B, T]: position of each new token, after the `lengths` [B] cached ones."""
    return np.asarray(lengths)[:, None] + np.arange(tokens)[None, :]


def rope_qk(q: Array, k: Array, lengths: Array, *, batch: int, theta: float,
            scaling: RopeScaling | None) -> tuple[Array, Array]:
    """RoPE on every head of q [M, Nq, H] and k [M, Nkv, H] at the new tokens' positions."""
    B, T = batch, q.shape[0] // batch
    pos = positions(lengths, T)
    turn = lambda x: rope(x.reshape(B, T, *x.shape[1:]), pos, theta, scaling).reshape(x.shape)  # noqa: E731
    return turn(q), turn(k)


def slots(block_table: Array, pos: Array, block_size: int) -> Array:
    """Pool slot (block x BS + offset) of each position.   block_table [B, nblk], pos [B, n] -> [B, n]"""
    return np.take_along_axis(np.asarray(block_table), pos // block_size, axis=1) * block_size + pos % block_size


def cache_insert(k: Array, v: Array, k_cache: Array, v_cache: Array, block_table: Array, lengths: Array, *,
                 batch: int) -> tuple[Array, Array]:
    """Write the new tokens' k, v [M, Nkv, H] into copies of the pools [NB, BS, Nkv, H] at their slots."""
    NB, BS = k_cache.shape[:2]
    where = slots(block_table, positions(lengths, k.shape[0] // batch), BS).reshape(-1)  # [M]
    out = []
    for new, pool in ((k, k_cache), (v, v_cache)):
        flat = pool.reshape(NB * BS, *pool.shape[2:]).copy()
        flat[where] = new
        out.append(flat.reshape(pool.shape))
    return out[0], out[1]


def paged_decode(q: Array, k_cache: Array, v_cache: Array, block_table: Array, lengths: Array, *sinks: Array,
                 batch: int, window: int, scale: float) -> Array:
    """Attention of the new tokens over the paged cache (their own rows already inserted), causal within the step,
    limited to the last `window` positions when window > 0, with each head's sink logit in the denominator.
    Vectorised over heads and positions: one gather of the sequence's cached rows, then the softmax.
    q [M, Nq, H] -> o [M, Nq H]"""
    M, Nq, H = q.shape
    B, T = batch, M // batch
    NB, BS, Nkv = k_cache.shape[:3]
    G = Nq // Nkv
    S = int(np.max(lengths)) + T
    pos = positions(lengths, T)  # [B, T]
    idx = slots(block_table, np.broadcast_to(np.arange(S), (B, S)), BS)  # [B, S]; rows past a length are masked
    K = k_cache.reshape(NB * BS, Nkv, H)[idx]  # [B, S, Nkv, H]
    V = v_cache.reshape(NB * BS, Nkv, H)[idx]
    qg = q.reshape(B, T, Nkv, G, H)
    logits = np.einsum("btkgh,bskh->btkgs", qg, K) * scale  # [B, T, Nkv, G, S]
    s = np.arange(S)[None, None, :]
    keep = (s <= pos[:, :, None]) & ((s > pos[:, :, None] - window) if window else True)  # [B, T, S]
    logits = np.where(keep[:, :, None, None, :], logits, -np.inf)
    top = logits.max(axis=-1, keepdims=True)
    if sinks:
        top = np.maximum(top, sinks[0].reshape(Nkv, G)[None, None, :, :, None])
    p = np.exp(logits - top)
    denom = p.sum(axis=-1, keepdims=True)
    if sinks:
        denom = denom + np.exp(sinks[0].reshape(Nkv, G)[None, None, :, :, None] - top)
    o = np.einsum("btkgs,bskh->btkgh", p / denom, V)
    return o.reshape(M, Nq * H)


def decode_flops(M: int, heads: int, S: int, H: int) -> int:
    """q . k and p . v: 2 x 2 x H per (token, head, cached position)."""
    return 4 * M * heads * S * H


# ===================================================================== reference form
def attention_reference(q: Array, K: Array, V: Array, lengths: Array, sinks: Array | None, *, window: int,
                        scale: float) -> Array:
    """Token by token, head by head, in float64 over contiguous K, V [B, S, Nkv, H] (no pages).
    q [B, T, Nq, H] -> o [B, T, Nq, H]"""
    B, T, Nq, H = q.shape
    G = Nq // K.shape[2]
    o = np.zeros(q.shape, dtype=np.float64)
    for b in range(B):
        for t in range(T):
            p = int(lengths[b]) + t  # this token's position: it sees positions lo..p
            lo = max(0, p - window + 1) if window else 0
            for h in range(Nq):
                scores = [float(q[b, t, h] @ K[b, s, h // G]) * scale for s in range(lo, p + 1)]
                extra = [float(sinks[h])] if sinks is not None else []
                m = max(scores + extra)
                e = [np.exp(x - m) for x in scores]
                total = sum(e) + sum(np.exp(x - m) for x in extra)
                o[b, t, h] = sum(w / total * V[b, s, h // G] for w, s in zip(e, range(lo, p + 1)))
    return o
