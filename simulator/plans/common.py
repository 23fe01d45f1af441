"""Pieces both plans share: per-rank dimensions, tensor declarations, launch flags, and the
residual-stream, o_proj and all-reduce kernels both plans launch (each attention kind's own: simulator/attention).

A kernel factory returns a `Kernel` bound to its op (kernel.py), its tensors declared from the dims, so traffic
is derived. Every attribute, stream, dependencies, PDL and prefetch included, is set where the kernel is built;
the plans (standard.py, specialized.py) read top to bottom as the launches they make.

Dimension legend: M tokens (B sequences x T tokens each), D hidden, P TP degree, n attention output width
per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import NamedTuple

from simulator.config import ATTENTION_KINDS, ATTENTION_WEIGHTS, ModelConfig, validate_tp
from simulator.errors import UserError
from simulator.memo import context_free
from simulator.ops import collectives as coll_ops
from simulator.ops import linear as lin
from simulator.ops import norm
from simulator.ops import residual as res
from simulator.plans.kernel import ALL_WEIGHTS, K3, LLG, SD, Collective, Kernel, RunOption, Shard, Tensor
from simulator.state import DecodeShape, block_boundary, blocks_before


@dataclass(frozen=True)
class Dims:
    """Every size a plan needs, per rank, from config x TP x decode shape x layer (cost.step.layer_signature)."""

    cfg: ModelConfig
    tp: int
    shape: DecodeShape
    layer: int

    @property
    def M(self) -> int:
        return self.shape.tokens

    @property
    def D(self) -> int:
        return self.cfg.hidden_size

    @property
    def P(self) -> int:
        return self.tp

    @property
    def attn(self) -> str:
        """The attention kind of this layer (an entry of simulator/attention/)."""
        return self.cfg.attn_kinds[self.layer]

    @property
    def attn_res(self) -> bool:
        """The model's residual stream is Block AttnRes (else a plain residual + RMSNorm)."""
        return self.cfg.residual == "attn_res"

    @property
    def n_blocks(self) -> int:
        """Block snapshots that exist before this layer."""
        return blocks_before(self.cfg, self.layer)

    @property
    def boundary(self) -> bool:
        return block_boundary(self.cfg, self.layer)

    @property
    def kda_heads_r(self) -> int:
        return self.cfg.kda_heads // self.tp

    @property
    def kda_w_r(self) -> int:  # KDA channels per rank (q, k, v each)
        return self.kda_heads_r * self.cfg.kda_head_dim

    @property
    def attn_width(self) -> int:  # n: the attention output width one rank feeds o_proj
        return ATTENTION_WEIGHTS[self.attn](self.cfg)[f"{self.attn}.w_o"][0][0] // self.tp  # its o_proj's rows

    @property
    def L(self) -> int:
        return self.cfg.expert_in_dim

    @property
    def F_r(self) -> int:
        return self.cfg.moe_intermediate // self.tp

    @property
    def S_r(self) -> int:  # shared-expert hidden per rank
        return self.cfg.shared_intermediate // self.tp

    @property
    def cache_len(self) -> int:  # MLA cache rows after this step's tokens are inserted
        return self.shape.context + self.shape.tokens_per_seq

    @property
    def single_request(self) -> bool:
        """One sequence, one token: the stock path's C=1 pipeline applies."""
        return self.shape.batch == 1 and self.shape.tokens_per_seq == 1

    @cached_property
    def sans_context(self) -> "Dims":
        """These dims with the context set to 0: what a factory that does not read the context is built from
        (`context_free`)."""
        return self if self.shape.context == 0 else replace(self, shape=replace(self.shape, context=0))


def make_dims(cfg: ModelConfig, tp: int, shape: DecodeShape, layer: int | None, layer_type: str) -> Dims:
    validate_tp(cfg, tp)
    for name in ("batch", "tokens_per_seq"):
        value = getattr(shape, name)
        if not isinstance(value, int) or value < 1:
            raise UserError(f"{name} = {value!r} must be a positive integer.")
    if not isinstance(shape.context, int) or shape.context < 0:
        raise UserError(f"context = {shape.context!r} must be a non-negative integer.")
    if layer_type not in ATTENTION_KINDS + ("dense",):
        raise UserError(f"layer type '{layer_type}' is not one of {', '.join(ATTENTION_KINDS + ('dense',))}.")
    index = cfg.first_layer_of(layer_type) if layer is None else layer
    if cfg.layer_type(index) != layer_type:
        raise UserError(f"layer {index} of model '{cfg.name}' is '{cfg.layer_type(index)}', not '{layer_type}'.")
    return Dims(cfg, tp, shape, index)


