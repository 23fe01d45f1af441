import pytest

from simulator.config import load_model


@pytest.fixture(scope="session")
def tiny():
    return load_model("tiny-k3")


@pytest.fixture(scope="session")
def tiny_ds():
    return load_model("tiny-deepseek")


def tiny_gqa_model():
    """tiny-deepseek's MoE with GQA attention: 8 query heads sharing 2 key/value heads of 16, layer 1 sliding over
    its last 5 positions, sinks, QK-norm, q/k/v biases and YaRN all on (no shipped model has GQA layers yet)."""
    from dataclasses import replace

    from simulator.config import RopeScaling
    return replace(load_model("tiny-deepseek"), attn_kinds=("gqa",) * 3, gqa_heads=8, gqa_kv_heads=2,
                   gqa_head_dim=16, gqa_windows=(0, 5, 0), gqa_sinks=True, gqa_qk_norm=True, gqa_qkv_bias=True,
                   rope_theta=10000.0, rope_scaling=RopeScaling(factor=4.0, original_max=16, mscale_all_dim=1.0))


@pytest.fixture(scope="session")
def tiny_gqa():
    return tiny_gqa_model()


@pytest.fixture(scope="session")
def k3():
    return load_model("kimi-k3")
