"""vLLM's FusedMoE: the MoE path of every layer the other paths do not take (DeepSeek-V3, Qwen3-MoE, Mixtral,
gpt-oss on Blackwell; Kimi K3 on Hopper and above the tier-0 tail's 128 tokens).

    standard     router | [latent down-projection (aux)] | [shared gate_up -> act -> down] | top-k | FC1 [-> act on
                 Hopper] -> FC2 -> finalize | classic tail: routed + shared partial -> all-reduce
                          | latent tail: concat -> all-reduce -> latent norm -> latent up -> add shared
    specialized  split router GEMM -> all-gather + top-k | shared gate_up+act -> down (aux) | FC1 ->
                 FC2 + finalize | AR + norm + RS -> sharded up + add + all-gather (each under its fusion)

The kernels are plans/moe_kernels.py's but for the two unfused tails below.

Dimension legend: M tokens, D hidden, L latent (expert input width).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.ops import experts as ex
from simulator.ops import norm, pointwise
from simulator.ops import linear as lin
from simulator.ops.fused_experts import expert_gate_up
from simulator.plans import moe_kernels as moe
from simulator.plans.common import PLAIN, Dims, Launch, act, all_reduce_kernel, context_free, post_norm_key, weight
from simulator.plans.fuse import cite
from simulator.plans.kernel import K3, Kernel


# Hopper: the Triton fused_moe (bf16, block FP8) and Marlin (MXFP4) experts launch the gate+up GEMM, then the
# activation as its own kernel, then the down GEMM (vLLM 0.33.0)
HOPPER_MOE = moe.FUSED_MOE + "fused_moe.py:fused_experts_impl"
HOPPER_ACT = moe.FUSED_MOE + "activation.py:apply_moe_activation"


def takes(d: Dims, arch: str) -> bool:
    """Every MoE layer (the registry tries this path last)."""
    return True


# ===================================================================== Hopper's experts: the activation apart
@context_free
def fc1_gate_up(d: Dims, deps: tuple[str, ...] = ()) -> Kernel:
    """FC1 as Hopper's Triton fused_moe and Marlin MoE launch it: the gate+up grouped GEMM alone, its [M, k, 2F]
    product written for the activation launch that follows (moe_act)."""
    M, F, k = d.M, d.F_r, d.cfg.top_k
    return replace(moe.fc1(d, deps=deps), name="fused_moe_kernel_gate_up", op=expert_gate_up, consts=(),
                   writes=(act("moe.gu", M, k, 2 * F),), flops=lin.gemm_flops(M * k, d.L, 2 * F), source=HOPPER_MOE,
                   note=f"grouped GEMM over the U(M) = {moe.expected_experts(d)} touched experts' TP shards; the "
                        "activation is the next launch")


@context_free
def moe_act(d: Dims) -> Kernel:
    """The routed experts' activation as its own launch (vLLM's apply_moe_activation on Hopper: _C's
    silu_and_mul, or K3's situ_and_mul), over the M k routed rows."""
    cfg, M, F, k = d.cfg, d.M, d.F_r, d.cfg.top_k
    return Kernel(key="moe_act", name=f"{cfg.hidden_act}_and_mul", kind="pointwise", family="small",
                  op=ex.glu_product, consts=(("cfg", cfg),), reads=(act("moe.gu", M, k, 2 * F),),
                  writes=(act("moe.h", M, k, F),), flops=ex.glu_flops(M * k, F, cfg.hidden_act), source=HOPPER_ACT,
                  note="activation and multiply of the routed rows between the two expert GEMMs, a separate kernel")


# ===================================================================== the unfused tails
@context_free
def latent_tail(d: Dims, launch: Launch = PLAIN) -> list[Kernel]:
    """concat [routed latent partial | shared partial] -> one all-reduce -> RMSNorm(latent) ->
    replicated up-projection -> add shared: the unfused tail (TRT-LLM PR #18505 baseline)."""
    cfg, M, D, L = d.cfg, d.M, d.D, d.L
    shared = (act("shared.partial", M, D),) if cfg.num_shared_experts else ()
    width = L + (D if shared else 0)
    latent = act("tail.sum", M, L, window=(1, 0, L))
    normed = act("latent.normed", M, L)
    on = dict(**launch.kw,
              source=K3 + "latent_moe_runner.py:LatentMoERunner._shard_up_proj_tail")
    norm_kernel = (
        Kernel(key="latent_norm", name="rmsnorm_latent", kind="pointwise", family="small",
               floor="reduction", op=norm.rms_norm,
               consts=(("eps", cfg.rms_norm_eps),), reads=(latent,), weights=(weight("latent.norm", L),),
               writes=(normed,), flops=norm.rms_norm_flops(M, L), **on,
               note="RMSNorm of the reduced latent sum; reads the latent slice in place (no split kernel)")
        if cfg.latent_norm else
        Kernel(key="latent_norm", name="copy_latent", kind="pointwise", family="small",
               op=pointwise.add, reads=(latent,),
               writes=(normed,), **on, note="the reduced latent sum, unnormalised (latent_norm off)"))
    return [
        Kernel(key="tail_concat", name="concat_latent_shared", kind="pointwise", family="small", op=pointwise.concat,
               reads=(act("moe.partial", M, L),) + shared, writes=(act("tail.cat", M, width),), **on,
               note="copy both partial sums into one buffer so one all-reduce carries them "
                    "(V-LMR tier 2 / TRT-LLM #18505)"),
        all_reduce_kernel(d, "moe_all_reduce", "tail.cat", "tail.sum", width, launch=launch,
                          note="one all-reduce of [M, L + D] (TRT-LLM #18505: 13.2 us at GB300 TEP8, M=8)"),
        norm_kernel,
        Kernel(key="latent_up", name="gemm_routed_expert_up_proj", kind="gemm", family="gemm",
               op=lin.linear, reads=(normed,),
               weights=(weight("latent.w_up", L, D),), writes=(act("latent.up", M, D),), flops=lin.gemm_flops(M, L, D),
               **on, note="replicated up-projection 7168x3584 on every rank (V-LMR tier 1/2)"),
        Kernel(key="tail_add", name="add_shared_output", kind="pointwise", family="small", op=pointwise.add,
               reads=(act("latent.up", M, D),) + ((act("tail.sum", M, D, window=(1, L, L + D)),) if shared else ()),
               writes=(act("moe_out", M, D),), flops=M * D, **on,
               note="add the reduced shared-expert output (unweighted)"),
    ]


