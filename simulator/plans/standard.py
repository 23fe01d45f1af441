"""The standard plan: stock vLLM's decode kernel sequence for one Kimi K3 layer on one TP rank.

A reconstruction from the vLLM source (docs/sources.md §K2), read top to bottom as the
launches one rank makes. Each kernel's `note` gives its source or the reasoning; docs/kernels.md
lists them. All kernels run on the main stream except the MLA `g_proj` and the latent
down-projection, which stock vLLM already puts on an aux stream at decode sizes.

Layer type -> kernels (TP16, any token count):
    KDA + MoE   = 9 attention-side + 14 MoE = 23     (the fused KDA decode kernel needs 12/24/48/96
                                                      local heads and one token per sequence; at TP16
                                                      = 6 heads vLLM falls back to a 3-kernel chain)
    MLA + MoE   = 13 + 14 = 27
    KDA + dense = 9 + 4 = 13
Dimension legend: M tokens, D hidden, P TP degree, C KDA channels per rank, E experts, L latent,
F expert hidden, S shared hidden.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.config import ModelConfig
from simulator.ops import experts as ex
from simulator.ops import kda as kda_ops
from simulator.ops import norm
from simulator.ops.router import route_fused
from simulator.plans import common as c
from simulator.plans import mla_kernels as mla_k
from simulator.plans.common import Dims, act, gemm_flops, per_rank, wt
from simulator.plans.kernel import DecodeShape, Kernel, Plan

# Local head counts the stock fused KDA decode kernel supports (V-KDA: 12/24/48/96 with head_dim 128,
# conv width 4, no speculative tokens). A kernel capability, not a model dimension.
STOCK_FUSED_KDA_HEADS = frozenset({12, 24, 48, 96})


def build(cfg: ModelConfig, tp: int, shape: DecodeShape, layer_type: str, layer: int | None = None) -> Plan:
    d = c.make_dims(cfg, tp, shape, layer, layer_type)
    kernels = [c.attn_res_pre(d)]
    kernels += kda_attention(d) if cfg.attn_kinds[d.layer] == "kda" else mla_k.mla_attention(d)
    kernels += attention_output(d)
    kernels += dense_ffn(d) if layer_type == "dense" else moe(d)
    if shape.batch == 1 and shape.tokens_per_seq == 1:
        kernels = stock_c1_pipeline(kernels)
    return Plan("standard", layer_type, tp, shape, tuple(kernels))


# The stock path's single-request (C=1) pipeline: these kernels launch with PDL and load their weights
# (and state / conv prep) before the dependency wait. vLLM PR #53525 (C=1 KDA PDL pipeline: CuTe skinny
# GEMM and dsv3 fused-A early trigger) and PR #53524 (M=1 router: weight tiles before the PDL wait).
STOCK_C1_PDL = frozenset({"kda_in_proj", "kda_fb_proj", "kda_conv", "kda_recurrent", "kda_gated_norm",
                          "kda_decode", "o_proj", "router"})


def stock_c1_pipeline(kernels: list[Kernel]) -> list[Kernel]:
    from dataclasses import replace
    return [replace(k, pdl=True, prefetch_bytes=k.weight_bytes) if k.key in STOCK_C1_PDL else k for k in kernels]


# ======================================================================= attention: KDA
def stock_fused_kda(d: Dims) -> bool:
    return (d.kda_heads_r in STOCK_FUSED_KDA_HEADS and d.cfg.kda_head_dim == 128
            and d.cfg.conv_size == 4 and d.shape.tokens_per_seq == 1)


def kda_attention(d: Dims) -> list[Kernel]:
    kernels = [c.kda_in_proj(d, "cutlass_gemm_in_proj_qkvgfab"), c.kda_fb_proj(d)]
    if stock_fused_kda(d):
        return kernels + [kda_fused_kernel(d, name="fused_kda_decode")]
    return kernels + [kda_conv(d), kda_recurrent(d), kda_gated_norm(d)]


def _bt(d: Dims, x: np.ndarray, *tail: int) -> np.ndarray:
    return x.reshape(d.shape.batch, d.shape.tokens_per_seq, *tail)  # [M, ...] -> [B, T, ...]


def kda_conv(d: Dims) -> Kernel:
    M, C, W, B = d.M, d.kda_w_r, d.cfg.conv_size, d.shape.batch

    def run(rank: Any) -> None:
        b = rank.buf
        y, b["kda.conv"] = kda_ops.kda_conv_update(_bt(d, b["kda.qkv"], 3 * C), _conv_w(rank), b["kda.conv"])
        b["kda.qkv_conv"] = y.reshape(M, 3 * C)

    return Kernel(key="kda_conv", name="causal_conv1d_update", kind="pointwise",
                  reads=(act("kda.qkv", M, 3 * C), act("kda.conv", B, 3 * C, W - 1)),
                  writes=(act("kda.qkv_conv", M, 3 * C), act("kda.conv", B, 3 * C, W - 1)),
                  weights=(wt("kda.conv_w", 3 * C, W),), flops=2 * M * 3 * C * W, effect=per_rank(run),
                  note="short causal conv + SiLU on q, k, v, conv history updated in place (V-KDA fallback)")


def _conv_w(rank: Any) -> np.ndarray:
    """[3C, W]: the rank's channel rows of the q, k and v depthwise conv weights (channels are head-major)."""
    return np.concatenate([c.row(rank, f"kda.conv_{p}") for p in "qkv"], axis=0)


