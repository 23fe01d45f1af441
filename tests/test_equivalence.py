"""End to end: standard == specialized == float64 reference, over layer types, TP, batch, tokens, seeds."""

import numpy as np
import pytest

from simulator.check import FLIP_MARGIN, check_layer, make_inputs
from simulator.dtypes import Precision
from simulator.execute import run_plan
from simulator.plans import specialized
from simulator.plans.common import make_dims
from simulator.plans.kernel import DecodeShape
from simulator.weights import LayerWeights

GRID = [(tp, b, t) for tp in (1, 2, 4, 8, 16) for b in (1, 3, 8) for t in (1, 8) if not (b == 8 and t == 8 and tp < 16)]


@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
@pytest.mark.parametrize("tp, batch, tokens", GRID, ids=[f"P{p}-B{b}-T{t}" for p, b, t in GRID])
def test_fp64_all_agree(tiny, layer, tp, batch, tokens):
    seed = tp * 100 + batch * 10 + tokens
    result = check_layer(tiny, layer, tp, DecodeShape(batch, tokens, 6), "fp64", seed=seed)
    for v in result.variants.values():
        assert not v.flips, f"{v.variant} flipped routing in fp64"
        for t in v.tensors:
            assert t.rel_rms_error < 1e-12, (f"{v.variant} {t.name}: rel RMS {t.rel_rms_error:.2e}, "
                                             f"max abs {t.max_abs_error:.2e}")


