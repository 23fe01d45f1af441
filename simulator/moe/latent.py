"""Kimi K3's latent MoE as vLLM 0.33.0 runs it on Blackwell up to 128 tokens (docs/vllm-k3-source.md).

    standard     router | latent down + shared expert (aux stream) | latent -> MXFP8 | top-k, routing indices |
                 FC1 -> FC2 (finalize deferred) | tier-0 tail: CollectiveKernel (finalize + latent AR + RMSNorm +
                 shared RS) -> AdaptiveUpProjectionKernel (up-projection shard + shared slice, multicast) ->
                 LamportCopyKernel                                          (LatentMoERunner._small_batch_tail)
    specialized  PreparedMoE.run: the shared expert beside a front (split router + top-k), the persistent experts
                 (FC1 + SiTU + FC2 in one launch), MoeTail (finalize, AR + RMSNorm + RS, up-projection shard,
                 multicast store in one launch); at 1-2 tokens the small-batch chain (MoeFront, cluster experts,
                 the polling tail). Each fusion switched off puts back the stock launches it replaced.

The launches only this path makes are below, then its plans (the kernels the paths share: plans/moe_kernels.py).

Dimension legend: M tokens, D hidden, P TP degree, L latent, S shared hidden per rank, k active experts.
"""

from __future__ import annotations

from simulator.ops import pointwise
from simulator.plans import moe_kernels as moe
from simulator.plans.common import EARLY, PDL, PLAIN, Dims, Launch, act, context_free, post_norm_key
from simulator.plans.fuse import cite, fuse
from simulator.plans.kernel import SD, Kernel

CHAIN = SD + "cutedsl/moe/small_batch/chain.py:SmallBatchChain.run"
TAIL_FUSION_MAX_TOKENS = 128  # the tier-0 tail's max_num_tokens (latent_moe_runner.py:_select_tail_tier)


def takes(d: Dims, arch: str) -> bool:
    """Kimi K3's latent MoE with its shared expert and latent norm, up to the tier-0 tail's 128 tokens, on sm100."""
    cfg = d.cfg
    return bool(arch == "sm100" and cfg.latent_dim and cfg.num_shared_experts and cfg.latent_norm
                and d.M <= TAIL_FUSION_MAX_TOKENS)


# ===================================================================== kernels only this path launches
@context_free
def mxfp8_quant(d: Dims, deps: tuple[str, ...], launch: Launch = PLAIN) -> Kernel:
    """The stock W4A8 experts' prepare step: the latent quantised to MXFP8 in one launch before routing (S8).
    Declared as a BF16 copy: moe-sim has no block-scaled FP8 storage (E4M3 without its per-32 scales would
    flush small latent values), so the numbers and bytes keep BF16 (M x L bytes more: 7 KB at M = 1)."""
    z = act("latent.z", d.M, d.L)
    return Kernel(key="mxfp8_quant", name="mxfp8_quantize", kind="pointwise", family="small", op=pointwise.add,
                  reads=(z,), writes=(z,), deps=deps, pdl=launch.pdl,
                  source=moe.FUSED_MOE + "prepare_finalize/no_dp_ep.py:_quantize_input",
                  note="latent -> MXFP8 for the TRT-LLM-gen MXFP4 x MXFP8 experts (moe_kernel_quantize_input)")


@context_free
def topk_indices(d: Dims, launch: Launch = PLAIN) -> Kernel:
    """routingIndicesClusterKernel: the second routing launch (<= 1024 tokens) builds the expert-major row
    permutation from the top-k ids; moe-sim's grouped ops index by expert directly, so its op passes them on."""
    idx = act("topk.idx", d.M, d.cfg.top_k, dtype="int32")
    return Kernel(key="topk_indices", name="routingIndicesClusterKernel", kind="router", family="small",
                  op=pointwise.add, reads=(idx,), writes=(idx,), pdl=launch.pdl, source=moe.TRTLLM_MOE,
                  note="expert-major permutation of the routed rows (TRT-LLM RoutingDeepSeek.cu, external)")


