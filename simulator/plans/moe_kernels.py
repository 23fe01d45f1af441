"""MoE kernels the MoE paths (simulator/moe/) and the dense FFN share: router, latent projections, shared /
dense gated MLP, routed experts and the fused latent tail, in their stock form and their fused form, each bound
to its op in `ops/`; the L2 prefetch launch. Each path's own launches (the unfused tails, Kimi K3's merged
kernels, matmul_ogs) are in its module there.

Dimension legend: M tokens, D hidden, P TP degree, E experts, k active experts, L latent (expert input
width), F expert hidden (F_r per rank, Fp padded), S shared hidden per rank, U touched experts.
"""

from __future__ import annotations

from simulator.errors import UserError
from simulator.ops import experts as ex
from simulator.ops import linear as lin
from simulator.ops import norm, pointwise
from simulator.ops.router import allgather_topk, route_flops, route_fused, route_unbiased
from simulator.routing import expected_unique_experts
from simulator.plans.common import PLAIN, Dims, Launch, act, context_free, packed, weight
from simulator.plans.kernel import K3, SD, Collective, Kernel, Tensor

FUSED_MOE = "vllm/model_executor/layers/fused_moe/"
TRTLLM_MOE = FUSED_MOE + "experts/trtllm_mxfp4_moe.py:TrtLlmMxfp4ExpertsMonolithic.apply"
TAIL_OP = K3 + "ops/latent_moe_tail.py:KimiK3LatentMoETailOp.__call__"
SHARED = {"gate_up": FUSED_MOE + "runner/shared_experts.py:SharedExperts.maybe_forward_async",
          "act": "vllm/model_executor/layers/activation.py:SituAndMul", "down": K3 + "model.py:KimiMLP.forward"}
FRONT = SD + "cutedsl/moe/front.py:SharedFront."

# The stock loader pads each rank's slice of the expert intermediate to at least 256 (V-MODEL: 3072 / 16
# = 192 -> 256 at TP16); the padded rows are zeros but are streamed like any other weight bytes.
STOCK_MIN_EXPERT_SHARD = 256


def expected_experts(d: Dims) -> int:
    """Distinct experts the step's tokens touch, U = E (1 - (1 - k/E)^M) for uniform independent routing,
    fewer under skew or correlated draft tokens (simulator.routing.RoutingStats); rounded, >= k."""
    cfg, routing = d.cfg, d.shape.routing
    free = routing.free_tokens(d.shape.batch, d.shape.tokens_per_seq)
    return max(cfg.top_k, round(expected_unique_experts(free, cfg.num_experts, cfg.top_k, routing.skew)))


def expert_math(d: Dims) -> str:
    """Tensor-core format of routed-expert GEMMs: MXFP4 weights run as W4A16 (bf16 activations) on
    the path the published change describes (docs/sources.md §K5, item 7)."""
    return "fp8" if d.cfg.expert_dtype == "fp8" else "bf16"


def expert_shard(d: Dims, pad: bool = True) -> int:
    """Intermediate rows per rank the expert GEMMs stream: the stock loader's padded shard, or the true one."""
    return max(d.F_r, STOCK_MIN_EXPERT_SHARD) if pad and d.P > 1 else d.F_r


def _experts(d: Dims, parts: tuple[str, ...], pad: bool) -> Tensor:
    """The U touched experts' shards of `parts` (gate/up: [U, L, 2F/P] column shards; down: [U, F/P, L]
    row shards), stored padded to the stock loader's shard when `pad`."""
    U, L, F, Fp = expected_experts(d), d.L, d.F_r, expert_shard(d, pad)
    down = parts == ("w_down",)
    shape, padded = ((U, F, L), (U, Fp, L)) if down else ((U, L, 2 * F), (U, L, 2 * Fp))
    return packed(tuple((f"expert.*.{p}", "row" if down else "col") for p in parts), *shape,
                  padded=padded, dtype=d.cfg.expert_dtype, axis=0 if down else -1)


