"""Multi-head Latent Attention (MLA) decode on one tensor-parallel rank, in the absorbed (latent) form.

MLA caches one low-rank latent per token instead of per-head keys and values:

    c_q = RMSNorm(x W_qa),  q = c_q W_qb -> per head [q_nope (Dn) | q_pe (R)]
    [c_kv | k_pe] = x W_kva,  c_kv = RMSNorm(c_kv)           cache per token: [c_kv (L) | k_pe (R)]
    k_nope[s, n] = W_UK[n] c_kv[s],   v[s, n] = c_kv[s] W_UV[n]       (textbook, non-absorbed)
    score[t, n, s] = (q_nope . k_nope[s] + q_pe . k_pe[s]) * scale,   o = softmax_s(score) v

Absorbing W_UK into the query turns every head into attention over the shared latent (MQA in L dims):

    q_lat = W_UK[n]^T q_nope;  score = (q_lat . c_kv[s] + q_pe . k_pe[s]) * scale
    o_lat = softmax_s(score) c_kv   [L];   o = o_lat W_UV[n]   [Dv]

Decode reads the cache once for all heads (576 elements = 1152 B/token in bf16 for K3) instead of
N * (Dn + R + Dv) per-head keys and values.

Dimension legend: B sequences, T new tokens per sequence (1, or 1 + draft tokens), S cache slots,
N heads on this rank (N/P; 12 for K3 at TP8), Dn nope head dim (128), R rope/pe dim (64),
Dv value head dim (128), L latent (kv_lora_rank, 512), Rq q latent (q_lora_rank, 1536).

What differs from DeepSeek's MLA (docs/sources.md §K1b):
- Kimi K3 is NoPE: the R "rope" dims are projected, cached and scored but never rotated, so
  `rope` is only called for DeepSeek-style models; the scale stays (Dn + R)^-1/2 = 192^-1/2
  (DeepSeek-V3's YaRN multiplies it by mscale^2 = 1.87 and corrects the frequencies: `rope_inv_freq`);
- the LoRA RMSNorms use eps 1e-6 (first-party) and the kv norm covers the latent only, not k_pe;
- the output gate sigmoid(g_proj x) multiplies o before o_proj, with no norm (done by the plan).

Cache convention: the cache already holds this step's T tokens at positions lengths[b] ..
lengths[b]+T-1, and token t attends to positions s < lengths[b] + t + 1; slots beyond are garbage and
never read. Functions are pure and compute in the inputs' dtype.
"""

from __future__ import annotations

import numpy as np

from simulator.config import RopeScaling
from simulator.dtypes import Array
from simulator.ops.linear import linear
from simulator.ops.norm import rms_norm
from simulator.ops.pointwise import sigmoid

KV_TILE = 64  # cache positions per tile of the fused kernel (FlashMLA's page/block size)


def _causal_softmax(scores: Array, length: int) -> Array:
    """Softmax over s of scores [T, N, S_b] with token t allowed positions s <= length + t."""
    T, _, S_b = scores.shape
    allowed = np.arange(S_b) <= length + np.arange(T)[:, None]  # [T, S_b]
    scores = np.where(allowed[:, None, :], scores, -np.inf)  # [T, N, S_b]
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))  # position 0 is always allowed
    return p / p.sum(axis=-1, keepdims=True)


def _check_cache(kv_cache: Array, lengths: Array, T: int) -> None:
    if np.any(lengths < 0) or np.any(lengths + T > kv_cache.shape[1]):
        raise ValueError(f"a cache of {kv_cache.shape[1]} slots cannot hold lengths {lengths} + T={T}")


# ============================================================================ projections and RoPE
def mla_qkv_a_norm(
    q_a: Array, kv_a: Array, q_a_norm_w: Array, kv_a_norm_w: Array, kv_lora: int, eps: float
) -> tuple[Array, Array, Array]:
    """LoRA norms: q_a [B, T, Rq], kv_a [B, T, L+R] -> c_q [B, T, Rq], c_kv [B, T, L], k_pe [B, T, R].

    The kv norm covers the latent only; k_pe passes through unnormalised.
    """
    c_q = rms_norm(q_a, q_a_norm_w, eps)  # [B, T, Rq]
    c_kv = rms_norm(kv_a[..., :kv_lora], kv_a_norm_w, eps)  # [B, T, L]
    return c_q, c_kv, kv_a[..., kv_lora:].copy()  # ..., [B, T, R]


