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
@pytest.mark.parametrize("name, layers, experts", [("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)])
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


# ----------------------------------------------------------------------------- Qwen3-MoE, Mixtral
@pytest.mark.parametrize("name, layers, heads, experts, width", [("qwen3-moe-235b", 94, 64, 128, 1536),
                                                                  ("qwen3-moe-30b", 48, 32, 128, 768)])
def test_qwen3_moe_fields_map_from_the_file(name, layers, heads, experts, width):
    f, cfg = raw(name), load_model(name)
    assert (cfg.family, cfg.num_layers, cfg.gqa_heads, cfg.num_experts, cfg.moe_intermediate) == (
        "qwen3_moe", layers, heads, experts, width)
    assert (cfg.hidden_size, cfg.vocab_size, cfg.rms_norm_eps, cfg.rope_theta) == (
        f["hidden_size"], f["vocab_size"], f["rms_norm_eps"], f["rope_theta"])
    assert (cfg.gqa_kv_heads, cfg.gqa_head_dim, cfg.top_k) == (f["num_key_value_heads"], f["head_dim"],
                                                               f["num_experts_per_tok"])
    assert cfg.gqa_head_dim == 128 and cfg.attn_kinds == ("gqa",) * layers and cfg.gqa_windows == ()
    assert cfg.gqa_qk_norm and not (cfg.gqa_sinks or cfg.gqa_qkv_bias or cfg.o_proj_bias)
    assert (cfg.router_act, cfg.renormalize, cfg.router_logit_bias, cfg.expert_bias) == ("softmax", True, False,
                                                                                         False)
    assert (cfg.hidden_act, cfg.expert_dtype, cfg.rope_scaling, cfg.first_k_dense) == ("silu", "bf16", None, 0)
    assert (cfg.num_shared_experts, cfg.latent_dim, cfg.n_group, cfg.residual) == (0, 0, 1, "plain")


def test_mixtral_fields_map_from_the_file():
    f, cfg = raw("mixtral-8x7b"), load_model("mixtral-8x7b")
    assert (cfg.family, cfg.num_layers, cfg.hidden_size, cfg.vocab_size) == ("mixtral", 32, 4096, 32000)
    assert (cfg.gqa_heads, cfg.gqa_kv_heads, cfg.gqa_head_dim) == (32, 8, 4096 // 32)  # head_dim: hidden / heads
    assert f["sliding_window"] is None and cfg.gqa_windows == ()  # v0.1 ships null: full attention
    assert (cfg.num_experts, cfg.top_k, cfg.moe_intermediate) == (f["num_local_experts"], f["num_experts_per_tok"],
                                                                  f["intermediate_size"])
    assert (cfg.router_act, cfg.renormalize, cfg.hidden_act, cfg.expert_dtype) == ("softmax", True, "silu", "bf16")
    assert not (cfg.gqa_qk_norm or cfg.gqa_sinks or cfg.gqa_qkv_bias or cfg.o_proj_bias or cfg.router_logit_bias)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.rope_scaling) == (1e6, 1e-5, None)


def test_a_window_and_a_dense_prefix_are_read_where_modelled(tmp_path):
    windowed = tmp_path / "mixtral-windowed.json"
    windowed.write_text(json.dumps(variant("mixtral-8x7b", sliding_window=4096)))
    assert load_model(str(windowed)).gqa_windows == (4096,) * 32  # Mistral-style: every layer slides
    prefix = tmp_path / "qwen3-dense-prefix.json"
    prefix.write_text(json.dumps(variant("qwen3-moe-30b", mlp_only_layers=[1, 0])))
    cfg = load_model(str(prefix))
    assert (cfg.first_k_dense, cfg.dense_intermediate, cfg.layer_type(1), cfg.layer_type(2)) == (2, 6144, "dense",
                                                                                                "gqa")
    yarn = tmp_path / "qwen3-yarn.json"  # the model card's YaRN recipe: factor 4 over 32768
    yarn.write_text(json.dumps(variant("qwen3-moe-30b", rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                      "original_max_position_embeddings": 32768})))
    assert load_model(str(yarn)).rope_scaling == RopeScaling(4.0, 32768, mscale_all_dim=1.0, truncate=True)


def test_the_five_models_are_listed():
    listed = runner.invoke(app, ["list", "models"]).stdout.split()
    assert {"gpt-oss-20b", "gpt-oss-120b", "qwen3-moe-235b", "qwen3-moe-30b", "mixtral-8x7b"} <= set(listed)


@pytest.mark.parametrize("name, tp", [("gpt-oss-20b", 8), ("mixtral-8x7b", 8), ("qwen3-moe-235b", 4),
                                      ("qwen3-moe-235b", 8), ("qwen3-moe-30b", 8), ("gpt-oss-120b", 16)])
def test_tp_splits_or_replicates_key_value_heads(name, tp):
    """Up to P = Nkv each rank owns Nkv / P heads; above, each head is replicated on P / Nkv ranks (vLLM's
    QKVParallelLinear), so Qwen3-MoE runs at TP 8 and gpt-oss-120b at TP 16."""
    from simulator.attention.gqa import kv_split
    cfg = load_model(name)
    validate_tp(cfg, tp)
    heads, layout = kv_split(cfg.gqa_kv_heads, tp)
    assert heads == max(1, cfg.gqa_kv_heads // tp)
    assert layout == ("col" if tp <= cfg.gqa_kv_heads else f"col/{cfg.gqa_kv_heads}")


def test_a_tp_that_neither_divides_nor_multiplies_the_kv_heads_is_refused():
    cfg = replace(load_model("qwen3-moe-30b"), gqa_heads=24, gqa_kv_heads=4)
    with pytest.raises(UserError, match=r"--tp 6 neither divides nor is a multiple of gqa_kv_heads = 4"):
        validate_tp(cfg, 6)
    result = runner.invoke(app, ["step", "--model", "qwen3-moe-30b", "--tp", "3"])
    assert result.exit_code == 2 and "Traceback" not in result.output


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


GPT, QWEN, MIX = "gpt-oss-20b", "qwen3-moe-30b", "mixtral-8x7b"
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
    "gpt-rope-parameters": (GPT, dict(rope_parameters={"rope_theta": 150000}), "'rope_parameters' (transformers 5"),
    "qwen-head-dim-zero": (QWEN, dict(head_dim=0), "'gqa_head_dim' = 0 must be a positive integer"),
    "qwen-no-head-dim-not-dividing": (QWEN, dict(head_dim=DROP, num_attention_heads=30, num_key_value_heads=6),
                                      "'head_dim' is missing and num_attention_heads = 30 does not divide"),
    "qwen-kv-zero": (QWEN, dict(num_key_value_heads=0), "'gqa_kv_heads' = 0 must be a positive integer"),
    "qwen-bias-int": (QWEN, dict(attention_bias=1), "'attention_bias' = 1 should be of type bool"),
    "qwen-experts-missing": (QWEN, dict(num_experts=DROP), "required field 'num_experts' is missing"),
    "qwen-topk-above-experts": (QWEN, dict(num_experts_per_tok=129), "'top_k' = 129 exceeds"),
    "qwen-moe-width-float": (QWEN, dict(moe_intermediate_size=768.5), "'moe_intermediate_size' = 768.5 should be"),
    "qwen-norm-topk-string": (QWEN, dict(norm_topk_prob="true"), "'norm_topk_prob' = 'true' should be of type bool"),
    "qwen-sliding-on": (QWEN, dict(use_sliding_window=True), "'use_sliding_window' = true is not modelled"),
    "qwen-sparse-step-2": (QWEN, dict(decoder_sparse_step=2), "'decoder_sparse_step' = 2 would interleave"),
    "qwen-dense-not-prefix": (QWEN, dict(mlp_only_layers=[3]), "'mlp_only_layers' = [3] is not a prefix"),
    "qwen-dense-strings": (QWEN, dict(mlp_only_layers=["0"]), "'mlp_only_layers' = ['0'] is not a prefix"),
    "qwen-dense-width-missing": (QWEN, dict(mlp_only_layers=[0], intermediate_size=DROP),
                                 "required field 'intermediate_size' is missing"),
    "qwen-act-gelu": (QWEN, dict(hidden_act="gelu"), "'hidden_act' = 'gelu' is not modelled"),
    "qwen-eps-nan": (QWEN, dict(rms_norm_eps=float("nan")), "'rms_norm_eps' = nan must be a finite"),
    "qwen-theta-string": (QWEN, dict(rope_theta="1e6"), "'rope_theta' = '1e6' should be of type float"),
    "qwen-yarn-mscale-all-dim": (QWEN, dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "mscale_all_dim": 1.0,
                                                          "original_max_position_embeddings": 32768}),
                                 "sets mscale or mscale_all_dim"),
    "qwen-quant-int4": (QWEN, dict(quantization_config={"quant_method": "awq"}), "names format 'awq'"),
    "mix-window-negative": (MIX, dict(sliding_window=-4096), "'sliding_window' = -4096 must be a positive integer"),
    "mix-window-zero": (MIX, dict(sliding_window=0), "'sliding_window' = 0 must be a positive integer or null"),
    "mix-window-string": (MIX, dict(sliding_window="4096"), "'sliding_window' = '4096' should be of type int"),
    "mix-experts-zero": (MIX, dict(num_local_experts=0), "'num_experts' = 0 must be a positive integer"),
    "mix-topk-missing": (MIX, dict(num_experts_per_tok=DROP), "required field 'num_experts_per_tok' is missing"),
    "mix-width-zero": (MIX, dict(intermediate_size=0), "'moe_intermediate' = 0 must be a positive integer"),
    "mix-heads-float": (MIX, dict(num_attention_heads=32.0), "'num_attention_heads' = 32.0 should be of type int"),
    "mix-rope-dynamic": (MIX, dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "only 'yarn' is modelled"),
    "mix-act-relu": (MIX, dict(hidden_act="relu"), "'hidden_act' = 'relu' is not modelled"),
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


# ----------------------------------------------------------------------------- fp64 three-way on shrunk models
SHRUNK = {  # each model's own file with tiny dimensions, every feature kept: parsed as the real one is
    "gpt-oss": ("gpt-oss-20b", dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                                    num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                                    sliding_window=5, num_local_experts=8, num_experts_per_tok=2,
                                    experts_per_token=2, intermediate_size=64, vocab_size=256, rope_theta=10000,
                                    rope_scaling__factor=4.0, rope_scaling__original_max_position_embeddings=64,
                                    rope_scaling__beta_fast=4.0)),
    "qwen3-moe": ("qwen3-moe-30b", dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                                        num_hidden_layers=3, mlp_only_layers=[0], intermediate_size=96,
                                        moe_intermediate_size=32, num_experts=16, num_experts_per_tok=4,
                                        vocab_size=256)),
    "mixtral": ("mixtral-8x7b", dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                                     num_hidden_layers=2, sliding_window=5, num_local_experts=4,
                                     num_experts_per_tok=2, intermediate_size=64, vocab_size=256)),
}