# ===================================================================== declarations

class Launch(NamedTuple):
    """How a kernel is launched, as the two `Kernel` fields it sets (`**launch.kw`): with programmatic
    dependent launch, and loading its weights before its inputs are ready (prefetch under the predecessor)."""

    pdl: bool = False
    prefetch_bytes: int = 0  # ALL_WEIGHTS: every weight byte the kernel declares

    @property
    def kw(self) -> dict[str, int]:
        return self._asdict()


PLAIN = Launch()
EARLY = Launch(pdl=True, prefetch_bytes=ALL_WEIGHTS)
PDL = Launch(pdl=True)  # launched with PDL, its weights loaded after the wait


def act(name: str, *shape: int, dtype: str = "bf16", window: tuple[int, int, int] | None = None) -> Tensor:
    """An activation or state buffer as one rank sees it."""
    return Tensor(name, tuple(shape), dtype, window=window)


def weight(name: str, *shape: int, shard: Shard = "full", dtype: str = "bf16") -> Tensor:
    """One weight of the specification (`weights.weight_table`), `shape` per rank after `shard`."""
    return Tensor(name, tuple(shape), dtype, parts=((name, shard),))


def packed(parts: tuple[tuple[str, Shard], ...], *shape: int, padded: tuple[int, ...] | None = None,
           dtype: str = "bf16", axis: int = -1) -> Tensor:
    """Several spec weights packed into one buffer along `axis` (as a checkpoint loader fuses them),
    `shape` wide; stored `padded` when the loader pads it (bytes count the padding)."""
    name = "+".join(p for p, _ in parts)
    if padded and padded != tuple(shape):
        return Tensor(name, padded, dtype, unpadded=tuple(shape), parts=parts, pack_axis=axis)
    return Tensor(name, tuple(shape), dtype, parts=parts, pack_axis=axis)


def blocks(d: Dims, n: int) -> Tensor:
    """The first n AttnRes block snapshots, [n, M, D] (0 bytes when n = 0)."""
    return act("blocks", n, d.M, d.D, window=(0, 0, n))


# ======================================== kernels both plans launch (by the same or another name / launch)

ATTN_RES_STOCK = K3 + "ops/attn_res.py:attn_res"  # the stock AttnRes + norm
RMS_NORM = "vllm/model_executor/layers/layernorm.py:RMSNorm.forward_cuda"  # fused_add_rms_norm given a residual
SKINNY = SD + "runtime/providers.py:SkinnyProjection.run"  # the specialized projections at 1-2 tokens
SPLIT_K = SD + "cutedsl/gemm/projection.py:PreparedProjection.run"  # ... and above


def projection_source(d: Dims) -> str:
    """The specialized path's projection launcher at this step's token count."""
    return SKINNY if d.M <= 2 else SPLIT_K


@context_free
def attn_res_pre(d: Dims, launch: Launch = PLAIN, source: str = ATTN_RES_STOCK) -> Kernel:
    """prefix += delta (previous layer's MLP output); mix over blocks + prefix; [snapshot]; RMSNorm.
    One kernel in the stock path already (vLLM's fused AttnRes + norm, V-ATTNRES)."""
    M, D, nb = d.M, d.D, d.n_blocks
    snapshot = (act("blocks", 1, M, D, window=(0, nb, nb + 1)),) if d.boundary else ()
    return Kernel(
        key="attn_res_pre", name="attn_res_add_mix_rmsnorm", kind="pointwise", family="small", floor="reduction",
        op=norm.attn_res_pre, consts=(("eps", d.cfg.rms_norm_eps), ("boundary", d.boundary)),
        reads=(act("prefix", M, D), act("delta", M, D), blocks(d, nb)),
        weights=(weight("attn_res_norm", D), weight("attn_res_proj", D), weight("input_norm", D)),
        writes=(act("prefix", M, D), act("x", M, D)) + snapshot,
        flops=M * D + norm.attn_res_mix_flops(nb + 1, M, D) + norm.rms_norm_flops(M, D), **launch.kw, source=source,
        note="prefix += previous MLP output, [block snapshot], softmax mix over sources, input RMSNorm; "
             "fused in stock vLLM (V-ATTNRES, PR #57464 folds the MLP add in)")


