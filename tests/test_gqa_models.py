"""GQA MoE models read from their public config.json (models/gpt-oss-*.json, qwen3-moe-*.json, mixtral-8x7b.json):
each parser's mapping against the file's own values, every field it reads refused when bad (one sentence, exit 2),
YaRN's unrounded correction range (gpt-oss's `truncate: false`) against an independent root-finding formulation,
and fp64 three-way equivalence on shrunk copies of each model that keep its features."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.config import RopeScaling, load_model, validate_tp
from simulator.errors import UserError
from simulator.ops import mla

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def raw(name: str) -> dict:
    return json.loads((ROOT / "models" / f"{name}.json").read_text())


# ----------------------------------------------------------------------------- gpt-oss
@pytest.mark.parametrize("name, layers, experts", [("gpt-oss-20b", 24, 32)])
def test_gpt_oss_fields_map_from_the_file(name, layers, experts):
    f, cfg = raw(name), load_model(name)
    assert (cfg.family, cfg.num_layers, cfg.num_experts) == ("gpt_oss", layers, experts)
    assert (cfg.hidden_size, cfg.vocab_size, cfg.rms_norm_eps) == (f["hidden_size"], f["vocab_size"],
                                                                   f["rms_norm_eps"])
    assert (cfg.gqa_heads, cfg.gqa_kv_heads, cfg.gqa_head_dim) == (f["num_attention_heads"],
                                                                   f["num_key_value_heads"], f["head_dim"])
    assert cfg.attn_kinds == ("gqa",) * layers and cfg.first_k_dense == 0
    assert cfg.gqa_windows == tuple(f["sliding_window"] if t == "sliding_attention" else 0 for t in f["layer_types"])
    assert cfg.gqa_windows[:2] == (128, 0)  # sliding first, then full
    assert cfg.gqa_sinks and cfg.gqa_qkv_bias and cfg.o_proj_bias and not cfg.gqa_qk_norm
    assert (cfg.top_k, cfg.moe_intermediate) == (f["num_experts_per_tok"], f["intermediate_size"])
    assert (cfg.router_act, cfg.renormalize, cfg.router_logit_bias, cfg.expert_bias) == ("softmax", True, True, True)
    assert (cfg.num_shared_experts, cfg.latent_dim, cfg.n_group, cfg.topk_group) == (0, 0, 1, 1)
    assert (cfg.hidden_act, cfg.swiglu_limit, cfg.swiglu_alpha) == ("swiglu_oai", f["swiglu_limit"], 1.702)
    assert cfg.expert_dtype == "mxfp4" and cfg.residual == "plain" and cfg.rope_theta == f["rope_theta"]
    assert cfg.rope_scaling == RopeScaling(factor=32.0, original_max=4096, beta_fast=32.0, beta_slow=1.0,
                                           mscale_all_dim=1.0, truncate=False)
    # Hugging Face's default YaRN attention factor, 0.1 ln 32 + 1 = 1.34657, multiplies cos and sin
    assert cfg.rope_scaling.softmax_mscale == pytest.approx(1.34657, abs=1e-5)


# ----------------------------------------------------------------------------- YaRN, truncate: false
def _rotations(i: float, R: int, theta: float, original_max: int) -> float:
    """How often rotary pair i (fractional) turns over the original context: L / wavelength."""
    return original_max * theta ** (-2 * i / R) / (2 * math.pi)


def _pair_at(beta: float, R: int, theta: float, original_max: int) -> float:
    """The fractional pair index that turns `beta` times, found by bisection (rotations fall with i)."""
    lo, hi = -4.0 * R, 4.0 * R
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _rotations(mid, R, theta, original_max) > beta else (lo, mid)
    return (lo + hi) / 2


def yarn_freqs_unrounded(R, theta, s):
    """YaRN written apart from ops/mla.py: each pair's share of interpolation grows linearly from the pair that
    turns beta_fast times to the one that turns beta_slow times (both fractional, clipped to [0, R - 1])."""
    lo = max(_pair_at(s.beta_fast, R, theta, s.original_max), 0.0)
    hi = min(_pair_at(s.beta_slow, R, theta, s.original_max), R - 1.0)
    out = []
    for i in range(R // 2):
        f = theta ** (-2 * i / R)
        share = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        out.append((1 - share) * f + share * f / s.factor)
    return np.array(out)


def test_unrounded_yarn_matches_the_root_finding_formulation():
    gpt_oss = load_model("gpt-oss-20b").rope_scaling
    got = mla.rope_inv_freq(64, 150000.0, gpt_oss)
    np.testing.assert_allclose(got, yarn_freqs_unrounded(64, 150000.0, gpt_oss), rtol=1e-12)
    # by hand: i(32) = 64 ln(4096 / (2 pi 32)) / (2 ln 150000) = 8.093, i(1) = 17.398; pair 9 is 0.0975 of the way
    assert _pair_at(32, 64, 150000.0, 4096) == pytest.approx(8.0928, abs=1e-4)
    assert _pair_at(1, 64, 150000.0, 4096) == pytest.approx(17.3981, abs=1e-4)
    f9 = 150000.0 ** (-18 / 64)
    share = (9 - 8.09278) / (17.39807 - 8.09278)
    assert got[9] == pytest.approx(f9 * (1 - share) + f9 / 32 * share, rel=1e-5)
    rounded = mla.rope_inv_freq(64, 150000.0, replace(gpt_oss, truncate=True))  # floor 8 / ceil 18: pair 9 moves
    assert not np.isclose(rounded[9], got[9], rtol=1e-6)
    np.testing.assert_array_equal(rounded[:9], got[:9])  # both keep pairs 0-8 unchanged (extrapolated)


# ----------------------------------------------------------------------------- bad input
DROP = object()  # a key removed from the file


def variant(name: str, **changes) -> dict:
    """A shipped model's config.json with keys replaced (DROP removes one); `rope_scaling__truncate` reaches in."""
    out = raw(name)
    for key, value in changes.items():
        parent, _, key = key.rpartition("__")
        target = out[parent] if parent else out
        if value is DROP:
            target.pop(key, None)
        else:
            target[key] = value
    return out


