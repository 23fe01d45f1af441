"""Kernel families: declared by every kernel factory, and the same vocabulary the H200 measurements use.

The family decides which law prices a kernel (pricing), which residual factor its draws take
(uncertainty) and under which CSV the GPU suite measures it (validate). Nothing guesses it from a kind or
a name, so each check below compares the declaration with an independent fact: the calibration rows that
measure a plan kernel, the op the kernel binds to, the kernel's collective.
"""

import csv
from pathlib import Path

import pytest

from simulator.config import load_model
from simulator.cost.measured import _plan, normalise
from simulator.cost.step import build_plan, head_plan
from simulator.cost.uncertainty import kernel_families
from simulator.plans import VARIANTS
from simulator.plans.fuse import Chain
from simulator.plans.kernel import FAMILIES, DecodeShape, Kernel
from conftest import tiny_gqa_model

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "calibration" / "h200"


def every_plan_kernel():
    for model in ("kimi-k3", "deepseek-v3", "tiny-k3", "tiny-deepseek", "tiny-gqa"):
        cfg = tiny_gqa_model() if model == "tiny-gqa" else load_model(model)
        for variant in VARIANTS:
            for tp, shape in ((2, DecodeShape(1, 1, 512)), (8, DecodeShape(1, 1, 512)), (16, DecodeShape(4, 8, 4096))):
                for layer in cfg.layer_counts():
                    try:
                        plan = build_plan(cfg, variant, tp, shape, layer)
                    except Exception:  # a layout the model cannot take (tiny models at TP16): not a family question
                        continue
                    yield from ((model, variant, layer, k) for k in plan)
                yield from ((model, variant, "head", k) for k in head_plan(cfg, tp, shape, variant, False))


def test_a_kernel_must_declare_a_known_family():
    with pytest.raises(ValueError, match="family"):
        Kernel("k", "k", "gemm")
    with pytest.raises(ValueError, match="family"):
        Kernel("k", "k", "attention", family="attention")


def test_every_plan_kernel_declares_the_family_of_its_work():
    seen = set()
    for model, variant, layer, k in every_plan_kernel():
        where = f"{model} {variant} {layer} {k.key}"
        assert k.family in FAMILIES, where
        seen.add(k.family)
        if k.kind == "moe":
            assert k.family == "moe", where
        if k.kind == "attention":  # an attention kind's own kernel: its op (a fused one: a part's) is ops/<kind>.py's
            ops = [p.op for p in k.op.parts] if isinstance(k.op, Chain) else [k.op]
            assert k.family in {op.__module__.rsplit(".", 1)[-1] for op in ops}, where
        if k.kind == "collective":
            assert k.family == "collective" and k.collective is not None, where
        if k.family in ("gemm", "moe"):  # a GEMM multiplies by weights and says so in its FLOPs
            assert k.weights and k.flops > 0, where
        if k.family == "small":
            assert k.kind in ("pointwise", "router"), where
    assert seen == set(FAMILIES)


def test_the_routing_topk_is_a_small_kernel_not_a_gemm():
    cfg = load_model("kimi-k3")
    topk = build_plan(cfg, "standard", 8, DecodeShape(1, 1, 512), "kda").kernel("topk")
    assert topk.weights  # it reads the selection bias: a weight, yet no GEMM
    assert kernel_families(topk) == ("small", None)
    fused = build_plan(cfg, "specialized", 16, DecodeShape(1, 8, 512), "kda").kernel("oproj_ar_norm")
    assert kernel_families(fused) == ("gemm", "collective")  # its exchange takes the collective factor


def test_each_measured_plan_kernel_is_measured_under_its_declared_family():
    rows = []
    for path in sorted(MEASURED.glob("*.csv")):
        with path.open(newline="") as f:
            rows += [normalise(r) for r in csv.DictReader(f) if r.get("plan_key") and r.get("model")]
    checked = 0
    for r in rows:
        if r["family"] not in FAMILIES or r["family"] == "kda" and r["plan_key"] == "kda_decode":
            continue  # the one-program-per-head rows stand for the specialized plan's fused decode (below)
        layer = r["layer"] or "kda"
        kernels = {k.key: k for v in VARIANTS for k in _plan(r["model"], v, r["tp"], 1, 1, 512, layer)}
        assert r["plan_key"] in kernels, r["id"]
        assert kernels[r["plan_key"]].family == r["family"], r["id"]
        checked += 1
    fused = _plan("kimi-k3", "specialized", 8, 1, 1, 512, "kda").kernel("kda_decode")
    assert fused.family == "kda"
    assert checked > 300  # the GEMM, MoE, small and MLA grids all join