def shrunk(kind: str, tmp_path: Path):
    name, changes = SHRUNK[kind]
    path = tmp_path / f"tiny-{kind}.json"
    path.write_text(json.dumps(variant(name, **changes)))
    return load_model(str(path))


def test_shrunk_models_keep_their_features(tmp_path):
    gpt, qwen, mix = (shrunk(k, tmp_path) for k in SHRUNK)
    assert gpt.gqa_windows == (5, 0) and gpt.gqa_sinks and gpt.hidden_act == "swiglu_oai" and gpt.o_proj_bias
    assert gpt.router_logit_bias and gpt.expert_bias and gpt.expert_dtype == "mxfp4"
    assert not gpt.rope_scaling.truncate and mla.rope_inv_freq(16, 1e4, gpt.rope_scaling)[1] != pytest.approx(
        mla.rope_inv_freq(16, 1e4, replace(gpt.rope_scaling, truncate=True))[1], rel=1e-9)  # the ramp is unrounded
    assert qwen.gqa_qk_norm and qwen.gqa_head_dim * qwen.gqa_heads != qwen.hidden_size and qwen.first_k_dense == 1
    assert mix.gqa_windows == (5, 5) and mix.gqa_head_dim == 8 and mix.renormalize


from simulator.check import check_layer  # noqa: E402
from simulator.plans.kernel import DecodeShape  # noqa: E402

