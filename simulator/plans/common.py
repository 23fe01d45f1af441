"""Pieces both plans share: per-rank dimensions, tensor declarations, and kernel factories.

A kernel factory returns a `Kernel` whose tensors are declared from the dims (so traffic is derived)
and whose `effect(ranks)` computes with the ops. The plans (standard.py, specialized.py) read
top-to-bottom as the launches they make and call these factories; what the two plans do
identically lives here once.

Dimension legend: M tokens (B sequences x T tokens each), D hidden, P TP degree, E experts,
k active experts, F expert hidden, L latent, Nh heads on this rank, H head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from simulator.config import ModelConfig, validate_tp
from simulator.errors import UserError
from simulator.ops import norm
from simulator.plans.kernel import DecodeShape, Kernel, Tensor
from simulator.weights import column_shard, row_shard

Effect = Callable[[list[Any]], None]


@dataclass(frozen=True)
class Dims:
    """Every size a plan needs, per rank, derived once from config x TP x decode shape x layer."""

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
    def n_blocks(self) -> int:
        """Block snapshots that exist before this layer (taken at layers 0, b, 2b, ... < layer)."""
        b = self.cfg.attn_res_block
        return 0 if b == 0 else -(-self.layer // b)

    @property
    def boundary(self) -> bool:
        b = self.cfg.attn_res_block
        return b > 0 and self.layer % b == 0

    @property
    def kda_heads_r(self) -> int:
        return self.cfg.kda_heads // self.tp

    @property
    def kda_w_r(self) -> int:  # KDA channels per rank (q, k, v each)
        return self.kda_heads_r * self.cfg.kda_head_dim

    @property
    def mla_heads_r(self) -> int:
        return self.cfg.mla_heads // self.tp

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


def make_dims(cfg: ModelConfig, tp: int, shape: DecodeShape, layer: int | None, layer_type: str) -> Dims:
    validate_tp(cfg, tp)
    for name in ("batch", "tokens_per_seq"):
        value = getattr(shape, name)
        if not isinstance(value, int) or value < 1:
            raise UserError(f"{name} = {value!r} must be a positive integer.")
    if not isinstance(shape.context, int) or shape.context < 0:
        raise UserError(f"context = {shape.context!r} must be a non-negative integer.")
    if layer_type not in ("kda", "mla", "dense"):
        raise UserError(f"layer type '{layer_type}' is not one of kda, mla, dense.")
    index = cfg.first_layer_of(layer_type) if layer is None else layer
    if cfg.layer_type(index) != layer_type:
        raise UserError(f"layer {index} of model '{cfg.name}' is '{cfg.layer_type(index)}', not '{layer_type}'.")
    return Dims(cfg, tp, shape, index)


# ---------------------------------------------------------------------------------------
# tensor declarations
# ---------------------------------------------------------------------------------------

def act(name: str, *shape: int, dtype: str = "bf16") -> Tensor:
    return Tensor(name, tuple(shape), dtype)


def wt(name: str, *shape: int, dtype: str = "bf16") -> Tensor:
    return Tensor(name, tuple(shape), dtype)


def gemm_flops(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


# ---------------------------------------------------------------------------------------
# effects helpers
# ---------------------------------------------------------------------------------------

def per_rank(fn: Callable[[Any], None]) -> Effect:
    """Lift a one-rank effect to all ranks (every rank runs the same kernel on its own shard)."""
    def effect(ranks: list[Any]) -> None:
        for rank in ranks:
            fn(rank)
    return effect


def col(rank: Any, name: str) -> np.ndarray:
    """Column-parallel shard of a full weight, in the rank's compute dtype (a view of one shared copy)."""
    return column_shard(rank.w.get(name, rank.dtype), rank.r, rank.tp)


def row(rank: Any, name: str) -> np.ndarray:
    return row_shard(rank.w.get(name, rank.dtype), rank.r, rank.tp)


def full(rank: Any, name: str) -> np.ndarray:
    return rank.w.get(name, rank.dtype)


