"""gpt-oss's MoE as vLLM runs it through OpenAI's triton_kernels (matmul_ogs): Hopper and ROCm, MXFP4 experts.
The standard plan's MoE path there (the specialized plan is Blackwell's: simulator/moe/fused.py).

    router GEMM (+ logit bias) | [pad the hidden to 256] | _topk_forward | _sum_bitmatrix_rows |
    _combined_routing_memset | _combined_routing_compute | matmul_ogs FC1 + SwiGLU | matmul_ogs FC2 |
    _finalize_matmul_scatter | [all-reduce at TP > 1]

vLLM's TRITON MXFP4 backend (model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py,
triton_kernel_moe_forward) routes with triton_kernels' legacy `routing` (triton_kernels 3.5.1): a top-k kernel
that also softmaxes the k chosen logits and packs a bitmatrix of the choices, then `sort_tokens` builds the
expert-sorted gather / scatter indices in three launches (a histogram of the bitmatrix, a memset of the offset
buffers, the index compute). moe-sim's grouped ops index experts directly, so the route is one op (on the top-k
launch) and the three index launches carry no numbers. The two matmul_ogs launches gather their rows by those
indices; the finalize launch scatters each token's k rows back and sums them with the routing weights. On ROCm
the backend pads the hidden and intermediate dimensions of the experts to 256 (2880 -> 3072 for gpt-oss) and
the hidden state with them (one Inductor pad launch).

The expert and router weights are the declared ones of plans/moe_kernels.py (`_experts`, `_expert_bias`, `router`):
biases and the clamped SwiGLU come with them and their ops. Kernel names are those of the public MI300X trace
(docs/gpt-oss.md): the matmul_ogs tile in the name (16x128x256x1) is the one triton_kernels picked there.

Dimension legend: M tokens, D hidden (Dp padded), k active experts, E experts, U touched experts, F expert
hidden (Fp padded), P TP degree.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.ops import experts as ex
from simulator.ops import linear as lin
from simulator.ops import pointwise
from simulator.plans import moe_kernels as moe
from simulator.plans.common import Dims, Launch, act, all_reduce_kernel, context_free
from simulator.plans.fuse import cite
from simulator.plans.kernel import Kernel, Tensor

# OpenAI's triton_kernels as vLLM 0.33.0 bundles it (its legacy 3.5.1 routing API; the trace's stacks show the same
# files and lines: routing.py:292 routing, :160 sort_tokens, topk.py:87 topk)
TK = "vllm/third_party/triton_kernels/"
ROCM = ("gfx942", "gfx950")  # the AMD archs of plans/standard.arch_of
ALIGN = {"rocm": (256, 256), "cuda": (1, 64)}  # (hidden, intermediate per rank) the TRITON backend rounds up to:
# vllm/model_executor/layers/fused_moe/oracle/mxfp4.py mxfp4_round_up_hidden_size_and_intermediate_size (ROCm,
# activation not SiTU / SiLU: 256; CUDA: the default branch, the intermediate to 64, e.g. 1440 -> 1472 at TP2)
TILE = "16x128x256x1"  # BLOCK_M x BLOCK_N x BLOCK_K x split-K that triton_kernels picked in the MI300X trace
IMPL = "triton_matmul_ogs"  # the measured implementation a kernel set may hold a law for (cost/laws.py)


def takes(d: Dims, arch: str) -> bool:
    """vLLM's MXFP4 oracle takes the TRITON (matmul_ogs) backend for gpt-oss's experts (clamped SwiGLU, MXFP4)
    where no vendor kernel comes first: Hopper (FlashInfer TRT-LLM needs SM100) and the ROCm trace's path."""
    cfg = d.cfg
    return cfg.expert_dtype == "mxfp4" and cfg.hidden_act == "swiglu_oai" and arch in ("sm90",) + ROCM


