import json

import pytest

from simulator.config import list_models, load_model, validate_tp
from simulator.errors import UserError


def test_presets_load():
    assert {"kimi-k3", "deepseek-v3", "tiny-k3", "tiny-deepseek"} <= set(list_models())


def test_kimi_k3_dimensions(k3):
    assert (k3.num_layers, k3.hidden_size, k3.num_experts, k3.top_k) == (93, 7168, 896, 16)
    assert (k3.latent_dim, k3.attn_res_block, k3.expert_dtype, k3.hidden_act) == (3584, 12, "mxfp4", "situ")
    assert (k3.situ_beta, k3.situ_linear_beta) == (4.0, 25.0)
    assert k3.shared_intermediate == 6144 and k3.mla_qk_head_dim == 192
    mla = [i for i, k in enumerate(k3.attn_kinds) if k == "mla"]
    assert len(mla) == 24 and mla[-3:] == [87, 91, 92]  # explicit list: the last two MLA layers are adjacent
    assert k3.layer_counts() == {"kda": 68, "mla": 24, "dense": 1}  # layer 0 is KDA attention + dense FFN
    assert k3.attn_kinds[0] == "kda" and k3.mla_nope and k3.mla_output_gate


def test_deepseek_v3(tiny_ds):
    ds = load_model("deepseek-v3")
    assert (ds.num_experts, ds.top_k, ds.n_group, ds.topk_group, ds.latent_dim) == (256, 8, 8, 4, 0)
    assert ds.hidden_act == "silu" and not ds.mla_nope and ds.attn_res_block == 0
    assert tiny_ds.n_group == 4


def test_model_by_path(tmp_path):
    src = json.loads(open("models/tiny-k3.json").read())
    p = tmp_path / "mine.json"
    p.write_text(json.dumps(src["text_config"]))  # a bare kimi_linear config works too
    cfg = load_model(str(p))
    assert cfg.family == "kimi_linear" and cfg.name == "mine"


def _write(tmp_path, mutate):
    raw = json.loads(open("models/tiny-k3.json").read())
    mutate(raw["text_config"])
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(raw))
    return str(p)


@pytest.mark.parametrize("mutate, needle", [
    (lambda t: t.update(num_experts_per_token=64), "top_k"),
    (lambda t: t.update(hidden_act="gelu_fancy"), "hidden_act"),
    (lambda t: t.pop("hidden_size"), "hidden_size"),
    (lambda t: t.update(num_experts="many"), "num_experts"),
    (lambda t: t.update(num_hidden_layers=-3), "num_hidden_layers"),
    (lambda t: t["linear_attn_config"].update(full_attn_layers=[3, 99]), "full_attn_layers"),
], ids=["topk-above-E", "unknown-activation", "missing-field", "wrong-type", "negative", "layer-out-of-range"])
def test_bad_config_names_the_field(tmp_path, mutate, needle):
    with pytest.raises(UserError) as err:
        load_model(_write(tmp_path, mutate))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_not_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_model(str(p))


def test_tp_must_divide(tiny, k3):
    validate_tp(k3, 16)
    with pytest.raises(UserError, match="does not divide"):
        validate_tp(tiny, 3)
    with pytest.raises(UserError, match="positive"):
        validate_tp(tiny, 0)
