"""YaRN rope_scaling: parsed from config.json, checked against the paper's formulas by hand, applied in
the reference and both plans (fp64 three-way equivalence with YaRN on), unknown kinds refused."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from simulator.check import check_layer, make_inputs
from simulator.config import RopeScaling, load_model
from simulator.errors import UserError
from simulator.ops import mla
from simulator.plans.common import make_dims
from simulator.plans.kernel import DecodeShape
from simulator.reference import reference_layer
from simulator.weights import LayerWeights

DS_V3 = RopeScaling(factor=40.0, original_max=4096, beta_fast=32.0, beta_slow=1.0, mscale_all_dim=1.0)


def test_deepseek_v3_carries_the_public_yarn_value():
    assert load_model("deepseek-v3").rope_scaling == DS_V3


def test_softmax_scale_is_0_1352_for_deepseek_v3():
    # by hand: 192^-1/2 = 0.072169; mscale = 0.1 ln 40 + 1 = 1.368888; 0.072169 * 1.368888^2 = 0.135234
    ds = load_model("deepseek-v3")
    assert ds.mla_softmax_scale == pytest.approx(0.135234, abs=1e-6)
    assert replace(ds, rope_scaling=None).mla_softmax_scale == pytest.approx(0.072169, abs=1e-6)
    assert load_model("kimi-k3").mla_softmax_scale == 192 ** -0.5  # no rope_scaling: unchanged


def test_frequencies_against_the_ramp_by_hand():
    # correction dims for R = 64, theta 1e4, L = 4096:
    #   i(32) = 64 ln(4096 / (2 pi 32)) / (2 ln 1e4) = 64 * 3.01414 / 18.4207 = 10.47 -> floor 10
    #   i(1)  = 64 ln(4096 / (2 pi))    / (2 ln 1e4) = 64 * 6.47997 / 18.4207 = 22.51 -> ceil 23
    f = 1e4 ** (-np.arange(0, 64, 2) / 64)
    got = mla.rope_inv_freq(64, 1e4, DS_V3)
    np.testing.assert_array_equal(got[:11], f[:11])  # extrapolated band (fast pairs): unchanged
    np.testing.assert_allclose(got[23:], f[23:] / 40, rtol=1e-15)  # interpolated band: divided by 40
    ramp = (16 - 10) / (23 - 10)  # pair 16 is 6/13 of the way from extrapolation to interpolation
    assert got[16] == pytest.approx(f[16] * (1 - ramp) + f[16] / 40 * ramp, rel=1e-15)
    np.testing.assert_array_equal(mla.rope_inv_freq(64, 1e4, None), f)


def test_rope_with_yarn_stays_a_rotation():
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 64))
    y = mla.rope(x, np.arange(6).reshape(2, 3) * 1000, 1e4, DS_V3)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)


def _tiny_yarn(tiny_ds):
    """tiny-deepseek (R = 4) with a YaRN window small enough that both bands appear at context ~10."""
    scaling = RopeScaling(factor=4.0, original_max=64, beta_fast=4.0, beta_slow=1.0, mscale_all_dim=1.0)
    assert mla.rope_inv_freq(4, tiny_ds.rope_theta, scaling)[1] != mla.rope_inv_freq(4, tiny_ds.rope_theta)[1]
    return replace(tiny_ds, rope_scaling=scaling)


@pytest.mark.parametrize("tp", [1, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_fp64_three_way_equivalence_with_yarn(tiny_ds, tp, seed):
    result = check_layer(_tiny_yarn(tiny_ds), "mla", tp, DecodeShape(3, 2, 9), "fp64", seed=seed)
    assert result.passed and all(t.rel_rms_error < 1e-12 for v in result.variants.values() for t in v.tensors)


def test_yarn_changes_the_reference(tiny_ds):
    """Guard against a YaRN that is parsed and then ignored: the oracle's output must move."""
    outs = []
    for cfg in (tiny_ds, _tiny_yarn(tiny_ds)):
        d = make_dims(cfg, 1, DecodeShape(2, 1, 9), None, "mla")
        io, state = make_inputs(cfg, d, np.random.default_rng(0))
        outs.append(reference_layer(cfg, d.layer, d.shape, LayerWeights(cfg, d.layer, 0), io, state)[0].delta)
    assert not np.allclose(outs[0], outs[1])


def _config_with(tmp_path, rope_scaling):
    raw = json.loads(open("models/tiny-deepseek.json").read()) | {"rope_scaling": rope_scaling}
    path = tmp_path / "yarn.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("rope_scaling, words", [
    ({"type": "linear", "factor": 4.0}, "only 'yarn'"),
    ({"rope_type": "dynamic", "factor": 4.0}, "only 'yarn'"),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale_all_dim": 1,
      "attention_factor": 2}, "unknown key 'attention_factor'"),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 0.7, "mscale_all_dim": 1},
     "mscale 0.7 != mscale_all_dim 1"),
    ({"type": "yarn", "factor": 0.5, "original_max_position_embeddings": 64, "mscale_all_dim": 1}, "out of range"),
    ({"type": "yarn", "original_max_position_embeddings": 64}, "'factor' is missing"),
])
def test_unsupported_rope_scaling_is_refused(tmp_path, rope_scaling, words):
    with pytest.raises(UserError, match=words):
        load_model(_config_with(tmp_path, rope_scaling))


def test_rope_scaling_yarn_parses(tmp_path):
    cfg = load_model(_config_with(tmp_path, {"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 64,
                                             "mscale": 1, "mscale_all_dim": 1}))
    assert cfg.rope_scaling.softmax_mscale == pytest.approx(0.1 * math.log(8) + 1)