THREE_WAY = [(kind, layer_type, layer, tp) for kind, layers in (("gpt-oss", ((0, "gqa"), (1, "gqa"))),
                                                                ("qwen3-moe", ((0, "dense"), (1, "gqa"))),
                                                                ("mixtral", ((1, "gqa"),)))
             for layer, layer_type in layers for tp in (1, 2, 4)]  # 2 key/value heads: TP 4 replicates each


@pytest.mark.parametrize("kind, layer_type, layer, tp", THREE_WAY,
                         ids=[f"{k}-L{layer}-{t}-P{p}" for k, t, layer, p in THREE_WAY])
def test_fp64_three_way_on_shrunk_models(kind, layer_type, layer, tp, tmp_path):
    """Standard and specialized plans against the float64 reference, 2 sequences x 2 tokens at context 20: past
    the 5-token windows and across a 16-position cache block."""
    cfg = shrunk(kind, tmp_path)
    result = check_layer(cfg, layer_type, tp, DecodeShape(2, 2, 20), "fp64", seed=layer + tp, layer=layer)
    errors = {(v.variant, t.name): t.rel_rms_error for v in result.variants.values() for t in v.tensors}
    assert {name for _, name in errors} >= {"prefix"} and len(result.variants) == 2
    assert all(e < 1e-12 for e in errors.values()), errors


