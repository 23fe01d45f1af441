"""The ops against an independent oracle: tests/data/golden.npz, written by tests/data/make_golden.py
from the model equations in plain per-token loops, with no code from `simulator`.

The reference and the plans share the op definitions, so the fp64 three-way check cannot see a mistake
in an op itself (swapped SiTU betas, groups scored by their best expert, RoPE turned the wrong way):
these tests can. Inputs are float64; agreement is to rounding (1e-12)."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from simulator.ops import kda, mla
from simulator.ops.experts import glu
from simulator.ops.router import route_fused, route_reference

G = np.load(Path(__file__).parent / "data" / "golden.npz")
TOL = dict(rtol=1e-12, atol=1e-12)


def _router_cfg():
    return SimpleNamespace(n_group=int(G["router.n_group"]), topk_group=int(G["router.topk_group"]),
                           top_k=int(G["router.top_k"]), router_act="sigmoid", renormalize=True,
                           routed_scaling_factor=float(G["router.scale"]))


@pytest.mark.parametrize("route", [route_reference, route_fused], ids=["reference", "fused"])
def test_grouped_topk_matches_golden(route):
    got = route(G["router.logits"], G["router.bias"], _router_cfg())
    np.testing.assert_array_equal(got.topk_idx, G["router.idx"])  # best first, as the oracle orders them
    np.testing.assert_allclose(got.topk_weight, G["router.weight"], **TOL)


@pytest.mark.parametrize("act", ["situ", "silu"])
def test_glu_matches_golden(act):
    cfg = SimpleNamespace(hidden_act=act, situ_beta=float(G["glu.b1"]), situ_linear_beta=float(G["glu.b2"]))
    np.testing.assert_allclose(glu(G["glu.g"], G["glu.u"], cfg), G[f"glu.{act}"], **TOL)


def test_rope_matches_golden():
    got = mla.rope(G["rope.x"], G["rope.pos"], float(G["rope.theta"]))
    np.testing.assert_allclose(got, G["rope.out"], **TOL)


@pytest.mark.parametrize("decode", ["reference", "fused"])
def test_mla_absorbed_attention_matches_golden(decode):
    q_lat = mla.mla_absorb_q(G["mla.q_nope"], G["mla.w_uk"])  # [B, T, N, L]
    args = (q_lat, G["mla.q_pe"], G["mla.cache"], G["mla.lengths"], float(G["mla.scale"]), G["mla.w_uv"])
    fn = mla.mla_decode_reference if decode == "reference" else mla.mla_decode_fused
    np.testing.assert_allclose(fn(*args), G["mla.o"], **TOL)


@pytest.mark.parametrize("form", ["kda_decode_reference", "kda_decode_fused", "kda_chain"])
def test_kda_step_matches_golden(form):
    names = ("x", "conv_w", "hist", "z", "dt_bias", "a_log", "beta_logits", "gate", "o_norm", "state")
    out, state, hist = getattr(kda, form)(*(G[f"kda.{n}"] for n in names), lower_bound=float(G["kda.lower_bound"]),
                                          eps=float(G["kda.eps"]))
    np.testing.assert_allclose(out, G["kda.out"], **TOL)
    np.testing.assert_allclose(state, G["kda.new_state"], **TOL)
    np.testing.assert_allclose(hist, G["kda.new_hist"], **TOL)


def test_golden_file_is_what_its_generator_writes():
    """The committed file and tests/data/make_golden.py agree (regenerate with the script after editing it).
    Agree to float64 rounding, not bit for bit: the generator's matrix products round differently with the
    CPU's BLAS kernels (1 ulp of mla.o between two x86 machines), while an edit of the generator moves values
    by far more than 1e-12."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_golden", Path(__file__).parent / "data" / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh = module.golden_arrays()
    assert sorted(fresh) == sorted(G.files)
    for name, value in fresh.items():
        np.testing.assert_allclose(G[name], value, rtol=1e-12, atol=1e-14, err_msg=name)