def sources(rank: Any, n_blocks: int) -> list[np.ndarray]:
    return [rank.buf[f"block.{i}"] for i in range(n_blocks)] + [rank.buf["prefix"]]


# ---------------------------------------------------------------------------------------
# kernels both plans launch identically
# ---------------------------------------------------------------------------------------

def attn_res_pre(d: Dims, pdl: bool = False) -> Kernel:
    """prefix += delta (previous layer's MLP output); mix over blocks + prefix; [snapshot]; RMSNorm.
    One kernel in the stock path already (vLLM's fused AttnRes + norm, V-ATTNRES)."""
    M, D, nb = d.M, d.D, d.n_blocks
    eps = d.cfg.rms_norm_eps

    def run(rank: Any) -> None:
        b = rank.buf
        b["prefix"] = b["prefix"] + b["delta"]
        h = norm.attn_res_mix(sources(rank, nb), full(rank, "attn_res_norm"), full(rank, "attn_res_proj"), eps)
        if d.boundary:
            b[f"block.{nb}"] = b["prefix"]
            b["prefix"] = np.zeros_like(b["prefix"])
        b["x"] = norm.rms_norm(h, full(rank, "input_norm"), eps)

    writes = [act("prefix", M, D), act("x", M, D)] + ([act(f"block.{nb}", M, D)] if d.boundary else [])
    return Kernel(
        key="attn_res_pre", name="attn_res_add_mix_rmsnorm", kind="pointwise",
        reads=(act("delta", M, D), act("sources", nb + 1, M, D)),
        writes=tuple(writes),
        weights=(wt("attn_res_norm", D), wt("attn_res_proj", D), wt("input_norm", D)),
        flops=(nb + 1) * M * D * 6, pdl=pdl, effect=per_rank(run),
        note="prefix += previous MLP output, [block snapshot], softmax mix over sources, input RMSNorm; "
             "fused in stock vLLM (V-ATTNRES, PR #57464 folds the MLP add in)")


def attn_res_post_effect(d: Dims, rank: Any, attn_out: np.ndarray) -> None:
    """prefix += attention output; mix; post-attention RMSNorm (shared by both plans' effects)."""
    b = rank.buf
    eps = d.cfg.rms_norm_eps
    b["prefix"] = rank.prec.store(b["prefix"] + attn_out, "bf16")
    h = norm.attn_res_mix(sources(rank, d.n_blocks + d.boundary), full(rank, "mlp_res_norm"),
                          full(rank, "mlp_res_proj"), eps)
    b["x2"] = norm.rms_norm(h, full(rank, "post_attn_norm"), eps)


def attn_res_post_tensors(d: Dims) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], tuple[Tensor, ...]]:
    """(reads, writes, weights) of the post-attention AttnRes + norm work."""
    M, D, ns = d.M, d.D, d.n_blocks + d.boundary + 1
    return ((act("sources", ns, M, D),), (act("prefix", M, D), act("x2", M, D)),
            (wt("mlp_res_norm", D), wt("mlp_res_proj", D), wt("post_attn_norm", D)))