# ----------------------------------------------------------------------------- each feature reaches the oracle
from simulator.check import make_inputs  # noqa: E402
from simulator.plans.common import make_dims  # noqa: E402
from simulator.reference import reference_layer  # noqa: E402
from simulator.weights import LayerWeights  # noqa: E402

FEATURES = [  # (shrunk model, layer, field switched off, its neutral value, xfail reason or None)
    ("gpt-oss", 0, "gqa_sinks", False, None),
    ("gpt-oss", 0, "gqa_windows", (0, 0), None),
    ("gpt-oss", 0, "gqa_qkv_bias", False, None),
    ("gpt-oss", 0, "rope_scaling.truncate", True, None),
    ("gpt-oss", 0, "hidden_act", "silu", None),
    ("gpt-oss", 0, "router_logit_bias", False, None),
    ("gpt-oss", 0, "expert_bias", False, None),
    ("gpt-oss", 0, "o_proj_bias", False, None),
    ("gpt-oss", 0, "selection_bias", True, None),  # on: DeepSeek's score bias, which these routers do not have
    ("qwen3-moe", 1, "gqa_qk_norm", False, None),
    ("qwen3-moe", 1, "renormalize", False, None),
    ("mixtral", 1, "gqa_windows", (), None),
]


def _delta(cfg, layer):
    d = make_dims(cfg, 1, DecodeShape(2, 2, 20), layer, cfg.layer_type(layer))
    io, state = make_inputs(cfg, d, np.random.default_rng(0))
    return reference_layer(cfg, d.layer, d.shape, LayerWeights(cfg, d.layer, 0), io, state)[0].delta


@pytest.mark.parametrize("kind, layer, field, off, reason", [
    pytest.param(*f, marks=pytest.mark.xfail(reason=f[4], strict=True) if f[4] else ()) for f in FEATURES],
    ids=[f"{f[0]}-{f[2]}" for f in FEATURES])
def test_each_parsed_feature_changes_the_reference(kind, layer, field, off, reason, tmp_path):
    """Guard against a field that is parsed and then ignored: switching it to its neutral value must move the
    float64 oracle's output (so the three-way tests above exercise it)."""
    cfg = shrunk(kind, tmp_path)
    if field == "rope_scaling.truncate":
        neutral = replace(cfg, rope_scaling=replace(cfg.rope_scaling, truncate=off))
    else:
        neutral = replace(cfg, **{field: off})
    assert np.abs(_delta(cfg, layer) - _delta(neutral, layer)).max() > 1e-9


@pytest.mark.parametrize("kind, layer_type, layer", [("gpt-oss", "gqa", 0), ("qwen3-moe", "dense", 0),
                                                     ("qwen3-moe", "gqa", 1), ("mixtral", "gqa", 1)])
def test_bf16_stays_within_the_check_s_bounds(kind, layer_type, layer, tmp_path):
    result = check_layer(shrunk(kind, tmp_path), layer_type, 2, DecodeShape(2, 2, 20), "bf16", layer=layer)
    assert result.passed, [(v.variant, t.name, t.rel_rms_error) for v in result.variants.values() for t in v.tensors]