def _expert_bias(d: Dims, down: bool) -> tuple[Tensor, ...]:
    """gpt-oss's expert biases: [E, 2F/P] = [b_gate | b_up] column shards for FC1; [E, Din] for FC2, added on
    rank 0 only (vLLM's gpt-oss loader zeros w2_bias on the other ranks: the all-reduce adds it once)."""
    E = d.cfg.num_experts
    if not d.cfg.expert_bias:
        return ()
    if down:
        return (weight("expert_bias.down", E, d.L, shard="rank0", dtype="fp32"),)
    return (packed((("expert_bias.gate", "col"), ("expert_bias.up", "col")), E, 2 * d.F_r, dtype="fp32"),)


# ===================================================================== router and latent down-projection
@context_free
def router(d: Dims, launch: Launch = PLAIN) -> Kernel:
    M, D, E = d.M, d.D, d.cfg.num_experts
    bias = (weight("router.logit_bias", E, dtype="fp32"),) if d.cfg.router_logit_bias else ()  # gpt-oss
    return Kernel(key="router", name="router_gemm_bf16_fp32", kind="gemm", family="gemm", op=lin.linear,
                  reads=(act("x2", M, D),), weights=(weight("router.w", D, E),) + bias,
                  writes=(act("router.logits", M, E, dtype="fp32"),), flops=lin.gemm_flops(M, D, E), **launch.kw,
                  source=FUSED_MOE + "router/gate_linear.py:GateLinear",
                  note="replicated router GEMM with FP32 logits (V-MODEL GateLinear; PR #53524)")


@context_free
def latent_down(d: Dims, deps: tuple[str, ...], launch: Launch = PLAIN) -> Kernel:
    M, D, L = d.M, d.D, d.L
    return Kernel(key="latent_down", name="gemm_routed_expert_down_proj", kind="gemm", family="gemm", op=lin.linear,
                  stream="aux", deps=deps, reads=(act("x2", M, D),), weights=(weight("latent.w_down", D, L),),
                  writes=(act("latent.z", M, L),), flops=lin.gemm_flops(M, D, L), **launch.kw,
                  source=K3 + "model.py:KimiMoE._maybe_overlap_router_and_down_proj",
                  note="replicated routed_expert_down_proj on an aux stream beside the router (V-MODEL, <= 256 tokens)")


@context_free
def topk(d: Dims, launch: Launch = PLAIN) -> Kernel:
    cfg, M, E, k = d.cfg, d.M, d.cfg.num_experts, d.cfg.top_k
    return Kernel(key="topk", name="moe_routing_topk", kind="router", family="small",
                  floor="topk", op=route_fused if cfg.selection_bias else route_unbiased, consts=(("cfg", cfg),),
                  reads=(act("router.logits", M, E, dtype="fp32"),),
                  weights=(weight("router.bias", E, dtype="fp32"),) if cfg.selection_bias else (),
                  writes=(act("topk.idx", M, k, dtype="int32"), act("topk.weight", M, k, dtype="fp32")),
                  diagnostics=("margin",), flops=route_flops(M, E), math="fp32", **launch.kw, source=TRTLLM_MOE,
                  note="sigmoid + selection bias + top-k + renormalise (TRT-LLM-gen routingMainKernel)")


