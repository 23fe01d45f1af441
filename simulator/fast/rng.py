"""NumPy's normal draws, bit for bit, as a Numba kernel: the PCG64 generator and the float32 ziggurat.

Weights are drawn as `np.random.default_rng(SeedSequence([...])).standard_normal(shape, float32) * std`
(weights.py); a routed expert part is 11 M of them. NumPy calls its bit generator through a function
pointer for every sample and cannot be fused with what follows, so on this CPU it draws ~75 M/s per
core (13 ns a sample): 442 touched experts at batch 64 are 14.6 G samples, ~100 s on 2 cores before any
arithmetic. This module draws the same numbers in two stages:

    PCG64 (XSL-RR 128/64)   state <- state * a + c  (mod 2^128);  out = rotr64(hi ^ lo, hi >> 58)
      four lanes            the state is an LCG, so four steps are one affine map: s_{n+4} = A s_n + C with
                            A = a^4, C = c (a^3 + a^2 + a + 1). Lanes holding s_{n+1} .. s_{n+4}, each moved
                            by (A, C), are four independent multiply chains the CPU overlaps; they write the
                            64-bit outputs in the stream's order into an L1-sized buffer (`_refill`)
    next_uint32             NumPy hands out an output's low half, then its high half: the buffer viewed as
                            uint32 (little-endian) is exactly that sequence, read with a cursor
    standard_normal_f       Marsaglia-Tsang ziggurat, 256 layers: r = next_uint32(); layer = r & 255,
                            sign = bit 8, x = (r >> 9) * w[layer]; accepted at once when (r >> 9) < k[layer]
                            (~99 %), otherwise NumPy's wedge / tail test, with its float32 arithmetic, reading
                            on from the cursor (refilling the buffer as it needs)

The ziggurat tables are NumPy's (numba ships a copy of them for its own Generator support), indexed by the
low 9 bits (layer and sign: WI2[256 + i] = -WI[i], as NumPy's multiply by -1 is exact). The kernels take
them as arguments (`tables()`): read as Numba global constants, the same first-try loop ran 3-4x slower
on this CPU when measured. The state words come from NumPy's PCG64 seeded by the same SeedSequence, so
the seeding is NumPy's too. Tests hold the draws equal to NumPy's: millions of samples, the rare wedge and
tail branches, buffer refills inside a rejection, and draws split across calls. `draw_mxfp4_t` draws an
expert part straight to MXFP4, a 32-row strip at a time (the section at the end), and `NormalStream`
continues one stream across calls (the dense weights, drawn a chunk at a time).

Dimension legend: K rows (the reduction dimension of a weight), N columns.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from simulator.fast import kernels as fast
from simulator.jit import lazy_njit as njit, on_compile

PCG_MULT = 0x2360ED051FC65DA4_4385DF649FCCF645  # PCG64's 128-bit multiplier
MASK64, MASK128 = (1 << 64) - 1, (1 << 128) - 1
ZERO, ONE = np.uint64(0), np.uint64(1)
U8, U9, U58, U63, U64 = np.uint64(8), np.uint64(9), np.uint64(58), np.uint64(63), np.uint64(64)
LANES = 4  # interleaved sub-streams (the multiply chains one core overlaps)
RAW_WORDS = 1024  # 64-bit outputs per buffer refill: 8 KB, in L1 beside the row being drawn
CURSOR = 12  # state[CURSOR]: the uint32 cursor into the buffer (2 * RAW_WORDS = read out)
NOR_R = NOR_INV_R = None  # the ziggurat's tail start r and 1 / r (float32), bound by tables()
_TABLES: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def tables() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """NumPy's float32 ziggurat tables as the kernels take them: WI2 [512] (x per unit of r >> 9, by layer
    and sign), KI2 [512] (the box test's bound) and FI [256] (the density at each layer). Numba ships NumPy's
    tables; importing them imports Numba, so they are made on first need, not at start-up."""
    global _TABLES, NOR_R, NOR_INV_R
    if _TABLES is None:
        from numba.np.random import _constants as zig
        wi, ki = zig.wi_float.astype(np.float32), zig.ki_float.astype(np.int32)
        NOR_R, NOR_INV_R = np.float32(zig.ziggurat_nor_r_f), np.float32(zig.ziggurat_nor_inv_r_f)
        _TABLES = (np.concatenate([wi, -wi]), np.concatenate([ki, ki]), zig.fi_float.astype(np.float32))
    return _TABLES


on_compile(tables)  # the kernels read NOR_R and NOR_INV_R as constants: bind them before they compile
on_compile("simulator.fast.numba_ext")  # _mulhi as one 128-bit multiply


def pcg64_words(seed: np.random.SeedSequence) -> npt.NDArray[np.uint64]:
    """NumPy's PCG64 state for `seed` as four words: state high, state low, increment high, low."""
    s = np.random.PCG64(seed).state["state"]
    return np.array([s["state"] >> 64, s["state"] & MASK64, s["inc"] >> 64, s["inc"] & MASK64], np.uint64)


def lane_state(words: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The four-lane generator for PCG64 state `words` (pcg64_words) as one uint64 array: [0:8] the lanes'
    (hi, lo) = s_1 .. s_4 (NumPy outputs from the advanced state), [8:12] the four-step map (A hi, lo, C hi,
    lo), [CURSOR] the cursor, at the end of a RAW_WORDS buffer so that the first read fills it."""
    s, c = (int(words[0]) << 64) | int(words[1]), (int(words[2]) << 64) | int(words[3])
    lanes = []
    for _ in range(LANES):
        s = (s * PCG_MULT + c) & MASK128
        lanes += [s >> 64, s & MASK64]
    a4 = pow(PCG_MULT, LANES, 1 << 128)
    c4 = c * sum(pow(PCG_MULT, j, 1 << 128) for j in range(LANES)) & MASK128
    return np.array(lanes + [a4 >> 64, a4 & MASK64, c4 >> 64, c4 & MASK64, 2 * RAW_WORDS], np.uint64)


def _mulhi(a, b):  # type: ignore[no-untyped-def]
    """High 64 bits of the 128-bit product a * b. The plain form; compiled kernels run
    `numba_ext.mulhi_llvm`, one `mul` instruction on x86-64."""
    return np.uint64((int(a) * int(b)) >> 64)


@njit(inline="always")
def _lcg(hi, lo, mhi, mlo, chi, clo):  # type: ignore[no-untyped-def]
    """(hi, lo) * (mhi, mlo) + (chi, clo)  (mod 2^128)."""
    lo_prod = lo * mlo
    hi_prod = _mulhi(lo, mlo) + lo * mhi + hi * mlo
    lo = lo_prod + clo
    return hi_prod + chi + (ONE if lo < lo_prod else ZERO), lo


@njit(inline="always")
def _xsl_rr(hi, lo):  # type: ignore[no-untyped-def]
    """PCG64's output of state (hi, lo): the xor of the halves rotated right by the top 6 bits."""
    xor, rot = hi ^ lo, hi >> U58
    return (xor >> rot) | (xor << ((U64 - rot) & U63))


@njit(inline="always")
def _refill(state, raw):  # type: ignore[no-untyped-def]
    """raw[:] = the stream's next raw.size outputs (a multiple of 4), four lanes at a time; the lanes move on."""
    h0, l0, h1, l1, h2, l2, h3, l3 = state[0], state[1], state[2], state[3], state[4], state[5], state[6], state[7]
    mhi, mlo, chi, clo = state[8], state[9], state[10], state[11]
    for i in range(0, raw.size, LANES):
        raw[i], raw[i + 1], raw[i + 2], raw[i + 3] = _xsl_rr(h0, l0), _xsl_rr(h1, l1), _xsl_rr(h2, l2), _xsl_rr(h3, l3)
        h0, l0 = _lcg(h0, l0, mhi, mlo, chi, clo)
        h1, l1 = _lcg(h1, l1, mhi, mlo, chi, clo)
        h2, l2 = _lcg(h2, l2, mhi, mlo, chi, clo)
        h3, l3 = _lcg(h3, l3, mhi, mlo, chi, clo)
    state[0], state[1], state[2], state[3], state[4], state[5], state[6], state[7] = h0, l0, h1, l1, h2, l2, h3, l3


@njit(inline="always")
def _u32(state, raw, u32, pos):  # type: ignore[no-untyped-def]
    """(the stream's next uint32, the cursor after it), refilling the buffer when it is read out."""
    if pos >= u32.size:
        _refill(state, raw)
        pos = 0
    return np.uint64(u32[pos]), pos + 1


@njit(inline="always")
def _unit_float(r):  # type: ignore[no-untyped-def]
    """NumPy's next_float: the top 24 bits of a uint32 times 2^-24."""
    return np.float32(r >> U8) * np.float32(1.0 / 16777216.0)


@njit
def _tail(state, raw, u32, pos, rabs):  # type: ignore[no-untyped-def]
    """(normal, cursor) for a rejected first try in the base layer: the tail beyond r = 3.65, Marsaglia's
    exponential test (NumPy's; ~1 draw in 4,000, so a call)."""
    while True:
        u, pos = _u32(state, raw, u32, pos)
        xx = -NOR_INV_R * np.log1p(-_unit_float(u))
        u, pos = _u32(state, raw, u32, pos)
        yy = -np.log1p(-_unit_float(u))
        if yy + yy > xx * xx:
            return (-(NOR_R + xx) if (rabs >> 8) & 1 else NOR_R + xx), pos  # NumPy's sign: bit 8 of r >> 9


@njit(inline="always")
def _draw_row(state, raw, u32, pos, std, out, wi, ki, fi):  # type: ignore[no-untyped-def]
    """out[:] = the stream's next out.size normals * std; returns the cursor.

    A run of first tries reads one uint32 each and stops at the buffer's end or at a try that fails its
    box test, so it has no call and no refill check in it. A failed try in layer i > 0 reads one more
    uint32 for NumPy's wedge test: accepted, it is the sample; rejected, the next uint32 is a fresh first
    try for the same sample, which is where the run resumes (NumPy's loop). Layer 0 goes to `_tail`."""
    n, j = out.size, 0
    while j < n:
        if pos >= u32.size:
            _refill(state, raw)
            pos = 0
        m = min(n - j, u32.size - pos)
        k, mu, p0, j0 = ZERO, np.uint64(m), np.uint64(pos), np.uint64(j)  # unsigned: no wraparound code
        while k < mu:
            r = u32[p0 + k]
            lane = r & np.uint32(0x1FF)
            rabs = np.int32(r >> np.uint32(9))
            if rabs >= ki[lane]:
                break
            out[j0 + k] = np.float32(rabs) * wi[lane] * std
            k += ONE
        k = np.int64(k)
        j, pos = j + k, pos + k
        if k == m:
            continue
        r = np.uint64(u32[pos])
        idx, lane, rabs = np.int64(r & np.uint64(0xFF)), np.int64(r & np.uint64(0x1FF)), np.int32(r >> U9)
        x = np.float32(rabs) * wi[lane]
        if idx == 0:
            x, pos = _tail(state, raw, u32, pos + 1, rabs)
        else:
            u, pos = _u32(state, raw, u32, pos + 1)
            if ((fi[idx - 1] - fi[idx]) * _unit_float(u) + fi[idx]
                    >= np.exp(-0.5 * np.float64(x) * x)):  # C: a double exp
                continue  # rejected: the next uint32 is a fresh try
        out[j] = x * std
        j += 1
    return pos


# The draw kernels run without Numba's reference counts (NRT; their scratch comes from the caller): every array
# passed to an inlined helper took an atomic pair, ~20 % of a two-thread draw's samples on a Xeon VM, the two
# threads' pairs contending on the shared tables (docs/architecture.md)
@njit(cache=True, nogil=True, _nrt=False)
def _fill(state, raw, std, out, wi, ki, fi):  # type: ignore[no-untyped-def]
    state[CURSOR] = _draw_row(state, raw, raw.view(np.uint32), np.int64(state[CURSOR]), std, out, wi, ki, fi)


@njit(cache=True, nogil=True, _nrt=False)
def _fill_block_amax(state, std, out, amax_t, wi, ki, fi, raw):  # type: ignore[no-untyped-def]
    u32, pos = raw.view(np.uint32), np.int64(state[CURSOR])
    K, N = out.shape
    amax_t[:] = 0
    for i in range(K):
        row, amax = out[i], amax_t[i // 32]
        pos = _draw_row(state, raw, u32, pos, std, row, wi, ki, fi)
        fast.max_abs_into(amax, row)  # the row is in L1


class NormalStream:
    """`default_rng(seed).standard_normal(dtype=float32)`'s stream, drawn in pieces: each `fill` continues
    where the last stopped (a dense weight drawn a chunk at a time equals the weight drawn whole)."""

    def __init__(self, seed: np.random.SeedSequence, raw_words: int = RAW_WORDS) -> None:
        if raw_words <= 0 or raw_words % LANES:
            raise ValueError(f"raw_words must be a positive multiple of {LANES}, not {raw_words}")
        self.state = lane_state(pcg64_words(seed))
        self.raw = np.empty(raw_words, np.uint64)  # tests make it small, so that refills land everywhere
        self.state[CURSOR] = 2 * raw_words

    def fill(self, out: np.ndarray, std: float = 1.0) -> None:
        """out (float32, C-contiguous, any shape) = the next out.size normals * float32(std), in order."""
        _fill(self.state, self.raw, np.float32(std), out.reshape(-1), *tables())


def normal_block_amax(words: npt.NDArray[np.uint64], std: np.float32, out: np.ndarray, amax_t: np.ndarray) -> None:
    """out[K, N] = float32 standard normals * std in NumPy's order (row-major) from PCG64 state `words`, and
    amax_t[b, n] = max |out[32b:32b+32, n]|, the MXFP4 block maxima of out^T, folded in row by row while
    each row is in L1."""
    _fill_block_amax(lane_state(words), np.float32(std), out, amax_t, *tables(), np.empty(RAW_WORDS, np.uint64))


def standard_normal_f32(seed: np.random.SeedSequence, shape: tuple[int, ...], std: float = 1.0) -> np.ndarray:
    """`default_rng(seed).standard_normal(shape, dtype=float32) * float32(std)`, the same bits."""
    out = np.empty(shape, np.float32)
    NormalStream(seed).fill(out, std)
    return out


# ===================================================================== drawn straight to MXFP4
# A routed expert part is drawn, its block maxima taken and packed (weights._make_packed). Drawn whole,
# its float32 values (44 MB for 3584 x 3072) go to memory and come back for the packer; drawn a 32-row
# strip at a time (384 KB, in L2), each strip is a row of blocks of W^T: maxima, exponents and codes are
# made while the strip is in cache, and only the 0.53 B/weight packed part is written.
#
# The exponent is floor(log2(amax)) - 2 with NumPy's float32 log2 (dtypes.mxfp4_quantize), which rounds
# up to k for amax a few ulps below 2^k. The kernel reads it off amax's bits with a threshold per power
# of two taken from NumPy's log2 itself (`_log2_thresholds`); the exponents NumPy computes from the
# drawn maxima are then compared with the kernel's, and a part where any differs is drawn again the
# plain way (never seen: the thresholds are exact for every float32 near a power of two, a test says so).

_MXFP4_TABLES: tuple[np.ndarray, np.ndarray] | None = None


def _log2_thresholds() -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.float32]]:
    """t[b]: the smallest float32 (as bits) below 2^(b - 127) whose NumPy float32 log2 floors to b - 127
    (the bits of 2^(b - 127) when log2 is exact there), for biased exponents b = 1 .. 254; and inv[e + 127]
    = NumPy's float32 exp2(-e), the reciprocal scale fast.mxfp4_quantize_t multiplies by. Made once, and
    bound in one assignment: the weight store's threads may ask at the same time."""
    global _MXFP4_TABLES
    if _MXFP4_TABLES is None:
        t = np.full(256, 0xFFFFFFFF, np.uint32)  # b = 0 and 255: no threshold (subnormals, inf)
        ulps = np.arange(1, 257, dtype=np.uint32)
        for b in range(1, 255):
            below = ((np.uint32(b) << np.uint32(23)) - ulps).view(np.float32)  # 1 .. 256 ulps below 2^(b-127)
            up = np.floor(np.log2(below)) == b - 127
            t[b] = (np.uint32(b) << np.uint32(23)) - (ulps[up].max() if up.any() else 0)
        _MXFP4_TABLES = t, np.exp2(-np.arange(-127, 128).astype(np.float32)).astype(np.float32)
    return _MXFP4_TABLES


@njit(inline="always")
def _exponent(bits, thresholds):  # type: ignore[no-untyped-def]
    """`fast.mxfp4_exponents` of one block maximum, from its float32 bits (non-negative)."""
    if bits == 0:
        return -2
    b = np.int64(bits >> np.uint32(23))
    e = b - 127
    if b < 254 and bits >= thresholds[b + 1]:
        e += 1  # a few ulps below 2^(e+1): NumPy's log2 rounds up to it
    if b == 0:
        e = -150  # a subnormal: log2 below -126, clipped below
    return max(-127, min(127, e - 2))


@njit(cache=True, nogil=True, _nrt=False)
def _draw_mxfp4_t(state, std, codes, amax_t, exps, wi, ki, fi, thresholds, inv_scale, raw, strip, pairs, inv):  # type: ignore[no-untyped-def]
    """codes [N, K/2] of the part drawn strip by strip, amax_t [K/32, N] its block maxima and exps [K/32, N]
    their exponents (`_exponent`)."""
    u32, pos = raw.view(np.uint32), np.int64(state[CURSOR])
    n_blocks, N = amax_t.shape
    bits_t = amax_t.view(np.uint32)
    for s in range(n_blocks):
        amax, exp = amax_t[s], exps[s]
        amax[:] = 0
        for i in range(32):
            row = strip[i]
            pos = _draw_row(state, raw, u32, pos, std, row, wi, ki, fi)
            fast.max_abs_into(amax, row)
        bits = bits_t[s]
        for n in range(N):
            exp[n] = _exponent(bits[n], thresholds)
            inv[n] = inv_scale[exp[n] + 127]
        for j in range(16):  # fast._pack_codes_t's byte pairs
            fast.code_pairs(strip[2 * j], strip[2 * j + 1], inv, pairs[j])
        fast.pairs_into_rows(pairs, codes, 16 * s)  # this strip's 16 bytes of each row of W^T


FUSED_FALLBACKS = [0]  # parts drawn again the plain way because an exponent differed (tests read it)


def draw_mxfp4_t(seed: np.random.SeedSequence, shape: tuple[int, int], std: float
                 ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """The part `default_rng(seed).standard_normal(shape, float32) * float32(std)` (W [K, N]) packed as
    MXFP4 W^T: `fast.mxfp4_quantize_t` of it, bit for bit, without the float32 part in memory."""
    k, n = shape
    codes, amax_t = np.empty((n, k // 2), np.uint8), np.empty((k // 32, n), np.float32)
    exps = np.empty((k // 32, n), np.int16)
    words = pcg64_words(seed)
    _draw_mxfp4_t(lane_state(words), np.float32(std), codes, amax_t, exps, *tables(), *_log2_thresholds(),
                  np.empty(RAW_WORDS, np.uint64), np.empty((32, n), np.float32), np.empty((16, n), np.uint8),
                  np.empty(n, np.float32))
    exp = fast.mxfp4_exponents(amax_t)
    if not np.array_equal(exp, exps):
        FUSED_FALLBACKS[0] += 1
        w = np.empty(shape, np.float32)
        normal_block_amax(words, np.float32(std), w, amax_t)
        return fast.mxfp4_quantize_t(w, amax_t)
    return codes, np.ascontiguousarray((exp + 127).astype(np.uint8).T)