@context_free
def add_norm(d: Dims, key: str, launch: Launch = PLAIN) -> Kernel:
    """A plain residual's add + RMSNorm in one kernel: `input_norm` (residual += the previous layer's MLP output;
    x = RMSNorm) or `post_attn_norm` (residual += the attention output, stored in bf16; x2 = RMSNorm)."""
    M, D, pre = d.M, d.D, key == "input_norm"
    added, out = ("delta", "x") if pre else ("attn.out", "x2")
    store = () if pre else (("store", RunOption("store_bf16")),)
    return Kernel(
        key=key, name="fused_add_rms_norm", kind="pointwise", family="small", floor="reduction",
        op=res.add_rms_norm if pre else res.add_rms_norm_post, consts=(("eps", d.cfg.rms_norm_eps),) + store,
        reads=(act("prefix", M, D), act(added, M, D)), weights=(weight(key, D),),
        writes=(act("prefix", M, D), act(out, M, D)), flops=M * D + norm.rms_norm_flops(M, D), **launch.kw,
        source=RMS_NORM,
        note=f"residual add + {'input' if pre else 'post-attention'} RMSNorm in one kernel "
             "(vLLM fused_add_rms_norm, csrc/layernorm_kernels.cu)")


def residual_pre(d: Dims, launch: Launch = PLAIN, attn_res_source: str = ATTN_RES_STOCK) -> Kernel:
    """The layer's first kernel: the AttnRes mix + norm (launched by `attn_res_source`), or a plain residual
    add + norm (the model's structure)."""
    return attn_res_pre(d, launch, attn_res_source) if d.attn_res else add_norm(d, "input_norm", launch)


def pre_norm_key(d: Dims) -> str:
    """Key of the kernel that writes the attention's input x."""
    return "attn_res_pre" if d.attn_res else "input_norm"


def post_norm_key(d: Dims) -> str:
    """Key of the standard kernel that writes the MLP's input x2 (what the fused o_proj kernel replaces)."""
    return "attn_res_post" if d.attn_res else "post_attn_norm"


def attn_res_post_tensors(d: Dims) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], tuple[Tensor, ...]]:
    """(reads besides the attention output, writes, weights) of the post-attention AttnRes + norm."""
    M, D = d.M, d.D
    return ((act("prefix", M, D), blocks(d, d.n_blocks + d.boundary)), (act("prefix", M, D), act("x2", M, D)),
            (weight("mlp_res_norm", D), weight("mlp_res_proj", D), weight("post_attn_norm", D)))


def attn_res_post_flops(d: Dims) -> int:
    """prefix add + mix over blocks and prefix + RMSNorm."""
    return d.M * d.D + norm.attn_res_mix_flops(d.n_blocks + d.boundary + 1, d.M, d.D) + norm.rms_norm_flops(d.M, d.D)


def o_proj_weight(d: Dims) -> Tensor:
    return weight(f"{d.attn}.w_o", d.attn_width, d.D, shard="row")


def o_proj_bias(d: Dims) -> tuple[Tensor, ...]:
    """gpt-oss's o_proj bias: row-parallel, so rank 0 adds it (vLLM RowParallelLinear skips it on the others)."""
    return (weight("o_proj.bias", d.D, shard="rank0", dtype="fp32"),) if d.cfg.o_proj_bias else ()


# vLLM's standalone all-reduce (CudaCommunicator.all_reduce, VLLM_ALLREDUCE_USE_FLASHINFER=1): FlashInfer's MNNVL
# allreduce_fusion, Lamport buffers, one- or two-shot chosen inside FlashInfer; no NVLS (multimem) all-reduce
FLASHINFER_AR = ("one_shot", "two_shot")
FLASHINFER_ALL_REDUCE = "vllm/distributed/device_communicators/flashinfer_all_reduce.py:FlashInferAllReduce.all_reduce"


@context_free
def all_reduce_kernel(d: Dims, key: str, src: str, dst: str, width: int, note: str, launch: Launch = PLAIN,
                      source: str = FLASHINFER_ALL_REDUCE) -> Kernel:
    """A standalone TP all-reduce of [M, width] bf16, in the run's reduction order."""
    t = act(src, d.M, width)
    return Kernel(key=key, name="allreduce", kind="collective", family="collective", scope="ranks",
                  op=coll_ops.all_reduce, consts=(("algorithm", RunOption("all_reduce")),), reads=(t,),
                  writes=(act(dst, d.M, width),),
                  collective=Collective("all_reduce", t.nbytes, d.P, algorithms=FLASHINFER_AR), pdl=launch.pdl,
                  note=note, source=source)


