"""The specialized plan: the fused decode path of vLLM PR #61867 ("latency_specialized"), one rank.

Read from the released vLLM 0.33.0 (docs/vllm-k3-source.md, docs/vllm_k3_map.toml); each kernel's
`source` names the function that launches it. Each fusion is a named switch; turning one off puts back
the standard kernels it replaced (called by name from the kernel modules), so a user can ablate one at
a time, and with none the plan is the standard plan. The fusions (`FUSIONS`, in ablation order):

{fusions}

At 1 x 8 tokens (each fusion's count is the plan with only it switched off; tests/test_plans.py builds them):
KDA + MoE at TP16: 22 standard kernels -> 13 (fused_kda -3, oproj_allreduce_norm -2, split_router -3,
kda_fb_in_kernel -1, persistent_experts -1, one_kernel_tail -2, l2_prefetch +2): 8 main, 3 shared-expert
launches on the aux stream, 2 L2 prefetches; at 1 x 1 the small-batch chain: 8. The source serves 1-8, 16, 32 and 64
tokens and runs the stock forward otherwise (`serves`: `build` returns the standard plan's kernels for those steps).
Dimension legend: M tokens, D hidden, P TP degree, E experts, L latent, k active experts.
"""

from __future__ import annotations

import textwrap
from typing import Iterable, NamedTuple

from simulator import attention
from simulator.attention.mla import SMALL_BATCH_MAX_TOKENS
from simulator.config import ModelConfig
from simulator.errors import UserError
from simulator.moe import moe_path
from simulator.plans import common as c
from simulator.plans import moe_kernels as moe
from simulator.plans import standard as std
from simulator.plans.common import EARLY, PLAIN, Dims, Launch
from simulator.plans.fuse import cite, fuse
from simulator.plans.kernel import SD, DecodeShape, Kernel, Plan

FUSIONS: dict[str, str] = {
    "fused_kda": "conv + gate + delta rule + norm + output gate in one KDA kernel, also at 6 local heads (TP16) "
                 "and for verify steps with draft tokens",
    "oproj_allreduce_norm": "o_proj GEMM + TP all-reduce + AttnRes/residual + RMSNorm in one kernel",
    "split_router": "router and latent down-projection sharded over ranks (E/P + L/P columns instead of E + L "
                    "replicated), one collective kernel gathers them and picks the top-k",
    "glu_epilogue": "activation in the gate/up GEMM epilogue (above 8 tokens)",
    "shared_overlap": "shared expert on an aux stream, overlapped with the routed experts (Kimi K3's stock path "
                      "already does it: it changes the generic MoE only)",
    "moe_finalize": "FC2 and the routing-weighted sum in one kernel (TP8 from 5 tokens, TP16 from 9)",
    "latent_tail": "AR(latent) + RMSNorm + reduce-scatter(shared) in one collective kernel, then a sharded "
                   "up-projection that adds the shared slice and all-gathers (Kimi K3's stock tier-0 tail, V-TAIL)",
    "small_batch_proj": "MLA g_proj joins the fused q_a/kv_a skinny GEMM at small batch",
    "pdl_prefetch": "PDL launches everywhere; a kernel whose weights do not depend on data loads them while its "
                    "predecessor (often a collective) runs",
    "kda_fb_in_kernel": "the f_b projection inside the KDA kernel (KdaSplit)",
    "mla_query_value": "MLA query kernel (norms, q_b, W_UK, quant, cache insert) and value kernel (W_UV + gate)",
    "persistent_experts": "FC1 + SiTU + FC2 in one persistent launch",
    "one_kernel_tail": "finalize + AR + RMSNorm + RS + up-projection + gather in one launch",
    "small_batch_chain": "TP16 1-2 / TP8 1 token: front (router, top-k, shared expert), cluster experts, polling tail",
    "l2_prefetch": "explicit L2Prefetch launches on a side stream (their bytes are not priced)",
    "unpadded_experts": "experts read the real 192 intermediate rows per rank at TP16, not the stock loader's zero "
                        "padding to 256",
}
# The launches vLLM 0.33.0 merges beyond the fusions the publication described (docs/vllm-k3-source.md):
# without them the specialized plan has the kernels the H200 measurements (calibration/h200) name.
SOURCE_MERGES = frozenset({"kda_fb_in_kernel", "mla_query_value", "persistent_experts", "one_kernel_tail",
                           "small_batch_chain", "l2_prefetch", "unpadded_experts"})
# What-ifs beyond the published path: off unless asked for by name (none now: the source settled the last one).
WHAT_IF_FUSIONS: dict[str, str] = {}
__doc__ = (__doc__ or "").replace("{fusions}", "\n".join(  # the listing above, from the one description of each
    textwrap.fill(text, 112, initial_indent=f"    {name:21} ", subsequent_indent=" " * 26)
    for name, text in (FUSIONS | WHAT_IF_FUSIONS).items()))
SERVED_TOKENS = frozenset((*range(1, 9), 16, 32, 64))  # providers.BATCHES: other token counts run the stock forward
ATTN_RES = SD + "cutedsl/attn_res/prepared.py:PreparedAttnRes.run_ring"


