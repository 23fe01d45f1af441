"""gpt-oss's MoE and attention-output math (clamped SwiGLU, router logit bias without a selection bias, expert
biases, o_proj bias): standard == specialized == float64 reference, on both backends and over TP; the activation
checked against its formula by hand, and each term shown to matter (the reference without it disagrees)."""

from dataclasses import replace

import numpy as np
import pytest

from simulator.check import check_layer, make_inputs
from simulator.config import load_model
from simulator.dtypes import Precision
from simulator.execute import run_plan
from simulator.ops import experts as ex
from simulator.plans import specialized, standard
from simulator.plans.common import make_dims
from simulator.plans.kernel import DecodeShape
from simulator.reference import reference_layer
from simulator.weights import LayerWeights


@pytest.fixture(scope="module")
def tiny_oss(tiny_gqa):
    """tiny_gqa with gpt-oss's MoE: softmax top-k, no shared expert, no groups, no selection bias, the router's
    logit bias, expert biases, clamped SwiGLU and o_proj's bias."""
    return replace(tiny_gqa, num_shared_experts=0, n_group=1, topk_group=1, router_act="softmax", renormalize=True,
                   routed_scaling_factor=1.0, hidden_act="swiglu_oai", router_logit_bias=True, expert_bias=True,
                   o_proj_bias=True, selection_bias=False, first_k_dense=0)


def test_swiglu_oai_by_hand():
    cfg = replace(load_model("tiny-deepseek"), hidden_act="swiglu_oai", swiglu_limit=7.0, swiglu_alpha=1.702)
    g = np.array([[-9.0, -1.0, 0.5, 3.0, 12.0]])
    u = np.array([[-8.0, -0.5, 0.0, 2.0, 9.0]])
    gc, uc = np.array([-9.0, -1.0, 0.5, 3.0, 7.0]), np.array([-7.0, -0.5, 0.0, 2.0, 7.0])
    want = gc / (1 + np.exp(-1.702 * gc)) * (uc + 1)
    np.testing.assert_allclose(ex.glu(g, u, cfg)[0], want, rtol=1e-15)
    np.testing.assert_allclose(ex.glu_product(np.concatenate([g, u], axis=1), cfg)[0], want, rtol=1e-14)


CASES = [(tp, b, t, layer) for tp in (1, 2) for b, t in ((1, 1), (3, 2)) for layer in (1, 2)]


@pytest.mark.parametrize("backend", ["numpy", "fast"])
@pytest.mark.parametrize("tp, batch, tokens, layer", CASES, ids=[f"P{p}-B{b}-T{t}-L{L}" for p, b, t, L in CASES])
def test_fp64_three_way(tiny_oss, tp, batch, tokens, layer, backend):
    result = check_layer(tiny_oss, "gqa", tp, DecodeShape(batch, tokens, 20), "fp64", seed=tp + batch + layer,
                         layer=layer, backend=backend)
    assert {"standard", "specialized"} <= set(result.variants)
    for v in result.variants.values():
        assert not v.flips
        for t in v.tensors:
            assert t.rel_rms_error < 1e-12, f"{v.variant} {t.name}: rel RMS {t.rel_rms_error:.2e}"


def test_bf16_stays_bounded(tiny_oss):
    result = check_layer(tiny_oss, "gqa", 2, DecodeShape(3, 2, 20), "bf16", layer=1)
    assert result.passed, [(v.variant, t.name, t.rel_rms_error) for v in result.variants.values() for t in v.tensors]


def _weight_names(plan) -> set[str]:
    return {n for k in plan for w in k.weights for n in ([n for n, _ in w.parts] or [w.name])}


def test_plans_read_the_biases(tiny_oss):
    shape = DecodeShape(2, 1, 20)
    for build in (standard.build, specialized.build):
        names = _weight_names(build(tiny_oss, 2, shape, "gqa", 1))
        assert {"router.logit_bias", "expert_bias.gate", "expert_bias.up", "expert_bias.down", "o_proj.bias"} <= names
        assert "router.bias" not in names  # no selection bias
    plain = replace(tiny_oss, router_logit_bias=False, expert_bias=False, o_proj_bias=False, selection_bias=True)
    names = _weight_names(standard.build(plain, 2, shape, "gqa", 1))
    assert "router.bias" in names and not {"router.logit_bias", "expert_bias.down", "o_proj.bias"} & names


@pytest.mark.parametrize("term", ["router_logit_bias", "expert_bias", "o_proj_bias", "hidden_act"])
def test_each_term_moves_the_output(tiny_oss, term):
    """The reference with one term switched off disagrees with the plan run with it on, by far more than rounding."""
    off = replace(tiny_oss, **{term: "silu" if term == "hidden_act" else False})
    shape = DecodeShape(3, 2, 20)
    d = make_dims(tiny_oss, 2, shape, 1, "gqa")
    io, state = make_inputs(tiny_oss, d, np.random.default_rng(0))
    out, _, _ = run_plan(standard.build(tiny_oss, 2, shape, "gqa", 1), d, LayerWeights(tiny_oss, 1, 0), io, state,
                         Precision("fp64"))
    same, _, _ = reference_layer(tiny_oss, 1, shape, LayerWeights(tiny_oss, 1, 0), io, state)
    ref, _, _ = reference_layer(off, 1, shape, LayerWeights(off, 1, 0), io, state)
    scale = np.abs(same.delta).max() + np.abs(same.prefix).max()
    assert max(np.abs(out.delta - same.delta).max(), np.abs(out.prefix - same.prefix).max()) < 1e-12 * scale
    assert max(np.abs(out.delta - ref.delta).max(), np.abs(out.prefix - ref.prefix).max()) > 1e-6 * scale