# ======================================== attention output: o_proj, all-reduce, residual + norm, or one fused kernel

@context_free
def o_proj(d: Dims, launch: Launch = PLAIN) -> Kernel:
    M, D, n = d.M, d.D, d.attn_width
    return Kernel(key="o_proj", name="cutlass_gemm_o_proj", kind="gemm", family="gemm", op=lin.linear,
                  reads=(act("attn.core", M, n),), weights=(o_proj_weight(d),) + o_proj_bias(d),
                  writes=(act("attn.partial", M, D),), flops=lin.gemm_flops(M, n, D), **launch.kw, source=LLG,
                  note="row-parallel o_proj; its partial sum still needs the all-reduce")


@context_free
def attn_all_reduce(d: Dims, launch: Launch = PLAIN) -> Kernel:
    return all_reduce_kernel(d, "attn_all_reduce", "attn.partial", "attn.out", d.D, launch=launch,
                             note="separate TP all-reduce after o_proj (FlashInfer/TRT-LLM AR; vLLM issue #55261)")


@context_free
def attn_res_post(d: Dims, launch: Launch = PLAIN) -> Kernel:
    reads, writes, weights = attn_res_post_tensors(d)
    return Kernel(key="attn_res_post", name="attn_res_add_mix_rmsnorm", kind="pointwise", family="small",
                  floor="reduction", op=norm.attn_res_post,
                  consts=(("eps", d.cfg.rms_norm_eps), ("store", RunOption("store_bf16"))),
                  reads=(reads[0], act("attn.out", d.M, d.D), reads[1]), writes=writes, weights=weights,
                  flops=attn_res_post_flops(d), **launch.kw, source=ATTN_RES_STOCK,
                  note="prefix += attention output, softmax mix, post-attention RMSNorm (V-ATTNRES)")


def residual_post(d: Dims, launch: Launch = PLAIN) -> Kernel:
    return attn_res_post(d, launch) if d.attn_res else add_norm(d, "post_attn_norm", launch)


@context_free
def oproj_allreduce_norm(d: Dims, launch: Launch = PLAIN) -> Kernel:
    """o_proj GEMM + in-kernel one-shot all-reduce + the residual's add (AttnRes: and mix) + RMSNorm: 3 kernels -> 1."""
    M, D, n = d.M, d.D, d.attn_width
    if d.attn_res:
        reads, writes, weights = attn_res_post_tensors(d)
        name, op = "fused_oproj_allreduce_attnres_rmsnorm", norm.oproj_allreduce_attn_res_post
        flops = attn_res_post_flops(d)
    else:
        reads, writes = (act("prefix", M, D),), (act("prefix", M, D), act("x2", M, D))
        weights, flops = (weight("post_attn_norm", D),) + o_proj_bias(d), M * D + norm.rms_norm_flops(M, D)
        name, op = "fused_oproj_allreduce_rmsnorm", res.oproj_allreduce_add_norm
    payload = act("attn.partial", M, D)
    return Kernel(
        key="oproj_ar_norm", name=name, kind="gemm_collective", family="gemm", scope="ranks",
        op=op, consts=(("eps", d.cfg.rms_norm_eps), ("store", RunOption("store_bf16"))),
        reads=(act("attn.core", M, n),) + reads, writes=writes, weights=(o_proj_weight(d),) + weights,
        flops=lin.gemm_flops(M, n, D) + flops,
        collective=Collective("all_reduce", payload.nbytes, d.P, in_kernel=True), fusions=("oproj_allreduce_norm",),
        replaces=("o_proj", "attn_all_reduce", post_norm_key(d)), **launch.kw,
        source=SD + "cutedsl/oproj/prepared.py:PreparedOproj.run",
        note="GEMM epilogue pushes bf16 partials to peers (one-shot, Lamport flags), reduces in FP32, "
             "adds to the AttnRes prefix, mixes and normalises; the [M, D] partial and reduced outputs "
             "never round-trip HBM (vLLM gemm_rs_ar #53053, SGLang #30753, TRT-LLM min-latency AR+norm)")
