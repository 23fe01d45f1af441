"""The standard plan: stock vLLM's decode kernel sequence for one Kimi K3 layer on one TP rank.

Read from the released vLLM 0.33.0 (docs/vllm-k3-source.md, the map `docs/vllm_k3_map.toml`), top to
bottom as the launches one rank makes; each kernel's `source` names the function that launches it.

Layer type -> launches (TP16, 1 x 8 tokens: the published trace; 1 x 1: the published step), the attention's
and the MoE's as their registry entries launch them (simulator/attention/kda.py, mla.py; simulator/moe/latent.py):
    KDA + MoE   = 9 attention-side (+1 copy at one token: at TP16 = 6 local heads the fallback chain) + 13 MoE
                = 22 (23)
    MLA + MoE   = 13 + 13 = 26

Most stock launches use programmatic dependent launch at every batch (CuTe skinny GEMMs, dsv3 fused-A,
the AttnRes Triton kernel, FlashInfer AR, the tail kernels); the single-request (C=1: batch 1, one
token) pipeline also loads the weights (and KDA state) of the KDA kernels, o_proj and the router before
the dependency wait: vLLM PR #53525 and PR #53524. `c1` below is that launch.

Dimension legend: M tokens, D hidden, P TP degree.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulator import attention
from simulator.config import ModelConfig
from simulator.moe import moe_path
from simulator.plans import common as c
from simulator.plans import moe_kernels as moe
from simulator.plans.common import EARLY, PDL, PLAIN, Dims
from simulator.plans.kernel import DecodeShape, Kernel, Plan


def arch_of(hw: Any) -> str:
    """The stock path a GPU runs: "sm100" on the NVIDIA parts with FP4 tensor cores (Blackwell: the tier-0
    tail, the TRT-LLM-gen MXFP4 MoE), "sm90" on the others (Hopper); on the AMD parts "gfx950" (CDNA 4, FP4
    matrix cores) or "gfx942" (CDNA 3), which run the Hopper path but for the kernels ROCm picks itself."""
    if hw.name.upper().startswith("MI"):
        return "gfx950" if hw.fp4_runs_as == "fp4" else "gfx942"
    return "sm100" if hw.fp4_runs_as == "fp4" else "sm90"


def build(cfg: ModelConfig, tp: int, shape: DecodeShape, layer_type: str, layer: int | None = None,
          arch: str = "sm100") -> Plan:
    """`arch`: "sm100" (GB300 and the Blackwell parts, what the source map describes), "sm90" (Hopper: no
    tier-0 tail, no TRT-LLM-gen MXFP4 MoE and no KDA projection split; the MoE as before the map, one routing
    launch, the unfused latent tail: the kernels the H200 measurements name), or "gfx942" / "gfx950" (ROCm:
    Hopper's path with the attention and MoE kernels vLLM picks there; docs/gpt-oss.md)."""
    d = c.make_dims(cfg, tp, shape, layer, layer_type)
    if arch not in ("sm100", "sm90", "gfx942", "gfx950"):
        raise ValueError(f"arch {arch!r} is not sm100, sm90, gfx942 or gfx950")
    c1 = EARLY if d.single_request else PLAIN
    kernels = [c.residual_pre(d, PDL)]
    kernels += attention.kind(d.attn).standard(d, c1, arch)  # the attention's kernels: simulator/attention/<kind>.py
    kernels += attention_output(d)
    kernels += dense_ffn(d) if layer_type == "dense" else moe_path(d, arch).standard(d, c1, arch)  # simulator/moe/
    return Plan("standard", layer_type, tp, shape, tuple(kernels))


def attention_output(d: Dims) -> list[Kernel]:
    """o_proj (C=1: weights before the wait), FlashInfer's MNNVL all-reduce, the post-attention residual; on
    one GPU no all-reduce (vLLM's tensor_model_parallel_all_reduce returns its input): o_proj writes the output."""
    o_proj = c.o_proj(d, EARLY if d.single_request else PDL)
    if d.P == 1:
        alone = replace(o_proj, writes=(c.act("attn.out", d.M, d.D),), note="o_proj on one GPU: its output is the "
                        "attention output (no all-reduce)")
        return [alone, c.residual_post(d, PDL)]
    return [o_proj, c.attn_all_reduce(d, PDL), c.residual_post(d, PDL)]


def dense_ffn(d: Dims) -> list[Kernel]:
    return moe.gated_mlp(d, "dense", d.cfg.dense_intermediate // d.P, "dense FFN") + [
        c.all_reduce_kernel(d, "dense_all_reduce", "dense.partial", "moe_out", d.D,
                            note="TP all-reduce of the FFN output")]
