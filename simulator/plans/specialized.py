"""The specialized plan: the fused decode path of vLLM PR #61867 ("latency_specialized"), one rank.

Reconstructed from the published description (docs/published.md) and the public precursors of each
fusion (docs/sources.md §K3). Each fusion is a named switch; turning one off puts back
the standard kernels it replaced (called by name from the kernel modules), so a user can ablate one at
a time. The listing below is the whole plan; every kernel's stream, dependencies, PDL and prefetch
are set in the call that builds it.

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

from typing import Iterable, NamedTuple

from simulator import attention
from simulator.config import ModelConfig
from simulator.errors import UserError
from simulator.plans import common as c
from simulator.plans import moe_kernels as moe
from simulator.plans.common import EARLY, PLAIN, Dims, Launch
from simulator.plans.kernel import DecodeShape, Kernel, Plan

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


def fusion_set(disable: list[str] | None = None, enable: list[str] | None = None) -> frozenset[str]:
    """The specialized plan's fusions with some turned off and what-ifs turned on; a name that would change
    nothing (already on, already off, both on and off) is refused rather than silently ignored."""
    base = resolve_fusions(None, disable or ())
    on = resolve_fusions(base | set(enable or ()))
    for name in sorted(set(enable or ()) & set(disable or ())):
        raise UserError(f"--enable-fusion and --disable-fusion both name {name}: choose one.")
    for name in sorted(set(enable or ()) & set(FUSIONS)):
        raise UserError(f"--enable-fusion {name} changes nothing: it is on by default "
                        f"(--enable-fusion takes a what-if fusion: {', '.join(WHAT_IF_FUSIONS)}).")
    for name in sorted(set(disable or ()) & set(WHAT_IF_FUSIONS)):
        raise UserError(f"--disable-fusion {name} changes nothing: it is off unless --enable-fusion turns it on.")
    return on


class Launches(NamedTuple):
    """The launch of each kernel under the chosen fusions (`launches`)."""

    every: Launch  # every kernel not named below
    c1: Launch  # the stock C=1 pipeline's kernels (standard.py)
    experts: Launch  # the routed experts


def launches(d: Dims, on: frozenset[str]) -> Launches:
    """With pdl_prefetch every kernel launches with PDL and loads its weights early, except the routed
    experts, whose weights the routing chooses; without it the stock C=1 pipeline still applies."""
    pdl = "pdl_prefetch" in on
    return Launches(every=EARLY if pdl else PLAIN, c1=EARLY if pdl or d.single_request else PLAIN,
                    experts=Launch(pdl=pdl, prefetch=False))


def build(cfg: ModelConfig, tp: int, shape: DecodeShape, layer_type: str, layer: int | None = None,
          fusions: Iterable[str] | None = None) -> Plan:
    d = c.make_dims(cfg, tp, shape, layer, layer_type)
    on = resolve_fusions(fusions)
    go = launches(d, on)
    kernels = [c.residual_pre(d, go.every)]
    kernels += attention.kind(d.attn).specialized(d, on, go)  # the attention's kernels: simulator/attention/<kind>.py
    if "oproj_allreduce_norm" in on:
        kernels += [c.oproj_allreduce_norm(d, go.every)]
    else:
        kernels += [c.o_proj(d, go.c1), c.attn_all_reduce(d, go.every), c.residual_post(d, go.every)]
    kernels += dense_ffn(d, on, go) if layer_type == "dense" else moe_block(d, on, go)
    return Plan("specialized", layer_type, tp, shape, tuple(kernels), fusions=on)


# ======================================================================= MoE
def moe_block(d: Dims, on: frozenset[str], go: Launches) -> list[Kernel]:
    cfg, e = d.cfg, go.every
    x2_from = "oproj_ar_norm" if "oproj_allreduce_norm" in on else c.post_norm_key(d)  # aux kernels wait for x2
    split = "split_router" in on and bool(cfg.latent_dim)
    if split:
        kernels = moe.split_router(d, e)
    else:
        kernels = [moe.router(d, go.c1)] + ([moe.latent_down(d, deps=(x2_from,), launch=e)] if cfg.latent_dim else [])
    if cfg.num_shared_experts:
        kernels += shared_expert(d, on, e, x2_from)
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
    return kernels + (moe.latent_tail(d, e) if cfg.latent_dim else moe.classic_tail(d, e))


def shared_expert(d: Dims, on: frozenset[str], e: Launch, x2_from: str) -> list[Kernel]:
    what = "shared expert (V-LMR: not reduced until the latent tail)"
    stream, deps = ("aux", (x2_from,)) if "shared_overlap" in on else ("main", ())
    if "glu_epilogue" not in on:
        return moe.gated_mlp(d, "shared", d.S_r, what, stream, deps, e)
    return [moe.gate_up_act(d, "shared", d.S_r, stream, deps, e),
            moe.down_proj(d, "shared", d.S_r, f"{what} down, row shard; its partial sum is reduced later", stream, e)]


# ======================================================================= dense FFN
def dense_ffn(d: Dims, on: frozenset[str], go: Launches) -> list[Kernel]:
    F, e = d.cfg.dense_intermediate // d.P, go.every
    reduce = c.all_reduce_kernel(d, "dense_all_reduce", "dense.partial", "moe_out", d.D, launch=e,
                                 note="TP all-reduce of the FFN output")
    if "glu_epilogue" not in on:
        return moe.gated_mlp(d, "dense", F, "dense FFN", launch=e) + [reduce]
    return [moe.gate_up_act(d, "dense", F, launch=e),
            moe.down_proj(d, "dense", F, "dense FFN down, row shard; its partial sum is reduced later", launch=e), reduce]