def _padded(t: Tensor, arch: str) -> Tensor:
    """The expert weights as the backend stores them (zeros padding): the hidden and each packed intermediate
    rounded up to ALIGN: gate/up [U, D, 2F] -> [U, Dp, 2 Fp], down [U, F, D] -> [U, Fp, Dp]."""
    hidden, inter = ALIGN["rocm" if arch in ROCM else "cuda"]
    up = lambda n, a: -(-n // a) * a  # noqa: E731
    rows, cols = t.shape[-2:]
    if t.pack_axis in (-1, len(t.shape) - 1):  # gate/up: D rows, the parts' F columns side by side
        parts = len(t.parts)
        shape = t.shape[:-2] + (up(rows, hidden), parts * up(cols // parts, inter))
    else:  # down: F rows, D columns
        shape = t.shape[:-2] + (up(rows, inter), up(cols, hidden))
    return replace(t, shape=shape, unpadded=t.unpadded or t.shape) if shape != t.shape else t


@context_free
def pad_hidden(d: Dims) -> Kernel:
    x = act("x2", d.M, d.D)
    return Kernel(key="moe_pad", name="triton_poi_fused_constant_pad_nd_moe_forward", kind="pointwise",
                  family="small", op=pointwise.add, reads=(x,), writes=(x,),
                  source="vllm/model_executor/layers/fused_moe/runner/moe_runner.py:MoERunner._maybe_pad_hidden_states",
                  note=f"x2 padded to {-(-d.D // ALIGN['rocm'][0]) * ALIGN['rocm'][0]} columns of zeros for the "
                       "padded experts (one Inductor "
                       "launch); declared in place: the zero columns change no number and add M x 192 x 2 B")


@context_free
def topk(d: Dims) -> Kernel:
    """The route: top-k of the router logits, softmax over the k chosen, the bitmatrix of the choices."""
    return cite(moe.topk(d), TK + "topk.py:topk", name="_topk_forward",
                note="top-k of the logits, softmax over the k chosen (renormalised), bitmatrix packed (triton_kernels)")


def _index_launch(d: Dims, key: str, name: str, what: str) -> Kernel:
    idx = act("topk.idx", d.M, d.cfg.top_k, dtype="int32")
    return Kernel(key=key, name=name, kind="router", family="small", op=pointwise.add, reads=(idx,), writes=(idx,),
                  source=TK + "routing.py:sort_tokens",
                  note=f"{what}; moe-sim's grouped ops index experts directly, so its op passes the ids on")


@context_free
def bitmatrix_rows(d: Dims) -> Kernel:
    return _index_launch(d, "ogs_hist", "_sum_bitmatrix_rows", "tokens per expert from the bitmatrix (histogram)")


@context_free
def routing_memset(d: Dims) -> Kernel:
    return Kernel(key="ogs_memset", name="_combined_routing_memset", kind="router", family="small",
                  op=pointwise.nothing, source=TK + "routing.py:sort_tokens",
                  note="zeroes the expert offsets and index buffers (~2 M k int32): no tensor moe-sim holds")


@context_free
def routing_compute(d: Dims) -> Kernel:
    return _index_launch(d, "ogs_indices", "_combined_routing_compute",
                         "expert offsets and the gather / scatter indices of the routed rows")


@context_free
def fc1(d: Dims, arch: str) -> Kernel:
    cfg, M, L, F, k = d.cfg, d.M, d.L, d.F_r, d.cfg.top_k
    w = _padded(moe._experts(d, ("w_gate", "w_up"), pad=False), arch)
    return Kernel(key="fc1", name=f"_matmul_ogs_NNT_bf16xbf16xmxfp4_{TILE}_swiglu", kind="moe", family="moe",
                  impl=IMPL, group_experts=cfg.num_experts, op=ex.expert_fc1, consts=(("cfg", cfg),),
                  reads=(act("x2", M, L), act("topk.idx", M, k, dtype="int32")),
                  weights=(w,) + moe._expert_bias(d, False),
                  writes=(act("moe.h", M, k, F),),
                  flops=lin.gemm_flops(M * k, L, 2 * F) + ex.glu_flops(M * k, F, cfg.hidden_act),
                  math=moe.expert_math(d), group_rows=M * k, group_tokens=M, source=TK + "matmul_ogs.py:matmul_ogs",
                  note=f"gather the routed rows, gate+up over the U(M) = {moe.expected_experts(d)} touched experts "
                       f"({w.shape[-2]} x {w.shape[-1]} MXFP4 each, dequantised to bf16), clamped SwiGLU in the "
                       "epilogue")


@context_free
def fc2(d: Dims, arch: str) -> Kernel:
    M, L, F, k = d.M, d.L, d.F_r, d.cfg.top_k
    w = _padded(moe._experts(d, ("w_down",), pad=False), arch)
    return Kernel(key="fc2", name=f"_matmul_ogs_NNT_bf16xbf16xmxfp4_{TILE}", kind="moe", family="moe",
                  impl=IMPL, group_experts=d.cfg.num_experts, op=ex.expert_fc2,
                  reads=(act("moe.h", M, k, F), act("topk.idx", M, k, dtype="int32")),
                  weights=(w,) + moe._expert_bias(d, True), writes=(act("moe.slots", M, k, L),),
                  flops=lin.gemm_flops(M * k, F, L),
                  math=moe.expert_math(d), group_rows=M * k, group_tokens=M, source=TK + "matmul_ogs.py:matmul_ogs",
                  note="down projection of each routed row, one output row per (token, slot), in expert order")


@context_free
def finalize(d: Dims) -> Kernel:
    M, L, k = d.M, d.L, d.cfg.top_k
    out = "moe_out" if d.P == 1 else "moe.partial"
    return Kernel(key="finalize", name="_finalize_matmul_scatter_bf16", kind="pointwise", family="small",
                  floor="finalize", op=ex.expert_finalize,
                  reads=(act("moe.slots", M, k, L), act("topk.weight", M, k, dtype="fp32")),
                  writes=(act(out, M, L),), flops=ex.finalize_flops(M, k, L),
                  source=TK + "matmul_ogs.py:matmul_ogs",
                  note="scatter the rows back to token order and sum each token's k rows with its routing weights (the "
                       "trace's triton_kernels launches _finalize_matmul; 0.33.0's bundle reduces in reduce_grouped)")


def standard(d: Dims, c1: Launch, arch: str) -> list[Kernel]:
    """The launches of triton_kernel_moe_forward after the router GEMM, in order (module docstring); no C=1
    pipeline (`c1` is the other paths')."""
    kernels = [moe.router(d)] + ([pad_hidden(d)] if arch in ROCM else [])
    kernels += [topk(d), bitmatrix_rows(d), routing_memset(d), routing_compute(d), fc1(d, arch), fc2(d, arch),
                finalize(d)]
    if d.P > 1:
        kernels.append(all_reduce_kernel(d, "moe_all_reduce", "moe.partial", "moe_out", d.D,
                                         note="TP all-reduce of the MoE output (FusedMoE reduce_results)"))
    return kernels