@context_free
def classic_tail(d: Dims, launch: Launch = PLAIN) -> list[Kernel]:
    """Classic MoE (DeepSeek-V3): routed partial + shared partial, then one all-reduce of [M, D]."""
    M, D = d.M, d.D
    shared = (act("shared.partial", M, D),) if d.cfg.num_shared_experts else ()
    return [
        Kernel(key="tail_add", name="add_shared_partial", kind="pointwise", family="small", op=pointwise.add,
               reads=(act("moe.partial", M, D),) + shared, writes=(act("moe.sum_partial", M, D),), flops=M * D,
               **launch.kw, source=K3 + "model.py:KimiMoE.forward",
               note="routed + shared partial sums before the all-reduce"),
        all_reduce_kernel(d, "moe_all_reduce", "moe.sum_partial", "moe_out", D, launch=launch,
                          note="TP all-reduce of the MoE output"),
    ]


# ===================================================================== the plans
def standard(d: Dims, c1: Launch, arch: str = "sm100") -> list[Kernel]:
    """vLLM's FusedMoE: the router (C=1: weights before the wait), [the latent down-projection on the aux stream],
    [the shared expert], top-k, FC1, FC2, the finalize, then the unfused tail."""
    cfg = d.cfg
    kernels = [moe.router(d, c1)]
    if cfg.latent_dim:
        kernels.append(moe.latent_down(d, deps=(post_norm_key(d),)))
    if cfg.num_shared_experts:
        kernels += moe.gated_mlp(d, "shared", d.S_r, "shared expert (V-LMR: not reduced until the latent tail)")
    deps = ("latent_down",) if cfg.latent_dim else ()
    if arch == "sm90":  # Triton fused_moe / Marlin: the activation is a launch of its own (fused_experts_impl)
        experts = [fc1_gate_up(d, deps=deps), moe_act(d)]
    else:  # trtllm-gen on Blackwell: the activation in FC1's epilogue
        experts = [moe.fc1(d, deps=deps)]
    kernels += [moe.topk(d)] + experts + [moe.fc2(d), moe.finalize(d)]
    return kernels + (latent_tail(d) if cfg.latent_dim else classic_tail(d))


def specialized(d: Dims, on: frozenset[str], go, x2_from: str) -> list[Kernel]:
    """The generic MoE under the specialized plan's fusions (split router, GLU epilogue, shared overlap, fused
    finalize, the fused latent tail); each one off puts back the launches of `standard`."""
    cfg, e = d.cfg, go.every
    split = "split_router" in on and bool(cfg.latent_dim)
    if split:
        kernels = moe.split_router(d, e)
    else:
        kernels = [moe.router(d, go.c1)] + ([moe.latent_down(d, deps=(x2_from,), launch=e)] if cfg.latent_dim else [])
    if cfg.num_shared_experts:
        what = "shared expert"
        stream, deps = ("aux", (x2_from,)) if "shared_overlap" in on else ("main", ())
        kernels += (moe.gated_mlp(d, "shared", d.S_r, what, stream, deps, e) if "glu_epilogue" not in on else
                    [moe.gate_up_act(d, "shared", d.S_r, stream, deps, e),
                     moe.down_proj(d, "shared", d.S_r, f"{what} down, row shard", stream, e)])
    if not split:
        kernels.append(moe.topk(d, e))
    pad = "unpadded_experts" not in on
    fc1_deps = ("latent_down",) if cfg.latent_dim and not split else ()  # the gather kernel already waited
    kernels.append(moe.fc1(d, pad, deps=fc1_deps, fusions=() if pad else ("unpadded_experts",), launch=go.experts))
    if "moe_finalize" in on:
        kernels.append(moe.fc2_finalize(d, pad, go.experts))
    else:
        kernels += [moe.fc2(d, pad, go.experts), moe.finalize(d, e)]
    if cfg.latent_dim and cfg.num_shared_experts and cfg.latent_norm and "latent_tail" in on:
        return kernels + moe.latent_tail_fused(d, e)
    tail = latent_tail(d, e) if cfg.latent_dim else classic_tail(d, e)
    if cfg.num_shared_experts and "shared_overlap" in on:  # the tail's first kernel reads the aux stream's partial
        tail[0] = cite(tail[0], tail[0].source, deps=tail[0].deps + ("shared_down",))
    return kernels + tail
