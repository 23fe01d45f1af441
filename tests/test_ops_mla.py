"""MLA decode: absorbed == non-absorbed oracle (NoPE and RoPE), fused (online softmax + W_UV) == reference.

Also: T tokens in one call == T one-token calls over the same cache, garbage slots are never read, RoPE
preserves norms, is the identity at position 0 and depends only on relative position; LoRA norms.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from simulator.ops import mla
from numerics import TOL, assert_close

# One tolerance table (rtol, atol) per working dtype.
SHAPES = [  # (B, T, N, Dn, R, Dv, L, Rq, max cached length)
    (1, 1, 1, 4, 2, 4, 8, 16, 1),
    (1, 4, 2, 8, 4, 8, 16, 32, 9),
    (3, 4, 3, 5, 6, 7, 11, 13, 140),
    (2, 1, 4, 8, 4, 6, 16, 24, 70),
]
CASES = [
    pytest.param(seed, dtype, shape, id="s{}-B{}-T{}-N{}-Dn{}-R{}-Dv{}-L{}-Rq{}-ctx{}-{}".format(
        seed, *shape, dtype.__name__))
    for seed in (0, 1)
    for dtype in (np.float64, np.float32)
    for shape in SHAPES
]
THETA = 10_000.0
GARBAGE = 3  # NaN slots after the valid cache: proves they are never read


def make_case(
    seed: int, shape: tuple[int, ...], dtype: type, rope_theta: float | None = None
) -> dict[str, Any]:
    """Latents, weights ~ 1/sqrt(fan_in), lengths, and the absorbed-path inputs built from them."""
    rng = np.random.default_rng(seed)
    B, T, N, Dn, R, Dv, L, Rq, ctx = shape
    lengths = rng.integers(0, ctx, B)
    S = int(lengths.max()) + T + GARBAGE
    arrays = dict(
        c_q=rng.standard_normal((B, T, Rq)),
        c_kv_all=rng.standard_normal((B, S, L)),
        k_pe_all=rng.standard_normal((B, S, R)),
        w_qb=rng.standard_normal((Rq, N * (Dn + R))) / np.sqrt(Rq),
        w_uk=rng.standard_normal((N, Dn, L)) / np.sqrt(L),
        w_uv=rng.standard_normal((N, L, Dv)) / np.sqrt(L),
    )
    c = {k: v.astype(dtype) for k, v in arrays.items()} | dict(lengths=lengths, scale=(Dn + R) ** -0.5)
    q = (c["c_q"] @ c["w_qb"]).reshape(B, T, N, Dn + R)  # [B, T, N, Dn+R]
    q_pe, k_pe = q[..., Dn:], c["k_pe_all"]
    if rope_theta is not None:  # the cache stores k_pe already rotated at its slot
        q_pe = mla.rope(q_pe, lengths[:, None] + np.arange(T), rope_theta)
        k_pe = mla.rope(k_pe, np.broadcast_to(np.arange(S), (B, S)), rope_theta)
    cache = np.concatenate([c["c_kv_all"], k_pe], axis=-1)  # [B, S, L+R]
    for b in range(B):
        cache[b, lengths[b] + T :] = np.nan
    return c | dict(q_lat=mla.mla_absorb_q(q[..., :Dn], c["w_uk"]), q_pe=q_pe, kv_cache=cache)


def absorbed_args(c: dict[str, Any]) -> tuple[Any, ...]:
    return c["q_lat"], c["q_pe"], c["kv_cache"], c["lengths"], c["scale"]


def oracle(c: dict[str, Any], rope_theta: float | None = None) -> np.ndarray:
    clean = c["c_kv_all"], c["k_pe_all"]
    return mla.mla_attention_reference(c["c_q"], *clean, c["w_qb"], c["w_uk"], c["w_uv"], c["lengths"],
                                       c["scale"], rope_theta=rope_theta)


def test_mla_shapes_and_dtypes() -> None:
    B, T, N, Dn, R, Dv, L, Rq = 2, 4, 3, 8, 4, 6, 16, 24
    for dtype in (np.float64, np.float32):
        c = make_case(0, (B, T, N, Dn, R, Dv, L, Rq, 20), dtype)
        o_lat = mla.mla_decode_attention(*absorbed_args(c))
        assert c["q_lat"].shape == (B, T, N, L) and c["q_lat"].dtype == dtype
        assert o_lat.shape == (B, T, N, L) and o_lat.dtype == dtype
        fused = mla.mla_decode_fused(*absorbed_args(c), c["w_uv"])
        for o in (mla.mla_uv(o_lat, c["w_uv"]), fused, oracle(c)):
            assert o.shape == (B, T, N, Dv) and o.dtype == dtype
        assert not np.isnan(o_lat).any(), "a garbage (NaN) cache slot was read"


@pytest.mark.parametrize("rope_theta", [None, THETA], ids=["nope", "rope"])
@pytest.mark.parametrize("seed, dtype, shape", CASES)
def test_mla_absorbed_matches_non_absorbed(
    seed: int, dtype: type, shape: tuple[int, ...], rope_theta: float | None
) -> None:
    c = make_case(seed, shape, dtype, rope_theta)
    want = oracle(c, rope_theta)
    assert_close(mla.mla_decode_reference(*absorbed_args(c), c["w_uv"]), want, dtype, "absorbed")


@pytest.mark.parametrize("kv_tile", [1, 5, mla.KV_TILE])
@pytest.mark.parametrize("seed, dtype, shape", CASES)
def test_mla_fused_matches_reference(seed: int, dtype: type, shape: tuple[int, ...], kv_tile: int) -> None:
    c = make_case(seed, shape, dtype)
    want = mla.mla_decode_reference(*absorbed_args(c), c["w_uv"])
    assert_close(mla.mla_decode_fused(*absorbed_args(c), c["w_uv"], kv_tile=kv_tile), want, dtype, "fused")


@pytest.mark.parametrize("form", [mla.mla_decode_reference, mla.mla_decode_fused], ids=["reference", "fused"])
@pytest.mark.parametrize("seed, dtype, shape", [c for c in CASES if c.values[2][1] > 1])
def test_mla_tokens_one_call_equals_sequential(
    form: Callable[..., np.ndarray], seed: int, dtype: type, shape: tuple[int, ...]
) -> None:
    """Token t alone, with lengths + t cached before it, sees exactly what it sees in the T-token call."""
    c = make_case(seed, shape, dtype)
    q_lat, q_pe, cache, lengths, scale = absorbed_args(c)
    want = form(q_lat, q_pe, cache, lengths, scale, c["w_uv"])
    got = [form(q_lat[:, t : t + 1], q_pe[:, t : t + 1], cache, lengths + t, scale, c["w_uv"])
           for t in range(q_lat.shape[1])]
    assert_close(np.concatenate(got, axis=1), want, dtype, "token by token")


def test_mla_inputs_not_mutated_and_cache_checked() -> None:
    c = make_case(2, SHAPES[2], np.float64)
    args = absorbed_args(c)
    before = [np.array(a, copy=True) for a in args]
    mla.mla_decode_fused(*args, c["w_uv"])
    mla.mla_decode_reference(*args, c["w_uv"])
    for a, b in zip(args, before, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="cannot hold"):
        mla.mla_decode_attention(c["q_lat"], c["q_pe"], c["kv_cache"][:, :2], c["lengths"] + 50, c["scale"])


def test_mla_qkv_a_norm() -> None:
    rng = np.random.default_rng(4)
    B, T, Rq, L, R = 2, 3, 12, 8, 4
    q_a, kv_a = rng.standard_normal((B, T, Rq)) * 3, rng.standard_normal((B, T, L + R)) * 3
    c_q, c_kv, k_pe = mla.mla_qkv_a_norm(q_a, kv_a, np.ones(Rq), 2 * np.ones(L), L, 1e-6)
    assert (c_q.shape, c_kv.shape, k_pe.shape) == ((B, T, Rq), (B, T, L), (B, T, R))
    np.testing.assert_allclose(np.sqrt((c_q**2).mean(-1)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.sqrt((c_kv**2).mean(-1)), 2.0, rtol=1e-6)  # weight 2, latent only
    np.testing.assert_array_equal(k_pe, kv_a[..., L:])  # the pe slot is not normed
    latent = kv_a[..., :L]
    np.testing.assert_allclose(c_kv, latent / np.sqrt((latent**2).mean(-1, keepdims=True) + 1e-6) * 2)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("x_shape", [(2, 5, 8), (1, 3, 4, 6)], ids=["k_pe-B2-T5-R8", "q_pe-B1-T3-N4-R6"])
def test_rope_preserves_norms_and_is_identity_at_zero(x_shape: tuple, dtype: type) -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal(x_shape).astype(dtype)
    positions = rng.integers(0, 1_000_000, x_shape[:2])
    y = mla.rope(x, positions, THETA)
    assert y.shape == x.shape and y.dtype == dtype
    half = x_shape[-1] // 2
    pair_norm_y = y[..., :half] ** 2 + y[..., half:] ** 2  # each rotated pair (i, i + R/2) keeps its length
    pair_norm_x = x[..., :half] ** 2 + x[..., half:] ** 2
    np.testing.assert_allclose(pair_norm_y, pair_norm_x, rtol=TOL[dtype][0] * 10, atol=TOL[dtype][1] * 10)
    np.testing.assert_array_equal(mla.rope(x, np.zeros(x_shape[:2], int), THETA), x)


def test_rope_scores_depend_on_relative_position_only() -> None:
    rng = np.random.default_rng(11)
    q, k = rng.standard_normal((1, 1, 8)), rng.standard_normal((1, 1, 8))
    def score(m: int, n: int) -> float:
        rq, rk = mla.rope(q, np.array([[m]]), THETA), mla.rope(k, np.array([[n]]), THETA)
        return float(rq.ravel() @ rk.ravel())

    np.testing.assert_allclose([score(7, 3), score(1004, 1000)], score(4, 0), rtol=1e-12)
