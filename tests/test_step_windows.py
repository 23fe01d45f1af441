"""A step of a sliding-window model prices its banded and its full-attention layers apart (gpt-oss alternates
them); a model whose layers attend alike keeps pricing one representative layer per type."""

import pytest

from simulator.config import load_model
from simulator.cost.step import estimate_step, layer_groups, layer_us, representative_layer
from simulator.hardware import load_hardware
from simulator.plans.kernel import DecodeShape


def test_layer_groups_split_by_window_only():
    oss, k3 = load_model("gpt-oss-20b"), load_model("kimi-k3")
    groups = layer_groups(oss, "gqa")
    assert sorted(oss.gqa_window(i) for i, _ in groups) == [0, 128] and sum(n for _, n in groups) == 24
    assert layer_groups(k3, "kda") == ((representative_layer(k3, "kda"), k3.layer_counts()["kda"]),)


@pytest.mark.parametrize("hardware", ["h200", "mi300x"])
def test_step_sums_each_window_group(hardware):
    oss, hw = load_model("gpt-oss-20b"), load_hardware(hardware)
    step = estimate_step(oss, hw, "standard", 1, 32, 1720)
    shape = DecodeShape(32, 1, 1720)
    parts = [(n, layer_us(oss, hw, "standard", 1, shape, "gqa", layer=i)[0]) for i, n in layer_groups(oss, "gqa")]
    sliding, full = sorted(t for _, t in parts)
    assert full > sliding * 1.05  # a full layer reads 1,721 cached positions, a banded one 128
    assert step.breakdown_us["gqa_layers"] == pytest.approx(sum(n * t for n, t in parts), rel=1e-12)
    assert step.layer_us["gqa"] == pytest.approx(step.breakdown_us["gqa_layers"] / 24, rel=1e-12)
