"""Numba kernels behind the fused ops and the compact weight store: what the CPU runs, at memory speed.

A decode step reads far more bytes than it computes, on a CPU as on a GPU. The plain NumPy forms
in ops/ stay the definitions (and the oracle); these kernels compute the same functions the way a
GPU kernel does, one pass over each weight byte, nothing intermediate written. They sit below
weights.py and ops/ (they import neither) so the weight store can pack and widen with them:

    mxfp4_matmul      y[m, n] = sum_b s[n, b] * sum_{i<32} x[m, 32b + i] * e2m1(code[n, 32b + i])
                      reads the packed nibbles (0.5 B) and the E8M0 scale (1/32 B) per weight: 0.53 B
                      instead of the 4 B of a float32 dequantized copy (or 8 B of a float64 one)
    mxfp4_quantize_t  the checkpoint packer: W [K, N] -> codes and scales of W^T, blocks along K
    bf16_to           bfloat16 bits -> float32 / float64 (dense weights are held as bf16: 2 B/param)
    rms_norm          y = x / sqrt(mean(x^2) + eps) * w, one pass over x per row
    attn_res_mix      h = sum_s softmax_s(<v_s / rms(v_s), q>) v_s, one read of each source
    topk_order        the first k of a stable descending argsort, by insertion (no [M, E] sort)

Dimension legend: M rows (tokens), K reduction width, N output width, S sources, E experts, k picks.

Napkin math (this machine, 2 cores, ~17 GB/s STREAM copy): a full-size K3 expert shard at TP16 is
3 x 192 x 3584 weights = 1.06 MB packed; at batch 1 a rank touches 16 of them, 16 ranks -> 280 MB per
layer, ~30 ms at copy speed. The dequantize-then-GEMM form moves 8x (float32) or 15x (float64) those
bytes, and writes them first.

Backend switch: `numba_enabled()` is true unless the environment says MOE_SIM_KERNELS=numpy (tests
run the NumPy forms that way); every fused op in ops/ asks it per call, so there is no module state.
Each kernel's `.py_func` is its pure-Python original (STYLE item 14); tests hold jitted == .py_func
== the NumPy form.
"""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

import numba
from numba import njit, prange

Array = npt.NDArray[np.floating]
FAST = {"reassoc", "contract", "nsz"}  # reassociation lets LLVM vectorise the dot products; no nnan/ninf
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
E8M0 = np.ldexp(1.0, np.arange(256) - 127)  # scale of E8M0 bits e: 2^(e - 127) (255 = NaN, never written)
E2M1_F32 = E2M1.astype(np.float32)
with np.errstate(over="ignore"):
    E8M0_F32 = E8M0.astype(np.float32)  # bits 255 overflow float32; mxfp4_matmul never looks them up


def numba_enabled() -> bool:
    """True unless the environment says MOE_SIM_KERNELS=numpy (then the fused ops run their NumPy forms)."""
    return os.environ.get("MOE_SIM_KERNELS", "numba") != "numpy"


# ===================================================================== MXFP4 x activations
def mxfp4_matmul(x: Array, packed: npt.NDArray[np.uint8], scale_bits: npt.NDArray[np.uint8]) -> Array:
    """y = x @ W for W^T stored as MXFP4 codes [N, K/2] and E8M0 scale bits [N, K/32].   [M, K] -> [M, N]

    Each output column decodes its row of W^T into two K/2-wide float32 scratch rows (even and odd
    elements, L1-resident: the registers / shared memory of a GPU tile), then dots them with every
    token row (split the same way once per call) in x's dtype. E2M1 values times a power of two are
    exact in float32 (for scales below 2^126, i.e. E8M0 bits < 253: anything larger goes through
    the element-wise kernel in x's dtype), so only the summation order differs from
    `x @ dequantize(W^T).T`."""
    if scale_bits.size and scale_bits.max() >= 253:
        return mxfp4_matmul_slice(x, packed, scale_bits, 0)
    x = np.ascontiguousarray(x)
    x_even, x_odd = np.ascontiguousarray(x[:, 0::2]), np.ascontiguousarray(x[:, 1::2])  # [M, K/2] each
    out = np.empty((x.shape[0], packed.shape[0]), x.dtype)
    chunks = min(packed.shape[0], 4 * numba.get_num_threads())
    _mxfp4_matmul(x_even, x_odd, packed, scale_bits, E2M1_F32, E8M0_F32, chunks, out)
    return out


