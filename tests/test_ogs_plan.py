"""gpt-oss's standard plan on Hopper and ROCm (simulator/moe/ogs.py, attention/gqa.py's ROCm launches): the
triton_kernels matmul_ogs MoE and aiter's 2d / split-KV 3d unified attention agree with the float64 reference;
the launches per layer are the MI300X trace's; the GQA decode law reads the window's bytes and its grid."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest

from simulator import check
from simulator.attention import gqa
from simulator.config import load_model
from simulator.cost.laws import gqa_chain_us, gqa_grid
from simulator.cost.pricing import price_kernel
from simulator.hardware import load_hardware
from simulator.plans import standard
from simulator.plans.common import make_dims
from simulator.plans.kernel import DecodeShape

ARCHS = ("gfx942", "sm90")


@pytest.fixture(scope="module")
def oss():
    return load_model("gpt-oss-20b")


@pytest.fixture(scope="module")
def tiny_oss(oss):
    """gpt-oss shrunk: every feature kept (sinks, biases, YaRN, clamped SwiGLU, MXFP4, a sliding layer 0)."""
    return replace(oss, name="tiny-gpt-oss", hidden_size=64, num_layers=2, attn_kinds=("gqa",) * 2, gqa_windows=(5, 0),
                   gqa_heads=8, gqa_kv_heads=2, gqa_head_dim=16, num_experts=8, top_k=2, moe_intermediate=64,
                   vocab_size=512, rope_scaling=replace(oss.rope_scaling, original_max=16, factor=4.0))


@pytest.fixture
def arch_plans(monkeypatch):
    """check_layer builds each arch's standard plan as its variants."""
    monkeypatch.setattr(check, "BUILDERS", {a: partial(standard.build, arch=a) for a in ARCHS})


CASES = [(tp, layer, ctx) for tp in (1, 2) for layer, ctx in ((0, 20), (1, 20), (1, 600))]


@pytest.mark.parametrize("tp, layer, context", CASES, ids=[f"P{p}-L{L}-C{c}" for p, L, c in CASES])
def test_fp64_three_way(tiny_oss, arch_plans, tp, layer, context):
    """The ROCm plan (with the 3d split at 600 cached positions of the full layer) and the Hopper plan agree with
    the reference to fp64 rounding."""
    result = check.check_layer(tiny_oss, "gqa", tp, DecodeShape(3, 1, context), "fp64", seed=tp + layer, layer=layer)
    assert set(result.variants) == set(ARCHS)
    for v in result.variants.values():
        assert {"moe_out", "gqa.k_cache[new]"} <= {t.name for t in v.tensors}
        for t in v.tensors:
            assert t.rel_rms_error < 1e-12, f"{v.variant} {t.name}: rel RMS {t.rel_rms_error:.2e}"


def test_bf16_stays_bounded(tiny_oss, arch_plans):
    result = check.check_layer(tiny_oss, "gqa", 1, DecodeShape(4, 1, 600), "bf16", layer=1)
    assert result.passed, [(v.variant, t.name, t.rel_rms_error) for v in result.variants.values() for t in v.tensors]


def test_launches_are_the_traces(oss):
    """MI300X, TP1, batch 32 at 1,720 cached positions: 16 launches in layer 0 (no cache cast: the step's first
    kernel does it), 17 in a sliding layer, 18 in a full one (3d + reduce_segments), as the public trace."""
    shape = DecodeShape(32, 1, 1720)
    plans = {i: standard.build(oss, 1, shape, "gqa", i, arch="gfx942") for i in (0, 12, 13)}
    assert [len(plans[i]) for i in (0, 12, 13)] == [16, 17, 18]
    names = [k.name for k in plans[13]]
    assert names[5:7] == ["kernel_unified_attention_3d", "reduce_segments"]
    assert plans[12].kernel("gqa_decode").name == "kernel_unified_attention_2d"
    assert [k.key for k in plans[13]][-9:] == ["router", "moe_pad", "topk", "ogs_hist", "ogs_memset", "ogs_indices",
                                               "fc1", "fc2", "finalize"]
    assert "attn_all_reduce" not in [k.key for k in plans[13]]  # one GPU: no all-reduce
    assert plans[13].kernel("gqa_rope_cache").hbm_bytes == 131072 * 64 * (4 + 2)  # the fp32 YaRN table, cast
    hopper = standard.build(oss, 2, shape, "gqa", 13, arch="sm90")
    assert "moe_pad" not in [k.key for k in hopper] and hopper.kernels[-1].key == "moe_all_reduce"
    kimi = standard.build(load_model("kimi-k3"), 8, DecodeShape(8, 1, 512), "mla", arch="sm90")
    assert "ogs_hist" not in [k.key for k in kimi]  # Kimi's MXFP4 SiTU experts keep their path