def experts(d: Dims, pad: bool, weighted: bool, deps: tuple[str, ...], launch: Launch = PLAIN,
            name: str = "ExpertsKernel",
            source: str = SD + "cutedsl/moe/experts_runtime.py:PersistentExperts.run") -> Kernel:
    """The persistent experts kernel: FC1, SiTU and FC2 in one launch (hidden rows exchanged through a
    workspace, never a kernel boundary); rows stay in top-k order for the tail, or with `weighted` the
    routing-weighted latent partial is summed in FC2's epilogue."""
    M, k = d.M, d.cfg.top_k
    parts = [moe.fc1(d, pad), moe.fc2_finalize(d, pad) if weighted else moe.fc2(d, pad)]
    return fuse(parts, "experts", name, "moe", "moe", ("moe.partial",) if weighted else ("moe.slots",), source,
                deps=deps, math=moe.expert_math(d), group_rows=M * k, group_tokens=M, pdl=launch.pdl,
                fusions=("persistent_experts",) + (() if pad else ("unpadded_experts",))
                + (("moe_finalize",) if weighted else ()),
                note=f"FC1 + SiTU + FC2 over the touched experts' shards ({moe.expert_shard(d, pad)} intermediate rows "
                     "per rank), FP4 weights; one persistent launch")


def moe_tail(d: Dims, finalize_in: bool, launch: Launch = PLAIN, name: str = "MoeTail",
             source: str = SD + "cutedsl/moe/tail_runtime.py:PreparedTail.run") -> Kernel:
    """MoeTail: [top-k finalize], latent all-reduce + RMSNorm + shared reduce-scatter, the K-split
    up-projection from this rank's row shard, and the output multicast into every rank, in one launch."""
    a, b = moe.latent_tail_fused(d)
    parts = ([moe.finalize(d)] if finalize_in else []) + [a, b]
    return fuse(parts, "moe_tail", name, "gemm_collective", "gemm", ("moe_out",), source, deps=("shared_down",),
                **launch.kw, fusions=("one_kernel_tail",), replaces=("tail_collective", "tail_up", "tail_copy"),
                note="finalize, AR(latent) + RMSNorm + RS(shared), up-projection shard + shared slice, multicast "
                     "store: one launch; its exchanges are pipelined per K slice (one α)")


def stock_tail(d: Dims, launch: Launch = PLAIN, finalize_in: bool = True) -> list[Kernel]:
    """Tier 0 of the stock latent-MoE tail (<= 128 tokens on SM100): CollectiveKernel (finalize + latent AR +
    RMSNorm + shared RS), AdaptiveUpProjectionKernel (row shard + shared slice, multicast), LamportCopyKernel.
    Without `finalize_in` the experts already summed their rows (the specialized moe_finalize)."""
    a, b = moe.latent_tail_fused(d, launch)
    collective = fuse(([moe.finalize(d)] if finalize_in else []) + [a], "tail_collective", "CollectiveKernel",
                      "collective", "collective", ("latent.normed", "shared.slice"), moe.TAIL_OP,
                      deps=("shared_down",), floor="reduction",
                      pdl=launch.pdl, fusions=(), note="top-k finalize, latent all-reduce, RMSNorm and shared "
                      "reduce-scatter in one CuTe DSL collective (allreduce_rmsnorm_reduce_scatter)")
    out = act("moe_out", d.M, d.D)
    return [collective, cite(b, moe.TAIL_OP, key="tail_up", name="AdaptiveUpProjectionKernel", fusions=()),
            Kernel(key="tail_copy", name="LamportCopyKernel", kind="pointwise", family="small", op=pointwise.add,
                   reads=(out,), writes=(out,), pdl=launch.pdl, source=moe.TAIL_OP,
                   note="copy the multicast output out of the Lamport buffer and re-arm it")]


