"""The attention registry (simulator/attention/): one entry per kind, checked against the plans it builds, and
the residual structure as a model feature (DeepSeek-V3 has no AttnRes kernel and declares no AttnRes weight)."""

import numpy as np
import pytest

from simulator import attention
from simulator.config import ATTENTION_KINDS, ATTENTION_WEIGHTS, load_model
from simulator.cost.memory import cache_bytes_per_gpu
from simulator.plans import specialized, standard
from simulator.plans.common import make_dims
from simulator.plans.kernel import DecodeShape
from simulator.plans.specialized import FUSIONS
from simulator.weights import weight_table

MODELS = ["tiny-k3", "tiny-deepseek", "kimi-k3", "deepseek-v3", "dspark-k3"]
SHAPE = DecodeShape(2, 2, 37)


def _plans(cfg, tp=2, shape=SHAPE):
    """Every plan of the model: each layer type it has, standard and specialized, each fusion off alone."""
    for layer_type, n in cfg.layer_counts().items():
        if n:
            yield standard.build(cfg, tp, shape, layer_type)
            yield specialized.build(cfg, tp, shape, layer_type)
            for fusion in FUSIONS:
                yield specialized.build(cfg, tp, shape, layer_type, fusions=set(FUSIONS) - {fusion})


def test_every_kind_has_one_entry_and_one_weight_table():
    assert list(attention.KINDS) == list(ATTENTION_KINDS) == list(ATTENTION_WEIGHTS)
    assert all(attention.kind(name).name == name for name in ATTENTION_KINDS)
    with pytest.raises(KeyError, match="unknown attention kind"):
        attention.kind("gqa-not-registered")


@pytest.mark.parametrize("model", MODELS)
def test_residual_structure_is_the_models(model):
    """AttnRes only where the config has blocks; a plain-residual model's plans launch no AttnRes kernel,
    declare no AttnRes weight, and its weight table holds none."""
    cfg = load_model(model)
    assert cfg.residual == ("attn_res" if cfg.attn_res_block else "plain")
    for plan in _plans(cfg):
        names = {k.name for k in plan} | {k.key for k in plan}
        weights = {name for k in plan for t in k.weights for name, _ in t.parts}
        has_res = any("attn_res" in n or "attnres" in n for n in names) or any("_res_" in w for w in weights)
        assert has_res == (cfg.residual == "attn_res"), (model, plan.variant, plan.layer, sorted(names))
    assert any("_res_" in name for name in weight_table(cfg)) == (cfg.residual == "attn_res")


def _declared(plan, name: str):
    return next(t for k in plan for t in k.reads + k.writes if t.name == name and t.window is None)


@pytest.mark.parametrize("model", ["tiny-k3", "tiny-deepseek", "kimi-k3"])
@pytest.mark.parametrize("tp", [1, 2])
def test_memory_of_each_entry_is_the_state_its_plan_declares(model, tp):
    """An entry's cache or state bytes per GPU are the state tensors its standard plan declares x its layers."""
    cfg = load_model(model)
    shape = DecodeShape(3, 2, 11)
    state_names = {"kda": ("kda.state", "kda.conv"), "mla": ("mla.cache",)}  # what each kind's kernels keep
    for kind in dict.fromkeys(cfg.attn_kinds):
        layer_type = kind if cfg.layer_counts()[kind] else "dense"
        plan = standard.build(cfg, tp, shape, layer_type)
        declared = sum(_declared(plan, name).nbytes for name in state_names[kind])
        key, _, total = attention.kind(kind).memory
        layers = cfg.attn_kinds.count(kind)
        assert total(cfg, tp, shape) == cache_bytes_per_gpu(cfg, tp, shape)[key] == declared * layers


@pytest.mark.parametrize("model", ["tiny-k3", "tiny-deepseek"])
def test_reads_context_is_what_the_plans_read(model):
    """A kind's plans change with the context exactly when its entry says its kernels read it (a KV cache)."""
    cfg = load_model(model)
    for kind in dict.fromkeys(cfg.attn_kinds):
        layer_type = kind if cfg.layer_counts()[kind] else "dense"
        for build in (standard.build, specialized.build):
            short, long = (build(cfg, 2, DecodeShape(1, 1, ctx), layer_type) for ctx in (5, 50))
            assert (short.kernels != long.kernels) == attention.kind(kind).reads_context, (kind, build)


@pytest.mark.parametrize("model", ["tiny-k3", "tiny-deepseek"])
@pytest.mark.parametrize("tp", [1, 2])
def test_sharded_state_is_what_each_rank_declares(model, tp):
    """An entry's initial state, sharded, has the shapes its plan's kernels declare on one rank, and unshards
    back to itself."""
    cfg = load_model(model)
    for kind in dict.fromkeys(cfg.attn_kinds):
        layer_type = kind if cfg.layer_counts()[kind] else "dense"
        d = make_dims(cfg, tp, SHAPE, None, layer_type)
        state = attention.initial_state(cfg, kind, SHAPE, np.random.default_rng(0))
        ranks = attention.shard_state(state, tp)
        plan = standard.build(cfg, tp, SHAPE, layer_type)
        for name, value in ranks[0].items():
            if value.ndim > 1:
                assert value.shape == _declared(plan, name).shape, (kind, name)
        back = attention.unshard_state(ranks, state, 0)
        assert back.keys() == state.keys() and all(np.array_equal(back[k], state[k]) for k in state)
        assert d.attn_width * tp == ATTENTION_WEIGHTS[kind](cfg)[f"{kind}.w_o"][0][0]


def test_kernel_names_follow_the_gpus_implementation_set():
    """DeepSeek-V3 on an H200 priced with vLLM's Hopper kernels shows FlashMLA's decode, not the TRT-LLM-gen
    (Blackwell) kernel of the plan; a GPU priced by the datasheet law keeps the plan's names."""
    from simulator.cost.step import layer_timeline
    from simulator.hardware import load_hardware
    cfg, shape = load_model("deepseek-v3"), DecodeShape(16, 1, 1024)
    names = {}
    for gpu in ("h200", "gb300"):
        hw = load_hardware(gpu)
        names[gpu] = {v: [s.name for s in layer_timeline(cfg, hw, v, 8, shape, "mla").spans]
                      for v in ("standard", "specialized")}
    assert load_hardware("h200").kernels == "vllm" and load_hardware("gb300").kernel_set is None
    for variant in ("standard", "specialized"):
        assert "flash_fwd_splitkv_mla_kernel" in names["h200"][variant]
        assert not any("trtllm" in n for n in names["h200"][variant])
        assert "trtllm_gen_mla_decode" in names["gb300"][variant]