KDA_BV = 8  # value columns per program of vLLM's fused_recurrent grid (one warp each)


def kda_recurrent(d: Dims) -> Kernel:
    """vLLM's fused_recurrent: grid (B x heads, H / 8) of one-warp programs, 16 per (sequence, head), about
    8 resident per SM; each runs its T tokens in order, loading each token's q, k, v, g inside the loop, so
    every token after the first is a dependent DRAM round trip (calibration/h200 kda split-V rows: ~0.9 µs
    per token per wave, docs/cost-model.md §6.6); a verify (T > 1) stores the state after every token for
    rollback."""
    M, C, Nh, H, B, T = d.M, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim, d.shape.batch, d.shape.tokens_per_seq

    def run(rank: Any) -> None:
        b = rank.buf
        q, k, v = (_bt(d, part, Nh, H) for part in np.split(b["kda.qkv_conv"], 3, axis=-1))
        g = kda_ops.kda_gate(_bt(d, b["kda.z"], C), c.row(rank, "kda.dt_bias"), c.row(rank, "kda.a_log"),
                             d.cfg.gate_lower_bound)
        beta = 1.0 / (1.0 + np.exp(-_bt(d, b["kda.b"], Nh)))
        if T > 1:
            o, b["kda.state"], b["kda.state_tokens"] = kda_ops.kda_recurrent(q, k, v, g, beta, b["kda.state"],
                                                                             checkpoints=True)
        else:
            o, b["kda.state"] = kda_ops.kda_recurrent(q, k, v, g, beta, b["kda.state"])
        b["kda.o"] = o.reshape(M, C)

    state = act("kda.state", B, Nh, H, H, dtype="fp32")
    checkpoints = (act("kda.state_tokens", B, T - 1, Nh, H, H, dtype="fp32"),) if T > 1 else ()
    return Kernel(key="kda_recurrent", name="fused_recurrent_kda", kind="attention",
                  reads=(act("kda.qkv_conv", M, 3 * C), act("kda.z", M, C), act("kda.b", M, Nh), state),
                  writes=(act("kda.o", M, C), state) + checkpoints,
                  weights=(wt("kda.dt_bias", C, dtype="fp32"), wt("kda.a_log", Nh, dtype="fp32")),
                  flops=M * Nh * H * H * 8, math="fp32", ctas=B * Nh * (H // KDA_BV), ctas_per_sm=8,
                  serial_steps=T - 1, effect=per_rank(run),
                  note="gate + beta + L2 norm + delta-rule update of the FP32 state; grid (B x heads, H/8) of "
                       "one-warp programs, the T tokens in order, the state stored after every token of a verify "
                       "(V-KDA fallback chain; vLLM fused_recurrent)")


def kda_gated_norm(d: Dims) -> Kernel:
    M, C, Nh, H = d.M, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim

    def run(rank: Any) -> None:
        b = rank.buf
        out = kda_ops.kda_gated_norm(_bt(d, b["kda.o"], Nh, H), _bt(d, b["kda.g"], C),
                                     c.full(rank, "kda.o_norm"), d.cfg.rms_norm_eps)
        b["attn.core"] = out.reshape(M, C)

    return Kernel(key="kda_gated_norm", name="fused_rms_norm_gated", kind="pointwise",
                  reads=(act("kda.o", M, C), act("kda.g", M, C)), writes=(act("attn.core", M, C),),
                  weights=(wt("kda.o_norm", H, dtype="fp32"),), flops=6 * M * C, effect=per_rank(run),
                  note="per-head RMSNorm then sigmoid output gate (V-KDA fallback chain)")


def kda_fused_kernel(d: Dims, name: str, fusions: tuple[str, ...] = (), pdl: bool = False) -> Kernel:
    """conv update + SiLU + L2 norm + gate + beta + delta rule + per-head RMSNorm + output gate."""
    M, C, Nh, H, B, W = d.M, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim, d.shape.batch, d.cfg.conv_size

    def run(rank: Any) -> None:
        b = rank.buf
        out, b["kda.state"], b["kda.conv"] = kda_ops.kda_decode_fused(
            _bt(d, b["kda.qkv"], 3 * C), _conv_w(rank), b["kda.conv"], _bt(d, b["kda.z"], C),
            c.row(rank, "kda.dt_bias"), c.row(rank, "kda.a_log"), _bt(d, b["kda.b"], Nh),
            _bt(d, b["kda.g"], C), c.full(rank, "kda.o_norm"), b["kda.state"],
            lower_bound=d.cfg.gate_lower_bound, eps=d.cfg.rms_norm_eps)
        b["attn.core"] = out.reshape(M, C)

    state, conv = act("kda.state", B, Nh, H, H, dtype="fp32"), act("kda.conv", B, 3 * C, W - 1)
    return Kernel(key="kda_decode", name=name, kind="attention",
                  reads=(act("kda.qkv", M, 3 * C), act("kda.z", M, C), act("kda.b", M, Nh),
                         act("kda.g", M, C), state, conv),
                  writes=(act("attn.core", M, C), state, conv),
                  weights=(wt("kda.conv_w", 3 * C, W), wt("kda.dt_bias", C, dtype="fp32"),
                           wt("kda.a_log", Nh, dtype="fp32"), wt("kda.o_norm", H, dtype="fp32")),
                  flops=M * Nh * H * H * 8 + 2 * M * 3 * C * W, math="fp32", fusions=fusions, pdl=pdl, ctas=B * Nh,
                  replaces=("kda_conv", "kda_recurrent", "kda_gated_norm"), effect=per_rank(run),
                  note="one pass per (sequence, head): conv, gate, delta rule, norm, output gate; "
                       "q/k/v/o intermediates stay on chip (V-KDA fused_kda_decode; FlashInfer PR #4243). "
                       "No serial term: the T tokens' inputs do not depend on the state and are loaded up front, "
                       "so a token's step is on-chip math, not the DRAM round trip vLLM's fused_recurrent pays")


# ======================================================================= attention output
def attn_width(d: Dims) -> int:
    return d.kda_w_r if d.cfg.attn_kinds[d.layer] == "kda" else d.mla_heads_r * d.cfg.v_head_dim


def attention_output(d: Dims) -> list[Kernel]:
    M, D, n = d.M, d.D, attn_width(d)
    wname = "kda.w_o" if d.cfg.attn_kinds[d.layer] == "kda" else "mla.w_o"

    def o_proj(rank: Any) -> None:
        rank.buf["attn.partial"] = c.row_parallel_partial(rank, rank.buf["attn.core"], wname)

    def post(rank: Any) -> None:
        c.attn_res_post_effect(d, rank, rank.buf["attn.out"])

    reads, writes, weights = c.attn_res_post_tensors(d)
    return [
        Kernel(key="o_proj", name="cutlass_gemm_o_proj", kind="gemm", reads=(act("attn.core", M, n),),
               writes=(act("attn.partial", M, D),), weights=(wt(wname, n, D),), flops=gemm_flops(M, n, D),
               effect=per_rank(o_proj), note="row-parallel o_proj; its partial sum still needs the all-reduce"),
        c.all_reduce_kernel(d, "attn_all_reduce", "attn.partial", "attn.out", D,
                            note="separate TP all-reduce after o_proj (FlashInfer/TRT-LLM AR; vLLM issue #55261)"),
        Kernel(key="attn_res_post", name="attn_res_add_mix_rmsnorm", kind="pointwise",
               reads=(act("attn.out", M, D),) + reads, writes=writes, weights=weights,
               flops=(d.n_blocks + 2) * M * D * 6, effect=per_rank(post),
               note="prefix += attention output, softmax mix, post-attention RMSNorm (V-ATTNRES)"),
    ]


# ======================================================================= MoE
def moe(d: Dims) -> list[Kernel]:
    cfg = d.cfg
    kernels = [router_gemm(d)]
    if cfg.latent_dim:
        kernels.append(latent_down(d))
    if cfg.num_shared_experts:
        kernels += shared_mlp(d)
    kernels += [topk(d), fc1(d), fc2(d), finalize(d)]
    return kernels + (latent_tail(d) if cfg.latent_dim else classic_tail(d))


def router_gemm(d: Dims) -> Kernel:
    M, D, E = d.M, d.D, d.cfg.num_experts

    def run(rank: Any) -> None:
        rank.buf["router.logits"] = rank.buf["x2"] @ c.full(rank, "router.w")

    return Kernel(key="router", name="router_gemm_bf16_fp32", kind="router", reads=(act("x2", M, D),),
                  writes=(act("router.logits", M, E, dtype="fp32"),), weights=(wt("router.w", D, E),),
                  flops=gemm_flops(M, D, E), effect=per_rank(run),
                  note="replicated router GEMM with FP32 logits (V-MODEL GateLinear; PR #53524)")


def latent_down(d: Dims) -> Kernel:
    M, D, L = d.M, d.D, d.L

    def run(rank: Any) -> None:
        rank.buf["latent.z"] = rank.buf["x2"] @ c.full(rank, "latent.w_down")

    return Kernel(key="latent_down", name="gemm_routed_expert_down_proj", kind="gemm", stream="aux",
                  deps=("attn_res_post",), reads=(act("x2", M, D),), writes=(act("latent.z", M, L),),
                  weights=(wt("latent.w_down", D, L),), flops=gemm_flops(M, D, L), effect=per_rank(run),
                  note="replicated routed_expert_down_proj on an aux stream beside the router (V-MODEL, <= 256 tokens)")


def gated_mlp(d: Dims, prefix: str, width: int, what: str) -> list[Kernel]:
    """gate+up GEMM (column shard) -> activation-and-multiply kernel -> down GEMM (row shard, partial sum).
    The shared expert (prefix "shared") and the dense FFN of layer 0 (prefix "dense") are both this."""
    M, D, cfg = d.M, d.D, d.cfg

    def gate_up(rank: Any) -> None:
        x = rank.buf["x2"]
        rank.buf[f"{prefix}.gu"] = np.concatenate([x @ c.col(rank, f"{prefix}.w_gate"), x @ c.col(rank, f"{prefix}.w_up")], -1)

    def glu(rank: Any) -> None:
        g, u = np.split(rank.buf[f"{prefix}.gu"], 2, axis=-1)
        rank.buf[f"{prefix}.h"] = ex.glu(g, u, cfg)

    def down(rank: Any) -> None:
        rank.buf[f"{prefix}.partial"] = c.row_parallel_partial(rank, rank.buf[f"{prefix}.h"], f"{prefix}.w_down")

    F = width
    return [
        Kernel(key=f"{prefix}_gate_up", name=f"gemm_{prefix}_gate_up", kind="gemm", reads=(act("x2", M, D),),
               writes=(act(f"{prefix}.gu", M, 2 * F),), weights=(wt(f"{prefix}.w_gate_up", D, 2 * F),),
               flops=gemm_flops(M, D, 2 * F), effect=per_rank(gate_up), note=f"{what} gate+up, column shard"),
        Kernel(key=f"{prefix}_act", name=f"{cfg.hidden_act}_and_mul", kind="pointwise",
               reads=(act(f"{prefix}.gu", M, 2 * F),), writes=(act(f"{prefix}.h", M, F),), flops=8 * M * F,
               effect=per_rank(glu), note="activation and multiply, a separate elementwise kernel"),
        Kernel(key=f"{prefix}_down", name=f"gemm_{prefix}_down", kind="gemm", reads=(act(f"{prefix}.h", M, F),),
               writes=(act(f"{prefix}.partial", M, D),), weights=(wt(f"{prefix}.w_down", F, D),),
               flops=gemm_flops(M, F, D), effect=per_rank(down),
               note=f"{what} down, row shard; its partial sum is reduced later"),
    ]


def shared_mlp(d: Dims) -> list[Kernel]:
    return gated_mlp(d, "shared", d.S_r, "shared expert (V-LMR: not reduced until the latent tail)")


def topk(d: Dims) -> Kernel:
    cfg, M, E, k = d.cfg, d.M, d.cfg.num_experts, d.cfg.top_k

    def run(rank: Any) -> None:
        b = rank.buf
        routing = route_fused(b["router.logits"], rank.w["router.bias"], cfg)  # FP32 on the GPU
        b["topk.idx"], b["topk.weight"], b["diag.margin"] = routing.topk_idx, routing.topk_weight, routing.margin
        b["diag.topk_idx"] = routing.topk_idx

    return Kernel(key="topk", name="moe_routing_topk", kind="router",
                  reads=(act("router.logits", M, E, dtype="fp32"),),
                  writes=(act("topk.idx", M, k, dtype="int32"), act("topk.weight", M, k, dtype="fp32")),
                  weights=(wt("router.bias", E, dtype="fp32"),), flops=4 * M * E, math="fp32",
                  effect=per_rank(run),
                  note="sigmoid + selection bias + top-k + renormalise (TRT-LLM-gen MoE routing kernel)")


# The stock loader pads each rank's slice of the expert intermediate to at least 256 (V-MODEL: 3072 / 16
# = 192 -> 256 at TP16); the padded rows are zeros but are streamed like any other weight bytes.
STOCK_MIN_EXPERT_SHARD = 256


def stock_expert_shard(d: Dims, pad: bool = True) -> int:
    return max(d.F_r, STOCK_MIN_EXPERT_SHARD) if pad and d.P > 1 else d.F_r


def fc1(d: Dims, pad: bool = True) -> Kernel:
    cfg, M, L, F, k, U = d.cfg, d.M, d.L, d.F_r, d.cfg.top_k, c.expected_experts(d)
    Fp = stock_expert_shard(d, pad)
    src = "latent.z" if cfg.latent_dim else "x2"

    def run(rank: Any) -> None:
        rank.buf["moe.h"] = ex.expert_fc1(rank.buf[src], rank.buf["topk.idx"], c.expert_shard(rank), cfg)

    return Kernel(key="fc1", name="moe_fc1_gate_up_act", kind="moe",
                  deps=("latent_down",) if cfg.latent_dim else (),
                  reads=(act(src, M, L), act("topk.idx", M, k, dtype="int32")), writes=(act("moe.h", M, k, F),),
                  weights=(wt("experts.w_gate_up", U, L, 2 * Fp, dtype=cfg.expert_dtype),),
                  flops=gemm_flops(M * k, L, 2 * F), math=c.expert_math(cfg), group_rows=M * k, effect=per_rank(run),
                  note=f"grouped GEMM over the U(M) = {U} touched experts' TP shards ({Fp} intermediate rows per rank"
                       + (", padded by the stock loader" if Fp != F else "") + "), activation in the epilogue")


def fc2(d: Dims, pad: bool = True) -> Kernel:
    cfg, M, L, F, k, U = d.cfg, d.M, d.L, d.F_r, d.cfg.top_k, c.expected_experts(d)
    Fp = stock_expert_shard(d, pad)

    def run(rank: Any) -> None:
        rank.buf["moe.slots"] = ex.expert_fc2(rank.buf["moe.h"], rank.buf["topk.idx"], c.expert_shard(rank))

    return Kernel(key="fc2", name="moe_fc2_down", kind="moe", reads=(act("moe.h", M, k, F),),
                  writes=(act("moe.slots", M, k, L),),
                  weights=(wt("experts.w_down", U, Fp, L, dtype=cfg.expert_dtype),),
                  flops=gemm_flops(M * k, F, L), math=c.expert_math(cfg), group_rows=M * k, effect=per_rank(run),
                  note="grouped down GEMM, one output row per (token, slot); intermediate padded like FC1")


def finalize(d: Dims) -> Kernel:
    M, L, k = d.M, d.L, d.cfg.top_k

    def run(rank: Any) -> None:
        rank.buf["moe.partial"] = ex.expert_finalize(rank.buf["moe.slots"], rank.buf["topk.weight"])

    return Kernel(key="finalize", name="moe_finalize", kind="pointwise",
                  reads=(act("moe.slots", M, k, L), act("topk.weight", M, k, dtype="fp32")),
                  writes=(act("moe.partial", M, L),), flops=2 * M * k * L, effect=per_rank(run),
                  note="unpermute + routing-weighted sum over the k slots (not deferred; PR #53152 defers it)")


def latent_tail(d: Dims) -> list[Kernel]:
    """concat [routed latent partial | shared partial] -> one all-reduce -> RMSNorm(latent) ->
    replicated up-projection -> add shared: the unfused tail (TRT-LLM PR #18505 baseline)."""
    cfg, M, D, L = d.cfg, d.M, d.D, d.L
    has_shared = cfg.num_shared_experts > 0
    width = L + (D if has_shared else 0)

    def concat(rank: Any) -> None:
        parts = [rank.buf["moe.partial"]] + ([rank.buf["shared.partial"]] if has_shared else [])
        rank.buf["tail.cat"] = np.concatenate(parts, axis=-1)

    def latent_norm(rank: Any) -> None:
        z = rank.buf["tail.sum"][:, :L]
        rank.buf["latent.normed"] = norm.rms_norm(z, c.full(rank, "latent.norm"), cfg.rms_norm_eps) if cfg.latent_norm else z

    def up(rank: Any) -> None:
        rank.buf["latent.up"] = rank.buf["latent.normed"] @ c.full(rank, "latent.w_up")

    def add(rank: Any) -> None:
        shared = rank.buf["tail.sum"][:, L:] if has_shared else 0.0
        rank.buf["moe_out"] = rank.buf["latent.up"] + shared

    cat_reads = (act("moe.partial", M, L),) + ((act("shared.partial", M, D),) if has_shared else ())
    return [
        Kernel(key="tail_concat", name="concat_latent_shared", kind="pointwise", reads=cat_reads,
               writes=(act("tail.cat", M, width),), effect=per_rank(concat),
               note="copy both partial sums into one buffer so one all-reduce carries them (V-LMR tier 2 / TRT-LLM #18505)"),
        c.all_reduce_kernel(d, "moe_all_reduce", "tail.cat", "tail.sum", width,
                            note="one all-reduce of [M, L + D] (TRT-LLM #18505: 13.2 us at GB300 TEP8, M=8)"),
        Kernel(key="latent_norm", name="rmsnorm_latent", kind="pointwise", reads=(act("tail.sum", M, L),),
               writes=(act("latent.normed", M, L),), weights=(wt("latent.norm", L),), flops=4 * M * L,
               effect=per_rank(latent_norm),
               note="RMSNorm of the reduced latent sum; reads the latent slice in place (no split kernel)"),
        Kernel(key="latent_up", name="gemm_routed_expert_up_proj", kind="gemm", reads=(act("latent.normed", M, L),),
               writes=(act("latent.up", M, D),), weights=(wt("latent.w_up", L, D),), flops=gemm_flops(M, L, D),
               effect=per_rank(up), note="replicated up-projection 7168x3584 on every rank (V-LMR tier 1/2)"),
        Kernel(key="tail_add", name="add_shared_output", kind="pointwise",
               reads=(act("latent.up", M, D),) + ((act("tail.sum[shared]", M, D),) if has_shared else ()),
               writes=(act("moe_out", M, D),), flops=M * D, effect=per_rank(add),
               note="add the reduced shared-expert output (unweighted)"),
    ]


def classic_tail(d: Dims) -> list[Kernel]:
    """Classic MoE (DeepSeek-V3): routed partial + shared partial, then one all-reduce of [M, D]."""
    M, D = d.M, d.D
    has_shared = d.cfg.num_shared_experts > 0

    def add(rank: Any) -> None:
        rank.buf["moe.sum_partial"] = rank.buf["moe.partial"] + (rank.buf["shared.partial"] if has_shared else 0.0)

    return [
        Kernel(key="tail_add", name="add_shared_partial", kind="pointwise",
               reads=(act("moe.partial", M, D), act("shared.partial", M, D)),
               writes=(act("moe.sum_partial", M, D),), flops=M * D, effect=per_rank(add),
               note="routed + shared partial sums before the all-reduce"),
        c.all_reduce_kernel(d, "moe_all_reduce", "moe.sum_partial", "moe_out", D, note="TP all-reduce of the MoE output"),
    ]


# ======================================================================= dense FFN (layer 0)
def dense_ffn(d: Dims) -> list[Kernel]:
    D = d.D
    return gated_mlp(d, "dense", d.cfg.dense_intermediate // d.P, "dense FFN") + [
        c.all_reduce_kernel(d, "dense_all_reduce", "dense.partial", "moe_out", D, note="TP all-reduce of the FFN output")]