def small_batch_front(d: Dims, launch: Launch = PLAIN, with_down: bool = True) -> Kernel:
    """MoeFrontTP16 (TP16, 1-2 tokens) or MoeFrontTP8 (TP8, 1 token): router and latent-down shards, the
    exchange, top-k, and the shared expert on designated SMs (TP16: gate/up, SiTU and down) in one launch."""
    shared = moe.gated_mlp(d, "shared", d.S_r, "shared expert")
    parts = moe.split_router(d) + (shared if with_down else shared[:2])
    keep = ("latent.z", "topk.idx", "topk.weight", "shared.partial" if with_down else "shared.h")
    return fuse(parts, "moe_front", f"MoeFrontTP{d.P}", "gemm_collective", "gemm", keep, CHAIN, **launch.kw,
                fusions=("split_router", "small_batch_chain"),
                note="router + latent-down shards multicast, top-k, latent copy and the shared expert: one launch")


@context_free
def shared_push(d: Dims) -> Kernel:
    """WaveMoeTail.push (TP8, 5-8 tokens): peer stores of the shared expert's rows into the tail's
    reduce-scatter mailboxes; moe-sim's tail does that exchange, so this launch moves no numbers."""
    return Kernel(key="shared_push", name="WaveMoeTail.push", kind="pointwise", family="small", op=pointwise.nothing,
                  stream="aux", source=SD + "cutedsl/moe/tail_runtime.py:PreparedTail.push",
                  note="shared rows pushed to their reduce-scatter owners (priced in the tail's exchange)")


@context_free
def experts_group(d: Dims) -> Kernel:
    """ExpertsGroupKernel (9-32 tokens): one CTA builds the (expert, <= 8 tokens) unit table first."""
    return Kernel(key="experts_group", name="ExpertsGroupKernel", kind="pointwise", family="small",
                  op=pointwise.nothing, pdl=True, source=SD + "cutedsl/moe/experts_runtime.py:PersistentExperts.group",
                  note="the persistent experts' unit table (one CTA); moe-sim's grouped ops index experts directly")


def shared_merged(d: Dims, launch: Launch = PLAIN) -> list[Kernel]:
    """TP8 from 41 tokens, TP16 from 33: SharedUmma computes the front rows (router and latent-down shards) with
    the shared gate/up + SiTU on the main stream, RouteSitu routes, SharedDown runs beside the experts."""
    front, route = moe.split_router(d, launch)
    merged = fuse([front, moe.gate_up_act(d, "shared", d.S_r)], "shared_merged", "SharedUmma", "gemm", "gemm",
                  ("router.logits_shard", "latent.z_shard", "shared.h"), moe.FRONT + "route", **launch.kw,
                  note="front rows joined to the shared gate/up GEMM (MERGED)")
    down = moe.down_proj(d, "shared", d.S_r, "shared expert down beside the experts (SharedDown)", "aux", launch)
    return [merged, route, cite(down, moe.FRONT + "shared_expert", name="SharedDown", deps=("shared_merged",),
                                **PLAIN.kw)]


# ===================================================================== the plans
def standard(d: Dims, c1: Launch, arch: str = "sm100") -> list[Kernel]:
    """The stock launches (module docstring): W4A8 experts, their finalize deferred to the tier-0 tail."""
    return ([moe.router(d, EARLY if d.single_request else PDL), moe.latent_down(d, (post_norm_key(d),), PDL)]
            + shared_expert(d, PDL, post_norm_key(d), glu=False)
            + [mxfp8_quant(d, ("latent_down",)), moe.topk(d, PDL), topk_indices(d, PDL), moe.fc1(d, launch=PDL),
               moe.fc2(d, launch=PDL)] + stock_tail(d, PDL))


