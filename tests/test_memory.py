"""Memory per GPU (weights + MLA cache + KDA state + activations) checked by hand, printed with its parts,
and a sweep point that does not fit becomes a skipped row."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from simulator import attention, sweep
from simulator.cli import app
from simulator.cost.memory import activation_bytes_per_gpu, cache_bytes_per_gpu, memory_per_gpu
from simulator.plans.kernel import DecodeShape
from simulator.scenario import DEFAULTS

runner = CliRunner()
ISSUE_SHAPE = DecodeShape(64, 1, 131072)  # step --hardware h200 --tp 8 --batch 64 --context 131072


def test_mla_cache_is_116_gb_by_hand(k3):
    # 576 B per token per MLA layer (512 latent + 64 pe, FP8), 24 MLA layers, replicated on all 8 ranks:
    # 64 sequences x (131,072 + 1) rows x 576 B x 24 = 115,965,001,728 B
    assert cache_bytes_per_gpu(k3, 8, ISSUE_SHAPE)["mla_cache"] == 64 * 131073 * 576 * 24 == 115_965_001_728


def test_kda_state_by_hand(k3):
    # per sequence per KDA layer at TP8: 12 heads x 128 x 128 x 4 B (FP32 state) = 786,432 B
    # + conv history 3 x 12 x 128 channels x 3 taps x 2 B (BF16) = 27,648 B; 69 KDA layers (layer 0 too)
    assert k3.attn_kinds.count("kda") == 69
    assert cache_bytes_per_gpu(k3, 8, DecodeShape(1, 1, 0))["kda_state"] == 69 * (786_432 + 27_648)
    assert cache_bytes_per_gpu(k3, 8, ISSUE_SHAPE)["kda_state"] == 64 * 69 * 814_080  # 3.6 GB: independent of context


def test_activations_are_modest_by_hand(k3):
    # per token at TP8: stream 2 B x 7168 x (8 block snapshots + 3) = 157,696 B, plus the widest
    # intermediate = MoE rows 2 B x 16 x (3584 + 2 x 3072 / 8) = 139,264 B (> logits 4 B x 163840 / 8)
    assert activation_bytes_per_gpu(k3, 8, DecodeShape(1, 1, 0)) == 157_696 + 139_264
    assert activation_bytes_per_gpu(k3, 8, ISSUE_SHAPE) < 0.1e9


def test_issue_example_does_not_fit(k3):
    from simulator.hardware import load_hardware
    mem = memory_per_gpu(k3, load_hardware("h200").hbm_capacity, 8, ISSUE_SHAPE)
    assert round(mem.weights / 1e9) == 205 and round(mem["mla_cache"] / 1e9) == 116
    assert mem.total == mem.weights + mem["mla_cache"] + mem["kda_state"] + mem.activations and not mem.fits


def test_step_prints_memory_parts_and_warns():
    args = ["step", "--hardware", "h200", "--tp", "8", "--batch", "64", "--context", "131072"]
    mem = json.loads(runner.invoke(app, args + ["--json"]).stdout)["memory_gb"]
    caches = {kind.memory[0] for kind in attention.entries()}  # each attention kind's part ("mla_cache", ...)
    assert {"mla_cache", "kda_state"} <= caches
    assert set(mem) == {"weights", "activations", "total", "capacity", "fits"} | caches
    assert mem["mla_cache"] == pytest.approx(115.965) and mem["fits"] is False and mem["capacity"] == 141.0
    text = " ".join(runner.invoke(app, args).stdout.split())  # the sentence wraps at the terminal's width
    assert "DOES NOT FIT IN HBM: kimi-k3 at TP8 on H200 needs 324.6 GB per GPU" in text and "MLA cache 116.0" in text


def test_layer_prints_memory_when_it_fits():
    r = runner.invoke(app, ["layer", "--hardware", "gb300", "--tp", "16", "--batch", "1"])
    assert r.exit_code == 0 and "memory per GPU: 108." in r.stdout
    mem = json.loads(runner.invoke(app, ["layer", "--json"]).stdout)["memory_gb"]
    assert mem["fits"] is True and mem["total"] > mem["weights"]


def test_sweep_point_that_does_not_fit_is_skipped_with_its_reason():
    fits = DEFAULTS | {"hardware": "gb300", "tp": 8, "batch": 1}
    too_long = fits | {"batch": 64, "context": 131072}
    assert sweep.evaluate(fits, "step")[0]["status"] == "ok"
    assert sweep.evaluate(fits, "step")[0]["memory_mla_cache_gb"] == pytest.approx(1e-9 * 513 * 576 * 24, abs=0.01)
    for kind in ("step", "layer", "ablation"):
        rows = sweep.evaluate(too_long, kind)
        assert len(rows) == 1 and rows[0]["status"].startswith("skipped: does not fit: needs ")
        assert "MLA cache 116.0" in rows[0]["status"]


FP32_WEIGHTS = ("kda.dt_bias", "kda.a_log", "kda.o_norm", "router.bias")  # FP32 in the checkpoint


def _family(name: str) -> str:
    return name.split(".")[0] if "." in name else "residual"


@pytest.mark.parametrize("model", ["tiny-k3", "tiny-deepseek"])
def test_weight_memory_at_tp1_is_the_whole_specification(model):
    """At TP1 nothing is sharded: one GPU holds every spec weight each layer's type uses (its attention
    family, MoE or dense FFN, the residual-stream norms), all E experts, the embedding and the LM head.
    Counted here from `weights.weight_table` alone, without the plans."""
    from simulator.config import load_model
    from simulator.cost.memory import weight_bytes_per_gpu
    from simulator.plans.kernel import Tensor
    from simulator.weights import model_weight_table, weight_spec, weight_table
    cfg = load_model(model)
    table = weight_table(cfg)
    unused = {"mla.w_g"} if not cfg.mla_output_gate else set()
    unused |= {"latent.w_down", "latent.norm", "latent.w_up"} if not cfg.latent_dim else set()
    unused |= {"latent.norm"} if not cfg.latent_norm else set()
    unused |= {"shared.w_gate", "shared.w_up", "shared.w_down"} if not cfg.num_shared_experts else set()

    def nbytes(name):
        return Tensor(name, table[name][0], "fp32" if name in FP32_WEIGHTS else "bf16").nbytes

    expert = sum(Tensor(p, weight_spec(cfg, f"expert.0.{p}")[0], cfg.expert_dtype).nbytes
                 for p in ("w_gate", "w_up", "w_down"))
    total = 0
    for i in range(cfg.num_layers):
        kind = cfg.layer_type(i)
        families = {"residual", cfg.attn_kinds[i]} | ({"dense"} if kind == "dense" else {"router", "latent", "shared"})
        total += sum(nbytes(n) for n in table if _family(n) in families and n not in unused)
        total += cfg.num_experts * expert if kind != "dense" else 0
    total += sum(2 * shape[0] * shape[1] for shape, _ in model_weight_table(cfg).values())
    assert weight_bytes_per_gpu(cfg, 1) == total
