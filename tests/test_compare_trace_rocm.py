"""compare-trace on an AMD trace: a synthetic torch-profiler trace of the standard KDA layer with the kernel
names vLLM launches on ROCm (hipBLASLt Cijk_*, vLLM's wvSplitK skinny GEMMs, its custom all-reduce, RCCL,
Triton fused MoE), against the unvalidated MI300X / MI355X profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.hardware import list_hardware, load_hardware

runner = CliRunner()
CIJK = "Cijk_Alik_Bljk_BBS_BH_MT{}_MI16x16x1_SN_LDSB1_GRPM1_GSU1_ISA942_K1_WG32_8_1"
NORM = "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, float, int, int)"
ROCM_KDA_LAYER = [  # the standard KDA plan in order, as vLLM on ROCm names each kernel (us)
    ("attn_res_pre", NORM, 2.1),
    ("kda_in_proj", CIJK.format("64x16x256"), 30.0),
    ("kda_fb_proj", "void wvSplitK_hf_sml_<__hip_bfloat16, 64, 2, 16, 8, 2, 1>(int, int, __hip_bfloat16 const*)", 2.0),
    ("kda_decode", "fused_recurrent_kda_fwd_kernel", 17.0),
    ("o_proj", CIJK.format("32x32x256"), 9.0),
    ("attn_all_reduce", "void vllm::cross_device_reduce_1stage<__hip_bfloat16, 8>(vllm::RankData*, "
                        "vllm::RankSignals)", 9.5),
    ("attn_res_post", NORM, 2.1),
    ("router", CIJK.format("16x16x512"), 10.0),
    ("latent_down", CIJK.format("64x16x128"), 28.0),
    ("shared_gate_up", "void wvSplitK_hf_sml_<__hip_bfloat16, 64, 4, 16, 8, 2, 2>(int, int, "
                       "__hip_bfloat16 const*)", 15.0),
    ("shared_act", "void vllm::act_and_mul_kernel<c10::BFloat16, &(vllm::silu_kernel<c10::BFloat16>)>", 0.9),
    ("shared_down", CIJK.format("32x16x256"), 5.5),
    ("topk", "void vllm::moe::grouped_topk_kernel<float>(float*, float const*, int*, int)", 3.5),
    ("fc1", "fused_moe_kernel", 190.0),
    ("fc2", "fused_moe_kernel", 100.0),
    ("finalize", "void vllm::moe::moe_sum_kernel<c10::BFloat16, 16>(c10::BFloat16*, c10::BFloat16 const*, int)", 3.2),
    ("tail_concat", "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous "
                    "namespace)::OpaqueType<2u>, unsigned int, 2, 128, 1>", 1.0),
    ("moe_all_reduce", "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", 11.0),
    ("latent_norm", "void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*, c10::BFloat16 const*, float, int, "
                    "int)", 1.0),
    ("latent_up", CIJK.format("64x32x128"), 17.0),
    ("tail_add", "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<c10::BFloat16>, "
                 "std::array<char*, 3ul> >(int, at::native::CUDAFunctorOnSelf_add<c10::BFloat16>, "
                 "std::array<char*, 3ul>)", 1.0),
]
SHAPE = ["--tp", "8", "--batch", "32", "--tokens-per-seq", "1"]


def rocm_trace(layers: int = 4) -> dict:
    """`layers` standard KDA layers on one HIP stream, torch-profiler shaped (ph X, cat kernel, µs)."""
    events: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 2, "tid": 3, "args": {"name": "stream 3"}}]
    ts, corr = 5000.0, 1
    for _ in range(layers):
        for _, name, dur in ROCM_KDA_LAYER:
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 2, "tid": 3, "ts": ts, "dur": dur,
                           "args": {"device": 0, "stream": 3, "correlation": corr}})
            ts, corr = ts + dur + 1.5, corr + 1
    return {"traceEvents": events, "deviceProperties": [{"id": 0, "name": "AMD Instinct MI300X"}]}


@pytest.mark.parametrize("hardware", ["mi300x", "mi355x"])
def test_rocm_trace_is_detected_and_matches_every_plan_kernel(tmp_path: Path, hardware: str) -> None:
    path = tmp_path / "rocm.json"
    path.write_text(json.dumps(rocm_trace()))
    r = runner.invoke(app, ["compare-trace", str(path), "--hardware", hardware, *SHAPE, "--json"])
    assert r.exit_code == 0, r.output[-800:]
    doc = json.loads(r.output)
    assert doc["engine"] == "vllm-rocm" and doc["engine_detected"]["ranking"][0]["fit"] == 1.0
    assert [k["plan"] for k in doc["kernels"]] == [key for key, _, _ in ROCM_KDA_LAYER]
    assert doc["unmatched_measured"] == [] and doc["unmatched_plan"] == [] and doc["layers_found"] == 4
    assert doc["hardware"] == hardware.upper()


def test_rocm_split_kv_combine_is_folded_into_its_attention_kernel(tmp_path: Path) -> None:
    """vLLM's ROCm paged attention launches its split-KV combine as a second kernel: part of the first."""
    from simulator.report.trace_compare import load_engine
    parts = load_engine("vllm-rocm").part_of_previous
    assert any(p.search("void vllm::paged_attention_ll4mi_reduce_kernel<__hip_bfloat16, 128>") for p in parts)
    assert not any(p.search("_ZN5aiter33paged_attention_ll4mi_QKV_mfma16_kernelI13__hip_bfloat16EEvv") for p in parts)


def test_amd_profiles_are_listed_marked_unvalidated_and_priced() -> None:
    assert {"mi300x", "mi355x"} <= set(list_hardware())
    listed = runner.invoke(app, ["list", "hardware"])
    assert listed.exit_code == 0 and "mi300x" in listed.output and "mi355x" in listed.output
    for name in ("mi300x", "mi355x"):
        hw = load_hardware(name)
        assert "unvalidated" in hw.description
        assert hw.launch_gap_pdl_us == hw.launch_gap_us  # no PDL on ROCm
    assert load_hardware("mi300x").fp4_runs_as == "bf16" and load_hardware("mi355x").fp4_runs_as == "fp4"


def test_step_runs_on_the_mi300x() -> None:
    r = runner.invoke(app, ["step", "--hardware", "mi300x", "--tp", "8", "--batch", "32", "--no-interval", "--json"])
    assert r.exit_code == 0, r.output[-800:]
    doc = json.loads(r.output)
    assert doc["hardware"] == "MI300X"
    steps = {name: v["step_ms"] for name, v in doc["variants"].items()}
    assert all(ms > 0 for ms in steps.values()) and len(steps) == 2
