"""Numba kernels behind the fused ops and the compact weight store: what the CPU runs, at memory speed.

A decode step reads far more bytes than it computes, on a CPU as on a GPU. The plain NumPy forms
in ops/ stay the definitions (and the oracle); these kernels compute the same functions the way a
GPU kernel does, one pass over each weight byte, nothing intermediate written. They sit below
weights.py and ops/ (they import neither) so the weight store can pack and widen with them:

    mxfp4_matmul      y[m, n] = sum_b s[n, b] * sum_{i<32} x[m, 32b + i] * e2m1(code[n, 32b + i])
                      reads the packed nibbles (0.5 B) and the E8M0 scale (1/32 B) per weight: 0.53 B
                      instead of the 4 B of a float32 dequantized copy (or 8 B of a float64 one)
    mxfp4_grouped     the same product for many packed weights and gathered token rows in one call: the
                      routed experts of a streamed chunk on every TP rank (fast/experts.py), both cores
    mxfp4_dot         one row of W^T times one token row; on AVX-512 a register-table lookup per nibble
                      and one scale per block (numba_ext.mxfp4_dot_avx512), nothing written; bfloat16 x
                      (the W4A16 path) with AVX-512 BF16: bf16 lookups and `vdpbf16ps` (mxfp4_dot_bf16)
    mxfp4_quantize_t  the checkpoint packer: W [K, N] -> codes and scales of W^T, blocks along K
    bf16_matmul       y = x @ W for W held as bfloat16 bits: 2 B per weight read once, widened in registers
    bf16_to           bfloat16 bits -> float32 / float64 (dense weights are held as bf16: 2 B/param)
    rms_norm          y = x / sqrt(mean(x^2) + eps) * w, one pass over x per row
    attn_res_mix      h = sum_s softmax_s(<v_s / rms(v_s), q>) v_s, one read of each source
    topk_order        the first k of a stable descending argsort, by insertion (no [M, E] sort)

Dimension legend: M rows (tokens), K reduction width, N output width, S sources, E experts, k picks.

Napkin math for the routed experts. A full-size K3 expert shard at TP16 is 3 x 192 x 3584 weights = 1.06 MB
packed; at batch 1 a rank touches 16 of them, 16 ranks -> 280 MB per layer, 7 ms at 40 GB/s. The
dequantize-then-GEMM form moves 8x (float32) or 15x (float64) those bytes and writes them first.
`mxfp4_dot` reads each byte once; per 64 code bytes (128 weights) and token row it issues ~30 vector ops
in float32 (8 shifts, 8 table permutes, 8 multiply-adds, the block scale) and ~52 in float64, so on a CPU
the shift and the lookup per weight, not the multiply or the memory, bind. With bfloat16 x on AVX-512 BF16
hosts the same step is ~17 ops (4 `vpermw` lookups, 3 shifts, 4 `vdpbf16ps`). benchmarks/mxfp4_roofline.py
and benchmarks/fullsize.py measure it; docs/history/fast-path.md keeps the figures measured so far.

The ops in simulator/ops stay the definitions (and the oracle): simulator/fast/__init__.py registers each
kernel here as the replacement of the op it computes, and the executor runs them on `backend="fast"`.
Each kernel's `.py_func` is its pure-Python original (STYLE item 14); tests hold jitted == .py_func
== the NumPy form.
"""

from __future__ import annotations

import ctypes
import functools
import math

import numpy as np
import numpy.typing as npt

from simulator.jit import jitable, lazy_njit as njit, on_compile, threads

prange = range  # numba.prange once the kernels compile (simulator/jit.py)
on_compile("simulator.fast.numba_ext")  # the byte-shuffle form of decode_block, for the compiled kernels

Array = npt.NDArray[np.floating]
FAST = {"reassoc", "contract", "nsz"}  # reassociation lets LLVM vectorise the dot products; no nnan/ninf
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
E8M0 = np.ldexp(1.0, np.arange(256) - 127)  # scale of E8M0 bits e: 2^(e - 127) (255 = NaN, never written)
with np.errstate(over="ignore"):
    E8M0_F32 = E8M0.astype(np.float32)  # bits 255 overflow float32; mxfp4_matmul never looks them up


# ===================================================================== MXFP4 x activations
PARALLEL_BYTES = 4 << 20  # a kernel reading less runs on one thread: waking the pool costs more than it
# saves, and when another process holds a core the pool's barrier waits for a time slice (ms) per call
E2M1_X2 = (2 * E2M1).astype(np.int8)  # twice the E2M1 values are the integers 0, +-1, 2, 3, 4, 6, 8, 12
with np.errstate(over="ignore"):
    E8M0_HALF_F32 = (E8M0 / 2).astype(np.float32)  # the scale over 2, to undo the 2 of E2M1_X2 (exactly)


F32_WIDE_SCALE_BITS = 253  # E8M0 bits from which a scaled E2M1 value can overflow float32 (6 x 2^126)


def mxfp4_matmul(x: Array, packed: npt.NDArray[np.uint8], scale_bits: npt.NDArray[np.uint8]) -> Array:
    """y = x @ W for W^T stored as MXFP4 codes [N, K/2] and E8M0 scale bits [N, K/32].   [M, K] -> [M, N]

    Each output column decodes its row of W^T, a 32-weight block (16 code bytes) at a time, into two
    float32 scratch rows (L1-resident: the registers / shared memory of a GPU tile): the low nibbles
    (even k) and the high nibbles (odd k), each looked up in a 16-entry table by a byte shuffle and
    times the block scale (`decode_block`); x is split into its even and odd columns to match, and
    the two rows are dotted with every token row in x's dtype. E2M1 values times a power of two are
    exact in float32 (for scales below 2^126, i.e. E8M0 bits < 253: anything larger goes through the
    element-wise kernel in x's dtype), so only the summation order differs from `x @ dequantize(W^T).T`.
    The one-weight path (`x @ MXFP4Weight`) and the grouped ops' fallback on hosts without AVX-512; the
    routed experts run `mxfp4_grouped`."""
    if scale_bits.size and scale_bits.max() >= F32_WIDE_SCALE_BITS:
        return mxfp4_matmul_slice(x, packed, scale_bits, 0)
    x = np.ascontiguousarray(x)
    xe, xo = np.ascontiguousarray(x[:, 0::2]), np.ascontiguousarray(x[:, 1::2])  # [M, K/2] each
    packed = packed if packed.strides[-1] == 1 else np.ascontiguousarray(packed)
    out = np.empty((x.shape[0], packed.shape[0]), x.dtype)
    if packed.nbytes < PARALLEL_BYTES:
        _mxfp4_rows(xe, xo, packed, scale_bits, E8M0_HALF_F32, out, 0, packed.shape[0])
    else:
        _mxfp4_matmul_parallel(xe, xo, packed, scale_bits, E8M0_HALF_F32, out, 4 * threads())
    return out