def specialized(d: Dims, on: frozenset[str], go, x2_from: str) -> list[Kernel]:
    """PreparedMoE.run (or the small-batch chain): shared expert on the side stream, front, experts, tail."""
    P, M, e = d.P, d.M, go.every
    pad = "unpadded_experts" not in on or P < 16  # at TP8 the 384-row shard has no padding either way
    weighted = "moe_finalize" in on and M >= (5 if P <= 8 else 9)  # experts publish the weighted partial
    one_tail = "one_kernel_tail" in on
    persistent = "persistent_experts" in on
    split = "split_router" in on
    prefetch = [moe.l2_prefetch(d, "next_attention", after="experts")] if "l2_prefetch" in on and M <= 8 else []
    chain_sizes = (P >= 16 and M <= 2) or (P == 8 and M == 1)
    if "small_batch_chain" in on and split and persistent and one_tail and chain_sizes:
        ks = [small_batch_front(d, e, with_down=P >= 16),
              experts(d, pad, False, (), go.experts, f"ClusterExpertsTP{P}", CHAIN)]
        if P == 8:
            down = moe.down_proj(d, "shared", d.S_r, "shared expert down (MoeSharedTP8)", launch=e)
            ks.append(cite(down, CHAIN, name="MoeSharedTP8"))
        return ks + prefetch + [cite(moe_tail(d, True, e, "MoeTail", CHAIN), CHAIN, deps=())]
    glu = "glu_epilogue" in on and M > 8
    if split and glu and M >= (41 if P <= 8 else 33):
        ks = shared_merged(d, e)  # the front GEMM's rows join the shared gate/up kernel (MERGED)
    elif split:  # SharedFront.shared_expert launches them beside the front; above 8 tokens without PDL
        plain = PLAIN.kw if glu else {}
        ks = [cite(k, moe.FRONT + "shared_expert", **plain) for k in shared_expert(d, e, x2_from, glu)]
        if P == 8 and 5 <= M <= 8:
            ks.append(shared_push(d))
        ks += moe.split_router(d, e)
    else:
        ks = ([moe.router(d, go.c1 if go.c1 is EARLY else e), moe.latent_down(d, (x2_from,), e)]
              + shared_expert(d, e, x2_from, glu)
              + [mxfp8_quant(d, ("latent_down",)), moe.topk(d, e), topk_indices(d, e)])
    if persistent and 9 <= M <= 32:
        ks.append(experts_group(d))
    wait = ("shared_down",) if P >= 16 and M <= 8 and split else ()  # a 152-CTA grid: the experts wait for it
    if persistent:
        ks.append(experts(d, pad, weighted, wait, go.experts))
    else:
        fc2 = moe.fc2_finalize(d, pad, go.experts) if weighted else moe.fc2(d, pad, go.experts)
        ks += [moe.fc1(d, pad, deps=wait, fusions=() if pad else ("unpadded_experts",), launch=go.experts), fc2]
        prefetch = [cite(k, k.source, deps=(fc2.key,)) for k in prefetch]
    ks += prefetch
    if one_tail:
        return ks + [moe_tail(d, not weighted, e, "MoeTail" if (P >= 16 and M <= 8) or (P == 8 and 2 <= M <= 4)
                              else "WaveMoeTail")]
    return ks + stock_tail(d, e, finalize_in=not weighted)


def shared_expert(d: Dims, e: Launch, x2_from: str, glu: bool) -> list[Kernel]:
    """On the MoE aux stream after `x2_from`, as stock vLLM runs it (S3): gate/up, SiTU, down (its situ_and_mul a
    plain elementwise launch, no PDL; under EARLY RouteSitu's SiTU runs with PDL); with the GLU epilogue, two."""
    what = "shared expert (not reduced until the latent tail)"
    if not glu:
        kernels = moe.gated_mlp(d, "shared", d.S_r, what, "aux", (x2_from,), e)
        return kernels if e is EARLY else [cite(k, k.source, pdl=False) if k.key == "shared_act" and k.pdl else k
                                           for k in kernels]
    return [moe.gate_up_act(d, "shared", d.S_r, "aux", (x2_from,), e),
            moe.down_proj(d, "shared", d.S_r, f"{what} down, row shard; its partial sum is reduced later", "aux", e)]
