"""Router, experts, norms and collectives: fused == reference (STYLE items 15-18)."""

import numpy as np
import pytest

from simulator.ops import collectives as col
from simulator.ops import experts as ex
from simulator.fast import kernels as expert_kernels
from simulator.ops import norm
from simulator.ops.router import route_fused, route_reference
from simulator.weights import LayerWeights

from numerics import assert_close

DTYPES = [np.float64, np.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("m, d, s", [(1, 64, 1), (5, 33, 3), (8, 7, 9)], ids=lambda v: str(v))
def test_attn_res_mix_fused_matches_reference(m, d, s, dtype):
    rng = np.random.default_rng(m + d + s)
    sources = [rng.standard_normal((m, d)).astype(dtype) for _ in range(s)]
    nw, pw = 1 + 0.1 * rng.standard_normal(d), rng.standard_normal(d) / np.sqrt(d)
    assert_close(norm.attn_res_mix(sources, nw, pw, 1e-5), norm.attn_res_mix_reference(sources, nw, pw, 1e-5), dtype)
    assert_close(norm.rms_norm(sources[0], nw, 1e-5), norm.rms_norm_reference(sources[0], nw, 1e-5), dtype)


def test_attn_res_single_source_is_identity():
    x = np.random.default_rng(0).standard_normal((3, 16))
    np.testing.assert_array_equal(norm.attn_res_mix([x], np.ones(16), np.ones(16), 1e-5), x)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("model", ["tiny", "tiny_ds"])
def test_route_fused_matches_reference(request, model, seed):
    cfg = request.getfixturevalue(model)
    rng = np.random.default_rng(seed)
    logits, bias = rng.standard_normal((9, cfg.num_experts)), rng.standard_normal(cfg.num_experts) * 0.05
    ref, fused = route_reference(logits, bias, cfg), route_fused(logits, bias, cfg)
    np.testing.assert_array_equal(fused.topk_idx, ref.topk_idx)
    assert_close(fused.topk_weight, ref.topk_weight, np.float64)
    assert np.all(ref.margin >= 0)
    if cfg.renormalize:
        np.testing.assert_allclose(ref.topk_weight.sum(-1), cfg.routed_scaling_factor)


def test_bias_selects_but_does_not_weight(tiny):
    logits = np.zeros((1, tiny.num_experts))
    logits[0, :] = np.linspace(-1, 1, tiny.num_experts)
    bias = np.zeros(tiny.num_experts)
    bias[0] = 10.0  # expert 0 has the lowest score but is forced in by the bias
    r = route_reference(logits, bias, tiny)
    assert r.topk_idx[0, 0] == 0
    scores = 1 / (1 + np.exp(-logits[0, r.topk_idx[0]]))
    np.testing.assert_allclose(r.topk_weight[0], scores / scores.sum())


def test_tie_break_lower_index_wins(tiny):
    logits = np.zeros((1, tiny.num_experts))  # every score ties
    for route in (route_reference, route_fused):
        r = route(logits, np.zeros(tiny.num_experts), tiny)
        np.testing.assert_array_equal(r.topk_idx[0], np.arange(tiny.top_k))
        assert r.margin[0] == 0.0


def test_grouped_topk_only_uses_best_groups(tiny_ds):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((16, tiny_ds.num_experts))
    r = route_reference(logits, np.zeros(tiny_ds.num_experts), tiny_ds)
    per_group = tiny_ds.num_experts // tiny_ds.n_group
    for t in range(16):
        assert len(set(r.topk_idx[t] // per_group)) <= tiny_ds.topk_group


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("m", [1, 4, 11])
def test_fused_and_unfused_expert_kernels_match_reference(tiny, m, dtype):
    w = LayerWeights(tiny, 1, 0)
    rng = np.random.default_rng(m)
    z = rng.standard_normal((m, tiny.expert_in_dim)).astype(dtype)
    r = route_reference(rng.standard_normal((m, tiny.num_experts)), np.zeros(tiny.num_experts), tiny)
    expert = lambda e: tuple(t.astype(dtype) for t in w.expert(e))  # noqa: E731
    ref = ex.routed_experts_reference(z, r.topk_idx, r.topk_weight.astype(dtype), expert, tiny)
    gate_up, down = (lambda e: expert(e)[:2]), (lambda e: expert(e)[2:])  # the parts each kernel declares
    h = ex.expert_fc1(z, r.topk_idx, gate_up, cfg=tiny)
    fused = ex.expert_fc2_finalize(h, r.topk_idx, r.topk_weight.astype(dtype), down)  # the specialized plan's pair
    assert_close(fused, ref, dtype)
    chain = ex.expert_finalize(ex.expert_fc2(h, r.topk_idx, down), r.topk_weight.astype(dtype))
    assert_close(chain, ref, dtype)
    assert_close(fused, chain, dtype)


def test_situ_is_bounded(tiny):
    g = np.linspace(-1e4, 1e4, 101)
    y = ex.glu(g, g, tiny)
    assert np.all(np.abs(y) <= tiny.situ_beta * tiny.situ_linear_beta + 1e-9)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("model", ["tiny", "tiny_ds"])
def test_glu_product_is_glu_within_a_few_ulp(request, model, dtype):
    """The kernels' activation (`sigmoid_exp`, in place) against the definition: SiTU and SiLU, gates out to
    +-40 where the sigmoid is e^-40 (normal in float32, so the error is relative). Measured: <= 15 ulp."""
    cfg = request.getfixturevalue(model)
    gu = (8 * np.random.default_rng(0).standard_normal((4, 16, 2 * 192))).astype(dtype)
    ref = ex.glu(*np.split(gu, 2, axis=-1), cfg)
    got = ex.glu_product(gu, cfg)
    assert got.dtype == dtype
    assert np.all(np.abs(got - ref) <= 32 * np.spacing(np.abs(ref)))


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
def test_sigmoid_exp_is_its_two_branches_bit_for_bit(dtype):
    """1 / (1 + t) for x >= 0 and t / (1 + t) below, t = e^-|x|, element by element in Python: the same bits
    as the vector form, for +-0, +-inf, NaN, subnormals, the edges of exp and random values."""
    from simulator.ops.pointwise import sigmoid_exp
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e-310, 88.0, -88.0, 104.0, -104.0, 800.0, -800.0]
    x = np.concatenate([np.array(special), 30 * np.random.default_rng(1).standard_normal(997)]).astype(dtype)
    want = np.empty_like(x)
    for i, v in enumerate(x):
        t = np.exp(-np.abs(v))
        want[i] = (dtype(1) if v >= 0 else t) / (dtype(1) + t)
    got = sigmoid_exp(x)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.view(f"u{x.itemsize}"), want.view(f"u{x.itemsize}"))


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
def test_scale_add_rows_is_scale_then_add_at(monkeypatch, dtype):
    """Compiled and its .py_func == scale in out's dtype, then np.add.at, bit for bit: a row repeated adds in
    order, a float64 weight rounds to float32 before the product (no FMA either)."""
    rng = np.random.default_rng(0)
    rows, weight = np.array([2, 0, 2, 1, 2]), rng.random(5)
    values, start = rng.standard_normal((5, 37)).astype(dtype), rng.standard_normal((3, 37)).astype(dtype)
    want = start.copy()
    np.add.at(want, rows, weight.astype(dtype)[:, None] * values)
    got = start.copy()
    expert_kernels.scale_add_rows(got, rows, weight, values)
    np.testing.assert_array_equal(got, want)
    py = start.copy()
    expert_kernels._scale_add_rows.py_func(py, rows, weight.astype(dtype), values)
    np.testing.assert_array_equal(py, want)


@pytest.mark.parametrize("p", [1, 2, 4, 8, 16])
def test_collectives(p):
    rng = np.random.default_rng(p)
    parts = [rng.standard_normal((3, 32)) for _ in range(p)]
    one = col.all_reduce_one_shot(parts)
    two = col.all_reduce_two_shot(parts)
    ring = col.all_reduce_ring(parts)
    for r in range(p):
        np.testing.assert_array_equal(two[r], one[r])  # same order per element: bitwise equal
        np.testing.assert_allclose(ring[r], one[r], rtol=1e-13, atol=1e-13)
        np.testing.assert_array_equal(ring[r], ring[0])  # identical on every rank
    np.testing.assert_allclose(one[0], np.sum(parts, axis=0), atol=1e-12)
    rs = col.reduce_scatter(parts)
    np.testing.assert_array_equal(np.concatenate(rs, axis=-1), one[0])
    np.testing.assert_array_equal(col.all_gather(rs)[p - 1], one[0])


def test_ring_order_differs_in_float32():
    rng = np.random.default_rng(0)
    parts = [(rng.standard_normal((64, 64)) * 10 ** rng.uniform(-3, 3)).astype(np.float32) for _ in range(8)]
    assert not np.array_equal(col.all_reduce_ring(parts)[0], col.all_reduce_one_shot(parts)[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("m, k, n", [(1, 64, 8), (5, 96, 3), (8, 3584, 24)], ids=lambda v: str(v))
def test_mxfp4_linear_fused_matches_reference(m, k, n, dtype):
    from simulator.dtypes import mxfp4_quantize
    from simulator.dtypes import mxfp4_linear_fused, mxfp4_linear_reference
    from simulator.ops.linear import linear, linear_reference
    rng = np.random.default_rng(m * n)
    x = rng.standard_normal((m, k)).astype(dtype)
    w_t = mxfp4_quantize(rng.standard_normal((n, k)) * 0.05)  # [N, K], blocks along K
    ref = mxfp4_linear_reference(x, w_t)
    assert_close(mxfp4_linear_fused(x, w_t), ref, dtype)
    from simulator.dtypes import mxfp4_dequantize
    w = mxfp4_dequantize(w_t, dtype).T
    assert_close(linear(x, w), ref, dtype)
    assert_close(linear_reference(x, w), linear(x, w), dtype)


@pytest.mark.parametrize("rows", [(0, 608), (160, 288)], ids=["whole", "row-shard"])
def test_mxfp4_weight_reference_is_the_float64_product(rows):
    """The reference product on a packed weight (each row of W^T dequantized to float64, one dot per token row),
    compiled and its .py_func, equals x @ dequantize(W) in float64 to rounding (within the bound of two
    length-K sums, 2 K eps sum_k |x_k w_kn|), on whole weights and on a row shard (a strided view of the
    codes), and a row alone has the same bits as among others."""
    from simulator.fast import kernels as fast
    from simulator.dtypes import mxfp4_dequantize, mxfp4_quantize
    from simulator.fast.packed import MXFP4Weight, mxfp4_weight_reference
    rng = np.random.default_rng(7)
    w_t = mxfp4_quantize(rng.standard_normal((40, 608)) * 0.05)  # [N, K]
    k0, k1 = rows
    w = MXFP4Weight(w_t.packed, w_t.scales.view(np.uint8), form="reference")
    w = w if (k0, k1) == (0, 608) else MXFP4Weight(w_t.packed, w_t.scales.view(np.uint8), k0, k1 - k0, "reference")
    x = rng.standard_normal((3, k1 - k0))
    want = x @ mxfp4_dequantize(w_t, np.float64).T[k0:k1]
    bound = 2 * (k1 - k0) * np.finfo(np.float64).eps * (np.abs(x) @ np.abs(mxfp4_dequantize(w_t, np.float64).T[k0:k1]))
    got = mxfp4_weight_reference(x, w)
    assert np.all(np.abs(got - want) <= bound)
    np.testing.assert_array_equal(mxfp4_weight_reference(x[1:2], w)[0], got[1])
    plain = np.empty_like(got)  # the Python form: the loops as written, sums in pair order
    half = (k1 - k0) // 2
    fast._reference_rows.py_func(np.ascontiguousarray(x[:, 0::2]), np.ascontiguousarray(x[:, 1::2]),
                                 w_t.packed[:, k0 // 2:k1 // 2], w_t.scales.view(np.uint8)[:, k0 // 32:k1 // 32],
                                 fast.E8M0_HALF_F32, fast.E2M1, fast.E8M0, plain, np.empty((2, half), np.float32),
                                 np.empty(2 * half))
    assert np.all(np.abs(plain - want) <= bound)


def test_mxfp4_reference_product_with_scales_float32_cannot_hold():
    """Rows holding a scale from 2^126 (E8M0 bits 253, 254: 6 x 2^127 overflows float32) are decoded by the
    float64 table instead of the float32 byte shuffle; their products stay finite and within the rounding
    bound of the exact float64 product, beside ordinary rows of the same weight."""
    from simulator.fast import kernels as fast
    rng = np.random.default_rng(9)
    codes = rng.integers(0, 256, (6, 48), dtype=np.uint8)  # [N, K/2], K = 96: three blocks a row
    bits = rng.integers(110, 140, (6, 3)).astype(np.uint8)
    bits[3, 1], bits[4, 0], bits[5, 2] = 253, 254, 254
    x = rng.standard_normal((2, 96)) * 1e-30
    dense = fast.mxfp4_dequantize_t(codes, bits, np.float64)  # [K, N], exact
    want = x @ dense
    bound = 2 * 96 * np.finfo(np.float64).eps * (np.abs(x) @ np.abs(dense))
    got = fast.mxfp4_reference_matmul(x, codes, bits)
    assert np.all(np.isfinite(got)) and np.all(np.abs(got - want) <= bound)
    assert np.abs(got[:, 4]).max() > 1e8  # a wide row's products: far beyond what a float32 weight could hold


@pytest.mark.parametrize("lengths, widths, ranks", [([1] * 4, [96], 16), ([3, 1, 2], [64, 40], 2), ([5], [31], 1)],
                         ids=str)
def test_tiles_cover_every_output_entry_once_in_item_order(lengths, widths, ranks):
    """grouped_matmul's work items, compiled and .py_func: each (row, column) of y in exactly one item whose
    weight is the row's (group, part, rank); items ordered by group, part, tile, then rank."""
    lengths, widths = np.array(lengths), np.array(widths)
    got = expert_kernels.tiles(lengths, widths, ranks, 32)
    np.testing.assert_array_equal(expert_kernels.tiles.py_func(lengths, widths, ranks, 32), got)
    total, starts = lengths.sum(), np.cumsum(widths) - widths
    hits = np.zeros((ranks * total, widths.sum()), int)
    for w, n0, n1, col0, r0, r1 in got:
        group, part, rank = w // (len(widths) * ranks), w // ranks % len(widths), w % ranks
        first = rank * total + lengths[:group].sum()
        assert (r0, r1, col0) == (first, first + lengths[group], starts[part] + n0) and 0 <= n0 < n1 <= widths[part]
        hits[r0:r1, col0:col0 + n1 - n0] += 1
    assert np.all(hits == 1)
    key = [(w // ranks, n0, w % ranks) for w, n0, *_ in got]  # (group, part) as one, tile, rank
    assert key == sorted(key)