def resolve_fusions(enabled: Iterable[str] | None = None, disabled: Iterable[str] = ()) -> frozenset[str]:
    """The published fusions by default; any subset, plus what-ifs, when named."""
    chosen = set(FUSIONS if enabled is None else enabled) - set(disabled)
    known = FUSIONS | WHAT_IF_FUSIONS
    for name in chosen | set(disabled):
        if name not in known:
            raise UserError(f"unknown fusion '{name}': known fusions are {', '.join(known)}.")
    return frozenset(chosen)


class Launches(NamedTuple):
    """The launch of each kernel under the chosen fusions (`launches`)."""

    every: Launch  # every kernel not named below
    c1: Launch  # the stock C=1 pipeline's kernels (standard.py)
    experts: Launch  # the routed experts


def launches(d: Dims, on: frozenset[str]) -> Launches:
    """With pdl_prefetch every kernel launches with PDL and loads its weights early, except the routed
    experts, whose weights the routing chooses; without it the stock launches apply (PDL, weights after the
    wait; the C=1 pipeline's early weights)."""
    pdl = "pdl_prefetch" in on
    return Launches(every=EARLY if pdl else std.PDL, c1=EARLY if pdl or d.single_request else PLAIN,
                    experts=std.PDL)


def serves(shape: DecodeShape) -> bool:
    """Whether the specialized runtime takes the step (SpecializedDecode.plan): a verify of up to 64 tokens, or
    a decode whose CUDA-graph size (1, 2, 4, then multiples of 8) is one of providers.BATCHES."""
    if shape.tokens_per_seq > 1:
        return shape.tokens <= SMALL_BATCH_MAX_TOKENS
    m = shape.tokens
    padded = m if m <= 2 else 4 if m <= 4 else -(-m // 8) * 8
    return padded in SERVED_TOKENS


def build(cfg: ModelConfig, tp: int, shape: DecodeShape, layer_type: str, layer: int | None = None,
          fusions: Iterable[str] | None = None, fallback: bool = True) -> Plan:
    """`fallback`: a step the runtime does not serve is the stock forward's (P13); off, the specialized kernels
    at any size (what a microbenchmark of them measures)."""
    d = c.make_dims(cfg, tp, shape, layer, layer_type)
    on = resolve_fusions(fusions)
    if fallback and not serves(shape):  # P13: the stock forward runs this step
        return Plan("specialized", layer_type, tp, shape, std.build(cfg, tp, shape, layer_type, layer).kernels)
    go = launches(d, on)
    kernels = [c.residual_pre(d, go.every, ATTN_RES)]
    kernels += attention.kind(d.attn).specialized(d, on, go)  # the attention's kernels: simulator/attention/<kind>.py
    kernels += oproj(d, on, go)
    x2_from = kernels[-1].key  # the aux-stream kernels wait for x2
    if "l2_prefetch" in on and 3 <= d.M <= 8 and layer_type != "dense":
        kernels.append(moe.l2_prefetch(d, "oproj_down", after=x2_from))
    if layer_type == "dense":
        kernels += dense_ffn(d, on, go)
    else:  # the MoE path's kernels: simulator/moe/<path>.py (the specialized plan is Blackwell's: sm100)
        kernels += moe_path(d, "sm100").specialized(d, on, go, x2_from)
    return Plan("specialized", layer_type, tp, shape, tuple(kernels), fusions=on)


# ======================================================================= attention output
OPROJ = SD + "cutedsl/oproj/prepared.py:PreparedOproj.run"


def oproj(d: Dims, on: frozenset[str], go: Launches) -> list[Kernel]:
    """OprojFused at TP16 up to 8 tokens (MLA from 5); elsewhere a producer (o_proj + the all-reduce's
    exchange) and a consumer (sum, AttnRes, RMSNorm) launch."""
    if "oproj_allreduce_norm" not in on:
        return std.attention_output(d)
    if d.P >= 16 and d.M <= 8 and (d.attn == "kda" or d.M >= 5):
        return [c.oproj_allreduce_norm(d, go.every)]
    producer = fuse([c.o_proj(d), c.attn_all_reduce(d)], "oproj_producer", "OprojProducer", "gemm_collective", "gemm",
                    ("attn.out",), OPROJ, **go.every.kw,
                    fusions=("oproj_allreduce_norm",), note="o_proj and the one-shot push of its partial (P10)")
    return [producer, cite(c.residual_post(d, go.every), OPROJ, key="oproj_consumer", name="OprojConsumer",
                           fusions=("oproj_allreduce_norm",))]


# ======================================================================= dense FFN
def dense_ffn(d: Dims, on: frozenset[str], go: Launches) -> list[Kernel]:
    F, e = d.cfg.dense_intermediate // d.P, go.every if "pdl_prefetch" in on else PLAIN
    reduce = c.all_reduce_kernel(d, "dense_all_reduce", "dense.partial", "moe_out", d.D, launch=e,
                                 note="TP all-reduce of the FFN output")
    if "glu_epilogue" not in on:
        return moe.gated_mlp(d, "dense", F, "dense FFN", launch=e) + [reduce]
    return [moe.gate_up_act(d, "dense", F, launch=e),
            moe.down_proj(d, "dense", F, "dense FFN down, row shard; its partial sum is reduced later", launch=e),
            reduce]
