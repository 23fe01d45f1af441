"""The MoE-path registry (simulator/moe/): which path a layer's MoE takes, per model, size and GPU path."""

import pytest

from simulator.config import list_models, load_model
from simulator.moe import PATHS, moe_path
from simulator.plans.common import make_dims
from simulator.plans.kernel import DecodeShape


def _path(model: str, layer_type: str, tp: int, batch: int, arch: str) -> str:
    return moe_path(make_dims(load_model(model), tp, DecodeShape(batch, 1, 512), None, layer_type), arch).name


@pytest.mark.parametrize("model, layer_type, tp, batch, arch, want", [
    ("kimi-k3", "kda", 16, 8, "sm100", "latent"),  # the tier-0 tail up to 128 tokens on Blackwell
    ("kimi-k3", "mla", 8, 128, "sm100", "latent"),
    ("kimi-k3", "kda", 16, 129, "sm100", "fused"),  # above it the stock forward's unfused latent tail
    ("kimi-k3", "kda", 8, 8, "sm90", "fused"),  # Hopper has no tier-0 tail
    ("gpt-oss-20b", "gqa", 2, 8, "sm90", "ogs"),  # MXFP4 experts through matmul_ogs on Hopper and ROCm
    ("gpt-oss-20b", "gqa", 1, 8, "gfx942", "ogs"),
    ("gpt-oss-20b", "gqa", 2, 8, "sm100", "fused"),
    ("deepseek-v3", "mla", 16, 8, "sm100", "fused"),
    ("deepseek-v3", "mla", 8, 8, "sm90", "fused"),
])
def test_each_layer_takes_its_path(model, layer_type, tp, batch, arch, want):
    assert _path(model, layer_type, tp, batch, arch) == want


def test_the_specialized_plan_finds_kernels_for_every_model():
    """The specialized plan is Blackwell's: every path it can take there has specialized kernels."""
    for model in list_models():
        cfg = load_model(model)
        for layer_type in sorted({cfg.layer_type(i) for i in range(cfg.num_layers)} - {"dense"}):
            for batch in (1, 8, 64, 200):
                d = make_dims(cfg, 1, DecodeShape(batch, 1, 512), None, layer_type)
                assert moe_path(d, "sm100").specialized is not None, (model, layer_type, batch)
    assert PATHS["ogs"].specialized is None and list(PATHS)[-1] == "fused"  # fused is tried last: it takes all
