"""The standard plan: stock vLLM's decode kernel sequence for one Kimi K3 layer on one TP rank.

A reconstruction from the vLLM source (docs/sources.md §K2), read top to bottom as the launches one
rank makes. Each kernel's `note` gives its source or the reasoning; docs/kernels.md lists them. All
kernels run on the main stream except the MLA `g_proj` and the latent down-projection, which stock
vLLM already puts on an aux stream at decode sizes.

Layer type -> kernels (TP16, any token count):
    KDA + MoE   = 9 attention-side + 14 MoE = 23     (the fused KDA decode kernel needs 12/24/48/96
                                                      local heads and one token per sequence; at TP16
                                                      = 6 heads vLLM falls back to a 3-kernel chain)
    MLA + MoE   = 13 + 14 = 27
    KDA + dense = 9 + 4 = 13

The stock single-request (C=1: batch 1, one token) pipeline launches the KDA kernels, o_proj and the
router with PDL and loads their weights (and state / conv prep) before the dependency wait: vLLM PR
#53525 (C=1 KDA PDL pipeline: CuTe skinny GEMM and dsv3 fused-A early trigger) and PR #53524 (M=1
router: weight tiles before the PDL wait). `c1` below is that launch.

Dimension legend: M tokens, D hidden, P TP degree, C KDA channels per rank, L latent, F expert hidden,
S shared hidden.
"""

from __future__ import annotations

from simulator import attention
from simulator.config import ModelConfig
from simulator.plans import common as c
from simulator.plans import moe_kernels as moe
from simulator.plans.common import EARLY, PLAIN, Dims
from simulator.plans.kernel import DecodeShape, Kernel, Plan


def build(cfg: ModelConfig, tp: int, shape: DecodeShape, layer_type: str, layer: int | None = None) -> Plan:
    d = c.make_dims(cfg, tp, shape, layer, layer_type)
    c1 = EARLY if d.single_request else PLAIN
    kernels = [c.residual_pre(d)]
    kernels += attention.kind(d.attn).standard(d, c1)  # the attention's kernels: simulator/attention/<kind>.py
    kernels += [c.o_proj(d, c1), c.attn_all_reduce(d), c.residual_post(d)]
    kernels += dense_ffn(d) if layer_type == "dense" else moe_block(d, c1)
    return Plan("standard", layer_type, tp, shape, tuple(kernels))


def moe_block(d: Dims, c1: c.Launch) -> list[Kernel]:
    cfg = d.cfg
    kernels = [moe.router(d, c1)]
    if cfg.latent_dim:
        kernels.append(moe.latent_down(d, deps=(c.post_norm_key(d),)))
    if cfg.num_shared_experts:
        kernels += moe.gated_mlp(d, "shared", d.S_r, "shared expert (V-LMR: not reduced until the latent tail)")
    kernels += [moe.topk(d), moe.fc1(d, deps=("latent_down",) if cfg.latent_dim else ()), moe.fc2(d), moe.finalize(d)]
    return kernels + (moe.latent_tail(d) if cfg.latent_dim else moe.classic_tail(d))


def dense_ffn(d: Dims) -> list[Kernel]:
    return moe.gated_mlp(d, "dense", d.cfg.dense_intermediate // d.P, "dense FFN") + [
        c.all_reduce_kernel(d, "dense_all_reduce", "dense.partial", "moe_out", d.D,
                            note="TP all-reduce of the FFN output")]