GPT = "gpt-oss-20b"
BAD = {  # case: (model file, changes, words the one sentence must hold)
    "gpt-hidden-zero": (GPT, dict(hidden_size=0), "'hidden_size' = 0 must be a positive integer"),
    "gpt-layers-float": (GPT, dict(num_hidden_layers=24.5), "'num_hidden_layers' = 24.5 should be of type int"),
    "gpt-vocab-missing": (GPT, dict(vocab_size=DROP), "required field 'vocab_size' is missing"),
    "gpt-eps-negative": (GPT, dict(rms_norm_eps=-1e-5), "'rms_norm_eps' = -1e-05 must be positive"),
    "gpt-theta-one": (GPT, dict(rope_theta=1), "'rope_theta' = 1.0 must exceed 1"),
    "gpt-heads-zero": (GPT, dict(num_attention_heads=0), "'num_attention_heads' = 0 must be a positive integer"),
    "gpt-kv-not-dividing": (GPT, dict(num_key_value_heads=6), "'gqa_kv_heads' = 6 does not divide the query heads"),
    "gpt-kv-string": (GPT, dict(num_key_value_heads="8"), "'num_key_value_heads' = '8' should be of type int"),
    "gpt-head-dim-odd": (GPT, dict(head_dim=63), "'gqa_head_dim' = 63 must be even for RoPE"),
    "gpt-bias-string": (GPT, dict(attention_bias="yes"), "'attention_bias' = 'yes' should be of type bool"),
    "gpt-experts-zero": (GPT, dict(num_local_experts=0), "'num_experts' = 0 must be a positive integer"),
    "gpt-topk-above-experts": (GPT, dict(num_experts_per_tok=40, experts_per_token=40),
                               "'top_k' = 40 exceeds the number of routed experts"),
    "gpt-topk-keys-differ": (GPT, dict(experts_per_token=2), "'experts_per_token' = 2 differs from"),
    "gpt-intermediate-not-32": (GPT, dict(intermediate_size=2880 + 16), "must be a multiple of 32 for MXFP4"),
    "gpt-act-gelu": (GPT, dict(hidden_act="gelu"), "'hidden_act' = 'gelu' is not 'silu'"),
    "gpt-limit-zero": (GPT, dict(swiglu_limit=0), "'swiglu_limit' = 0.0 must be positive"),
    "gpt-limit-nan": (GPT, dict(swiglu_limit=float("nan")), "'swiglu_limit' = nan must be a finite"),
    "gpt-alpha-negative": (GPT, dict(swiglu_alpha=-1.702), "'swiglu_alpha' = -1.702 must be positive"),
    "gpt-layer-types-short": (GPT, dict(layer_types=["full_attention"] * 3), "'layer_types' must list"),
    "gpt-layer-types-unknown": (GPT, dict(layer_types=["chunked_attention"] * 24), "'layer_types' must list"),
    "gpt-window-zero": (GPT, dict(sliding_window=0), "'sliding_window' = 0 must be a positive integer"),
    "gpt-window-null": (GPT, dict(sliding_window=None), "'sliding_window' = None must be a positive integer"),
    "gpt-window-float": (GPT, dict(sliding_window=128.5), "'sliding_window' = 128.5 should be of type int"),
    "gpt-truncate-string": (GPT, dict(rope_scaling__truncate="no"), "'truncate' = 'no' should be of type bool"),
    "gpt-yarn-mscale": (GPT, dict(rope_scaling__mscale=1.0), "sets mscale or mscale_all_dim"),
    "gpt-yarn-attention-factor": (GPT, dict(rope_scaling__attention_factor=1.2), "unknown key 'attention_factor'"),
    "gpt-rope-linear": (GPT, dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "only 'yarn' is modelled"),
    "gpt-quant-gptq": (GPT, dict(quantization_config={"quant_method": "gptq"}), "names format 'gptq'"),
    "gpt-model-type-list": (GPT, dict(model_type=["gpt_oss"]), "'model_type' = ['gpt_oss'] is not one of"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_every_field_read_is_refused_in_one_sentence(case, tmp_path):
    name, changes, words = BAD[case]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(variant(name, **changes)))
    with pytest.raises(UserError) as err:
        load_model(str(path))
    assert words in str(err.value) and str(err.value).count("\n") == 0, str(err.value)
    result = runner.invoke(app, ["layer", "--model", str(path), "--hardware", "h200", "--tp", "8"])
    assert result.exit_code == 2 and result.stdout == "" and words in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
