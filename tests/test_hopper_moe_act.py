"""The Hopper MoE: the activation between the expert GEMMs is a launch of its own (vLLM 0.33.0's Triton fused_moe
and Marlin experts, fused_moe.py fused_experts_impl -> activation.py apply_moe_activation), computed as the fp64
reference computes the layer."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.check import check_layer, make_inputs
from simulator.config import load_model
from simulator.cost import laws
from simulator.dtypes import Precision
from simulator.execute import run_plan
from simulator.hardware import load_hardware
from simulator.plans import standard
from simulator.plans.common import make_dims
from simulator.plans.kernel import DecodeShape
from simulator.reference import reference_layer
from simulator.weights import LayerWeights


def keys(model: str, layer: str, arch: str) -> list[str]:
    return [k.key for k in standard.build(load_model(model), 8, DecodeShape(2, 1, 64), layer, None, arch=arch)]


@pytest.mark.parametrize("model, layer", [("kimi-k3", "kda"), ("deepseek-v3", "mla"), ("qwen3-moe-30b", "gqa"),
                                          ("mixtral-8x7b", "gqa")])
def test_hopper_launches_the_activation_apart_blackwell_in_the_epilogue(model, layer):
    hopper, blackwell = keys(model, layer, "sm90"), keys(model, layer, "sm100")
    assert hopper[hopper.index("fc1"):hopper.index("fc2") + 1] == ["fc1", "moe_act", "fc2"]
    assert "moe_act" not in blackwell


def test_gpt_oss_keeps_its_swiglu_in_matmul_ogs():
    assert "moe_act" not in keys("gpt-oss-20b", "gqa", "sm90")


@pytest.mark.parametrize("name, layer, tp, shape", [("tiny", "kda", 4, DecodeShape(3, 2, 5)),
                                                     ("tiny", "mla", 2, DecodeShape(2, 1, 6)),
                                                     ("tiny_ds", "mla", 4, DecodeShape(3, 1, 5))])
def test_the_hopper_plan_is_the_reference_in_fp64(request, name, layer, tp, shape):
    cfg = request.getfixturevalue(name)
    d = make_dims(cfg, tp, shape, None, layer)
    plan = standard.build(cfg, tp, shape, layer, d.layer, arch="sm90")
    assert "moe_act" in [k.key for k in plan]
    io, st = make_inputs(cfg, d, np.random.default_rng(7))
    weights = LayerWeights(cfg, d.layer, 7)
    ref_io, _, _ = reference_layer(cfg, d.layer, d.shape, weights, io, st)
    out, _, _ = run_plan(plan, d, weights, io, st, Precision("fp64"))
    for got, want in ((out.delta, ref_io.delta), (out.prefix, ref_io.prefix)):
        assert np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)) < 1e-12
    assert check_layer(cfg, layer, tp, shape, "fp64", seed=7).passed  # the other plans, on the same layer


def test_the_activation_is_priced_as_the_shared_experts_launch():
    """The same _C activation kernel as the shared expert's (the replays' stand-in for both): its measured floor."""
    hw = load_hardware("h200")
    plan = standard.build(load_model("kimi-k3"), 8, DecodeShape(8, 1, 1024), "kda", None, arch="sm90")
    act, shared = plan.kernel("moe_act"), plan.kernel("shared_act")
    assert laws.role_of(act) == ("small", "shared_act") == laws.role_of(shared)
    assert laws.law_us(act, hw.kernel_set, hw.sm_count, hw.l2_bytes) is not None
