"""The specialized plan: the fused decode path of vLLM PR #61867 ("latency_specialized"), one rank.

Reconstructed from the published description (docs/published.md) and the public precursors of each
fusion (docs/sources.md §K3). Each fusion is a named switch; turning one off puts back
the standard kernels it replaced, so a user can ablate one at a time.

    fused_kda             conv + gate + delta rule + norm + output gate in one kernel, also for
                          6 local heads (TP16) and for verify steps with draft tokens
    oproj_allreduce_norm  o_proj GEMM + TP all-reduce + AttnRes add/mix + RMSNorm in one kernel
    split_router          router and latent down-projection sharded over ranks (E/P + L/P columns
                          instead of E + L replicated), one collective kernel gathers them and
                          picks the top-k
    glu_epilogue          the activation runs in the gate/up GEMM's epilogue (no separate kernel)
    shared_overlap        the shared expert runs on an aux stream, overlapped with routed experts
    moe_finalize          FC2 and the routing-weighted sum in one kernel
    latent_tail           AR(latent) + RMSNorm + reduce-scatter(shared) in one collective kernel,
                          then a sharded up-projection whose epilogue adds the shared slice and
                          all-gathers (vLLM tier-0 tail, V-TAIL)
    small_batch_proj      at small M, the MLA g_proj shard joins the fused q_a/kv_a skinny GEMM
    pdl_prefetch          programmatic dependent launch everywhere; every kernel whose weights do
                          not depend on data loads them while its predecessor (often a collective)
                          is still running

KDA + MoE at TP16: 23 standard kernels -> 13 (fused_kda -2, oproj_allreduce_norm -2,
split_router -1, glu_epilogue -1, moe_finalize -1, latent_tail -3).
What-if, off by default (the published path keeps the weights unchanged, padding included):
    unpadded_experts      expert GEMMs built for the true per-rank intermediate (192 rows at TP16)
                          instead of streaming the stock loader's zero padding to 256
Dimension legend: M tokens, D hidden, P TP degree, E experts, L latent, k active experts.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from simulator.config import ModelConfig
from simulator.errors import UserError
from simulator.ops import experts as ex
from simulator.ops import norm
from simulator.ops.collectives import all_gather, all_reduce_one_shot, reduce_scatter
from simulator.ops.router import route_fused
from simulator.plans import common as c
from simulator.plans import mla_kernels as mla_k
from simulator.plans import standard as std
from simulator.plans.common import Dims, act, gemm_flops, per_rank, wt
from simulator.plans.kernel import Collective, DecodeShape, Kernel, Plan

FUSIONS: dict[str, str] = {
    "fused_kda": "conv + gate + delta rule + norm + output gate in one KDA kernel",
    "oproj_allreduce_norm": "o_proj GEMM + TP all-reduce + AttnRes/residual + RMSNorm in one kernel",
    "split_router": "router and latent down-projection sharded over ranks, gathered with the top-k",
    "glu_epilogue": "activation in the gate/up GEMM epilogue",
    "shared_overlap": "shared expert on an aux stream, overlapped with the routed experts",
    "moe_finalize": "FC2 and the routing-weighted sum in one kernel",
    "latent_tail": "AR + RMSNorm + reduce-scatter, then sharded up-projection + add + all-gather",
    "small_batch_proj": "MLA g_proj joins the fused q_a/kv_a skinny GEMM at small batch",
    "pdl_prefetch": "PDL launches and weight prefetch while the predecessor (often a collective) runs",
}
# What-ifs beyond the published path: off unless asked for by name.
WHAT_IF_FUSIONS: dict[str, str] = {
    "unpadded_experts": "expert GEMMs built for the true per-rank intermediate (192 at TP16), skipping the "
                        "stock loader's zero padding to 256",
}
SMALL_BATCH_MAX_TOKENS = 64  # the published path supports non-speculative decode up to batch 64


def resolve_fusions(enabled: Iterable[str] | None = None, disabled: Iterable[str] = ()) -> frozenset[str]:
    """The published fusions by default; any subset, plus what-ifs, when named."""
    chosen = set(FUSIONS if enabled is None else enabled) - set(disabled)
    known = FUSIONS | WHAT_IF_FUSIONS
    for name in chosen | set(disabled):
        if name not in known:
            raise UserError(f"unknown fusion '{name}': known fusions are {', '.join(known)}.")
    return frozenset(chosen)


def build(cfg: ModelConfig, tp: int, shape: DecodeShape, layer_type: str, layer: int | None = None,
          fusions: Iterable[str] | None = None) -> Plan:
    d = c.make_dims(cfg, tp, shape, layer, layer_type)
    on = resolve_fusions(fusions)
    pdl = "pdl_prefetch" in on
    kernels = [c.attn_res_pre(d, pdl=pdl)]
    kernels += kda_attention(d, on) if cfg.attn_kinds[d.layer] == "kda" else mla_attention(d, on)
    kernels += attention_output(d, on)
    kernels += dense_ffn(d, on) if layer_type == "dense" else moe(d, on)
    if not pdl and shape.batch == 1 and shape.tokens_per_seq == 1:
        kernels = std.stock_c1_pipeline(kernels)  # without its own PDL the path keeps the stock C=1 pipeline
    return Plan("specialized", layer_type, tp, shape, tuple(_with_pdl(kernels, pdl)), fusions=on)


def _with_pdl(kernels: list[Kernel], pdl: bool) -> list[Kernel]:
    """Under pdl_prefetch every launch is PDL and every weight not chosen by the data is prefetchable."""
    if not pdl:
        return kernels
    from dataclasses import replace
    out = []
    for k in kernels:
        data_dependent = k.kind == "moe"  # routed experts' weights depend on the routing
        out.append(replace(k, pdl=True, prefetch_bytes=0 if data_dependent else k.weight_bytes))
    return out


# ======================================================================= attention
def kda_attention(d: Dims, on: frozenset[str]) -> list[Kernel]:
    kernels = [c.kda_in_proj(d, "skinny_gemm_in_proj_qkvgfab"), c.kda_fb_proj(d)]
    if "fused_kda" in on:
        return kernels + [std.kda_fused_kernel(d, "kda_decode_specialized", fusions=("fused_kda",))]
    return std.kda_attention(d)


def mla_attention(d: Dims, on: frozenset[str]) -> list[Kernel]:
    cfg = d.cfg
    merge_g = cfg.mla_output_gate and "small_batch_proj" in on and d.M <= SMALL_BATCH_MAX_TOKENS
    if not merge_g:
        return mla_k.mla_attention(d)
    kernels = [mla_k.mla_qkv_a(d, "skinny_gemm_qkv_a_g", fusions=("small_batch_proj",), with_g=True)]
    kernels += [mla_k.mla_norm(d), mla_k.mla_q_b(d), mla_k.mla_absorb(d), mla_k.mla_cache_insert(d),
                mla_k.mla_decode(d), mla_k.mla_w_uv(d)]
    gate = mla_k.mla_gate_mul(d)
    from dataclasses import replace
    return kernels + [replace(gate, deps=())]


def attention_output(d: Dims, on: frozenset[str]) -> list[Kernel]:
    if "oproj_allreduce_norm" not in on:
        return std.attention_output(d)
    M, D, n = d.M, d.D, std.attn_width(d)
    wname = "kda.w_o" if d.cfg.attn_kinds[d.layer] == "kda" else "mla.w_o"

    def run(ranks: list[Any]) -> None:
        partials = [c.row_parallel_partial(rank, rank.buf["attn.core"], wname) for rank in ranks]
        for rank, total in zip(ranks, all_reduce_one_shot(partials)):  # FP32 sum, never rounded to bf16
            c.attn_res_post_effect(d, rank, total)

    reads, writes, weights = c.attn_res_post_tensors(d)
    payload = act("attn.partial", M, D)
    return [Kernel(
        key="oproj_ar_norm", name="fused_oproj_allreduce_attnres_rmsnorm", kind="gemm_collective",
        reads=(act("attn.core", M, n),) + reads, writes=writes, weights=(wt(wname, n, D),) + weights,
        flops=gemm_flops(M, n, D) + (d.n_blocks + 2) * M * D * 6,
        collective=Collective("all_reduce", payload.nbytes, d.P, in_kernel=True), fusions=("oproj_allreduce_norm",),
        replaces=("o_proj", "attn_all_reduce", "attn_res_post"), effect=run,
        note="GEMM epilogue pushes bf16 partials to peers (one-shot, Lamport flags), reduces in FP32, "
             "adds to the AttnRes prefix, mixes and normalises; the [M, D] partial and reduced outputs "
             "never round-trip HBM (vLLM gemm_rs_ar #53053, SGLang #30753, TRT-LLM min-latency AR+norm)")]


# ======================================================================= MoE
def moe(d: Dims, on: frozenset[str]) -> list[Kernel]:
    from dataclasses import replace
    cfg = d.cfg
    split = "split_router" in on and bool(cfg.latent_dim)
    if split:
        front, routing = split_router(d), []
    else:
        latent = [replace(std.latent_down(d), deps=(_x2_producer(on),))] if cfg.latent_dim else []
        front, routing = [std.router_gemm(d)] + latent, [std.topk(d)]
    shared = shared_mlp(d, on) if cfg.num_shared_experts else []
    pad = "unpadded_experts" not in on
    fc1 = replace(std.fc1(d, pad), deps=()) if split else std.fc1(d, pad)  # the gather kernel already waited
    if not pad:
        fc1 = replace(fc1, fusions=("unpadded_experts",))
    kernels = front + shared + routing + [fc1]
    kernels += [fc2_finalize(d, pad)] if "moe_finalize" in on else [std.fc2(d, pad), std.finalize(d)]
    if cfg.latent_dim and "latent_tail" in on:
        return kernels + latent_tail(d)
    return kernels + (std.latent_tail(d) if cfg.latent_dim else std.classic_tail(d))


def _x2_producer(on: frozenset[str]) -> str:
    """Key of the kernel that writes the MoE input x2 (aux-stream kernels wait for it)."""
    return "oproj_ar_norm" if "oproj_allreduce_norm" in on else "attn_res_post"


def split_router(d: Dims) -> list[Kernel]:
    """Rank r computes x2 @ [W_r[:, E/P slice] | W_ld[:, L/P slice]]; one collective kernel gathers
    both and runs sigmoid + bias + top-k on the full logits. Per-rank weight bytes fall from
    (E + L) D 2 to (E + L) D 2 / P: 64 MB -> 4 MB for Kimi K3 at TP16."""
    cfg, M, D, E, L, P, k = d.cfg, d.M, d.D, d.cfg.num_experts, d.L, d.P, d.cfg.top_k
    if E % P or L % P:
        raise UserError(f"split_router needs --tp {P} to divide the {E} experts and the latent {L}.")

    def gemm(rank: Any) -> None:
        x = rank.buf["x2"]
        rank.buf["router.logits_shard"] = x @ c.col(rank, "router.w")
        rank.buf["latent.z_shard"] = x @ c.col(rank, "latent.w_down")

    def gather_topk(ranks: list[Any]) -> None:
        logits = all_gather([rank.buf["router.logits_shard"] for rank in ranks])
        latent = all_gather([rank.buf["latent.z_shard"] for rank in ranks])
        for rank, lg, z in zip(ranks, logits, latent):
            routing = route_fused(lg, rank.w["router.bias"], cfg)
            rank.buf["topk.idx"], rank.buf["topk.weight"] = routing.topk_idx, routing.topk_weight
            rank.buf["diag.margin"], rank.buf["diag.topk_idx"] = routing.margin, routing.topk_idx
            rank.buf["latent.z"] = z

    shards = (act("router.logits_shard", M, E // P, dtype="fp32"), act("latent.z_shard", M, L // P))
    payload = sum(t.nbytes for t in shards)
    return [
        Kernel(key="router_split", name="skinny_gemm_router_latent_down_shard", kind="gemm", reads=(act("x2", M, D),),
               writes=shards, weights=(wt("router_latent.w_shard", D, (E + L) // P),),
               flops=gemm_flops(M, D, (E + L) // P), fusions=("split_router",),
               replaces=("router", "latent_down"), effect=per_rank(gemm),
               note="router logits and latent down-projection, both column-sharded over ranks "
                    "(local-inference-lab vllm #343; TokenSpeed #1038 packs them into one projection)"),
        Kernel(key="router_gather_topk", name="allgather_sigmoid_bias_topk", kind="collective", reads=shards,
               writes=(act("latent.z", M, L), act("topk.idx", M, k, dtype="int32"), act("topk.weight", M, k, dtype="fp32")),
               weights=(wt("router.bias", E, dtype="fp32"),), flops=4 * M * E, math="fp32",
               collective=Collective("all_gather", payload, P, in_kernel=True), fusions=("split_router",),
               replaces=("topk",), effect=gather_topk,
               note="one collective kernel: all-gather the logit and latent shards, exact top-k on the full "
                    "logits (b12x issue #225: top-16 kernel 6.2-7.0 us)"),
    ]


def shared_mlp(d: Dims, on: frozenset[str]) -> list[Kernel]:
    from dataclasses import replace
    kernels = std.shared_mlp(d)
    if "glu_epilogue" in on:
        kernels = [_gate_up_act(d)] + [kernels[2]]
    if "shared_overlap" in on:
        first_dep = _x2_producer(on)
        kernels = [replace(k, stream="aux", deps=(first_dep,) if i == 0 else ()) for i, k in enumerate(kernels)]
    return kernels


def _gate_up_act(d: Dims) -> Kernel:
    M, D, S, cfg = d.M, d.D, d.S_r, d.cfg

    def run(rank: Any) -> None:
        x = rank.buf["x2"]
        rank.buf["shared.h"] = ex.glu(x @ c.col(rank, "shared.w_gate"), x @ c.col(rank, "shared.w_up"), cfg)

    return Kernel(key="shared_gate_up_act", name=f"skinny_gemm_shared_gate_up_{cfg.hidden_act}", kind="gemm",
                  reads=(act("x2", M, D),), writes=(act("shared.h", M, S),), weights=(wt("shared.w_gate_up", D, 2 * S),),
                  flops=gemm_flops(M, D, 2 * S) + 8 * M * S, fusions=("glu_epilogue",),
                  replaces=("shared_gate_up", "shared_act"), effect=per_rank(run),
                  note="activation in the GEMM epilogue: the [M, 2S/P] gate/up output is never written")


def fc2_finalize(d: Dims, pad: bool = False) -> Kernel:
    cfg, M, L, F, k, U = d.cfg, d.M, d.L, d.F_r, d.cfg.top_k, c.expected_experts(d)
    Fp = std.stock_expert_shard(d, pad)

    def run(rank: Any) -> None:
        b = rank.buf
        y = np.zeros((M, L), dtype=rank.dtype)
        expert = c.expert_shard(rank)
        for e, rows, slots in ex._groups(b["topk.idx"]):
            np.add.at(y, rows, b["topk.weight"][rows, slots, None].astype(rank.dtype) * (b["moe.h"][rows, slots] @ expert(e)[2]))
        b["moe.partial"] = y

    return Kernel(key="fc2_finalize", name="moe_fc2_down_finalize", kind="moe",
                  reads=(act("moe.h", M, k, F), act("topk.weight", M, k, dtype="fp32")), writes=(act("moe.partial", M, L),),
                  weights=(wt("experts.w_down", U, Fp, L, dtype=cfg.expert_dtype),), flops=gemm_flops(M * k, F, L) + 2 * M * k * L,
                  math=c.expert_math(cfg), group_rows=M * k,
                  fusions=("moe_finalize",) + (() if pad else ("unpadded_experts",)), replaces=("fc2", "finalize"), effect=per_rank(run),
                  note="routing weight and scatter-add in the FC2 epilogue: the [M, k, L] slot outputs are never written")


def latent_tail(d: Dims) -> list[Kernel]:
    """(a) AR(latent partial) + RMSNorm + RS(shared partial); (b) u_r = normed @ W_up[:, D/P slice] +
    shared slice, all-gathered (multicast) into every rank's output: 5 standard kernels -> 2, and
    the replicated 7168x3584 up-projection (51 MB) becomes a 1/P shard per rank."""
    cfg, M, D, L, P = d.cfg, d.M, d.D, d.L, d.P
    has_shared = cfg.num_shared_experts > 0

    def ar_norm_rs(ranks: list[Any]) -> None:
        z = all_reduce_one_shot([r.buf["moe.partial"] for r in ranks])
        shared = reduce_scatter([r.buf["shared.partial"] for r in ranks]) if has_shared else [0.0] * len(ranks)
        for rank, zr, sr in zip(ranks, z, shared):
            normed = norm.rms_norm(zr, c.full(rank, "latent.norm"), cfg.rms_norm_eps) if cfg.latent_norm else zr
            rank.buf["latent.normed"], rank.buf["shared.slice"] = normed, sr

    def up_add_gather(ranks: list[Any]) -> None:
        pieces = [r.buf["latent.normed"] @ c.col(r, "latent.w_up") + r.buf["shared.slice"] for r in ranks]
        for rank, out in zip(ranks, all_gather(pieces)):
            rank.buf["moe_out"] = out

    # RS of [M, D] moves (P-1)/P of it, the same bytes as a one-shot AR of [M, D/P]: priced as one AR.
    ar_bytes = act("moe.partial", M, L).nbytes + (act("shared.partial", M, D // P).nbytes if has_shared else 0)
    return [
        Kernel(key="tail_ar_norm_rs", name="latent_tail_allreduce_rmsnorm_reducescatter", kind="collective",
               reads=(act("moe.partial", M, L), act("shared.partial", M, D)),
               writes=(act("latent.normed", M, L), act("shared.slice", M, D // P)), weights=(wt("latent.norm", L),),
               flops=4 * M * L, collective=Collective("all_reduce", ar_bytes, P, in_kernel=True), fusions=("latent_tail",),
               deps=("shared_down",) if has_shared else (),
               replaces=("tail_concat", "moe_all_reduce", "latent_norm"), effect=ar_norm_rs,
               note="one collective kernel: AR(latent) + RMSNorm + RS(shared) (V-TAIL tier 0 kernel a)"),
        Kernel(key="tail_up_add_gather", name="latent_up_shard_add_allgather", kind="gemm_collective",
               reads=(act("latent.normed", M, L), act("shared.slice", M, D // P)), writes=(act("moe_out", M, D),),
               weights=(wt("latent.w_up_shard", L, D // P),), flops=gemm_flops(M, L, D // P),
               collective=Collective("all_gather", act("u", M, D // P).nbytes, P, in_kernel=True), fusions=("latent_tail",),
               replaces=("latent_up", "tail_add"), effect=up_add_gather,
               note="sharded up-projection, epilogue adds the shared slice and multicast-stores into every "
                    "rank's output (V-TAIL tier 0 kernels b + c; NVLS)"),
    ]


# ======================================================================= dense FFN
def dense_ffn(d: Dims, on: frozenset[str]) -> list[Kernel]:
    kernels = std.dense_ffn(d)
    if "glu_epilogue" not in on:
        return kernels
    cfg, M, D, F = d.cfg, d.M, d.D, d.cfg.dense_intermediate // d.P

    def run(rank: Any) -> None:
        x = rank.buf["x2"]
        rank.buf["dense.h"] = ex.glu(x @ c.col(rank, "dense.w_gate"), x @ c.col(rank, "dense.w_up"), cfg)

    fused = Kernel(key="dense_gate_up_act", name=f"skinny_gemm_dense_gate_up_{cfg.hidden_act}", kind="gemm",
                   reads=(act("x2", M, D),), writes=(act("dense.h", M, F),), weights=(wt("dense.w_gate_up", D, 2 * F),),
                   flops=gemm_flops(M, D, 2 * F) + 8 * M * F, fusions=("glu_epilogue",),
                   replaces=("dense_gate_up", "dense_act"), effect=per_rank(run),
                   note="activation in the GEMM epilogue")
    return [fused] + kernels[2:]