def rope_inv_freq(R: int, theta: float, scaling: RopeScaling | None = None) -> Array:
    """Rotary frequency of each pair i < R/2: theta^(-2i/R), with YaRN's "NTK-by-parts" correction.

    YaRN (arXiv:2309.00071 section 3.2) counts how often pair i turns over the original context L,
    r_i = L / (2 pi / f_i). Solving r_i = beta for i gives the correction dim

        i(beta) = R ln(L / (2 pi beta)) / (2 ln theta)

    pairs below floor(i(beta_fast)) turn fast (> 32 times) and keep f_i (extrapolation); pairs from
    ceil(i(beta_slow)) on turn less than once and get f_i / factor (interpolation); a linear ramp
    blends the two in between (DeepSeek-V3's R = 64, theta 1e4, L = 4096: pairs 0-9 kept, 23-31 / 40).
    `scaling.truncate` False (gpt-oss) keeps i(beta_fast) and i(beta_slow) unrounded. -> [R/2] float64.
    """
    inv_freq = float(theta) ** (-np.arange(0, R, 2, dtype=np.float64) / R)  # [R/2]
    if scaling is None:
        return inv_freq
    floor, ceil = (np.floor, np.ceil) if scaling.truncate else (float, float)
    low = max(floor(_correction_dim(R, theta, scaling.original_max, scaling.beta_fast)), 0.0)
    high = min(ceil(_correction_dim(R, theta, scaling.original_max, scaling.beta_slow)), R - 1.0)
    ramp = np.clip((np.arange(R // 2) - low) / max(high - low, 1e-3), 0.0, 1.0)  # 0 extrapolate .. 1 interpolate
    return inv_freq / scaling.factor * ramp + inv_freq * (1.0 - ramp)  # [R/2]


def _correction_dim(R: int, theta: float, original_max: int, beta: float) -> float:
    """The (fractional) pair index that turns `beta` times over `original_max` positions."""
    return R * np.log(original_max / (2 * np.pi * beta)) / (2 * np.log(theta))


def rope(x: Array, positions: Array, theta: float, scaling: RopeScaling | None = None) -> Array:
    """Rotary embedding in the "half" layout: pairs (x[i], x[i + R/2]) rotate by positions * f_i.

    f_i = theta^(-2i/R), YaRN-corrected when `scaling` is given (`rope_inv_freq`).
    x [B, T, (N,) R], positions [B, T] ints -> same shape as x. Angles are computed in float64 (a cos/sin
    table, as kernels precompute) and cast to x's dtype, so position 1M does not lose precision.
    """
    R = x.shape[-1]
    assert R % 2 == 0, f"rope dim must be even, got {R}"
    inv_freq = rope_inv_freq(R, theta, scaling)  # [R/2]
    angles = np.asarray(positions, np.float64)[..., None] * inv_freq  # [B, T, R/2]
    angles = angles.reshape(angles.shape[:2] + (1,) * (x.ndim - 3) + (R // 2,))  # [B, T, (1,) R/2]
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    x1, x2 = x[..., : R // 2], x[..., R // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # [B, T, (N,) R]


def mla_absorb_q(q_nope: Array, w_uk: Array) -> Array:
    """q_lat[n] = W_UK[n]^T q_nope[n]: q_nope [B, T, N, Dn], w_uk [N, Dn, L] -> q_lat [B, T, N, L]."""
    return np.einsum("btnd,ndl->btnl", q_nope, w_uk)


def mla_uv(o_lat: Array, w_uv: Array) -> Array:
    """o[n] = o_lat[n] W_UV[n]: o_lat [B, T, N, L], w_uv [N, L, Dv] -> o [B, T, N, Dv]."""
    return np.einsum("btnl,nlv->btnv", o_lat, w_uv)


# ============================================================================ textbook oracle
def mla_attention_reference(
    c_q: Array, c_kv_all: Array, k_pe_all: Array, w_qb: Array, w_uk: Array, w_uv: Array,
    lengths: Array, scale: float, *, rope_theta: float | None = None, rope_scaling: RopeScaling | None = None,
) -> Array:
    """Non-absorbed MLA: up-project per-head keys and values from the latent, then plain attention.

    c_q [B, T, Rq] (normed), c_kv_all [B, S, L] (normed) and k_pe_all [B, S, R] (*unrotated*) for every
    cache position, w_qb [Rq, N*(Dn+R)] (per head [nope | pe]), w_uk [N, Dn, L], w_uv [N, L, Dv],
    lengths [B]. With rope_theta, q_pe rotates at positions lengths[b] + t and k_pe at s (YaRN-corrected
    frequencies with rope_scaling; its softmax mscale is already inside `scale`).
    Returns o [B, T, N, Dv] (before the output gate and o_proj).
    """
    B, T, _ = c_q.shape
    N, Dn, _ = w_uk.shape
    lengths = np.asarray(lengths)
    q = (c_q @ w_qb).reshape(B, T, N, -1)  # [B, T, N, Dn+R]
    k_nope = np.einsum("ndl,bsl->bsnd", w_uk, c_kv_all)  # [B, S, N, Dn]
    v = np.einsum("bsl,nlv->bsnv", c_kv_all, w_uv)  # [B, S, N, Dv]
    q_pe, k_pe = q[..., Dn:], k_pe_all[:, :, None, :]  # [B, T, N, R], [B, S, 1, R]: one k_pe for all heads
    if rope_theta is not None:
        q_pe = rope(q_pe, lengths[:, None] + np.arange(T), rope_theta, rope_scaling)
        k_pe = rope(k_pe, np.broadcast_to(np.arange(k_pe.shape[1]), k_pe.shape[:2]), rope_theta, rope_scaling)
    q = np.concatenate([q[..., :Dn], q_pe], axis=-1)  # [B, T, N, Dn+R]
    k = np.concatenate([k_nope, np.broadcast_to(k_pe, k_nope.shape[:3] + k_pe.shape[3:])], axis=-1)
    o = np.empty((B, T, N, w_uv.shape[2]), np.result_type(q, k, v))  # [B, T, N, Dv]
    for b in range(B):
        ctx = int(lengths[b]) + T
        p = _causal_softmax(np.einsum("tnd,snd->tns", q[b], k[b, :ctx]) * scale, int(lengths[b]))
        o[b] = np.einsum("tns,snv->tnv", p, v[b, :ctx])  # [T, N, Dv]
    return o


# ============================================================================ absorbed reference: two kernels
def mla_decode_attention(
    q_lat: Array, q_pe: Array, kv_cache: Array, lengths: Array, scale: float
) -> Array:
    """Absorbed decode attention over the latent cache.

    q_lat [B, T, N, L], q_pe [B, T, N, R], kv_cache [B, S, L+R] ([c_kv | k_pe] per slot), lengths [B]
    -> o_lat [B, T, N, L]. scores = (q_lat . c_kv + q_pe . k_pe) * scale, causal softmax over the cache.
    """
    B, T, N, L = q_lat.shape
    _check_cache(kv_cache, lengths, T)
    o_lat = np.empty(q_lat.shape, np.result_type(q_lat, q_pe, kv_cache))  # [B, T, N, L]
    for b in range(B):
        cache = kv_cache[b, : int(lengths[b]) + T]  # [S_b, L+R], the valid slots only
        scores = (q_lat[b] @ cache[:, :L].T + q_pe[b] @ cache[:, L:].T) * float(scale)  # [T, N, S_b]
        o_lat[b] = _causal_softmax(scores, int(lengths[b])) @ cache[:, :L]  # [T, N, L]
    return o_lat


def mla_decode_reference(
    q_lat: Array, q_pe: Array, kv_cache: Array, lengths: Array, scale: float, w_uv: Array
) -> Array:
    """The unfused pair: `mla_decode_attention` then `mla_uv`; o [B, T, N, Dv]."""
    return mla_uv(mla_decode_attention(q_lat, q_pe, kv_cache, lengths, scale), w_uv)


# ============================================================================ fused: attention + W_UV
def mla_decode_fused(
    q_lat: Array, q_pe: Array, kv_cache: Array, lengths: Array, scale: float, w_uv: Array,
    *, kv_tile: int = KV_TILE,
) -> Array:
    """Flash-decoding over cache tiles (online softmax) with W_UV applied in the epilogue.

    Same inputs and result as `mla_decode_reference`. o_lat stays on-chip: per token per rank it is
    not written and re-read, saving 2 * N*L*2 B in bf16 = 24,576 B for K3 at TP8 (N=12, L=512) and
    one launch. Against the cache read (576*2 B per slot: 9.4 MB at 8k context) the bytes are noise;
    the launch (a few us at batch 1) is the win.
    """
    B, T, N, _ = q_lat.shape
    _check_cache(kv_cache, lengths, T)
    o = np.empty((B, T, N, w_uv.shape[2]), np.result_type(q_lat, q_pe, kv_cache, w_uv))  # [B, T, N, Dv]
    for b in range(B):
        o_lat = _flash_decode(q_lat[b], q_pe[b], kv_cache[b], int(lengths[b]), float(scale), kv_tile)
        o[b] = np.einsum("tnl,nlv->tnv", o_lat, w_uv)  # [T, N, Dv], epilogue on the registers
    return o


def _flash_decode(q_lat: Array, q_pe: Array, cache: Array, length: int, scale: float, kv_tile: int) -> Array:
    """One sequence, online softmax tile by tile: running max m, denominator den, numerator acc."""
    T, N, L = q_lat.shape
    dtype = np.result_type(q_lat, q_pe, cache)
    m = np.full((T, N), -np.inf, dtype)  # [T, N]
    den = np.zeros((T, N), dtype)  # [T, N]
    acc = np.zeros((T, N, L), dtype)  # [T, N, L]
    for s0 in range(0, length + T, kv_tile):
        tile = cache[s0 : min(s0 + kv_tile, length + T)]  # [S_t, L+R]
        scores = (q_lat @ tile[:, :L].T + q_pe @ tile[:, L:].T) * scale  # [T, N, S_t]
        allowed = s0 + np.arange(tile.shape[0]) <= length + np.arange(T)[:, None]  # [T, S_t]
        scores = np.where(allowed[:, None, :], scores, -np.inf)
        m_new = np.maximum(m, scores.max(axis=-1))  # finite from the first tile on (slot 0 is allowed)
        p = np.exp(scores - m_new[..., None])  # [T, N, S_t]
        rescale = np.exp(m - m_new)  # [T, N]; 0 on the first tile
        den = den * rescale + p.sum(axis=-1)
        acc = acc * rescale[..., None] + p @ tile[:, :L]  # [T, N, L]
        m = m_new
    return acc / den[..., None]  # [T, N, L]


# ============================================================================ kernels of the plans
# The plans hold activations as [M, ...] rows (M = B T) and every sequence has `context` cached tokens
# before the step (lengths = context); these entry points take exactly a kernel's declared tensors.

def linear_heads(x: Array, w: Array, *, heads: int) -> Array:
    """q_b: a column-sharded projection whose output is per head.   [M, K] @ [K, Nh Dh] -> [M, Nh, Dh]"""
    return linear(x, w).reshape(x.shape[0], heads, -1)


def mla_absorb_step(q: Array, w_uk: Array, *, nope_dim: int) -> Array:
    """q [M, N, Dn+R], w_uk [L, N Dn] (column shard) -> q_lat [M, N, L]."""
    M, N, _ = q.shape
    w = w_uk.reshape(w_uk.shape[0], N, nope_dim).transpose(1, 2, 0)  # [N, Dn, L]
    return mla_absorb_q(q[None, :, :, :nope_dim], w)[0]


def mla_cache_insert_step(q_lat: Array, q_pe: Array, c_kv: Array, k_pe: Array, *, batch: int, context: int,
                          rope_theta: float | None, rope_scaling: RopeScaling | None) -> tuple[Array, Array]:
    """[RoPE at positions context + t]; q = [q_lat | q_pe]; the new cache rows [c_kv | k_pe].
    q_lat [M, N, L], q_pe [M, N, R], c_kv [M, L], k_pe [M, R] -> q [M, N, L+R], rows [B, T, L+R]."""
    M, N, _ = q_pe.shape
    T = M // batch
    q_pe, k_pe = q_pe.reshape(batch, T, N, -1), k_pe.reshape(batch, T, -1)  # [B, T, N, R], [B, T, R]
    if rope_theta is not None:
        pos = np.broadcast_to(context + np.arange(T), (batch, T))  # [B, T]
        q_pe, k_pe = rope(q_pe, pos, rope_theta, rope_scaling), rope(k_pe, pos, rope_theta, rope_scaling)
    rows = np.concatenate([c_kv.reshape(batch, T, -1), k_pe], axis=-1)  # [B, T, L+R]
    return np.concatenate([q_lat, q_pe.reshape(M, N, -1)], axis=-1), rows


def mla_decode_step(q: Array, kv_cache: Array, *, batch: int, latent: int, context: int, scale: float) -> Array:
    """Absorbed decode attention: q [M, N, L+R], kv_cache [B, S, L+R] -> o_lat [M, N, L]."""
    M, N, _ = q.shape
    q = q.reshape(batch, M // batch, N, -1)  # [B, T, N, L+R]
    lengths = np.full(batch, context)
    return mla_decode_attention(q[..., :latent], q[..., latent:], kv_cache, lengths, scale).reshape(M, N, latent)


def mla_uv_step(o_lat: Array, w_uv: Array) -> Array:
    """o_lat [M, N, L], w_uv [L, N Dv] (column shard) -> o [M, N Dv]."""
    M, N, L = o_lat.shape
    w = w_uv.reshape(L, N, -1).transpose(1, 0, 2)  # [N, L, Dv]
    return mla_uv(o_lat[None], w)[0].reshape(M, -1)


def sigmoid_gate(o: Array, g: Array) -> Array:
    """The output gate, o * sigmoid(g) (no norm).   [M, n], [M, n] -> [M, n]"""
    return o * sigmoid(g)


def sigmoid_gate_flops(M: int, n: int) -> int:
    """Per element: sigmoid (exp, add, divide: counted 3) and the multiply (1)."""
    return 4 * M * n


def mla_decode_flops(M: int, N: int, S: int, L: int, R: int) -> int:
    """Per token, head and cached slot: the score q_lat . c_kv + q_pe . k_pe (2 (L + R)) and the
    value accumulation p c_kv (2 L)."""
    return 2 * M * N * S * (2 * L + R)

