"""MLA attention kernels, as stock vLLM launches them for decode tokens (V-MLA), shared by both plans.

    fused_qkv_a GEMM (replicated) -> [g_proj on aux] -> q_a / kv_a RMSNorm -> q_b GEMM -> absorb (W_UK)
    -> q concat + FP8 quant + latent cache insert -> decode attention over the FP8 cache -> W_UV
    -> sigmoid output gate

Dimension legend: M tokens (B sequences x T tokens), D hidden, Nh heads on this rank, Lkv latent (512),
R rope slot (64), Dn / Dv nope / value head dims, S cached tokens after this step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.ops import mla as mla_ops
from simulator.plans import common as c
from simulator.plans.common import Dims, act, gemm_flops, per_rank, wt
from simulator.plans.kernel import Kernel


def mla_attention(d: Dims) -> list[Kernel]:
    kernels = [mla_qkv_a(d, "dsv3_fused_a_gemm")]
    if d.cfg.mla_output_gate:
        kernels.append(mla_g_proj(d))
    kernels += [mla_norm(d), mla_q_b(d), mla_absorb(d), mla_cache_insert(d), mla_decode(d), mla_w_uv(d)]
    if d.cfg.mla_output_gate:
        kernels.append(mla_gate_mul(d))
    return kernels


def mla_qkv_a(d: Dims, name: str, fusions: tuple[str, ...] = (), with_g: bool = False,
              pdl: bool = False, prefetch: bool = False) -> Kernel:
    """x @ [W_qa | W_kva] (replicated on every rank; N = 1536 + 512 + 64 = 2112 for K3), optionally
    with the g_proj column shard appended (one skinny GEMM instead of two launches)."""
    cfg, M, D = d.cfg, d.M, d.D
    n_a = cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_dim
    n_g = d.mla_heads_r * cfg.v_head_dim if with_g else 0

    def run(rank: Any) -> None:
        x, b = rank.buf["x"], rank.buf
        b["mla.qa"] = x @ c.full(rank, "mla.w_qa")
        b["mla.kva"] = x @ c.full(rank, "mla.w_kva")
        if with_g:
            b["mla.g"] = x @ c.col(rank, "mla.w_g")

    writes = [act("mla.qa", M, cfg.q_lora_rank), act("mla.kva", M, n_a - cfg.q_lora_rank)]
    writes += [act("mla.g", M, n_g)] if with_g else []
    w = wt("mla.w_qkv_a" + ("_g" if with_g else ""), D, n_a + n_g)
    return Kernel(key="mla_qkv_a", name=name, kind="gemm", reads=(act("x", M, D),), writes=tuple(writes),
                  weights=(w,), flops=gemm_flops(M, D, n_a + n_g), fusions=fusions, pdl=pdl,
                  prefetch_bytes=w.nbytes if prefetch else 0, effect=per_rank(run),
                  replaces=("mla_qkv_a", "mla_g_proj") if with_g else (),
                  note="fused_qkv_a_proj, replicated (V-MLA, V-LLG dsv3_fused_a)" +
                       ("; g_proj shard appended to the same skinny GEMM" if with_g else ""))


def mla_g_proj(d: Dims) -> Kernel:
    M, D, n = d.M, d.D, d.mla_heads_r * d.cfg.v_head_dim

    def run(rank: Any) -> None:
        rank.buf["mla.g"] = rank.buf["x"] @ c.col(rank, "mla.w_g")

    return Kernel(key="mla_g_proj", name="gemm_g_proj", kind="gemm", stream="aux", deps=("attn_res_pre",),
                  reads=(act("x", M, D),), writes=(act("mla.g", M, n),), weights=(wt("mla.w_g", D, n),),
                  flops=gemm_flops(M, D, n), effect=per_rank(run),
                  note="output-gate projection on an aux stream, overlapped while tokens < 512 (V-MLA)")


def mla_norm(d: Dims) -> Kernel:
    cfg, M = d.cfg, d.M
    rq, lkv, r = cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_dim

    def run(rank: Any) -> None:
        b = rank.buf
        b["mla.cq"], b["mla.ckv"], b["mla.kpe"] = mla_ops.mla_qkv_a_norm(
            b["mla.qa"], b["mla.kva"], c.full(rank, "mla.q_a_norm"), c.full(rank, "mla.kv_a_norm"),
            lkv, cfg.mla_lora_eps)

    return Kernel(key="mla_norm", name="fused_qk_rmsnorm", kind="pointwise",
                  reads=(act("mla.qa", M, rq), act("mla.kva", M, lkv + r)),
                  writes=(act("mla.cq", M, rq), act("mla.ckv", M, lkv), act("mla.kpe", M, r)),
                  weights=(wt("mla.q_a_norm", rq), wt("mla.kv_a_norm", lkv)), flops=4 * M * (rq + lkv),
                  effect=per_rank(run), note="q_a and kv_a RMSNorms in one kernel (V-MLA)")


def mla_q_b(d: Dims) -> Kernel:
    cfg, M = d.cfg, d.M
    n = d.mla_heads_r * cfg.mla_qk_head_dim

    def run(rank: Any) -> None:
        rank.buf["mla.q"] = rank.buf["mla.cq"] @ c.col(rank, "mla.w_qb")

    return Kernel(key="mla_q_b", name="gemm_q_b_proj", kind="gemm", reads=(act("mla.cq", M, cfg.q_lora_rank),),
                  writes=(act("mla.q", M, n),), weights=(wt("mla.w_qb", cfg.q_lora_rank, n),),
                  flops=gemm_flops(M, cfg.q_lora_rank, n), effect=per_rank(run),
                  note="q_b_proj column shard by head (2304x1536 at TP8; V-LLG)")


def _w_uk(rank: Any, d: Dims) -> np.ndarray:
    cfg = d.cfg  # [Lkv, Nh Dn] shard -> [Nh, Dn, Lkv]
    return c.col(rank, "mla.w_uk").reshape(cfg.kv_lora_rank, d.mla_heads_r, cfg.qk_nope_dim).transpose(1, 2, 0)


def _w_uv(rank: Any, d: Dims) -> np.ndarray:
    cfg = d.cfg  # [Lkv, Nh Dv] shard -> [Nh, Lkv, Dv]
    return c.col(rank, "mla.w_uv").reshape(cfg.kv_lora_rank, d.mla_heads_r, cfg.v_head_dim).transpose(1, 0, 2)


def mla_absorb(d: Dims) -> Kernel:
    cfg, M, Nh = d.cfg, d.M, d.mla_heads_r

    def run(rank: Any) -> None:
        q = rank.buf["mla.q"].reshape(M, Nh, cfg.mla_qk_head_dim)
        rank.buf["mla.qlat"] = mla_ops.mla_absorb_q(q[None, :, :, :cfg.qk_nope_dim], _w_uk(rank, d))[0]

    return Kernel(key="mla_absorb", name="bmm_absorb_w_uk", kind="gemm",
                  reads=(act("mla.q", M, Nh * cfg.mla_qk_head_dim),),
                  writes=(act("mla.qlat", M, Nh, cfg.kv_lora_rank),),
                  weights=(wt("mla.w_uk", cfg.kv_lora_rank, Nh * cfg.qk_nope_dim),),
                  flops=gemm_flops(M * Nh, cfg.qk_nope_dim, cfg.kv_lora_rank), effect=per_rank(run),
                  note="absorbed decode: q_nope . W_UK -> 512-wide latent query per head (V-MLA)")


def mla_cache_insert(d: Dims) -> Kernel:
    """[RoPE]; q = [q_lat | q_pe] quantized to FP8; c_kv, k_pe appended to the FP8 latent cache."""
    cfg, M, Nh, B, T = d.cfg, d.M, d.mla_heads_r, d.shape.batch, d.shape.tokens_per_seq
    lkv, r = cfg.kv_lora_rank, cfg.qk_rope_dim

    def run(rank: Any) -> None:
        b = rank.buf
        q_pe = b["mla.q"].reshape(B, T, Nh, cfg.mla_qk_head_dim)[..., cfg.qk_nope_dim:]
        k_pe = b["mla.kpe"].reshape(B, T, r)
        pos = b["mla.lengths"][:, None] + np.arange(T)[None, :]  # [B, T]
        if not cfg.mla_nope:
            q_pe = mla_ops.rope(q_pe, pos, cfg.rope_theta, cfg.rope_scaling)
            k_pe = mla_ops.rope(k_pe, pos, cfg.rope_theta, cfg.rope_scaling)
        new = np.concatenate([b["mla.ckv"].reshape(B, T, lkv), k_pe], axis=-1)  # [B, T, Lkv+R]
        cache = b["mla.cache"].copy()
        cache[np.arange(B)[:, None], pos] = new
        b["mla.cache"] = cache
        b["mla.qcat"] = np.concatenate([b["mla.qlat"].reshape(B, T, Nh, lkv), q_pe], axis=-1).reshape(M, Nh, lkv + r)

    return Kernel(key="mla_cache_insert", name="fused_concat_fp8_quant_cache_insert", kind="pointwise",
                  reads=(act("mla.qlat", M, Nh, lkv), act("mla.q_pe", M, Nh, r), act("mla.ckv", M, lkv),
                         act("mla.kpe", M, r)),
                  writes=(act("mla.qcat", M, Nh, lkv + r, dtype="fp8"), act("mla.cache[new]", B, T, lkv + r, dtype="fp8")),
                  flops=0, effect=per_rank(run),
                  note="decode q-concat + FP8 quant + latent KV-cache insert in one kernel (vLLM PR #54896)")


def mla_decode(d: Dims) -> Kernel:
    cfg, M, Nh, B = d.cfg, d.M, d.mla_heads_r, d.shape.batch
    lkv, r = cfg.kv_lora_rank, cfg.qk_rope_dim
    S = d.cache_len

    def run(rank: Any) -> None:
        b = rank.buf
        q = b["mla.qcat"].reshape(B, d.shape.tokens_per_seq, Nh, lkv + r)
        o = mla_ops.mla_decode_attention(q[..., :lkv], q[..., lkv:], b["mla.cache"], b["mla.lengths"],
                                         cfg.mla_softmax_scale)
        b["mla.olat"] = o.reshape(M, Nh, lkv)

    return Kernel(key="mla_decode", name="trtllm_gen_mla_decode", kind="attention",
                  reads=(act("mla.qcat", M, Nh, lkv + r, dtype="fp8"), act("mla.cache", B, S, lkv + r, dtype="fp8")),
                  writes=(act("mla.olat", M, Nh, lkv),), flops=2 * M * Nh * S * (2 * lkv + r),
                  math="fp8", effect=per_rank(run),
                  note="MLA decode attention over the FP8 latent cache (FlashInfer TRTLLM-gen MLA; V-MLA)")


def mla_w_uv(d: Dims) -> Kernel:
    cfg, M, Nh = d.cfg, d.M, d.mla_heads_r
    out = "mla.o" if cfg.mla_output_gate else "attn.core"

    def run(rank: Any) -> None:
        o = mla_ops.mla_uv(rank.buf["mla.olat"][None], _w_uv(rank, d))[0]  # [M, Nh, Dv]
        rank.buf[out] = o.reshape(M, Nh * cfg.v_head_dim)

    return Kernel(key="mla_w_uv", name="bmm_w_uv", kind="gemm", reads=(act("mla.olat", M, Nh, cfg.kv_lora_rank),),
                  writes=(act(out, M, Nh * cfg.v_head_dim),),
                  weights=(wt("mla.w_uv", cfg.kv_lora_rank, Nh * cfg.v_head_dim),),
                  flops=gemm_flops(M * Nh, cfg.kv_lora_rank, cfg.v_head_dim), effect=per_rank(run),
                  note="latent -> 128 per head (V-MLA)")


def mla_gate_mul(d: Dims) -> Kernel:
    M, n = d.M, d.mla_heads_r * d.cfg.v_head_dim

    def run(rank: Any) -> None:
        b = rank.buf
        b["attn.core"] = b["mla.o"] / (1.0 + np.exp(-b["mla.g"]))

    return Kernel(key="mla_gate_mul", name="sigmoid_gate_mul", kind="pointwise", deps=("mla_g_proj",),
                  reads=(act("mla.o", M, n), act("mla.g", M, n)), writes=(act("attn.core", M, n),),
                  flops=4 * M * n, effect=per_rank(run),
                  note="o * sigmoid(g_proj x), a compiled elementwise kernel (V-MLA)")
