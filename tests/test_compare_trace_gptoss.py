"""compare-trace on a whole gpt-oss-20b decode step as vLLM runs it on an MI300X: a synthetic torch-profiler trace
built here with the kernel names and event structure of the public TraceLens trace (docs/gpt-oss.md; that file is
never read by the tests): one HIP-graph replay on one stream, 24 layers alternating sliding-window (aiter's 2d
unified attention) and full attention (3d split-KV + reduce_segments), the per-layer YaRN cache cast from layer 1
on, triton_kernels' routing and matmul_ogs MoE, and the step's own launches around the layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.config import load_model
from simulator.plans.kernel import DecodeShape
from simulator.report import trace_step
from simulator.report.trace_patterns import load_engine
from simulator.report.trace_reader import KernelEvent, KernelTrace

runner = CliRunner()
NORM = ("_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePassINS_27Rmsnorm2dFwdPipelineProblem"
        "IDF16bfS4_fS4_S4_S4_S4_S4_S4_EEEEEEEvNT_5KargsE")
CIJK = "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT{}_MI16x16x1_SN_LDSB1_AFC1_AFEM1_ISA942"
OGS = "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1"
FRONT = [("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctorOnSelf_add<int>>", 2.0),
         ("triton_poi_fused_0", 14.0)]  # step inputs; the embedding fused with layer 0's rope cache cast
BACK = [(NORM, 6.0), ("void at::native::elementwise_kernel_manual_unroll<128, 4>", 2.0),
        ("void at::native::vectorized_gather_kernel<16, long>", 2.0), (CIJK.format("448x32x64"), 300.0)]
STEP_LAUNCHES = ("unrolled_elementwise_kernel", "elementwise_kernel_manual_unroll", "vectorized_gather_kernel")


def layer(i: int) -> list[tuple[str, float]]:
    """Layer i's launches, in order (µs): layer 0 has no cast (fused into the step's first kernel)."""
    attention = ([("kernel_unified_attention_2d", 13.0)] if i % 2 == 0
                 else [("kernel_unified_attention_3d", 41.0), ("reduce_segments", 6.0)])
    return ([(NORM, 6.0), (CIJK.format("32x32x256"), 16.0)] + ([("triton_poi_fused__to_copy_1", 13.0)] if i else [])
            + [("void vllm::rotary_embedding_kernel<c10::BFloat16, true>", 6.0),
               ("void vllm::reshape_and_cache_flash_kernel<__hip_bfloat16, __hip_bfloat16>", 6.0)] + attention
            + [(CIJK.format("32x32x256"), 15.0), (NORM, 7.0), (CIJK.format("16x16x256"), 8.6),
               ("triton_poi_fused_constant_pad_nd_moe_forward_0", 5.0), ("_topk_forward", 4.8),
               ("_sum_bitmatrix_rows", 4.6), ("_combined_routing_memset", 5.0), ("_combined_routing_compute", 5.5),
               (OGS + "_swiglu", 139.0), (OGS, 160.0), ("_finalize_matmul_scatter_bf16", 6.0)])


def gptoss_step(layers: int = 24) -> dict:
    """One decode step, kernels back to back on HIP stream 0 (device 2), as the graph replay recorded them."""
    names = FRONT + [k for i in range(layers) for k in layer(i)] + BACK
    events: list[dict] = [{"ph": "X", "cat": "user_annotation", "name": "execute_32_context_0(sq0sk0sqsq0sqsk0)_"
                           "generation_32(sq32sk55086sqsq32sqsk55086)", "pid": 1, "tid": 1, "ts": 900.0, "dur": 1.0}]
    ts = 1000.0
    for n, (name, dur) in enumerate(names):
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 2, "tid": 0, "ts": ts, "dur": dur,
                       "args": {"device": 2, "stream": 0, "correlation": 500000 + n, "kind": "Dispatch Kernel"}})
        ts += dur
    return {"traceEvents": events, "deviceProperties": [{"id": 0, "numSms": 304, "computeMajor": 9}]}


def compare(tmp_path: Path, trace: dict, *extra: str) -> tuple[int, dict]:
    path = tmp_path / "step.json"
    path.write_text(json.dumps(trace))
    out = runner.invoke(app, ["compare-trace", str(path), "--model", "gpt-oss-20b", "--hardware", "mi300x",
                              "--tp", "1", "--batch", "32", "--tokens-per-seq", "1", "--context", "1720",
                              "--engine", "vllm-rocm", "--json", *extra])
    return out.exit_code, (json.loads(out.output) if out.exit_code == 0 else {"error": out.output})


def test_whole_step_matched_and_unmatched_listed(tmp_path):
    code, doc = compare(tmp_path, gptoss_step())
    assert code == 0, doc
    cov = doc["step_coverage"]
    assert cov["kernels"] == 2 + 24 * 17 + 12 - 1 + 4  # 17 launches a sliding layer, 18 a full one, no cast in 0
    assert cov["matched_pct"] >= 90.0
    missed = {u["name"] for u in cov["unmatched_measured"]}
    assert all(any(s in m for m in missed) for s in STEP_LAUNCHES)  # the step's own launches, listed by name
    assert cov["matched"] == cov["kernels"] - len(STEP_LAUNCHES)
    assert {u["key"] for u in cov["unmatched_plan"]} == {"embed_all_reduce", "argmax", "sample_gather"}


def test_each_layer_kind_against_its_own_plan(tmp_path):
    """The median layer (12) is a sliding one: its plan has no reduce_segments; layer 13's plan (full) does, and
    each matches its own signature's every kernel."""
    for index, decode, reduce in ((None, "kernel_unified_attention_2d", False), ("13", "kernel_unified_attention_3d",
                                                                                  True)):
        code, doc = compare(tmp_path, gptoss_step(), *(("--layer-index", index) if index else ()))
        assert code == 0, doc
        rows = {r["plan"]: r["measured"] for r in doc["kernels"]}
        assert rows["gqa_decode"] == decode and ("gqa_reduce" in rows) == reduce
        assert rows["fc1"].endswith("_swiglu") and rows["fc2"] == OGS
        assert doc["unmatched_measured"] == [] and doc["unmatched_plan"] == []