def test_rocm_padding_streams_the_padded_experts(oss):
    """ROCm's matmul_ogs stores 2880 x 5760 gate/up experts as 3072 x 6144: (3072 / 2880)^2 more bytes."""
    shape = DecodeShape(32, 1, 1720)
    amd, nv = (standard.build(oss, 1, shape, "gqa", 12, arch=a).kernel("fc1") for a in ("gfx942", "sm90"))
    assert amd.weights[0].shape[1:] == (3072, 6144) and nv.weights[0].shape[1:] == (2880, 5760)
    assert amd.weights[0].nbytes / nv.weights[0].nbytes == pytest.approx((3072 / 2880) ** 2, rel=1e-3)


@pytest.mark.parametrize("layer, context, tokens, expected", [
    (12, 1720, 32, 1),      # a sliding layer: always the 2d kernel
    (13, 500, 32, 1),       # <= 512 cached positions
    (13, 1720, 32, 16),     # grid (16 + 32) x 8 = 384 programs <= 1216: ceil(1216 / 384) = 4 -> at least 16
    (13, 1720, 2, 64),      # grid (1 + 2) x 8 = 24: ceil(1216 / 24) = 51 -> the next power of 2
    (13, 1720, 256, 1),     # grid (128 + 256) x 8 = 3072 > 1216: the 2d kernel
])
def test_rocm_split_follows_aiter(oss, layer, context, tokens, expected):
    d = make_dims(oss, 1, DecodeShape(tokens, 1, context), layer, "gqa")
    assert gqa.rocm_split(d, "gfx942") == expected


def test_decode_law_reads_the_window_and_its_grid(oss):
    """A sliding layer's bytes are its window's (128 of 1,721 positions), the full layer's the whole cache; the
    tile chain runs the grid's programs in waves of 304 CUs x 4."""
    hw = load_hardware("mi300x")
    shape = DecodeShape(32, 1, 1720)
    slide, full = (standard.build(oss, 1, shape, "gqa", i, arch="gfx942").kernel("gqa_decode") for i in (12, 13))
    kv = 32 * 2 * 8 * 64 * 2  # bytes of one position of every sequence, K and V
    assert slide.hbm_bytes - kv * 128 == full.hbm_bytes - kv * 1721 - 32 * 64 * 16 * 66 * 4  # + fp32 partials
    programs, tiles, segments, tile_bytes = gqa_grid(full)
    assert (programs, segments, tiles, tile_bytes) == (32 * 8 * 16, 16, -(-108 // 16), 16 * 2 * 64 * 2)
    assert gqa_chain_us(full, 304, 35e9) == pytest.approx(-(-4096 // 1216) * 7 * 4096 / 35e9 * 1e6)
    assert price_kernel(full, hw).mem_us > price_kernel(full, hw).math_us  # batch 32: streaming the cache binds
    few = standard.build(oss, 1, DecodeShape(1, 1, 1720), "gqa", 13, arch="sm90").kernel("gqa_decode")
    cost = price_kernel(few, hw)  # one sequence, 8 unsplit programs: each walks 108 tiles at one CTA's rate
    assert cost.math_us == pytest.approx(108 * 4096 / 35e9 * 1e6)
    assert cost.stream_bandwidth == 8 * 35e9 and cost.mem_us == pytest.approx(cost.math_us, rel=0.05)