@njit(parallel=True, cache=True, fastmath=FAST)
def _mxfp4_matmul(x_even, x_odd, packed, scale_bits, lut, scale_lut, chunks, out):  # type: ignore[no-untyped-def]
    M, H = x_even.shape
    N = packed.shape[0]
    for c in prange(chunks):
        lo = np.empty(H, np.float32)  # decoded W^T[n, 0::2] and W^T[n, 1::2], scale applied
        hi = np.empty(H, np.float32)
        for n in range(c * N // chunks, (c + 1) * N // chunks):
            for b in range(H // 16):
                s = scale_lut[scale_bits[n, b]]
                for j in range(16 * b, 16 * b + 16):
                    p = packed[n, j]
                    lo[j] = lut[p & 15] * s
                    hi[j] = lut[p >> 4] * s
            for m in range(M):
                acc = x_even[m, 0] - x_even[m, 0]
                for j in range(H):
                    acc += x_even[m, j] * lo[j] + x_odd[m, j] * hi[j]
                out[m, n] = acc


def mxfp4_matmul_slice(x: Array, packed: npt.NDArray[np.uint8], scale_bits: npt.NDArray[np.uint8], k0: int) -> Array:
    """y = x @ W[k0:k0+K'] for W^T stored as MXFP4 [N, K/2] + [N, K/32] and x [M, K']: a TP row shard
    whose bounds need not fall on 32-blocks (or bytes). Decodes element by element.   [M, K'] -> [M, N]"""
    x = np.ascontiguousarray(x)
    out = np.empty((x.shape[0], packed.shape[0]), x.dtype)
    with np.errstate(over="ignore"):
        scale_lut = E8M0.astype(x.dtype)
    _mxfp4_matmul_slice(x, packed, scale_bits, scale_lut, k0, out)
    return out


@njit(parallel=True, cache=True, fastmath=FAST)
def _mxfp4_matmul_slice(x, packed, scale_bits, scale_lut, k0, out):  # type: ignore[no-untyped-def]
    M, K = x.shape
    for n in prange(packed.shape[0]):
        w = np.empty(K, x.dtype)
        for i in range(K):
            k = k0 + i
            w[i] = e2m1_value((packed[n, k >> 1] >> (4 * (k & 1))) & 15, scale_lut[scale_bits[n, k >> 5]])
        for m in range(M):
            acc = w[0] - w[0]
            for i in range(K):
                acc += x[m, i] * w[i]
            out[m, n] = acc


@njit(inline="always", fastmath=FAST)
def e2m1_value(code, s):  # type: ignore[no-untyped-def]
    """E2M1 code (bit 3 = sign) times s, by arithmetic instead of a table so the loop vectorises:
    the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 of a = 0..7 are the broken line a/2 + max(a-4, 0)/2 + max(a-6, 0)."""
    c = s * 0 + code
    neg = c >= 8
    a = c - 8 if neg else c
    v = (0.5 * a + 0.5 * max(a - 4, 0) + max(a - 6, 0)) * s
    return -v if neg else v


# ===================================================================== MXFP4 packing (weight generation)
def mxfp4_quantize_t(w: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """Pack W^T as MXFP4 for W [K, N] float32: codes [N, K/2] and E8M0 scale bits [N, K/32].

    Bit-identical to `dtypes.mxfp4_quantize(W.T)`: the block maxima come from one pass over W, the
    scale exponent from the same NumPy expression (float32 log2, as the reference rounds it), the
    codes from round-to-nearest-even onto the E2M1 grid with saturation at 6 (ml_dtypes' rule)."""
    amax = _block_amax_t(w)  # [N, K/32]
    exp = np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2  # float32, as mxfp4_quantize computes it
    exp = np.clip(exp, -127, 127)
    scale = np.exp2(exp).astype(np.float32)  # [N, K/32]
    packed = np.zeros((w.shape[1], w.shape[0] // 2), np.uint8)  # [N, K/2]
    _pack_codes_t(w, scale, packed)
    return packed, (exp + 127).astype(np.uint8)


@njit(cache=True, nogil=True)
def _block_amax_t(w):  # type: ignore[no-untyped-def]
    K, N = w.shape
    amax = np.zeros((N, K // 32), np.float32)
    for i in range(K):  # row-major walk of W: contiguous reads
        b = i // 32
        for n in range(N):
            a = abs(w[i, n])
            if a > amax[n, b]:
                amax[n, b] = a
    return amax


@njit(cache=True, nogil=True)
def _pack_codes_t(w, scale, packed):  # type: ignore[no-untyped-def]
    K, N = w.shape
    for i in range(K):
        b, shift = i // 32, 4 * (i & 1)
        for n in range(N):
            packed[n, i // 2] |= e2m1_code(w[i, n] / scale[n, b]) << shift


E2M1_MIDPOINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # between consecutive magnitudes


@njit(cache=True, nogil=True)
def e2m1_code(v):  # type: ignore[no-untyped-def]
    """Nearest E2M1 code of a float (ties to the even code, saturating at 6); bit 3 is the sign.
    The magnitude code counts the midpoints below |v|; at a tie it moves up only onto an even code."""
    a = abs(v)
    c = 0
    for i in range(7):
        t = E2M1_MIDPOINTS[i]
        c += (a > t) if i % 2 == 0 else (a >= t)
    if v < 0 or (v == 0 and np.signbit(v)):
        c |= 8
    return np.uint8(c)


def mxfp4_dequantize_t(packed: npt.NDArray[np.uint8], scale_bits: npt.NDArray[np.uint8], dtype: type) -> Array:
    """W [K, N] from the packed W^T, as the transpose of a C-ordered [N, K]: the float copy only the
    reference path asks for (rows of W^T decode with contiguous reads and writes)."""
    n, half = packed.shape
    out = np.empty((n, 2 * half), dtype)
    with np.errstate(over="ignore"):  # E8M0 bits above 2^128 are inf in float32 and never written
        scale_lut = E8M0.astype(dtype)
    _dequantize_t(packed, scale_bits, E2M1.astype(dtype), scale_lut, out)
    return out.T


@njit(parallel=True, cache=True)
def _dequantize_t(packed, scale_bits, lut, scale_lut, out):  # type: ignore[no-untyped-def]
    N, half = packed.shape
    for n in prange(N):
        for i in range(half):
            p, s = packed[n, i], scale_lut[scale_bits[n, i >> 4]]
            out[n, 2 * i] = lut[p & 15] * s
            out[n, 2 * i + 1] = lut[p >> 4] * s


# ===================================================================== bf16 storage
def bf16_to(bits: npt.NDArray[np.uint16], dtype: type) -> Array:
    """bfloat16 bit patterns (a 1-D or 2-D view, any strides) -> a new C-ordered array of dtype. Exact."""
    bits2 = bits.reshape(1, -1) if bits.ndim == 1 else bits
    out = np.empty(bits2.shape, dtype)
    _bf16_widen(bits2, out)
    return out.reshape(bits.shape)


@njit(parallel=True, cache=True)
def _bf16_widen(bits, out):  # type: ignore[no-untyped-def]
    R, C = bits.shape
    for r in prange(R):
        row = np.empty(C, np.uint32)
        row_f32 = row.view(np.float32)  # bf16 is the top half of a float32
        for c in range(C):
            row[c] = np.uint32(bits[r, c]) << 16
        for c in range(C):
            out[r, c] = row_f32[c]


# ===================================================================== norms and the AttnRes mix
def rms_norm(x: Array, w: Array, eps: float) -> Array:
    """RMSNorm over the last axis in x's dtype.   [..., D] -> [..., D]"""
    x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    out = np.empty_like(x2)
    _rms_norm(x2, np.ascontiguousarray(w, x2.dtype), x2.dtype.type(eps), out)
    return out.reshape(x.shape)


@njit(cache=True, fastmath=FAST)
def _rms_norm(x, w, eps, out):  # type: ignore[no-untyped-def]
    M, D = x.shape
    for m in range(M):
        ss = x[m, 0] * 0
        for i in range(D):
            ss += x[m, i] * x[m, i]
        inv = 1 / np.sqrt(ss / D + eps)
        for i in range(D):
            out[m, i] = x[m, i] * inv * w[i]


def attn_res_mix(sources: list[Array], norm_w: Array, proj_w: Array, eps: float) -> Array:
    """Softmax mix over S sources in their dtype.   S x [M, D] -> [M, D]"""
    v = np.stack(sources)  # [S, M, D]
    query = (norm_w * proj_w).astype(v.dtype)  # [D]
    out = np.empty(v.shape[1:], v.dtype)
    _attn_res_mix(v, query, v.dtype.type(eps), out)
    return out


@njit(cache=True, fastmath=FAST)
def _attn_res_mix(v, query, eps, out):  # type: ignore[no-untyped-def]
    S, M, D = v.shape
    score = np.empty(S, v.dtype)
    for m in range(M):
        for s in range(S):  # one read of source s for its rms and its score together
            ss, dot = v[s, m, 0] * 0, v[s, m, 0] * 0
            for i in range(D):
                ss += v[s, m, i] * v[s, m, i]
                dot += v[s, m, i] * query[i]
            score[s] = dot / np.sqrt(ss / D + eps)
        p = np.exp(score - score.max())
        p /= p.sum()
        for i in range(D):
            acc = v[0, m, i] * 0
            for s in range(S):
                acc += p[s] * v[s, m, i]
            out[m, i] = acc


# ===================================================================== top-k
def topk_order(scores: Array, k: int) -> npt.NDArray[np.int64]:
    """Indices of the k largest per row, best first, ties to the lower index: equal to
    `np.argsort(-scores, axis=-1, kind="stable")[:, :k]` without sorting all E.   [M, E] -> [M, k]"""
    k = min(k, scores.shape[1])
    out = np.empty((scores.shape[0], k), np.int64)
    _topk_order(np.ascontiguousarray(scores), out)
    return out


@njit(cache=True)
def _topk_order(scores, out):  # type: ignore[no-untyped-def]
    M, E = scores.shape
    k = out.shape[1]
    for m in range(M):
        n = 0  # insertion into a sorted list of at most k; a later index never beats an equal score
        for e in range(E):
            s = scores[m, e]
            if n == k and not s > scores[m, out[m, k - 1]]:
                continue
            j = n if n < k else k - 1
            while j > 0 and s > scores[m, out[m, j - 1]]:
                out[m, j] = out[m, j - 1]
                j -= 1
            out[m, j] = e
            n = min(n + 1, k)