def test_unknown_kernels_lower_the_step_match(tmp_path):
    """Renamed MoE launches (an engine the table does not know) are unmatched and the coverage says so."""
    trace = gptoss_step()
    for e in trace["traceEvents"]:
        if e["name"].startswith("_matmul_ogs"):
            e["name"] = "mystery_expert_kernel_v9"
    code, doc = compare(tmp_path, trace)
    assert code == 0, doc
    cov = doc["step_coverage"]
    assert {"name": "mystery_expert_kernel_v9", "count": 48} in cov["unmatched_measured"]
    assert cov["matched"] == cov["kernels"] - len(STEP_LAUNCHES) - 48


@pytest.mark.parametrize("index", ["24", "-1"])
def test_layer_index_outside_the_model(tmp_path, index):
    code, doc = compare(tmp_path, gptoss_step(2), "--layer-index", index)
    assert code == 2 and "is not a layer of 'gpt-oss-20b'" in doc["error"]


def test_a_step_too_large_to_align_says_so(monkeypatch):
    """Past MAX_STEP_CELLS the coverage is not computed (bounded time and memory) and says why."""
    plan = trace_step.step_plan(load_model("gpt-oss-20b"), "standard", 1, DecodeShape(32, 1, 1720), "gfx942")
    events = [KernelEvent(name, (2, 0), float(ts), 1.0, None) for ts, (name, _) in enumerate(layer(1) * 26)]
    trace = KernelTrace("synthetic", events, len(events))
    engine = load_engine("vllm-rocm")
    assert trace_step.step_coverage(trace, plan, engine)["matched"] > 0
    monkeypatch.setattr(trace_step, "MAX_STEP_CELLS", len(events) * len(plan) - 1)
    cov = trace_step.step_coverage(trace, plan, engine)
    assert cov["matched"] is None and "more than" in cov["why"]
