"""Numba kernels (simulator/fast/kernels.py) == their .py_func == the NumPy forms they replace (STYLE 14-18).

Integer outputs (codes, scale bits, top-k indices, bf16 widening) are compared exactly; float outputs
with the per-dtype tolerance of tests/numerics.py, reference as `desired`.
"""

import ml_dtypes
import numba
import numpy as np
import pytest

from simulator.fast import kernels as fast
from simulator.dtypes import mxfp4_dequantize, mxfp4_quantize, round_bf16
from simulator.errors import UserError
from simulator.execute import make_backend
from simulator.ops import norm
from simulator.ops.replaceable import replacing
from simulator.fast.packed import BF16Weight, MXFP4Weight
from simulator.dtypes import mxfp4_linear_reference
from simulator.ops.router import route_fused, route_reference
from simulator.weights import LayerWeights, column_shard, row_shard

from numerics import assert_close

DTYPES = [np.float64, np.float32]
DT_IDS = ["float64", "float32"]


def _weights(rng: np.random.Generator, k: int, n: int) -> np.ndarray:
    """N(0, 1/k) float32 with the awkward values: zeros, a negative zero, an all-zero block, and E2M1
    rounding midpoints (a block whose max is 4.0 has scale 1, so 0.25, 0.75, ... 5.0 are exact ties)."""
    w = rng.standard_normal((k, n), dtype=np.float32) * np.float32(k ** -0.5)
    w[3, 0], w[4, 0] = 0.0, -0.0
    w[:32, 1] = 0.0
    ties = np.array([4.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, 7.0, -7.9, 0.1], np.float32)
    w[32:32 + len(ties), 2] = ties
    return w


@pytest.mark.parametrize("k, n, seed", [(32, 1, 0), (64, 7, 1), (256, 33, 2)], ids=["K32-N1", "K64-N7", "K256-N33"])
def test_mxfp4_quantize_t_is_bit_identical(k, n, seed):
    w = (_weights(np.random.default_rng(seed), k, n) if k >= 64
         else np.random.default_rng(seed).standard_normal((k, n), dtype=np.float32))
    codes, bits = fast.mxfp4_quantize_t(w)
    ref = mxfp4_quantize(np.ascontiguousarray(w.T))
    assert codes.shape == ref.packed.shape and codes.dtype == np.uint8
    np.testing.assert_array_equal(codes, ref.packed)
    np.testing.assert_array_equal(bits, ref.scales.view(np.uint8))
    np.testing.assert_array_equal(fast.mxfp4_dequantize_t(codes, bits, np.float32), mxfp4_dequantize(ref).T)


def _near_e2m1_grid() -> np.ndarray:
    """Every float32 within 2,000 ulps of each E2M1 value and midpoint (where the rounding turns), both
    signs, zeros, tiny and huge values, infinities excepted (ml_dtypes saturates those as well)."""
    marks = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0,
                      16.0, 1e-30, 3e38], np.float32)
    near = marks.view(np.int32)[:, None] + np.arange(-2000, 2001, dtype=np.int32)[None, :]
    v = np.unique(near[near >= 0]).view(np.float32)
    v = v[np.isfinite(v)]
    return np.concatenate([v, -v])