def kda_in_proj(d: Dims, name: str, pdl: bool = False, prefetch: bool = False) -> Kernel:
    """x @ [W_q | W_k | W_v | W_g | W_fa | W_b] per rank: q, k, v, g column shards, f_a replicated."""
    M, D, C, Nh, H = d.M, d.D, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim
    n = -(-(4 * C + H + Nh) // 16) * 16  # vLLM pads the fused projection to a multiple of 16 rows

    def run(rank: Any) -> None:
        x, b = rank.buf["x"], rank.buf
        b["kda.qkv"] = np.concatenate([x @ col(rank, f"kda.w_{p}") for p in "qkv"], axis=-1)
        b["kda.g"] = x @ col(rank, "kda.w_g")
        b["kda.fa"] = x @ full(rank, "kda.w_fa")
        b["kda.b"] = x @ col(rank, "kda.w_b")

    w = wt("kda.w_in", D, n)
    return Kernel(
        key="kda_in_proj", name=name, kind="gemm", reads=(act("x", M, D),),
        writes=(act("kda.qkv", M, 3 * C), act("kda.g", M, C), act("kda.fa", M, H), act("kda.b", M, Nh)),
        weights=(w,), flops=gemm_flops(M, D, n), pdl=pdl, prefetch_bytes=w.nbytes if prefetch else 0,
        effect=per_rank(run),
        note="in_proj_qkvgfab: 4 column shards + replicated f_a (N = 6288 at TP8, 3216 at TP16; V-LLG)")


def kda_fb_proj(d: Dims, pdl: bool = False, prefetch: bool = False) -> Kernel:
    """z = f_a(x) @ W_fb (column shard): the low-rank decay path."""
    M, C, H = d.M, d.kda_w_r, d.cfg.kda_head_dim

    def run(rank: Any) -> None:
        rank.buf["kda.z"] = rank.buf["kda.fa"] @ col(rank, "kda.w_fb")

    w = wt("kda.w_fb", H, C)
    return Kernel(key="kda_fb_proj", name="gemm_f_b_proj", kind="gemm", reads=(act("kda.fa", M, H),),
                  writes=(act("kda.z", M, C),), weights=(w,), flops=gemm_flops(M, H, C), pdl=pdl,
                  prefetch_bytes=w.nbytes if prefetch else 0, effect=per_rank(run),
                  note="f_b_proj GEMM (1536x128 at TP8; V-LLG dsv3_fused_a table)")


def row_parallel_partial(rank: Any, x: np.ndarray, wname: str) -> np.ndarray:
    return x @ row(rank, wname)


def all_reduce_effect(src: str, dst: str) -> Effect:
    """TP all-reduce of buffer `src` into `dst` on every rank, with the run's chosen algorithm."""
    from simulator.ops.collectives import ALL_REDUCE, all_reduce_one_shot

    def effect(ranks: list[Any]) -> None:
        partials = [rank.buf[src] for rank in ranks]
        algo = ALL_REDUCE[ranks[0].all_reduce]
        if partials[0].shape[-1] % len(ranks):
            algo = all_reduce_one_shot  # chunked algorithms need the payload to split evenly
        for rank, total in zip(ranks, algo(partials)):
            rank.buf[dst] = total
    return effect


def all_reduce_kernel(d: Dims, key: str, src: str, dst: str, width: int, note: str) -> Kernel:
    """A standalone TP all-reduce of [M, width] bf16."""
    from simulator.plans.kernel import Collective
    t = act(src, d.M, width)
    return Kernel(key=key, name="allreduce", kind="collective", reads=(t,), writes=(act(dst, d.M, width),),
                  collective=Collective("all_reduce", t.nbytes, d.P), effect=all_reduce_effect(src, dst),
                  note=note)


def expert_shard(rank: Any):
    """e -> rank's TP shard of routed expert e: (w_gate [Din, F/P], w_up [Din, F/P], w_down [F/P, Din])."""
    def get(e: int):
        w_gate, w_up, w_down = rank.w.expert(e, rank.dtype)
        return (column_shard(w_gate, rank.r, rank.tp), column_shard(w_up, rank.r, rank.tp),
                row_shard(w_down, rank.r, rank.tp))
    return get


def expected_experts(d: Dims) -> int:
    """Distinct experts the step's tokens touch, U = E (1 - (1 - k/E)^M) for uniform independent routing,
    fewer under skew or correlated draft tokens (ops.experts.RoutingStats); rounded, >= k."""
    from simulator.ops.experts import expected_unique_experts
    cfg, routing = d.cfg, d.shape.routing
    free = routing.free_tokens(d.shape.batch, d.shape.tokens_per_seq)
    return max(cfg.top_k, round(expected_unique_experts(free, cfg.num_experts, cfg.top_k, routing.skew)))


def expert_math(cfg: ModelConfig) -> str:
    """Tensor-core format of routed-expert GEMMs: MXFP4 weights run as W4A16 (bf16 activations) on
    the path the published change describes (docs/sources.md §K5, item 7)."""
    return "bf16" if cfg.expert_dtype == "mxfp4" else ("fp8" if cfg.expert_dtype == "fp8" else "bf16")