@pytest.mark.parametrize("layer", ["mla", "dense"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fp64_deepseek(tiny_ds, layer, seed):
    result = check_layer(tiny_ds, layer, 4, DecodeShape(3, 2, 5), "fp64", seed=seed)
    assert result.passed and all(t.rel_rms_error < 1e-12 for v in result.variants.values() for t in v.tensors)


@pytest.mark.parametrize("algo", ["one_shot", "two_shot", "ring"])
def test_all_reduce_orders_agree(tiny, algo):
    assert check_layer(tiny, "kda", 8, DecodeShape(2, 1, 4), "fp64", all_reduce=algo).passed


@pytest.mark.parametrize("layer", ["kda", "mla"])
def test_p_ranks_equal_one_rank(tiny, layer):
    shape = DecodeShape(3, 2, 5)
    outs = []
    for tp in (1, 16):
        d = make_dims(tiny, tp, shape, None, layer)
        io, st = make_inputs(tiny, d, np.random.default_rng(4))
        out, new_state, _ = run_plan(specialized.build(tiny, tp, shape, layer), d, LayerWeights(tiny, d.layer, 4), io,
                                     st, Precision("fp64"))
        outs.append((out, new_state))
    np.testing.assert_allclose(outs[1][0].delta, outs[0][0].delta, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(outs[1][0].prefix, outs[0][0].prefix, rtol=1e-12, atol=1e-12)
    for k in outs[0][1]:
        np.testing.assert_allclose(outs[1][1][k], outs[0][1][k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", ["kda", "mla"])
def test_reference_leaves_its_inputs_as_they_were(tiny, layer):
    """The reference takes a float64 state without copying it (a 0.5 GB KDA state at batch 64) and updates
    copies: the layer's input state and activations must come out of it bit for bit as they went in, since
    the standard and specialized paths run on them next."""
    from simulator.reference import reference_layer
    shape = DecodeShape(3, 2, 5)
    d = make_dims(tiny, 4, shape, None, layer)
    io, st = make_inputs(tiny, d, np.random.default_rng(5))
    before = {k: np.array(v, copy=True) for k, v in st.items()}
    prefix, delta = io.prefix.copy(), io.delta.copy()
    reference_layer(tiny, d.layer, shape, LayerWeights(tiny, d.layer, 5), io, st)
    assert all(np.array_equal(st[k], v) and st[k].dtype == v.dtype for k, v in before.items())
    assert np.array_equal(io.prefix, prefix) and np.array_equal(io.delta, delta)


@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_within_tolerance(tiny, layer, seed):
    result = check_layer(tiny, layer, 4, DecodeShape(4, 2, 16), "bf16", seed=seed)
    assert result.passed, {n: [(t.name, t.rel_rms_error) for t in v.tensors] for n, v in result.variants.items()}
    std, spec = result.variants["standard"], result.variants["specialized"]
    assert 1e-5 < std.rel_rms_error and 1e-5 < spec.rel_rms_error  # bf16 really rounds


def test_fp32_within_tolerance(tiny):
    assert check_layer(tiny, "mla", 2, DecodeShape(2, 3, 9), "fp32").passed


class NearTieWeights(LayerWeights):
    """Experts 0 and 1 compete for the last top-k slot with biased scores 1e-7 apart.

    Their router columns are zero (score exactly 0.5); k-1 other experts are forced in by a +10 bias,
    the rest pushed out by -10, and expert 1 is ahead by 1e-7. float64 picks expert 1; FP32 cannot
    resolve 1e-7 at 5.5 (one ulp is 4.8e-7), sees a tie, and the documented tie-break picks expert 0.
    """

    def _make(self, name):
        w = super()._make(name)
        k = self.cfg.top_k
        if name == "router.w":
            w[:, :2] = 0.0
        if name == "router.bias":
            w = np.full(self.cfg.num_experts, -10.0)
            w[2:k + 1] = 10.0
            w[0], w[1] = 5.0, 5.0 + 1e-7
        return w


def test_near_tie_is_reported_as_flip_with_its_margin(tiny):
    shape = DecodeShape(4, 1, 4)
    d = make_dims(tiny, 2, shape, None, "kda")
    weights = NearTieWeights(tiny, d.layer, 0)
    result = check_layer(tiny, "kda", 2, shape, "bf16", weights=weights)
    for v in result.variants.values():
        assert len(v.flips) == shape.tokens, v.variant
        assert all(abs(f["margin"] - 1e-7) < 1e-9 for f in v.flips)
        assert v.passed  # a flip below the bound is reported, not counted as an error
    exact = check_layer(tiny, "kda", 2, shape, "fp64", weights=weights)
    assert all(not v.flips for v in exact.variants.values())


def test_flip_above_bound_fails(tiny):
    from simulator.check import VariantResult
    v = VariantResult("x", 1, [], [{"token": 0, "margin": FLIP_MARGIN["bf16"] * 2}], FLIP_MARGIN["bf16"])
    assert not v.passed


BACKEND_GRID = [("kda", 4, 3, 1), ("mla", 16, 1, 8), ("dense", 2, 8, 1), ("kda", 8, 2, 2)]


@pytest.mark.parametrize("layer, tp, batch, tokens", BACKEND_GRID,
                         ids=[f"{k}-P{p}-B{b}-T{t}" for k, p, b, t in BACKEND_GRID])
def test_numpy_and_numba_kernels_agree(tiny, monkeypatch, layer, tp, batch, tokens):
    """The equivalence above runs on the Numba kernels (the default); the NumPy forms pass it too, and
    both backends give the same layer output to rounding (the packed expert path included)."""
    shape = DecodeShape(batch, tokens, 6)
    outs = {}
    for backend in ("numpy", "fast"):
        result = check_layer(tiny, layer, tp, shape, "fp64", seed=tp + batch, backend=backend)
        assert result.passed and all(t.rel_rms_error < 1e-12 for v in result.variants.values() for t in v.tensors)
        d = make_dims(tiny, tp, shape, None, layer)
        io, st = make_inputs(tiny, d, np.random.default_rng(1))
        outs[backend] = run_plan(specialized.build(tiny, tp, shape, layer), d, LayerWeights(tiny, d.layer, 1), io, st,
                                 Precision("fp64"), backend=backend)[0]
    np.testing.assert_allclose(outs["fast"].delta, outs["numpy"].delta, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(outs["fast"].prefix, outs["numpy"].prefix, rtol=1e-12, atol=1e-12)