def test_e2m1_code_rounds_as_ml_dtypes():
    """The codes `code_pairs` makes (compiled, vectorised) and the plain `e2m1_code` equal ml_dtypes' E2M1
    rounding (ties to even, saturation at 6) where it turns; a wrong tie or a wrong range edge fails it."""
    v = _near_e2m1_grid()
    want = v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    out = np.empty(v.size, np.uint8)
    fast.code_pairs(v, np.zeros_like(v), np.ones_like(v), out)  # low nibble: v's code, high: +0's
    np.testing.assert_array_equal(out & 0xF, want)
    assert not np.any(out >> 4)
    some = v[:: max(1, v.size // 3000)]
    np.testing.assert_array_equal([fast.e2m1_code.py_func(x) for x in some], want[:: max(1, v.size // 3000)])


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("m, k, n", [(1, 64, 5), (3, 96, 7), (9, 256, 64)],
                         ids=["M1-K64-N5", "M3-K96-N7", "M9-K256-N64"])
def test_mxfp4_matmul_fused_matches_reference(m, k, n, dtype):
    rng = np.random.default_rng(m * k + n)
    q = mxfp4_quantize(np.ascontiguousarray(_weights(rng, k, n).T))
    x = rng.standard_normal((m, k)).astype(dtype)
    ref = mxfp4_linear_reference(x, q)  # dequantize, then one GEMM
    bits = q.scales.view(np.uint8)
    jitted = fast.mxfp4_matmul(x, q.packed, bits)
    assert jitted.shape == (m, n) and jitted.dtype == dtype
    assert_close(jitted, ref, dtype)
    py, parallel = np.empty_like(jitted), np.empty_like(jitted)
    xe, xo = np.ascontiguousarray(x[:, 0::2]), np.ascontiguousarray(x[:, 1::2])
    fast._mxfp4_rows.py_func(xe, xo, q.packed, bits, fast.E8M0_HALF_F32, py, 0, n)
    fast._mxfp4_matmul_parallel(xe, xo, q.packed, bits, fast.E8M0_HALF_F32, parallel, 3)
    assert_close(jitted, py, dtype)
    assert_close(parallel, py, dtype)
    strided = np.zeros((n, k), np.uint8)  # a row shard of a wider packed weight is a strided view
    strided[:, 3:3 + k // 2] = q.packed
    assert_close(fast.mxfp4_matmul(x, strided[:, 3:3 + k // 2], bits), jitted, dtype)


@pytest.mark.parametrize("bits", [0, 1, 120, 127, 140, 252], ids=lambda b: f"E8M0-{b}")
def test_decode_block_shuffle_equals_table(bits):
    """The byte-shuffle decode (LLVM vector IR) == the plain table form, exactly, for every code byte
    and scales from 2^-127 (subnormal halves) to 2^125."""
    row = np.arange(256, dtype=np.uint8)
    half = fast.E8M0_HALF_F32[bits]
    want = np.full((2, 256), np.nan, np.float32)
    got = want.copy()
    for j in range(0, 256, 16):
        fast.decode_block(row, j, half, *want)
    _decode_all(row, half, *got)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want[0], (fast.E2M1[row & 15] * fast.E8M0[bits]).astype(np.float32))
    np.testing.assert_array_equal(want[1], (fast.E2M1[row >> 4] * fast.E8M0[bits]).astype(np.float32))


@numba.njit
def _decode_all(row, half, even, odd):
    for j in range(0, row.size, 16):
        fast.decode_block(row, j, half, even, odd)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("k0, width", [(0, 64), (32, 32), (5, 40), (17, 1)],
                         ids=["aligned", "block", "odd-start", "one"])
def test_mxfp4_weight_row_slice_matches_dequantized(k0, width, dtype):
    rng = np.random.default_rng(k0 + width)
    w = _weights(rng, 128, 6)
    codes, bits = fast.mxfp4_quantize_t(w)
    dense = fast.mxfp4_dequantize_t(codes, bits, np.float64)[k0:k0 + width]  # [width, N]
    x = rng.standard_normal((4, width)).astype(dtype)
    shard = MXFP4Weight(codes, bits, k0, width)
    assert shard.shape == dense.shape
    assert_close(x @ shard, (x.astype(np.float64) @ dense).astype(dtype), dtype)
    np.testing.assert_array_equal(np.asarray(shard, np.float64), dense)


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_packed_expert_shards_equal_dense_shards(tiny, tp):
    w = LayerWeights(tiny, 2, 5)
    dense = w.expert(3, np.float64)
    rng = np.random.default_rng(tp)
    for r in range(tp):
        shards = [MXFP4Weight(*q).shard(how, r, tp) for q, how in zip(w.expert_packed(3), ("col", "col", "row"))]
        ref = (column_shard(dense[0], r, tp), column_shard(dense[1], r, tp), row_shard(dense[2], r, tp))
        for got, want in zip(shards, ref):
            x = rng.standard_normal((3, want.shape[0]))
            assert got.shape == want.shape
            assert_close(x @ got, x @ want, np.float64)


def test_packed_experts_are_the_same_numbers(tiny):
    """The packed path draws, scales and rounds exactly as the float path it replaces (`_make`)."""
    w = LayerWeights(tiny, 2, 11)
    for e in (0, 17):
        for part, got in zip(("w_gate", "w_up", "w_down"), w.expert(e)):
            np.testing.assert_array_equal(got, w._make(f"expert.{e}.{part}"))


def test_expert_cache_is_bounded_keeps_what_it_has_and_regenerates_identically(tiny):
    one = sum(c.nbytes + s.nbytes for c, s in LayerWeights(tiny, 2, 3).expert_packed(0))
    w = LayerWeights(tiny, 2, 3, expert_cache_bytes=2 * one)
    first = {e: [c.copy() for c, _ in w.expert_packed(e)] for e in range(6)}  # one pass, room for 2 experts
    assert w._experts.nbytes <= 2 * one and w.expert_generations == 18 and 0 in w.cached_experts()
    made = w.expert_generations
    w.expert_packed(0)
    assert w.expert_generations == made  # kept: the next pass finds it
    for got, want in zip(w.expert_packed(4), first[4]):
        np.testing.assert_array_equal(got[0], want)
    assert w.expert_generations == made + 3  # expert 4 gave way, and comes back the same


def test_dense_weights_held_as_bf16_and_read_back_exactly(tiny):
    w = LayerWeights(tiny, 1, 0)
    r = w["router.w"]
    assert w._held["router.w"].dtype == ml_dtypes.bfloat16 and r.dtype == np.float32
    np.testing.assert_array_equal(r, w._make("router.w"))
    np.testing.assert_array_equal(w.shard("router.w", np.float64, "col", 1, 4),
                                  column_shard(r, 1, 4).astype(np.float64))
    np.testing.assert_array_equal(w.shard("router.w", np.float64, "row", 3, 4), row_shard(r, 3, 4).astype(np.float64))
    assert w["kda.a_log"].dtype == np.float32 and w._held["kda.a_log"].dtype == np.float32  # FP32 in the checkpoint


def test_bf16_widening_is_exact():
    x = np.random.default_rng(0).standard_normal((37, 19)).astype(ml_dtypes.bfloat16)
    for dtype in DTYPES:
        got = fast.bf16_to(x.view(np.uint16)[:, 3:11], dtype)
        assert got.dtype == dtype and got.flags.c_contiguous
        np.testing.assert_array_equal(got, x[:, 3:11].astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("m, d, s", [(1, 64, 1), (5, 33, 3), (8, 7, 9)], ids=["M1-D64-S1", "M5-D33-S3", "M8-D7-S9"])
def test_norm_kernels_match_reference(m, d, s, dtype):
    rng = np.random.default_rng(m + d + s)
    sources = [rng.standard_normal((m, d)).astype(dtype) for _ in range(s)]
    nw, pw = 1 + 0.1 * rng.standard_normal(d), rng.standard_normal(d) / np.sqrt(d)
    mix = fast.attn_res_mix(sources, nw, pw, 1e-5)
    assert mix.shape == (m, d) and mix.dtype == dtype
    assert_close(mix, norm.attn_res_mix_reference(sources, nw, pw, 1e-5), dtype)
    out = np.empty_like(sources[0])
    fast._attn_res_mix.py_func(np.stack(sources), (nw * pw).astype(dtype), dtype(1e-5), out)
    assert_close(mix, out, dtype)
    assert_close(fast.rms_norm(sources[0], nw, 1e-5), norm.rms_norm_reference(sources[0], nw, 1e-5), dtype)


def test_topk_order_is_the_stable_argsort():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((6, 40))
    scores[0, 5] = scores[0, 9] = scores[0, 30] = 9.0  # a three-way tie at the top: lower index first
    scores[1, :] = 0.25  # all tied
    scores[2, 10:] = -np.inf  # fewer eligible than asked for
    scores[3, 7] = scores[3].max()  # tie with the maximum, later index
    for k in (1, 4, 17, 40):
        want = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
        np.testing.assert_array_equal(fast.topk_order(scores, k), want)
        py = np.empty_like(want)
        fast._topk_order.py_func(scores, py)
        np.testing.assert_array_equal(py, want)


@pytest.mark.parametrize("backend", ["fast", "numpy"])
def test_route_fused_same_under_both_backends(tiny, backend):
    rng = np.random.default_rng(3)
    logits, bias = rng.standard_normal((9, tiny.num_experts)), rng.standard_normal(tiny.num_experts) * 0.05
    with replacing(make_backend(backend).replacements if backend == "fast" else {}):
        got = route_fused(logits, bias, tiny).topk_idx
    np.testing.assert_array_equal(got, route_reference(logits, bias, tiny).topk_idx)


def test_backend_names():
    assert make_backend("numpy") is None and make_backend("fast").replacements
    with pytest.raises(UserError, match="unknown backend 'numba'"):
        make_backend("numba")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("m, k, n", [(1, 7, 5), (3, 64, 600), (40, 33, 1100)],
                         ids=["M1-K7-N5", "M3-K64-N600", "M40-K33-N1100"])
def test_bf16_matmul_matches_widened_gemm(m, k, n, dtype, monkeypatch):
    """Reading bf16 bits (a strided column shard, several 512-wide tiles) == widen then GEMM; one thread, the
    threads' split and no prefetch give the same bits; a view whose columns are not adjacent is copied first,
    and shapes that do not multiply are refused (the rows are read by address)."""
    rng = np.random.default_rng(m + k + n)
    w = rng.standard_normal((k, 2 * n)).astype(ml_dtypes.bfloat16)
    bits = w.view(np.uint16)[:, n // 2:n // 2 + n]  # [K, N], row stride 2N
    x = rng.standard_normal((m, k)).astype(dtype)
    ref = x @ w[:, n // 2:n // 2 + n].astype(dtype)
    got = fast.bf16_matmul(x, bits)
    assert got.shape == (m, n) and got.dtype == dtype
    assert_close(got, ref, dtype)
    py, one, parallel = np.empty_like(got), np.empty_like(got), np.empty_like(got)
    fast._bf16_matmul_cols.py_func(x, bits, py, 0, n, fast.BF16_AHEAD)
    fast._bf16_matmul_cols(x, bits, one, 0, n, 0)  # no prefetch
    fast._bf16_matmul_parallel(x, bits, parallel, 3, 64)  # three column ranges, not on 512-column tiles
    assert_close(py, ref, dtype)
    np.testing.assert_array_equal(parallel, one)  # each y[m, n] sums over k in order, however split or asked for
    np.testing.assert_array_equal(got, one)
    monkeypatch.setattr(fast, "BF16_PARALLEL_BYTES", 0)  # bf16_matmul's own dispatch to the threads
    np.testing.assert_array_equal(fast.bf16_matmul(x, bits), one)
    every_other = w.view(np.uint16)[:, n // 2:n // 2 + 2 * n:2]  # columns 4 bytes apart: copied, then read
    assert_close(fast.bf16_matmul(x, every_other), x @ w[:, n // 2:n // 2 + 2 * n:2].astype(dtype), dtype)
    with pytest.raises(ValueError, match="do not multiply"):  # rows are read by address: never past W
        fast.bf16_matmul(x[:, :-1], bits)
    held = BF16Weight((bits[:, :n // 3], bits[:, n // 3:]), np.dtype(dtype))  # two packed blocks, as the executor
    # hands a packed projection: skinny x reads the bits, wide x widens
    assert_close(x @ held, ref, dtype)
    np.testing.assert_array_equal(np.asarray(held), w[:, n // 2:n // 2 + n].astype(dtype))
    np.testing.assert_array_equal(held.reshape(-1), np.asarray(held).reshape(-1))


# ===================================================================== grouped MXFP4 (routed experts)
def _packed(rng: np.random.Generator, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    w = _weights(rng, k, n) if k >= 64 else rng.standard_normal((k, n), dtype=np.float32)
    return fast.mxfp4_quantize_t(w)


def _table(weights: list[MXFP4Weight]) -> np.ndarray:
    return np.array([w.packed_rows() for w in weights], np.int64)


def test_permute_x_puts_each_weight_where_the_lanes_read_it():
    """Position j L + i of a 128-weight step holds x[(128/L) i + j] (L lanes of 128/L nibbles), zero-padded."""
    for dtype in DTYPES:
        x = np.arange(1, 2 * 200 + 1, dtype=dtype).reshape(2, 200)
        xp = fast.permute_x(x)
        width, per = fast.lanes(dtype), 128 // fast.lanes(dtype)
        assert xp.shape == (2, 256)
        for k in (0, 1, per - 1, per, 127, 128, 199):
            step, q = divmod(k, 128)
            assert xp[1, 128 * step + (q % per) * width + q // per] == x[1, k]
        assert np.count_nonzero(xp[0]) == 200


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("k", [32, 64, 96, 128, 192, 256, 416], ids=lambda k: f"K{k}")
def test_mxfp4_dot_avx512_equals_plain_form_and_dequantized_product(k, dtype):
    """The AVX-512 dot (full 64-byte steps, tails of 1 and 3 blocks, and the half step a tail of 2 takes: K = 64
    and 192) == the weight-by-weight form compiled
    == its plain Python == x @ dequantize(W^T).T."""
    rng = np.random.default_rng(k)
    codes, bits = _packed(rng, k, 5)
    bits[1, 0], bits[2, -1] = 0, 200  # the smallest scale (2^-127, subnormal in float32) and a large one
    x = rng.standard_normal((1, k)).astype(dtype)
    xp, lut = fast.permute_x(x)[0], fast.value_lut(dtype)
    want = (x.astype(np.float64) @ fast.mxfp4_dequantize_t(codes, bits, np.float64))[0]
    simd = _dots_simd(codes, bits, lut, xp)
    loops = _dots_loops(codes, bits, lut, xp)
    plain = np.array([fast.mxfp4_dot(codes[n], 0, bits[n], 0, lut, xp, 0, k // 2) for n in range(5)], dtype)
    for got in (simd, loops, plain):
        assert_close(got, want.astype(dtype), dtype)
    if fast.has_avx512():  # the AVX-512 form did run: its table lookup is in the machine code
        asm = next(a for sig, a in _dots_simd.inspect_asm().items() if f"Array({np.dtype(dtype).name}, 1" in str(sig))
        wanted = ("vpermps", "vpermd") if dtype == np.float32 else ("vpermi2pd", "vpermt2pd")  # LLVM's choice
        assert any(op in asm for op in wanted)


BF16_DOT = pytest.mark.skipif(not fast.has_bf16_dot(), reason="no AVX-512 BF16 on this host")


def test_permute_x_bf16_puts_each_weight_where_the_words_read_it():
    """Whole pairs of 64-weight steps: position 128 p + 32 j + 16 h + i holds weight 128 p + 64 h + 4 i + j (step
    2p + h, nibble j of its word i); an odd last step and a tail step: position 16 j + i of the step holds its
    weight 4 i + j. As bfloat16 bits, zero-padded."""
    for k in (200, 256, 96):  # 3 whole steps and a tail: one pair, one step alone; two pairs; one step and a tail
        x = (np.arange(2 * k, dtype=np.float32).reshape(2, k) % 255 + 1)  # integers 1-255: exact in bfloat16
        xb = fast.permute_x_bf16(x)
        assert xb.shape == (2, 64 * -(-k // 64)) and xb.dtype == np.uint16
        for w in range(k):
            step, q = divmod(w, 64)
            i, j = divmod(q, 4)
            at = 128 * (step // 2) + 32 * j + 16 * (step % 2) + i if w < 128 * (k // 128) else 64 * step + 16 * j + i
            assert fast.bf16_value(xb[1, at]) == x[1, w], (k, w)
        assert np.count_nonzero(xb[0]) == k


def test_bf16_value_is_the_bfloat16():
    bits = np.arange(1 << 16, dtype=np.uint16)
    finite = (bits & 0x7F80) != 0x7F80
    want = bits[finite].view(ml_dtypes.bfloat16).astype(np.float32)
    got = np.array([fast.bf16_value(b) for b in bits[finite][::97]], np.float32)
    np.testing.assert_array_equal(got, want[::97])


def test_permute_x_takes_the_bf16_layout_only_for_bfloat16_values(monkeypatch):
    x = np.random.default_rng(0).standard_normal((3, 96)).astype(np.float32)
    assert fast.permute_x(x).dtype == np.float32  # not bfloat16 values: the float32 dot
    assert fast.permute_x(round_bf16(x).astype(np.float64)).dtype == np.float64
    assert fast.permute_x(round_bf16(x)).dtype == (np.uint16 if fast.has_bf16_dot() else np.float32)


@BF16_DOT
@pytest.mark.parametrize("k", [32, 64, 96, 128, 192, 256, 416], ids=lambda k: f"K{k}")
def test_mxfp4_dot_bf16_equals_plain_form_and_dequantized_product(k):
    """The AVX-512 BF16 dot (whole 32-byte steps, odd step counts, a one-block tail) == the weight-by-weight
    form compiled == its plain Python == x @ dequantize(W^T).T, for bfloat16 x with float32 sums."""
    rng = np.random.default_rng(k)
    codes, bits = _packed(rng, k, 5)
    bits[1, 0], bits[2, -1] = 0, 200  # the smallest scale (2^-127, subnormal in float32) and a large one
    x = round_bf16(rng.standard_normal((1, k)).astype(np.float32))
    xb, lut = fast.permute_x_bf16(x)[0], fast.value_lut(np.float32)
    want = (x.astype(np.float64) @ fast.mxfp4_dequantize_t(codes, bits, np.float64))[0].astype(np.float32)
    simd = _dots_simd(codes, bits, lut, xb)
    loops = _dots_loops(codes, bits, lut, xb)
    plain = np.array([fast.mxfp4_dot(codes[n], 0, bits[n], 0, lut, xb, 0, k // 2) for n in range(5)], np.float32)
    for got in (simd, loops, plain):
        assert_close(got, want, np.float32)
    asm = next(a for sig, a in _dots_simd.inspect_asm().items() if "Array(uint16, 1" in str(sig))
    assert "vdpbf16ps" in asm and "vpermw" in asm


def _bf16_dot_by_lanes(codes: np.ndarray, bits: np.ndarray, x: np.ndarray) -> np.float32:
    """What `mxfp4_dot_bf16` computes, written out in NumPy float32 from Intel's definition of `vdpbf16ps`
    (lane l += w[2l+1] x[2l+1], then += w[2l] x[2l], each product exact, each add rounded): a 32-byte step's
    16 words feed 8 lanes (words 2l, 2l+1), nibbles 0 and 2 one chain, 1 and 3 another; their sum times the
    lanes' block scales (lanes 0-3 block 0, 4-7 block 1) is added to the even or the odd steps' sums (an odd
    last step to the even ones, a one-block tail to the odd ones); the two are added and the 8 lanes summed
    i + size/2 into i. For normal-range values, where DAZ/FTZ do nothing."""
    f32 = np.float32
    w = fast.E2M1.astype(f32)[np.stack([codes & 15, codes >> 4], axis=1).ravel()]
    scale = (2.0 ** (bits.astype(np.float64) - 127)).astype(f32)
    acc = [np.zeros(8, f32), np.zeros(8, f32)]
    for c in range(-(-len(codes) // 32)):
        wc, xc = np.zeros(64, f32), np.zeros(64, f32)
        n = min(64, len(w) - 64 * c)
        wc[:n], xc[:n] = w[64 * c:64 * c + n], x[64 * c:64 * c + n]
        chains = [np.zeros(8, f32), np.zeros(8, f32)]
        for j in range(4):
            lo, hi = 8 * np.arange(8) + j, 8 * np.arange(8) + 4 + j  # word 2l's nibble j, word 2l+1's
            ch = chains[j % 2]
            ch[:] = ch + wc[hi] * xc[hi]
            ch[:] = ch + wc[lo] * xc[lo]
        lanes_scale = np.repeat(np.append(scale[2 * c:2 * c + 2], f32(0))[:2], 4)
        k = 1 if n < 64 else (c % 2 if c < 2 * (len(codes) // 64) else 0)
        acc[k] = (acc[k].astype(np.float64) + (chains[0] + chains[1]).astype(np.float64) * lanes_scale).astype(f32)
    total = acc[0] + acc[1]
    while len(total) > 1:
        total = total[:len(total) // 2] + total[len(total) // 2:]
    return total[0]


@BF16_DOT
@pytest.mark.parametrize("k", [32, 96, 128, 192, 224, 416, 7168], ids=lambda k: f"K{k}")
def test_mxfp4_dot_bf16_bits_follow_its_lanes(k):
    """The bf16 dot bit for bit as `_bf16_dot_by_lanes` writes it out: the 512-bit loop over pairs of steps
    sums the same products in the same order as one 256-bit step at a time (its form until 2026-12-01)."""
    from simulator.jit import compile_all
    compile_all()  # binds mxfp4_dot's overload when this test runs alone
    rng = np.random.default_rng(k + 1)
    codes = rng.integers(0, 256, (32, k // 2), dtype=np.uint8)
    bits = rng.integers(112, 142, (32, k // 32), dtype=np.uint8)
    x = round_bf16((rng.standard_normal(k) * 10.0 ** rng.integers(-2, 3, k)).astype(np.float32))
    got = _dots_simd(codes, bits, fast.value_lut(np.float32), fast.permute_x_bf16(x[None])[0])
    want = np.array([_bf16_dot_by_lanes(codes[n], bits[n], x) for n in range(32)], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@numba.njit
def _dots_simd(codes, bits, lut, xp):
    out = np.empty(codes.shape[0], lut.dtype)
    for n in range(codes.shape[0]):
        out[n] = fast.mxfp4_dot(codes[n], 0, bits[n], 0, lut, xp, 0, codes.shape[1])
    return out


@numba.njit
def _dots_loops(codes, bits, lut, xp):
    out = np.empty(codes.shape[0], lut.dtype)
    for n in range(codes.shape[0]):
        out[n] = fast._dot_loops(codes[n], 0, bits[n], 0, lut, xp, 0, codes.shape[1], False)
    return out


AVX512 = pytest.mark.skipif(not fast.has_avx512(), reason="grouped_matmul runs on AVX-512 hosts only")


@AVX512
@pytest.mark.parametrize("dtype", DTYPES + ["bfloat16"], ids=DT_IDS + ["bfloat16"])
@pytest.mark.parametrize("m", [1, 4])
def test_mxfp4_grouped_equals_products_of_the_shards(m, dtype):
    """Column shards, block-aligned row shards (strided rows) and whole weights of different experts in
    one call: compiled (one thread and the parallel split) == .py_func == the dequantized products; every
    rank's shard of a whole weight (`grouped_matmul`'s table from the whole rows) == the shard's own product.
    bfloat16: float32 x holding bfloat16 values, which the grouped call multiplies with the bf16 dot."""
    rng = np.random.default_rng(m)
    bf16, dtype = dtype == "bfloat16", np.float32 if dtype == "bfloat16" else dtype
    values = round_bf16 if bf16 else (lambda a: a)
    gate, down = _packed(rng, 256, 96), _packed(rng, 96, 256)
    shards = [MXFP4Weight(*gate).shard("col", 1, 3), MXFP4Weight(*gate).shard("col", 2, 3)]  # [256, 32] each
    rows = [MXFP4Weight(*down).shard("row", r, 3) for r in range(3)]  # [32, 256] each, k0 = 0, 32, 64
    x = values(rng.standard_normal((m + 2, 256)).astype(dtype))
    tokens = [np.arange(m), np.arange(2, m + 2)]
    y = linear_grouped([x], [(tokens[0], tuple(shards)), (tokens[1], tuple(shards))])[0]
    want = np.concatenate([x[t].astype(np.float64) @ np.concatenate([np.asarray(s, np.float64) for s in shards], axis=1)
                           for t in tokens])
    assert_close(y, want.astype(dtype), dtype)
    xs = [values(rng.standard_normal((m + 2, 256)).astype(dtype)) for _ in range(3)]  # every rank its column shard
    together = linear_grouped(xs, [(t, (MXFP4Weight(*gate),)) for t in tokens], ("col",))
    for r in range(3):
        np.testing.assert_array_equal(together[r], linear_grouped(
            [xs[r]], [(t, (MXFP4Weight(*gate).shard("col", r, 3),)) for t in tokens])[0])
    h = values(rng.standard_normal((3 * m, 32)).astype(dtype))
    groups = [(np.arange(r * m, (r + 1) * m), (w,)) for r, w in enumerate(rows)]
    table, items = _table(rows), _items(rows, m)
    xp = fast.permute_x(h)
    assert xp.dtype == (np.uint16 if bf16 and fast.has_bf16_dot() else dtype)
    got = fast.mxfp4_grouped(xp, np.arange(3 * m), table, items, 256)
    want = np.concatenate([h[g].astype(np.float64) @ np.asarray(w[0], np.float64) for g, w in groups])
    assert_close(got, want.astype(dtype), dtype)
    ranks = linear_grouped([h[g] for g, _ in groups], [(np.arange(m), (MXFP4Weight(*down),))], ("row",))
    np.testing.assert_array_equal(ranks.reshape(got.shape), got)
    py, parallel = np.zeros_like(got), np.zeros_like(got)
    lut = fast.value_lut(dtype)
    fast._mxfp4_grouped_items.py_func(xp, np.arange(3 * m), table, items, lut, 256, py, 0, len(items))
    fast._mxfp4_grouped_parallel(xp, np.arange(3 * m), table, items, lut, 256, parallel, 5)
    assert_close(py, got, dtype)
    np.testing.assert_array_equal(parallel, got)  # each entry is one dot, however the items are split


def test_grouped_runs_are_the_ranks_slices_of_the_same_rows():
    """`fast._run_end`: the TP row shards of one weight, same rows, side by side in memory, form one run
    (read row by row); column shards and whole weights are runs of one."""
    rng = np.random.default_rng(3)
    down = MXFP4Weight(*_packed(rng, 128, 64))
    rows = [down.shard("row", r, 4) for r in range(4)]  # 16 bytes a row each, one after another
    cols = [MXFP4Weight(*_packed(rng, 64, 96)).shard("col", r, 3) for r in range(3)]
    for weights, run in ((rows, 4), (cols, 1)):
        wtab = _table(weights)
        items = np.array([(w, n0, n0 + 32, n0, w, w + 1) for n0 in (0, 32) for w in range(len(weights))], np.int64)
        ends = [fast._run_end(wtab, items, i, len(items)) - i for i in range(0, len(items), run)]
        assert ends == [run] * (len(items) // run)
    wtab = _table(rows[::-1])  # not in memory order: no run
    assert fast._run_end(wtab, np.array([(w, 0, 32, 0, w, w + 1) for w in range(4)], np.int64), 0, 4) == 1


def _items(weights: list[MXFP4Weight], m: int) -> np.ndarray:
    return np.array([(w, n0, n0 + 32, n0, w * m, (w + 1) * m) for w in range(len(weights)) for n0 in range(0, 256, 32)],
                    np.int64)


def linear_grouped(xs, groups, shards=None):  # type: ignore[no-untyped-def]
    from simulator.fast.packed import grouped_matmul
    y = grouped_matmul(xs, groups, shards)
    assert y is not None
    return y


@AVX512
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bfloat16"])
def test_mxfp4_grouped_float32_scales_past_2_126_scale_each_weight(bf16):
    """E8M0 bits >= 253: 6 x 2^126 overflows float32, so such rows multiply c s per weight, as the
    dequantized float32 W does (inf where it is inf), and the other rows are untouched; with bfloat16 x
    too (those rows then read the bf16 dot's order weight by weight)."""
    rng = np.random.default_rng(5)
    codes, bits = _packed(rng, 64, 4)
    codes[0, :] = 0x77  # every weight of row 0 is 6.0 x its scale
    bits[0, 0], bits[1, 1] = 253, 253
    x = np.abs(rng.standard_normal((1, 64))).astype(np.float32)
    x = round_bf16(x) if bf16 else x
    w = MXFP4Weight(codes, bits)
    got = linear_grouped([x], [(np.arange(1), (w,))])[0]
    with np.errstate(over="ignore", invalid="ignore"):
        want = x @ np.asarray(w, np.float32)
    assert np.isinf(want[0, 0]) and np.isinf(got[0, 0])
    assert_close(got[:, 1:], want[:, 1:], np.float32)
    # the same rows as two ranks' K slices side by side: one run (`fast._run_end`), row by row
    codes[1, 16:32] = 0  # row 1's block 1 (scale 253) as +6 and -6 2^126 only: inf - inf in the float32 W, a nan
    codes[1, 16] = 0x7F  # that scaling the block's partial sum (a finite 6 (x_33 - x_32) 2^126) would miss
    shards = [w.shard("row", r, 2) for r in range(2)]  # rank 0: block 0 (scale 253 in row 0), rank 1: block 1
    got = linear_grouped([x[:, :32], x[:, 32:]], [(np.arange(1), (w,))], ("row",))[:, 0]
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.concatenate([x[:, 32 * r:32 * r + 32] @ np.asarray(s, np.float32) for r, s in enumerate(shards)])
    assert np.isinf(want[0, 0]) and np.isnan(want[1, 1]) and np.isfinite(want[1, 0])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))  # inf and nan where the float32 W has them
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    assert_close(got[np.isfinite(want)], want[np.isfinite(want)], np.float32)


def test_transpose_16_compiled_equals_its_plain_form():
    """`fast.transpose_16` compiled (`numba_ext.transpose_16_simd`'s shuffles) moves the same bytes as its
    plain loops, at tile offsets that are not multiples of 16 and with the destination's other bytes kept."""
    from simulator.jit import compile_all
    compile_all()  # binds the overload

    @numba.njit
    def tiles(s, d, at):  # type: ignore[no-untyped-def]
        for i in range(at.shape[0]):
            fast.transpose_16(s, at[i, 0], d, at[i, 1])

    rng = np.random.default_rng(11)
    src = rng.integers(0, 256, (16, 70), dtype=np.uint8)
    at = np.array([(0, 0), (5, 16), (54, 33), (21, 3)], np.int64)
    plain = rng.integers(0, 256, (70, 60), dtype=np.uint8)
    compiled = plain.copy()
    tiles(src, compiled, at)
    for n0, c0 in at:
        fast.transpose_16(src, n0, plain, c0)
    np.testing.assert_array_equal(compiled, plain)
    np.testing.assert_array_equal(plain[21:37, 3:19], src[:, 21:37].T)
