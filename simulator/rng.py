"""NumPy's normal draws, bit for bit, as a Numba kernel: the PCG64 generator and the float32 ziggurat.

Weights are drawn as `np.random.default_rng(SeedSequence([...])).standard_normal(shape, float32) * std`
(weights.py); a routed expert part is 11 M of them. NumPy calls its bit generator through a function
pointer for every sample and cannot be fused with what follows, so on this CPU it draws ~75 M/s per
core (13 ns a sample): 442 touched experts at batch 64 are 14.6 G samples, ~100 s on 2 cores before any
arithmetic. This module draws the same numbers with the generator inlined:

    PCG64 (XSL-RR 128/64)   state <- state * A + inc  (mod 2^128);  out = rotr64(hi ^ lo, hi >> 58)
    next_uint32             the low half of an output, then its high half (NumPy's buffered order)
    standard_normal_f       Marsaglia-Tsang ziggurat, 256 layers: r = next_uint32(); layer = r & 255,
                            sign = bit 8, x = (r >> 9) * w[layer]; accepted at once when (r >> 9) < k[layer]
                            (99.3 %), otherwise NumPy's wedge / tail test, with its float32 arithmetic

The ziggurat tables are NumPy's (numba ships a copy of them for its own Generator support). The state
words come from NumPy's PCG64 seeded by the same SeedSequence, so the seeding is NumPy's too. Tests hold
the draws equal to NumPy's, millions of samples including the rare wedge and tail branches.

Dimension legend: K rows (the reduction dimension of a weight), N columns.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from simulator.jit import lazy_njit as njit, on_compile

MULT_HI, MULT_LO = np.uint64(0x2360ED051FC65DA4), np.uint64(0x4385DF649FCCF645)  # PCG's 128-bit multiplier
LOW32, HAVE, ZERO, ONE = np.uint64(0xFFFFFFFF), np.uint64(1 << 32), np.uint64(0), np.uint64(1)
U8, U9, U58, U63, U64 = np.uint64(8), np.uint64(9), np.uint64(58), np.uint64(63), np.uint64(64)
WI = KI = FI = NOR_R = NOR_INV_R = None  # NumPy's float32 ziggurat tables, bound by _tables() when first needed


def _tables() -> None:
    """Bind the ziggurat tables (numba ships NumPy's; importing them imports Numba, so not at start-up)."""
    global WI, KI, FI, NOR_R, NOR_INV_R
    from numba.np.random import _constants as zig
    WI, KI, FI = zig.wi_float.astype(np.float32), zig.ki_float.astype(np.uint32), zig.fi_float.astype(np.float32)
    NOR_R, NOR_INV_R = np.float32(zig.ziggurat_nor_r_f), np.float32(zig.ziggurat_nor_inv_r_f)


on_compile(_tables)  # compiled kernels read the tables as constants: bind them before they compile
on_compile("simulator.numba_ext")  # _mulhi as one 128-bit multiply


def pcg64_words(seed: np.random.SeedSequence) -> npt.NDArray[np.uint64]:
    """NumPy's PCG64 state for `seed` as four words: state high, state low, increment high, low."""
    s = np.random.PCG64(seed).state["state"]
    mask = (1 << 64) - 1
    return np.array([s["state"] >> 64, s["state"] & mask, s["inc"] >> 64, s["inc"] & mask], np.uint64)


def _mulhi(a, b):  # type: ignore[no-untyped-def]
    """High 64 bits of the 128-bit product a * b. The plain form; compiled kernels run
    `numba_ext.mulhi_llvm`, one `mul` instruction on x86-64."""
    return np.uint64((int(a) * int(b)) >> 64)


@njit(inline="always")
def _next_uint32(st):  # type: ignore[no-untyped-def]
    """(r, state'): state = (hi, lo, inc_hi, inc_lo, buffered); buffered holds a spare high half + 2^32."""
    hi, lo, inc_hi, inc_lo, buf = st
    if buf & HAVE:
        return buf & LOW32, (hi, lo, inc_hi, inc_lo, ZERO)
    lo_prod = lo * MULT_LO
    hi_prod = _mulhi(lo, MULT_LO) + lo * MULT_HI + hi * MULT_LO
    lo = lo_prod + inc_lo
    hi = hi_prod + inc_hi + (ONE if lo < lo_prod else ZERO)
    xor, rot = hi ^ lo, hi >> U58
    out = (xor >> rot) | (xor << ((U64 - rot) & U63))
    return out & LOW32, (hi, lo, inc_hi, inc_lo, (out >> np.uint64(32)) | HAVE)


@njit(inline="always")
def _next_float(st):  # type: ignore[no-untyped-def]
    r, st = _next_uint32(st)
    return np.float32(r >> U8) * np.float32(1.0 / 16777216.0), st


@njit(inline="always")
def _normal_f32(st):  # type: ignore[no-untyped-def]
    """One float32 standard normal, NumPy's `random_standard_normal_f`: the accepted 99.3 % inline."""
    r, st = _next_uint32(st)
    idx = np.int64(r & np.uint64(0xFF))
    rabs = np.int32((r >> U9) & np.uint64(0x7FFFFF))  # a signed int converts in one instruction
    sign = np.float32(1) - np.float32(2) * np.float32((r >> U8) & ONE)  # no branch: the sign is a coin
    x = np.float32(rabs) * WI[idx] * sign
    if rabs < KI[idx]:
        return x, st
    return _normal_rejected(st, idx, rabs, x)


@njit
def _normal_rejected(st, idx, rabs, x):  # type: ignore[no-untyped-def]
    """NumPy's wedge and tail tests after a rejected first try (not inlined: it keeps the hot loop small)."""
    while True:
        if idx == 0:  # the tail beyond r = 3.65: Marsaglia's exponential test
            while True:
                u, st = _next_float(st)
                xx = -NOR_INV_R * np.log1p(-u)
                u, st = _next_float(st)
                yy = -np.log1p(-u)
                if yy + yy > xx * xx:
                    return (-(NOR_R + xx) if (rabs >> 8) & 1 else NOR_R + xx), st
        u, st = _next_float(st)  # the wedge of layer idx
        if (FI[idx - 1] - FI[idx]) * u + FI[idx] < np.exp(-0.5 * np.float64(x) * x):  # C: a double exp
            return x, st
        r, st = _next_uint32(st)  # a fresh try
        idx = np.int64(r & np.uint64(0xFF))
        rabs = np.int32((r >> U9) & np.uint64(0x7FFFFF))
        x = np.float32(rabs) * WI[idx] * (np.float32(1) - np.float32(2) * np.float32((r >> U8) & ONE))
        if rabs < KI[idx]:
            return x, st


@njit(cache=True, nogil=True)
def normal_block_amax(words, std, out, amax_t):  # type: ignore[no-untyped-def]
    """out[K, N] = float32 standard normals * std in NumPy's order (row-major), and amax_t[b, n] =
    max |out[32b:32b+32, n]|, the MXFP4 block maxima of out^T, taken while each value is in a register."""
    st = (words[0], words[1], words[2], words[3], ZERO)
    K, N = out.shape
    amax_t[:] = 0
    for i in range(K):
        row = amax_t[i // 32]
        for n in range(N):
            x, st = _normal_f32(st)
            v = x * std
            out[i, n] = v
            row[n] = max(row[n], abs(v))


@njit(cache=True, nogil=True)
def normal_fill(words, std, out):  # type: ignore[no-untyped-def]
    """out (1-D) = float32 standard normals * std, NumPy's stream from its first sample."""
    st = (words[0], words[1], words[2], words[3], ZERO)
    for j in range(out.size):
        x, st = _normal_f32(st)
        out[j] = x * std


def standard_normal_f32(seed: np.random.SeedSequence, shape: tuple[int, ...], std: float = 1.0) -> np.ndarray:
    """`default_rng(seed).standard_normal(shape, dtype=float32) * float32(std)`, the same bits."""
    out = np.empty(shape, np.float32)
    normal_fill(pcg64_words(seed), np.float32(std), out.reshape(-1))
    return out