@njit(parallel=True, cache=True)
def _mxfp4_matmul_parallel(xe, xo, packed, scale_bits, half_scale, out, chunks):  # type: ignore[no-untyped-def]
    N = packed.shape[0]
    for c in prange(chunks):
        _mxfp4_rows(xe, xo, packed, scale_bits, half_scale, out, c * N // chunks, (c + 1) * N // chunks)


@njit(cache=True, fastmath=FAST)
def _mxfp4_rows(xe, xo, packed, scale_bits, half_scale, out, n0, n1):  # type: ignore[no-untyped-def]
    """Output columns n0 .. n1-1 of `mxfp4_matmul`, on one thread."""
    M, H = xe.shape
    even, odd = np.empty(H, np.float32), np.empty(H, np.float32)  # W^T[n, 0::2] and W^T[n, 1::2]
    for n in range(n0, n1):
        row = packed[n]
        for b in range(H // 16):
            decode_block(row, 16 * b, half_scale[scale_bits[n, b]], even, odd)
        for m in range(M):
            acc = xe[m, 0] - xe[m, 0]
            for j in range(H):
                acc += xe[m, j] * even[j] + xo[m, j] * odd[j]
            out[m, n] = acc


def decode_block(row: npt.NDArray[np.uint8], j: int, half_scale: float, even: Array, odd: Array) -> None:
    """One MXFP4 block, code bytes row[j:j+16]: even[j:j+16] = e2m1(low nibbles) * scale and odd[j:j+16]
    = e2m1(high nibbles) * scale, float32, with half_scale = scale / 2 (the table holds 2 x E2M1). The
    plain form; compiled kernels run `numba_ext.decode_block_simd`, the same table as one byte shuffle per nibble."""
    codes = row[j:j + 16]
    even[j:j + 16] = E2M1_X2[codes & 15].astype(np.float32) * np.float32(half_scale)
    odd[j:j + 16] = E2M1_X2[codes >> 4].astype(np.float32) * np.float32(half_scale)


def mxfp4_matmul_slice(x: Array, packed: npt.NDArray[np.uint8], scale_bits: npt.NDArray[np.uint8], k0: int) -> Array:
    """y = x @ W[k0:k0+K'] for W^T stored as MXFP4 [N, K/2] + [N, K/32] and x [M, K']: a TP row shard
    whose bounds need not fall on 32-blocks (or bytes). Decodes element by element.   [M, K'] -> [M, N]"""
    x = np.ascontiguousarray(x)
    out = np.empty((x.shape[0], packed.shape[0]), x.dtype)
    with np.errstate(over="ignore"):
        scale_lut = E8M0.astype(x.dtype)
    if packed.shape[0] * x.shape[1] < 2 * PARALLEL_BYTES:  # half a byte per weight read
        _mxfp4_slice_rows(x, packed, scale_bits, scale_lut, k0, out, 0, packed.shape[0])
    else:
        _mxfp4_slice_parallel(x, packed, scale_bits, scale_lut, k0, out, 4 * threads())
    return out


@njit(parallel=True, cache=True)
def _mxfp4_slice_parallel(x, packed, scale_bits, scale_lut, k0, out, chunks):  # type: ignore[no-untyped-def]
    N = packed.shape[0]
    for c in prange(chunks):
        _mxfp4_slice_rows(x, packed, scale_bits, scale_lut, k0, out, c * N // chunks, (c + 1) * N // chunks)


@njit(cache=True, fastmath=FAST)
def _mxfp4_slice_rows(x, packed, scale_bits, scale_lut, k0, out, n0, n1):  # type: ignore[no-untyped-def]
    M, K = x.shape
    w = np.empty(K, x.dtype)
    for n in range(n0, n1):
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


# ===================================================================== MXFP4 x activations, grouped
STEP_WEIGHTS = 128  # weights per step of `mxfp4_dot`: 64 code bytes (one 512-bit vector), 4 blocks


def lanes(dtype: npt.DTypeLike) -> int:
    """Lanes of a 512-bit vector of dtype: 16 float32 or 8 float64."""
    return 64 // np.dtype(dtype).itemsize


def permute_x(x: Array) -> Array:
    """Activations in the order `mxfp4_dot` reads them.   [M, K] -> [M, 128 ceil(K / 128)], zero-padded

    A step loads 64 code bytes as L lanes (L = `lanes`) of 128/L nibbles each: lane i holds weights
    (128/L) i .. (128/L)(i + 1) - 1 and its j-th nibble is weight (128/L) i + j. So the x vector that
    multiplies nibble j of every lane is x[(128/L) i + j] for i < L: position j L + i of the step. A row
    ending in a half step (K = 64 mod 128: the TP16 down projection's 192-weight slices) loads its last 32
    bytes as L lanes of 64/L nibbles, so that step is laid out with 64/L for 128/L (and half the work).

    float32 x whose values are all bfloat16 (the W4A16 path's activations) on a host with the AVX-512
    bf16 dot comes back as `permute_x_bf16(x)` instead: uint16 bits that `mxfp4_dot` then multiplies with
    `vdpbf16ps` (`has_bf16_dot`)."""
    if x.dtype == np.float32 and has_bf16_dot() and _all_bf16(x):
        return permute_x_bf16(x)
    m, k = x.shape
    width = lanes(x.dtype)
    steps = -(-k // STEP_WEIGHTS)
    padded = np.zeros((m, steps * STEP_WEIGHTS), x.dtype)
    padded[:, :k] = x
    out = np.ascontiguousarray(padded.reshape(m, steps, width, -1).transpose(0, 1, 3, 2)).reshape(m, -1)
    if ends_in_half_step(k):  # lanes of half as many nibbles (see mxfp4_dot)
        last = (steps - 1) * STEP_WEIGHTS
        out[:, last:k] = x[:, last:].reshape(m, width, -1).transpose(0, 2, 1).reshape(m, -1)
        out[:, k:] = 0
    return out


@jitable
def ends_in_half_step(k):  # type: ignore[no-untyped-def]
    """A row of k weights ends in a half step (64 of 128): the float dots load it as lanes of half the width,
    and `permute_x` lays its x out to match."""
    return k % STEP_WEIGHTS == STEP_WEIGHTS // 2


BF16_STEP = 64  # weights per step of the bf16 dot: 32 code bytes, 2 blocks; it runs two at once (one 512-bit vector)


def permute_x_bf16(x: Array) -> npt.NDArray[np.uint16]:
    """bfloat16 bits of x (rounded to nearest even), in the bf16 dot's order.   [M, K] -> [M, 64 ceil(K/64)]

    The dot reads a row's whole steps two at a time: a pair's 128 positions hold, for nibble j, step 2p's 16
    words then step 2p + 1's (position 128 p + 32 j + 16 h + i: step 2p + h, weight 4 i + j of it). An odd
    last whole step and a one-block tail each keep a step's own order (`bf16_position`)."""
    import ml_dtypes
    m, k = x.shape
    steps = -(-k // BF16_STEP)
    padded = np.zeros((m, steps * BF16_STEP), ml_dtypes.bfloat16)
    padded[:, :k] = x.astype(ml_dtypes.bfloat16)
    out = np.empty_like(padded)
    out[:, _bf16_positions(k)] = padded
    return out.view(np.uint16)


@functools.lru_cache(maxsize=64)
def _bf16_positions(k: int) -> npt.NDArray[np.int64]:
    """`bf16_position` of every weight of a k-weight row, padding included, once per width (a layer permutes
    the same two widths at every call: computing it each time was ~60 % of `permute_x_bf16`'s time)."""
    positions = bf16_position(np.arange(BF16_STEP * -(-k // BF16_STEP)), k)
    positions.flags.writeable = False
    return positions


@jitable
def bf16_position(w, k):  # type: ignore[no-untyped-def]
    """Where weight w (an int or an array of them) of a k-weight row sits in `permute_x_bf16`'s order."""
    paired = 2 * BF16_STEP * (k // (2 * BF16_STEP))  # weights in whole pairs of steps
    q = w % BF16_STEP
    single = w - q + 16 * (q % 4) + q // 4  # a step of its own: position 16 j + i holds weight 4 i + j
    pair = w - w % (2 * BF16_STEP) + 32 * (q % 4) + 16 * (w % (2 * BF16_STEP) // BF16_STEP) + q // 4
    return single + (pair - single) * (w < paired)


def _all_bf16(x: Array) -> bool:
    """Every value of float32 x is a bfloat16 (its low 16 bits are zero)."""
    return not np.any(np.ascontiguousarray(x).view(np.uint32) & np.uint32(0xFFFF))


def has_bf16_dot() -> bool:
    """The host has AVX-512 BF16 (`vdpbf16ps`, Zen 4, Cooper Lake, Sapphire Rapids and later) and AVX-512."""
    return _host_avx512() and _host_feature("avx512bf16")


@functools.cache
def _host_feature(name: str) -> bool:
    from llvmlite import binding
    return bool(binding.get_host_cpu_features().get(name))


def mxfp4_dot(codes: npt.NDArray[np.uint8], c0: int, scales: npt.NDArray[np.uint8], s0: int, lut: Array,
              xp: Array, x0: int, nbytes: int) -> float:
    """One row of W^T times one token row: sum_b 2^(e_b - 127) sum_{i<32} x[32b + i] e2m1(code[32b + i]).

    codes[c0:c0 + nbytes] are the row's code bytes (nbytes a multiple of 16: whole blocks), scales[s0:]
    its E8M0 bits, lut = `value_lut(x.dtype)`, xp[x0:] the token row permuted (`permute_x`; x0 lets a
    kernel pass every row of a flat xp without making a view per dot): float32 or float64,
    or bfloat16 bits (uint16, `permute_x_bf16`) summed in float32 with lut = `value_lut(np.float32)`. The plain form;
    compiled kernels run `numba_ext.mxfp4_dot_avx512` on AVX-512 hosts (no scratch: each step's nibbles
    index a 16-entry register table), this form compiled elsewhere.

    Numerics against `x @ dequantize(W^T).T` in x's dtype: the E2M1 values are exact, and each block's
    partial sum is multiplied by its power-of-two scale once instead of each weight, which is exact while
    the values stay in the normal range. So only the summation order differs (and, compiled, the products
    fused into FMAs: x times an E2M1 value can need a bit or two more than x's precision, which the
    dequantized product rounds and an FMA does not), except where a product or a
    block's partial sum leaves that range (below 2^-126 in float32 / 2^-1022 in float64, where the
    dequantized product rounds each term into subnormals and this rounds once; or a float32 partial sum that
    overflows where the whole sum would not). `mxfp4_grouped` scales each weight instead (`_dot_loops`) in
    float32 rows holding a scale >= 2^126, where the dequantized float32 weight itself can overflow."""
    return _dot_loops(codes, c0, scales, s0, lut, xp, x0, nbytes, False)


@jitable
def _dot_loops(codes, c0, scales, s0, lut, xp, x0, nbytes, per_weight):  # type: ignore[no-untyped-def]
    """`mxfp4_dot` weight by weight, in lut's dtype (x's, or float32 for bf16 bits). per_weight: scale each
    weight (c s, as the dequantized W holds it) instead of each block's partial sum: the form for scales
    whose c s overflows that dtype."""
    per = STEP_WEIGHTS // (64 // xp.itemsize)  # nibbles per lane
    width = STEP_WEIGHTS // per
    half_from = 2 * nbytes - STEP_WEIGHTS // 2 if ends_in_half_step(2 * nbytes) else 2 * nbytes
    one = lut[127]
    acc = one * 0
    for b in range(nbytes // 16):
        s = lut[scales[s0 + b]]
        part = one * 0
        for t in range(32):
            k = 32 * b + t
            c = lut[E2M1_AT + (np.int64(codes[c0 + (k >> 1)]) >> (4 * (k & 1))) % 16]
            if xp.itemsize == 2:  # bfloat16 bits in the bf16 dot's order (`permute_x_bf16`)
                xv = bf16_value(xp[x0 + bf16_position(k, 2 * nbytes)])
            else:
                q, lane = k % STEP_WEIGHTS, per // 2 if k >= half_from else per  # a last half step: half the nibbles
                xv = xp[x0 + k - q + (q % lane) * width + q // lane]
            part += xv * (c * s if per_weight else c)
        acc += part if per_weight else part * s
    return acc


@jitable
def bf16_value(bits):  # type: ignore[no-untyped-def]
    """The value of bfloat16 bits (finite): (128 + m) 2^(e - 134), or m 2^-133 for e = 0, signed."""
    b = np.int64(bits)  # (typed for float x too: `_dot_loops` compiles this branch for every dtype)
    e, m = (b >> 7) & 255, b & 127
    v = math.ldexp(float(m + 128 if e else m), int(max(e, 1)) - 134)
    return np.float32(-v if b >> 15 else v)  # exact: a bfloat16 is a float32


E2M1_AT = 256  # value_lut(dtype)[e] = 2^(e - 127) for E8M0 bits e, [256 + code] = e2m1(code)


def value_lut(dtype: npt.DTypeLike) -> Array:
    """The E8M0 scale values then the E2M1 values, in dtype (E8M0 bits 255, NaN, are never written)."""
    with np.errstate(over="ignore"):
        return np.concatenate([E8M0, E2M1]).astype(dtype)


def packed_at(addr: int, nbytes: int) -> npt.NDArray[np.uint8]:
    """The nbytes bytes at address addr as a uint8 array (a view: the caller keeps their owner alive). Lets
    one compiled call read the packed experts where the weight store holds them, however many there are."""
    return np.frombuffer((ctypes.c_uint8 * int(nbytes)).from_address(int(addr)), np.uint8)


PREFETCH_ROWS = 8  # rows of W^T ahead that `mxfp4_grouped` asks the cache for


def prefetch(addr: int) -> None:
    """A hint to bring the cache line at addr in (never faults, whatever the address). The plain form does
    nothing; compiled kernels run `numba_ext.prefetch_llvm`."""


STREAM_AHEAD = 4096  # bytes ahead of an AVX-512 dot's current code line that it asks the cache for (and the
# scales' line there): the hardware prefetcher alone leaves the stream short of lines; 2-8 KB measured alike
# (docs/history/fast-path.md)


def has_avx512() -> bool:
    """The host can run `numba_ext.mxfp4_dot_avx512` (AVX-512F, and Numba compiles for this host)."""
    return _host_avx512()


@functools.cache
def _host_avx512() -> bool:
    import numba
    from llvmlite import binding
    return bool(binding.get_host_cpu_features().get("avx512f")) and numba.config.CPU_NAME in (None, "host")


def mxfp4_grouped(xp: Array, tokens: npt.NDArray[np.int64], wtab: npt.NDArray[np.int64],
                  items: npt.NDArray[np.int64], width: int) -> Array:
    """Many packed weights times gathered token rows in one compiled call (the routed experts of a chunk).

    xp [T, P] token rows permuted (`permute_x`: float, or bfloat16 bits summed in float32); wtab [W, 5] one
    packed W^T per row: address of its first code byte, code row stride, address of its first scale byte,
    scale row stride, code bytes per row
    (K/2, whole blocks); items [I, 6]: (weight w, n0, n1, col0, r0, r1): y[r, col0 + n - n0] =
    x[tokens[r]] @ W_w[:, n] for n0 <= n < n1, r0 <= r < r1.   -> y [len(tokens), width]
    The caller keeps the weights alive. Each entry of y is one `mxfp4_dot` whatever the items around it,
    so splitting the work differently changes no bit."""
    dtype = np.float32 if xp.dtype == np.uint16 else xp.dtype  # bfloat16 bits: float32 sums
    y = np.empty((len(tokens), width), dtype)  # the items cover every entry once
    lut = value_lut(dtype)
    wide_from = F32_WIDE_SCALE_BITS if dtype == np.float32 else 256  # those rows scale each weight
    work = int(np.sum((items[:, 2] - items[:, 1]) * wtab[items[:, 0], 4]))  # code bytes read
    if work < PARALLEL_BYTES or len(items) == 1:
        _mxfp4_grouped_items(xp, tokens, wtab, items, lut, wide_from, y, 0, len(items))
    else:
        _mxfp4_grouped_parallel(xp, tokens, wtab, items, lut, wide_from, y, min(len(items), 8 * threads()))
    return y


@njit(parallel=True, cache=True)
def _mxfp4_grouped_parallel(xp, tokens, wtab, items, lut, wide_from, y, chunks):  # type: ignore[no-untyped-def]
    n = items.shape[0]
    for c in prange(chunks):
        _mxfp4_grouped_items(xp, tokens, wtab, items, lut, wide_from, y, c * n // chunks, (c + 1) * n // chunks)


@njit(cache=True)
def _mxfp4_grouped_items(xp, tokens, wtab, items, lut, wide_from, y, i0, i1):  # type: ignore[no-untyped-def]
    i = i0
    while i < i1:
        j = _run_end(wtab, items, i, i1)
        if j - i > 1:
            _grouped_run(xp, tokens, wtab, items, lut, wide_from, y, i, j)
        else:
            _grouped_item(xp, tokens, wtab, items, lut, wide_from, y, i)
        i = j


@jitable
def _run_end(wtab, items, i, i1):  # type: ignore[no-untyped-def]
    """The end of the run of items from i: the same rows of row shards that sit side by side in memory (the
    TP ranks' K slices of one weight: rank r's 96 bytes of a down-projection row follow rank r - 1's)."""
    w = items[i, 0]
    if wtab[w, 1] == wtab[w, 4]:  # whole rows: nothing beside them
        return i + 1
    j = i + 1
    while j < i1 and items[j, 1] == items[i, 1] and items[j, 2] == items[i, 2] \
            and wtab[items[j, 0], 0] == wtab[items[j - 1, 0], 0] + wtab[items[j - 1, 0], 4] \
            and wtab[items[j, 0], 1] == wtab[w, 1] and wtab[items[j, 0], 4] == wtab[w, 4]:
        j += 1
    return j


@jitable
def _span_top(scales, wide_from):  # type: ignore[no-untyped-def]
    """The largest scale bits in a span (a superset of its rows' own) when some may be wide, else 0."""
    top = np.uint8(0)
    if wide_from < 256:
        for j in range(scales.shape[0]):  # a byte max reduction LLVM vectorises
            top = max(top, scales[j])
    return top


@jitable
def _wide(scales, s0, nbytes, wide_from):  # type: ignore[no-untyped-def]
    """A row holds a scale from wide_from up: `mxfp4_dot` would overflow where c s does not."""
    for b in range(nbytes // 16):
        if scales[s0 + b] >= wide_from:
            return True
    return False


@jitable
def _grouped_item(xp, tokens, wtab, items, lut, wide_from, y, i):  # type: ignore[no-untyped-def]
    """One item alone: token rows outer, so the item's rows of W^T (<= 57 KB) stay in L2."""
    w, n0, n1, col, r0, r1 = items[i]
    c_addr, c_stride, s_addr, s_stride, nbytes = wtab[w]
    codes = packed_at(c_addr + n0 * c_stride, (n1 - n0 - 1) * c_stride + nbytes)
    scales = packed_at(s_addr + n0 * s_stride, (n1 - n0 - 1) * s_stride + nbytes // 16)
    for r in range(r0, r1):
        x = xp[tokens[r]]
        for n in range(n1 - n0):
            if r == r0 and c_stride > nbytes:  # a lone row shard: its short rows are far apart, and without
                ahead = c_addr + (n0 + n + PREFETCH_ROWS) * c_stride  # this each waits for DRAM
                prefetch(ahead)
                prefetch(ahead + nbytes - 1)
                prefetch(s_addr + (n0 + n + PREFETCH_ROWS) * s_stride)
            y[r, col + n] = mxfp4_dot(codes, n * c_stride, scales, n * s_stride, lut, x, 0, nbytes)
    if _span_top(scales, wide_from) >= wide_from:  # rare: redo the rows with a wide scale weight by weight
        slot = np.zeros((r1 - r0, 4), np.int64)
        slot[:, 1], slot[:, 2], slot[:, 3] = tokens[r0:r1] * xp.shape[1], np.arange(r0, r1), col
        _redo_wide(codes, scales, lut, xp.ravel(), nbytes, wide_from, n1 - n0, c_stride, s_stride, slot, y)


@jitable
def _redo_wide(codes, scales, lut, flat, nbytes, wide_from, m, c_stride, s_stride, slot, y):  # type: ignore[no-untyped-def]
    """The entries of m rows of W^T whose row holds a wide scale (`_wide`), again weight by weight (c s, as
    the dequantized W holds it): entry e reads its row's bytes from slot[e, 0] and x from slot[e, 1] of the
    flat token rows, and goes to y[slot[e, 2], slot[e, 3] + n]."""
    for n in range(m):
        for e in range(slot.shape[0]):
            c, s = n * c_stride + slot[e, 0], n * s_stride + slot[e, 0] // 16
            if _wide(scales, s, nbytes, wide_from):
                y[slot[e, 2], slot[e, 3] + n] = _dot_loops(codes, c, scales, s, lut, flat, slot[e, 1], nbytes, True)


@jitable
def _grouped_run(xp, tokens, wtab, items, lut, wide_from, y, i, j):  # type: ignore[no-untyped-def]
    """Items i..j-1, row shards side by side (`_run_end`), row by row: each row of the weight they split is
    read once, front to back, slice after slice, instead of a 96-byte slice of every row per item. Same dots,
    so the same bits. Entries go through a small stage, so that y's rows are written a tile at a time; their
    lines are asked for first (at batch 1, TP16, 32 of them a run, each a miss whose wait stalled the copy:
    with the prefetch and a loop for the copy, 6-12 % less time for the down projection in an in-process
    A/B, 10.5 against 11.4 ns a slice on one Zen 4 core)."""
    w0, n0, n1 = items[i, 0], items[i, 1], items[i, 2]
    c_addr, c_stride, s_addr, s_stride, nbytes = wtab[w0]
    span = (j - i) * nbytes  # the run's bytes of a row
    codes = packed_at(c_addr + n0 * c_stride, (n1 - n0 - 1) * c_stride + span)
    scales = packed_at(s_addr + n0 * s_stride, (n1 - n0 - 1) * s_stride + span // 16)
    flat, width = xp.ravel(), xp.shape[1]  # one view of every token row: a view per dot costs more than the dot
    count = 0
    for k in range(i, j):
        count += items[k, 5] - items[k, 4]
    slot = np.empty((count, 4), np.int64)  # per entry: its slice's offset in the row, its x's offset, its y row, col
    at = 0
    for k in range(j - i):
        for r in range(items[i + k, 4], items[i + k, 5]):
            slot[at, 0], slot[at, 1], slot[at, 2], slot[at, 3] = k * nbytes, tokens[r] * width, r, items[i + k, 3]
            for b in range(0, (n1 - n0) * y.itemsize, 64):  # y's lines of the entry, in by the time it is written
                prefetch(y.ctypes.data + (r * y.shape[1] + items[i + k, 3]) * y.itemsize + b)
            at += 1
    stage = np.empty((n1 - n0, count), y.dtype)
    for n in range(n1 - n0):
        c0, s0 = n * c_stride, n * s_stride
        for e in range(count):
            c, x0 = c0 + slot[e, 0], slot[e, 1]
            stage[n, e] = mxfp4_dot(codes, c, scales, s0 + slot[e, 0] // 16, lut, flat, x0, nbytes)
    for e in range(count):
        row, col = slot[e, 2], slot[e, 3]
        for t in range(n1 - n0):  # a loop, not a slice assignment: ~50 ns less a row of y
            y[row, col + t] = stage[t, e]
    if _span_top(scales, wide_from) >= wide_from:  # rare: the rows with a wide scale again, weight by weight
        _redo_wide(codes, scales, lut, flat, nbytes, wide_from, n1 - n0, c_stride, s_stride, slot, y)


# ===================================================================== MXFP4 packing (weight generation)
def mxfp4_exponents(amax: np.ndarray) -> np.ndarray:
    """E8M0 exponents of blocks with maxima `amax`, as dtypes.mxfp4_quantize computes them (the packer's
    and the drawing kernel's one rule): floor(float32 log2(amax)) - 2, clipped to [-127, 127] (0 -> -2)."""
    return np.clip(np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2, -127, 127)


def mxfp4_quantize_t(w: npt.NDArray[np.float32], amax_t: npt.NDArray[np.float32] | None = None,
                     ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """Pack W^T as MXFP4 for W [K, N] float32: codes [N, K/2] and E8M0 scale bits [N, K/32].

    Bit-identical to `dtypes.mxfp4_quantize(W.T)`: the block maxima come from one pass over W (or from
    the drawing kernel, `amax_t` [K/32, N]), the scale exponent from the same NumPy expression (float32
    log2, as the reference rounds it: just below a power of two it can round up, so the exponent is not
    read off the bits), the codes from round-to-nearest-even onto the E2M1 grid with saturation at 6
    (ml_dtypes' rule). Dividing by a power of two is multiplying by its reciprocal, exactly."""
    amax_t = _block_amax_t(w) if amax_t is None else amax_t  # [K/32, N]
    exp = mxfp4_exponents(amax_t)
    packed = np.empty((w.shape[1], w.shape[0] // 2), np.uint8)  # [N, K/2]
    _pack_codes_t(w, np.exp2(-exp).astype(np.float32), packed)
    return packed, np.ascontiguousarray((exp + 127).astype(np.uint8).T)


@njit(cache=True, nogil=True)
def _block_amax_t(w):  # type: ignore[no-untyped-def]
    K, N = w.shape
    amax_t = np.zeros((K // 32, N), np.float32)
    for i in range(K):  # row-major walk of W: contiguous reads and a contiguous row of maxima
        max_abs_into(amax_t[i // 32], w[i])
    return amax_t


@njit(cache=True, nogil=True, inline="always")
def max_abs_into(amax, row):  # type: ignore[no-untyped-def]
    """amax[n] = max(amax[n], |row[n]|): one row of W into its blocks' maxima (vectorised)."""
    for n in range(row.shape[0]):
        amax[n] = max(amax[n], abs(row[n]))


@njit(cache=True, nogil=True, inline="always")
def code_pairs(even, odd, inv, out):  # type: ignore[no-untyped-def]
    """out[n] = the byte of rows 2j (low nibble) and 2j + 1 (high) of W at column n, each times its block's
    1 / scale inv[n] and coded (`e2m1_code`): one row of W^T's byte pairs along N (vectorised)."""
    for n in range(out.shape[0]):
        out[n] = e2m1_code(even[n] * inv[n]) | (e2m1_code(odd[n] * inv[n]) << 4)


def transpose_16(src: npt.NDArray[np.uint8], n0: int, dst: npt.NDArray[np.uint8], c0: int) -> None:
    """dst[n0 + c, c0 + j] = src[j, n0 + c] for j, c < 16: a 16 x 16 tile of byte pairs [16, N] into 16 rows of
    W^T's codes. The plain form; compiled kernels run `numba_ext.transpose_16_simd` (16 vector loads, a few
    two-source byte shuffles, 16 vector stores) where this is 256 single-byte loads and stores."""
    for c in range(16):
        for j in range(16):
            dst[n0 + c, c0 + j] = src[j, n0 + c]


@njit(cache=True, nogil=True, inline="always")
def pairs_into_rows(pairs, codes, c0):  # type: ignore[no-untyped-def]
    """codes[n, c0:c0 + 16] = pairs[:, n] for every column n of 16 rows of byte pairs [16, N]: 16 rows of W^T
    at a time (`transpose_16`), the last N % 16 byte by byte. The packer and the fused draw both end so."""
    N = pairs.shape[1]
    whole = N - N % 16
    for n0 in range(0, whole, 16):
        transpose_16(pairs, n0, codes, c0)
    for n in range(whole, N):
        for j in range(16):
            codes[n, c0 + j] = pairs[j, n]


@njit(cache=True, nogil=True)
def _pack_codes_t(w, inv_scale_t, packed):  # type: ignore[no-untyped-def]
    """Codes of W * (1 / scale): rows 2j and 2j+1 of W coded along N into one row of byte pairs
    (contiguous, vectorised), then the [K/2, N] pairs transposed 16 x 16 tiles at a time into W^T's [N, K/2]
    (`pairs_into_rows`)."""
    K, N = w.shape
    pairs = np.empty((K // 2, N), np.uint8)
    for j in range(K // 2):
        code_pairs(w[2 * j], w[2 * j + 1], inv_scale_t[j // 16], pairs[j])
    for j0 in range(0, K // 2, 16):
        pairs_into_rows(pairs[j0:j0 + 16], packed, j0)


@njit(cache=True, nogil=True, inline="always")
def e2m1_code(v):  # type: ignore[no-untyped-def]
    """Nearest E2M1 code of a float (ties to the even code, saturating at 6); bit 3 is the sign.

    The grid's spacing is 0.5 below 2, 1 on [2, 4) and 2 from 4, so on each range the code is an offset plus
    |v| over the spacing rounded to the nearest integer, ties to even (`np.rint`, one vector instruction):
    2|v| (codes 0..4), 2 + |v| (4..6), 4 + |v|/2 (6..7, then the saturation). An even integer there is an
    even code, so the ties go where ml_dtypes sends them. Scaling by 2, 1 and 1/2 is exact, and the one
    rounding vectorises where seven threshold comparisons did not (docs/history/fast-path.md)."""
    a = abs(v)  # float32 constants: a float32 v stays float32 (twice the lanes of float64)
    step = np.float32(2.0) if a < 2 else (np.float32(1.0) if a < 4 else np.float32(0.5))
    base = np.float32(0.0) if a < 2 else (np.float32(2.0) if a < 4 else np.float32(4.0))
    c = min(np.float32(7.0), base + np.rint(a * step))
    return np.uint8(np.int32(c)) | (np.uint8(np.signbit(v)) << 3)


def mxfp4_dequantize_t(packed: npt.NDArray[np.uint8], scale_bits: npt.NDArray[np.uint8], dtype: type) -> Array:
    """W [K, N] from the packed W^T, as the transpose of a C-ordered [N, K]: the float copy only the
    reference path asks for (rows of W^T decode with contiguous reads and writes)."""
    n, half = packed.shape
    out = np.empty((n, 2 * half), dtype)
    with np.errstate(over="ignore"):  # E8M0 bits above 2^128 are inf in float32 and never written
        scale_lut = E8M0.astype(dtype)
    lut = E2M1.astype(dtype)
    if packed.nbytes < PARALLEL_BYTES:
        _dequantize_rows(packed, scale_bits, lut, scale_lut, out, 0, n)
    else:
        _dequantize_parallel(packed, scale_bits, lut, scale_lut, out, 4 * threads())
    return out.T


@njit(parallel=True, cache=True)
def _dequantize_parallel(packed, scale_bits, lut, scale_lut, out, chunks):  # type: ignore[no-untyped-def]
    N = packed.shape[0]
    for c in prange(chunks):
        _dequantize_rows(packed, scale_bits, lut, scale_lut, out, c * N // chunks, (c + 1) * N // chunks)


@njit(cache=True, nogil=True)
def _dequantize_rows(packed, scale_bits, lut, scale_lut, out, n0, n1):  # type: ignore[no-untyped-def]
    for n in range(n0, n1):
        dequantize_row(packed[n], scale_bits[n], lut, scale_lut, out[n])


@njit(cache=True, nogil=True, inline="always")
def dequantize_row(codes, bits, lut, scale_lut, out):  # type: ignore[no-untyped-def]
    """One row of W^T: out[2i], out[2i + 1] = the E2M1 values of byte i's low and high nibble times its
    block's scale (lut, scale_lut in out's dtype: the product is exact)."""
    for i in range(codes.shape[0]):
        p, s = codes[i], scale_lut[bits[i >> 4]]
        out[2 * i] = lut[p & 15] * s
        out[2 * i + 1] = lut[p >> 4] * s


def mxfp4_reference_matmul(x: Array, packed: npt.NDArray[np.uint8], scale_bits: npt.NDArray[np.uint8]) -> Array:
    """The reference product on a packed W^T [N, K/2] of whole 32-blocks (any strides: a row shard's
    columns): y = x @ W in float64, with W the float64 weights `mxfp4_dequantize_t` gives (exact). Row n of
    W^T is decoded into two K/2-long scratch rows, its even and its odd weights (L1-resident), a block at a
    time by `decode_block` (one byte shuffle per nibble; E2M1 values times a scale below 2^126 are exact in
    float32, and widened to float64 they are the float64 weights), or, in a row holding a scale from 2^126
    (E8M0 bits >= 253), by the float64 table. Each token row's dot with them is a plain loop over pairs,
    sum_j x[2j] w[2j] + x[2j+1] w[2j+1], whose sum LLVM may reorder into vector partial sums (`reassoc`;
    products still rounded once, no FMA), the same loop for both decodes. No float64 copy of W in memory
    and no BLAS: one order per (row, column), so the same bits for a row alone or among others and on any
    thread count. It replaced 256-row chunks dequantized to float64 and an einsum per token row, then a
    float64 table lookup per weight (~0.5 ns a weight; docs/architecture.md).   [M, K] -> [M, N] float64"""
    n, half = packed.shape
    x = np.ascontiguousarray(x, np.float64)
    xe, xo = np.ascontiguousarray(x[:, 0::2]), np.ascontiguousarray(x[:, 1::2])
    out = np.empty((x.shape[0], n))
    _reference_rows(xe, xo, packed, scale_bits, E8M0_HALF_F32, E2M1, E8M0, out, np.empty((2, half), np.float32),
                    np.empty(2 * half))
    return out


# threads run it (reference._routed_experts); no reference counts (NRT): it allocates nothing, and its views of
# the rows took atomic pairs (docs/architecture.md)
@njit(cache=True, nogil=True, _nrt=False, fastmath={"reassoc"})
def _reference_rows(xe, xo, packed, scale_bits, half_scale, lut, scale_lut, out, w32, w64):  # type: ignore[no-untyped-def]
    """Rows of `mxfp4_reference_matmul`: xe, xo the token rows' even and odd columns; w32 [2, K/2] the scratch
    for a row's even and odd weights, w64 [K] for a row of W^T the float64 table decodes."""
    H = packed.shape[1]
    for n in range(packed.shape[0]):
        row, bits = packed[n], scale_bits[n]
        if _wide(bits, 0, H, F32_WIDE_SCALE_BITS):  # E2M1 x scale may overflow float32: the float64 table
            dequantize_row(row, bits, lut, scale_lut, w64)
            _pair_dots(xe, xo, w64[0::2], w64[1::2], out, n)
        else:
            for b in range(H // 16):
                decode_block(row, 16 * b, half_scale[bits[b]], w32[0], w32[1])
            _pair_dots(xe, xo, w32[0], w32[1], out, n)


@njit(inline="always", fastmath={"reassoc"})
def _pair_dots(xe, xo, even, odd, out, n):  # type: ignore[no-untyped-def]
    """out[r, n] = sum_j xe[r, j] even[j] + xo[r, j] odd[j] in float64, for every token row r."""
    for r in range(xe.shape[0]):
        a, c, acc = xe[r], xo[r], 0.0
        for j in range(even.shape[0]):
            acc += a[j] * np.float64(even[j]) + c[j] * np.float64(odd[j])
        out[r, n] = acc


# ===================================================================== bf16 storage
def bf16_to(bits: npt.NDArray[np.uint16], dtype: type) -> Array:
    """bfloat16 bit patterns (a 1-D or 2-D view, any strides) -> a new C-ordered array of dtype. Exact:
    a bfloat16 is the top half of a float32."""
    bits2 = bits.reshape(1, -1) if bits.ndim == 1 else bits
    out = np.empty(bits2.shape, dtype)
    if bits.nbytes < PARALLEL_BYTES:
        _bf16_rows(bits2, out, 0, bits2.shape[0])
    else:
        _bf16_widen_parallel(bits2, out, 4 * threads())
    return out.reshape(bits.shape)


@njit(parallel=True, cache=True)
def _bf16_widen_parallel(bits, out, chunks):  # type: ignore[no-untyped-def]
    R = bits.shape[0]
    for c in prange(chunks):
        _bf16_rows(bits, out, c * R // chunks, (c + 1) * R // chunks)


@njit(cache=True)
def _bf16_rows(bits, out, r0, r1):  # type: ignore[no-untyped-def]
    C = bits.shape[1]
    row = np.empty(C, np.uint32)
    row_f32 = row.view(np.float32)
    for r in range(r0, r1):
        for c in range(C):
            row[c] = np.uint32(bits[r, c]) << 16
        for c in range(C):
            out[r, c] = row_f32[c]


def bf16_matmul(x: Array, bits: npt.NDArray[np.uint16], ahead: int | None = None) -> Array:
    """y = x @ W for W [K, N] held as bfloat16 bits (rows of any stride: a column shard is a strided view), in
    x's dtype.   [M, K] -> [M, N]

    Reads 2 B per weight once; the widen-then-GEMM form writes and re-reads 4 (float32) or 8 (float64).
    The threads split the columns evenly (in BF16_SPLIT-column units); each takes its columns BF16_TILE at a time:
    for every k it widens W[k, tile] (the top half of a float32) and adds x[:, k] times it into the
    [M, tile] accumulators, so y sums over k in order, however the columns are split.

    A decode projection's shard is K rows of a few hundred bytes each, one row stride (a whole weight's row,
    7-24 KB for K3) apart: every row is in a page of its own, where the hardware prefetchers do not follow, and
    a row of a strided view is an 'A'-layout slice, which Numba does not vectorise. So each row is read through
    its address (a contiguous array: vectorised), and the row `ahead` bytes of rows on (BF16_AHEAD unless
    given; 0: none) is asked for while this one is multiplied (benchmarks/bf16_gemv.py measures both;
    docs/history/fast-path.md)."""
    if x.ndim != 2 or bits.ndim != 2 or x.shape[1] != bits.shape[0]:  # the rows are read by address: no bounds
        raise ValueError(f"bf16_matmul: x {x.shape} and W {bits.shape} do not multiply")
    ahead = BF16_AHEAD if ahead is None else ahead
    x = np.ascontiguousarray(x)
    if bits.strides[1] != 2 or bits.strides[0] < 0:  # not rows of contiguous columns: make them so (rare)
        bits = np.ascontiguousarray(bits)
    out = np.empty((x.shape[0], bits.shape[1]), x.dtype)
    chunks = min(threads(), -(-bits.shape[1] // BF16_SPLIT))
    if bits.shape[0] * bits.shape[1] * 2 < BF16_PARALLEL_BYTES or chunks == 1:
        _bf16_matmul_cols(x, bits, out, 0, bits.shape[1], ahead)
    else:
        _bf16_matmul_parallel(x, bits, out, chunks, ahead)
    return out


BF16_TILE = 512  # output columns per tile: [M, 512] float64 accumulators are 4 KB a token row
BF16_SPLIT = 32  # the threads' column ranges are multiples of this many columns: 64 bytes of a bf16 row
BF16_AHEAD = 4096  # bytes of rows ahead of the current one that the bf16 GEMM asks the cache for: 4 KB read best
# or within noise of 2 and 8 KB (benchmarks/bf16_gemv.py; docs/history/fast-path.md)
BF16_PARALLEL_BYTES = 512 << 10  # smaller weights run on one thread (two threads gained 1.07-1.11x at 128-448 KB,
# 1.19-1.51x from 896 KB on K3-like shards; docs/history/fast-path.md)


@njit(parallel=True, cache=True)
def _bf16_matmul_parallel(x, bits, out, chunks, ahead):  # type: ignore[no-untyped-def]
    n = bits.shape[1]
    units = -(-n // BF16_SPLIT)
    for c in prange(chunks):
        c0, c1 = min(n, BF16_SPLIT * (c * units // chunks)), min(n, BF16_SPLIT * ((c + 1) * units // chunks))
        _bf16_matmul_cols(x, bits, out, c0, c1, ahead)


@njit(cache=True, fastmath=FAST)
def _bf16_matmul_cols(x, bits, out, c0, c1, ahead):  # type: ignore[no-untyped-def]
    """Columns c0 .. c1 - 1 of y = x @ W, BF16_TILE at a time (bits' columns contiguous), asking for the row
    `ahead` bytes of rows on (at least 2 rows; none for ahead = 0)."""
    M, K = x.shape
    w_bits = np.empty(BF16_TILE, np.uint32)
    w = w_bits.view(np.float32)
    acc = np.empty((M, BF16_TILE), x.dtype)
    base, stride = bits.ctypes.data, bits.strides[0]
    for n0 in range(c0, c1, BF16_TILE):
        width = min(BF16_TILE, c1 - n0)
        rows = max(2, ahead // (2 * width)) if ahead > 0 else K
        acc[:] = 0
        for k in range(K):
            if k + rows < K:
                line = base + (k + rows) * stride + 2 * n0
                for b in range(0, 2 * width + 64, 64):  # the row's lines, the last one partly
                    prefetch(line + b)
            src = packed_at(base + k * stride + 2 * n0, 2 * width).view(np.uint16)
            for j in range(width):
                w_bits[j] = np.uint32(src[j]) << 16
            for m in range(M):
                xk, row = x[m, k], acc[m]  # a 1-D row: LLVM then vectorises the update (2x)
                for j in range(width):
                    row[j] += xk * w[j]
        out[:, n0:n0 + width] = acc[:, :width]


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


# ===================================================================== around the routed experts' grouped products
def scale_add_rows(out: Array, rows: npt.NDArray[np.int64], weight: Array, values: Array) -> None:
    """out[rows[i]] += weight[i] values[i] for i in order, each product rounded to out's dtype before its add:
    FC2's finalize epilogue, one pass over values (NumPy's scale then `np.add.at` writes and re-reads the
    scaled [rows, Din] and pays ~15 us of Python a rank: 16 ranks at batch 1, 0.38 -> 0.11 ms)."""
    _scale_add_rows(out, rows, weight.astype(out.dtype), values)


@njit(cache=True)
def _scale_add_rows(out, rows, weight, values):  # type: ignore[no-untyped-def]
    for i in range(rows.shape[0]):
        o, w, v = out[rows[i]], weight[i], values[i]
        for d in range(v.shape[0]):
            o[d] += w * v[d]


@njit(cache=True)
def tiles(lengths, widths, ranks, tile):  # type: ignore[no-untyped-def]
    """Work items (weight, n0, n1, col0, r0, r1) of `tile` output columns for groups of `lengths` rows times
    parts of `widths` columns on every rank: weight (group, part, rank) of the table, output rows (rank,
    group); ordered by group, part, tile, then rank (`fast.packed.grouped_matmul`). One pass writing each
    item once: NumPy's strided column stores took ~130 us for FC2's 28,672 items at batch 1, TP16 (~50 us)."""
    total, parts = lengths.sum(), widths.shape[0]
    count = 0
    for n in widths:
        count += (n + tile - 1) // tile
    items = np.empty((lengths.shape[0] * count * ranks, 6), np.int64)
    i = row = 0
    for g in range(lengths.shape[0]):
        col = 0
        for p in range(parts):
            for n0 in range(0, widths[p], tile):
                for r in range(ranks):
                    items[i, 0] = (g * parts + p) * ranks + r
                    items[i, 1] = n0
                    items[i, 2] = min(n0 + tile, widths[p])
                    items[i, 3] = col + n0
                    items[i, 4] = r * total + row
                    items[i, 5] = r * total + row + lengths[g]
                    i += 1
            col += widths[p]
        row += lengths[g]
    return items