@context_free
def split_router(d: Dims, launch: Launch = PLAIN) -> list[Kernel]:
    """Rank r computes x2 @ [W_r[:, E/P slice] | W_ld[:, L/P slice]]; one collective kernel gathers
    both and runs sigmoid + bias + top-k on the full logits. Per-rank weight bytes fall from
    (E + L) D 2 to (E + L) D 2 / P: 64 MB -> 4 MB for Kimi K3 at TP16."""
    cfg, M, D, E, L, P, k = d.cfg, d.M, d.D, d.cfg.num_experts, d.L, d.P, d.cfg.top_k
    if E % P or L % P:
        raise UserError(f"split_router needs --tp {P} to divide the {E} experts and the latent {L}.")
    shards = (act("router.logits_shard", M, E // P, dtype="fp32"), act("latent.z_shard", M, L // P))
    w = packed((("router.w", "col"), ("latent.w_down", "col")), D, (E + L) // P)
    return [
        Kernel(key="router_split", name="skinny_gemm_router_latent_down_shard", kind="gemm", family="gemm",
               op=lin.linear_split,
               consts=(("widths", (E // P, L // P)),), reads=(act("x2", M, D),), weights=(w,), writes=shards,
               flops=lin.gemm_flops(M, D, (E + L) // P), fusions=("split_router",), replaces=("router", "latent_down"),
               **launch.kw, source=FRONT + "route",
               note="router logits and latent down-projection, both column-sharded over ranks "
                    "(local-inference-lab vllm #343; TokenSpeed #1038 packs them into one projection)"),
        Kernel(key="router_gather_topk", name="allgather_sigmoid_bias_topk", kind="collective", family="collective",
               floor="topk", scope="ranks", op=allgather_topk, consts=(("cfg", cfg),), reads=shards,
               weights=(weight("router.bias", E, dtype="fp32"),),
               writes=(act("latent.z", M, L), act("topk.idx", M, k, dtype="int32"),
                       act("topk.weight", M, k, dtype="fp32")),
               diagnostics=("margin",), flops=route_flops(M, E), math="fp32",
               collective=Collective("all_gather", sum(t.nbytes for t in shards), P, in_kernel=True),
               fusions=("split_router",), replaces=("topk", "topk_indices", "mxfp8_quant"), **launch.kw,
               source=FRONT + "route",
               note="one collective kernel: all-gather the logit and latent shards, exact top-k on the full "
                    "logits (b12x issue #225: top-16 kernel 6.2-7.0 us)"),
    ]


# ======================================== gated MLP: the shared expert and the dense FFN of layer 0
def _gate_up(prefix: str, D: int, F: int) -> Tensor:
    return packed(((f"{prefix}.w_gate", "col"), (f"{prefix}.w_up", "col")), D, 2 * F)


@context_free
def gated_mlp(d: Dims, prefix: str, F: int, what: str, stream: str = "main", deps: tuple[str, ...] = (),
              launch: Launch = PLAIN) -> list[Kernel]:
    """gate+up GEMM (column shard) -> activation-and-multiply kernel -> down GEMM (row shard, partial sum)."""
    M, D, cfg = d.M, d.D, d.cfg
    on = dict(stream=stream, **launch.kw)
    return [
        Kernel(key=f"{prefix}_gate_up", name=f"gemm_{prefix}_gate_up", kind="gemm", family="gemm", op=lin.linear,
               reads=(act("x2", M, D),), weights=(_gate_up(prefix, D, F),), writes=(act(f"{prefix}.gu", M, 2 * F),),
               flops=lin.gemm_flops(M, D, 2 * F), deps=deps, **on, note=f"{what} gate+up, column shard",
               source=SHARED["gate_up"] if prefix == "shared" else SHARED["down"]),
        Kernel(key=f"{prefix}_act", name=f"{cfg.hidden_act}_and_mul", kind="pointwise", family="small",
               op=ex.glu_product, consts=(("cfg", cfg),), reads=(act(f"{prefix}.gu", M, 2 * F),),
               writes=(act(f"{prefix}.h", M, F),), flops=ex.glu_flops(M, F, cfg.hidden_act), **on, source=SHARED["act"],
               note="activation and multiply, a separate elementwise kernel"),
        down_proj(d, prefix, F, f"{what} down, row shard; its partial sum is reduced later", stream, launch),
    ]


@context_free
def gate_up_act(d: Dims, prefix: str, F: int, stream: str = "main", deps: tuple[str, ...] = (),
                launch: Launch = PLAIN) -> Kernel:
    """The gate+up GEMM with the activation in its epilogue (glu_epilogue): 2 kernels -> 1."""
    M, D, cfg = d.M, d.D, d.cfg
    return Kernel(key=f"{prefix}_gate_up_act", name=f"skinny_gemm_{prefix}_gate_up_{cfg.hidden_act}", kind="gemm",
                  family="gemm", op=ex.linear_glu, consts=(("cfg", cfg),), reads=(act("x2", M, D),),
                  weights=(_gate_up(prefix, D, F),), writes=(act(f"{prefix}.h", M, F),), stream=stream, deps=deps,
                  flops=lin.gemm_flops(M, D, 2 * F) + ex.glu_flops(M, F, cfg.hidden_act), fusions=("glu_epilogue",),
                  replaces=(f"{prefix}_gate_up", f"{prefix}_act"), **launch.kw,
                  source=FRONT + "shared_expert" if prefix == "shared" else SHARED["down"],
                  note="activation in the GEMM epilogue: the [M, 2S/P] gate/up output is never written"
                  if prefix == "shared" else "activation in the GEMM epilogue")


@context_free
def down_proj(d: Dims, prefix: str, F: int, note: str, stream: str = "main", launch: Launch = PLAIN) -> Kernel:
    M, D = d.M, d.D
    return Kernel(key=f"{prefix}_down", name=f"gemm_{prefix}_down", kind="gemm", family="gemm", op=lin.linear,
                  stream=stream, reads=(act(f"{prefix}.h", M, F),),
                  weights=(weight(f"{prefix}.w_down", F, D, shard="row"),), writes=(act(f"{prefix}.partial", M, D),),
                  flops=lin.gemm_flops(M, F, D), **launch.kw, note=note, source=SHARED["down"])


# ===================================================================== routed experts
@context_free
def fc1(d: Dims, pad: bool = True, deps: tuple[str, ...] = (), fusions: tuple[str, ...] = (),
        launch: Launch = PLAIN) -> Kernel:
    cfg, M, L, F, k = d.cfg, d.M, d.L, d.F_r, d.cfg.top_k
    Fp, U = expert_shard(d, pad), expected_experts(d)
    src = "latent.z" if cfg.latent_dim else "x2"
    return Kernel(key="fc1", name="moe_fc1_gate_up_act", kind="moe", family="moe", op=ex.expert_fc1,
                  consts=(("cfg", cfg),), deps=deps, reads=(act(src, M, L), act("topk.idx", M, k, dtype="int32")),
                  weights=(_experts(d, ("w_gate", "w_up"), pad),) + _expert_bias(d, False),
                  writes=(act("moe.h", M, k, F),),
                  flops=lin.gemm_flops(M * k, L, 2 * F) + ex.glu_flops(M * k, F, cfg.hidden_act), math=expert_math(d),
                  group_rows=M * k, group_tokens=M, group_experts=cfg.num_experts, fusions=fusions, **launch.kw,
                  source=TRTLLM_MOE,
                  note=f"grouped GEMM over the U(M) = {U} touched experts' TP shards ({Fp} intermediate rows per rank"
                       + (", padded by the stock loader" if Fp != F else "") + "), activation in the epilogue")


@context_free
def fc2(d: Dims, pad: bool = True, launch: Launch = PLAIN) -> Kernel:
    M, L, F, k = d.M, d.L, d.F_r, d.cfg.top_k
    return Kernel(key="fc2", name="moe_fc2_down", kind="moe", family="moe", op=ex.expert_fc2,
                  reads=(act("moe.h", M, k, F), act("topk.idx", M, k, dtype="int32")),
                  weights=(_experts(d, ("w_down",), pad),) + _expert_bias(d, True), writes=(act("moe.slots", M, k, L),),
                  flops=lin.gemm_flops(M * k, F, L), math=expert_math(d), group_rows=M * k, group_tokens=M,
                  group_experts=d.cfg.num_experts, **launch.kw, source=TRTLLM_MOE,
                  note="grouped down GEMM, one output row per (token, slot); intermediate padded like FC1")


@context_free
def finalize(d: Dims, launch: Launch = PLAIN) -> Kernel:
    M, L, k = d.M, d.L, d.cfg.top_k
    return Kernel(key="finalize", name="moe_finalize", kind="pointwise", family="small", floor="finalize",
                  op=ex.expert_finalize, reads=(act("moe.slots", M, k, L), act("topk.weight", M, k, dtype="fp32")),
                  writes=(act("moe.partial", M, L),), flops=ex.finalize_flops(M, k, L), **launch.kw, source=TRTLLM_MOE,
                  note="unpermute + routing-weighted sum over the k slots (not deferred; PR #53152 defers it)")


@context_free
def fc2_finalize(d: Dims, pad: bool = True, launch: Launch = PLAIN) -> Kernel:
    """FC2 with the routing weight and scatter-add in its epilogue (moe_finalize): 2 kernels -> 1."""
    M, L, F, k = d.M, d.L, d.F_r, d.cfg.top_k
    return Kernel(key="fc2_finalize", name="moe_fc2_down_finalize", kind="moe", family="moe", op=ex.expert_fc2_finalize,
                  reads=(act("moe.h", M, k, F), act("topk.idx", M, k, dtype="int32"),
                         act("topk.weight", M, k, dtype="fp32")),
                  weights=(_experts(d, ("w_down",), pad),) + _expert_bias(d, True), writes=(act("moe.partial", M, L),),
                  flops=lin.gemm_flops(M * k, F, L) + ex.finalize_flops(M, k, L), math=expert_math(d),
                  group_rows=M * k, group_tokens=M, fusions=("moe_finalize",) + (() if pad else ("unpadded_experts",)),
                  replaces=("fc2", "finalize"), group_experts=d.cfg.num_experts, **launch.kw,
                  source=SD + "cutedsl/moe/experts_runtime.py:PersistentExperts.run",
                  note="routing weight and scatter-add in the FC2 epilogue: the [M, k, L] slot outputs are never "
                       "written")


# ======================================== the fused latent tail (the unfused tails: simulator/moe/fused.py)
@context_free
def latent_tail_fused(d: Dims, launch: Launch = PLAIN) -> list[Kernel]:
    """(a) AR(latent partial) + RMSNorm + RS(shared partial); (b) u_r = normed @ W_up[:, D/P slice] +
    shared slice, all-gathered (multicast) into every rank's output: 5 standard kernels -> 2, and
    the replicated 7168x3584 up-projection (51 MB) becomes a 1/P shard per rank."""
    cfg, M, D, L, P = d.cfg, d.M, d.D, d.L, d.P
    # RS of [M, D] moves (P-1)/P of it, the same bytes as a one-shot AR of [M, D/P]: priced as one AR.
    ar_bytes = act("moe.partial", M, L).nbytes + act("shared.partial", M, D // P).nbytes
    on = dict(**launch.kw, source=TAIL_OP)
    return [
        Kernel(key="tail_ar_norm_rs", name="latent_tail_allreduce_rmsnorm_reducescatter", kind="collective",
               family="collective", floor="reduction", scope="ranks", op=ex.allreduce_rmsnorm_reducescatter,
               consts=(("eps", cfg.rms_norm_eps),),
               reads=(act("moe.partial", M, L), act("shared.partial", M, D)), weights=(weight("latent.norm", L),),
               writes=(act("latent.normed", M, L), act("shared.slice", M, D // P)), flops=norm.rms_norm_flops(M, L),
               collective=Collective("all_reduce", ar_bytes, P, in_kernel=True), fusions=("latent_tail",),
               deps=("shared_down",), replaces=("tail_concat", "moe_all_reduce", "latent_norm"), **on,
               note="one collective kernel: AR(latent) + RMSNorm + RS(shared) (V-TAIL tier 0 kernel a)"),
        Kernel(key="tail_up_add_gather", name="latent_up_shard_add_allgather", kind="gemm_collective", family="gemm",
               scope="ranks", op=ex.linear_add_allgather,
               reads=(act("latent.normed", M, L), act("shared.slice", M, D // P)),
               weights=(weight("latent.w_up", L, D // P, shard="col"),), writes=(act("moe_out", M, D),),
               flops=lin.gemm_flops(M, L, D // P),
               collective=Collective("all_gather", act("u", M, D // P).nbytes, P, in_kernel=True),
               fusions=("latent_tail",), replaces=("latent_up", "tail_add"), **on,
               note="sharded up-projection, epilogue adds the shared slice and multicast-stores into every "
                    "rank's output (V-TAIL tier 0 kernels b + c; NVLS)"),
    ]


# ======================================== the L2 prefetch launches of the specialized path (docs/vllm-k3-source.md)
@context_free
def l2_prefetch(d: Dims, point: str, after: str) -> Kernel:
    """An L2Prefetch launch on the prefetch stream, forked after `after` (no PDL). moe-sim keeps its launch but
    not its bytes: L2 residency across kernels is beyond the model, which charges each kernel's weights where
    that kernel loads them (early, under its predecessor)."""
    return Kernel(key=f"l2_prefetch_{point}", name="L2Prefetch", kind="pointwise", family="small", op=pointwise.nothing,
                  stream="prefetch", deps=(after,), fusions=("l2_prefetch",),
                  source=SD + "runtime/prefetch.py:PrefetchController.fork",
                  note=f"cp.async.bulk.prefetch.L2 of the '{point}' ranges (sd/runtime/prefetch.py)")
