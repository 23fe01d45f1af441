"""Multi-head Latent Attention (MLA): low-rank q and kv, decode in the absorbed form over a latent cache.

    plans      fused q_a / kv_a GEMM -> [g_proj] -> q_a / kv_a RMSNorm -> q_b -> absorb (W_UK) -> q concat +
                      FP8 quant + cache insert -> decode attention over the FP8 latent cache -> W_UV -> [output gate]
    reference  the textbook (non-absorbed) form: per head k = W_UK^T c_kv, v = W_UV^T c_kv, then o_proj
    state      the latent cache [B, context + T, Lkv + R] (c_kv then k_pe; FP8 on the GPU) with room for this
                      step's T tokens, and `lengths` [B] = tokens cached before the step; replicated on every rank
    memory     B x (context + T) x (Lkv + R) x 1 B per layer on every rank (FP8, vLLM --kv-cache-dtype fp8,
                      docs/sources.md §K1b): every rank's heads attend to the same latent

Dimension legend: M tokens (B sequences x T tokens), D hidden, N heads, Lkv latent (512), R rope slot (64),
Dn / Dv nope / value head dims, S cached tokens after this step.
"""

from __future__ import annotations

import numpy as np

from simulator.attention.kind import AttentionKind
from simulator.dtypes import round_fp8
from simulator.ops import mla as mla_ops
from simulator.ops.pointwise import sigmoid
from simulator.plans import common as c
from simulator.plans import mla_kernels as mla
from simulator.plans import moe_kernels as moe
from simulator.plans.kernel import SD, Kernel

F64 = np.float64
SMALL_BATCH_MAX_TOKENS = 64  # the published specialized path supports non-speculative decode up to batch 64
CACHE_BYTES = 1  # FP8 latent cache: vLLM --kv-cache-dtype fp8, as in the Kimi K3 serving recipes (docs/sources.md §K2)


def standard(d: c.Dims, c1: c.Launch, arch: str = "sm100") -> list[Kernel]:
    gate, pdl = d.cfg.mla_output_gate, c.PDL
    return ([mla.mla_qkv_a(d, "dsv3_fused_a_gemm", launch=pdl)] + ([mla.mla_g_proj(d, pdl)] if gate else [])
            + [mla.mla_norm(d), mla.mla_q_b(d, pdl), mla.mla_absorb(d), mla.mla_cache_insert(d), mla.mla_decode(d),
               mla.mla_w_uv(d)] + ([mla.mla_gate_mul(d)] if gate else []))


def specialized(d: c.Dims, on: frozenset[str], go) -> list[Kernel]:
    e = go.every
    if not (d.cfg.mla_output_gate and "small_batch_proj" in on and d.M <= SMALL_BATCH_MAX_TOKENS):
        return standard(d, go.c1)
    proj = mla.mla_qkv_a(d, "skinny_gemm_qkv_a_g", fusions=("small_batch_proj",), with_g=True, launch=e,
                         source=c.projection_source(d))
    tokenspeed = d.M < 16 or d.shape.tokens_per_seq > 1  # tokenspeed split-KV below 16 tokens and for verifies
    core = mla.mla_decode(d, e, SD + ("cutedsl/mla/dcp.py:stock_decode" if tokenspeed
                                      else "cutedsl/mla/prepared.py:trtllm_decode"),
                          "tokenspeed_mla_decode" if tokenspeed else "trtllm_gen_mla_decode")
    # TP8 at 8 tokens: the front and shared weights are pulled into L2 once the MLA core is launched
    l2 = "l2_prefetch" in on and d.P == 8 and d.M == 8
    prefetch = [moe.l2_prefetch(d, "attention_moe", after="mla_decode")] if l2 else []
    if "mla_query_value" in on:
        return [proj, mla.mla_query(d, e), core, mla.mla_value(d, e)] + prefetch
    return ([proj, mla.mla_norm(d, e), mla.mla_q_b(d, e), mla.mla_absorb(d, e), mla.mla_cache_insert(d, e), core,
             mla.mla_w_uv(d, e), mla.mla_gate_mul(d, deps=(), launch=e)] + prefetch)


def reference(cfg, layer: int, shape, W, x: np.ndarray, state: dict) -> tuple[np.ndarray, dict]:
    B, T = shape.batch, shape.tokens_per_seq
    N = cfg.mla_heads
    lkv, ctx = cfg.kv_lora_rank, shape.context
    c_q, c_kv, k_pe = mla_ops.mla_qkv_a_norm(x @ W("mla.w_qa"), x @ W("mla.w_kva"), W("mla.q_a_norm"),
                                                    W("mla.kv_a_norm"), lkv, cfg.mla_lora_eps)
    cache, lengths = state["mla.cache"].astype(F64), state["mla.lengths"]
    old_pe = cache[:, :ctx, lkv:]
    theta = None if cfg.mla_nope else cfg.rope_theta
    if theta is not None:  # the cache holds rotated k_pe; the textbook form rotates inside attention
        old_pe = mla_ops.rope(old_pe, -np.broadcast_to(np.arange(ctx), (B, ctx)), theta, cfg.rope_scaling)
    c_kv_all = np.concatenate([cache[:, :ctx, :lkv], c_kv.reshape(B, T, lkv)], axis=1)  # [B, S, Lkv]
    k_pe_all = np.concatenate([old_pe, k_pe.reshape(B, T, -1)], axis=1)  # [B, S, R]
    w_uk = W("mla.w_uk").reshape(lkv, N, cfg.qk_nope_dim).transpose(1, 2, 0)  # [N, Dn, Lkv]
    w_uv = W("mla.w_uv").reshape(lkv, N, cfg.v_head_dim).transpose(1, 0, 2)  # [N, Lkv, Dv]
    o = mla_ops.mla_attention_reference(c_q.reshape(B, T, -1), c_kv_all, k_pe_all, W("mla.w_qb"), w_uk, w_uv,
                                               lengths, cfg.mla_softmax_scale, rope_theta=theta,
                                               rope_scaling=cfg.rope_scaling)
    o = o.reshape(B * T, N * cfg.v_head_dim)  # [M, N Dv]
    if cfg.mla_output_gate:
        o = o * sigmoid(x @ W("mla.w_g"))
    new_pe = k_pe.reshape(B, T, -1)
    if theta is not None:
        new_pe = mla_ops.rope(new_pe, lengths[:, None] + np.arange(T)[None, :], theta, cfg.rope_scaling)
    new_cache = cache.copy()
    new_cache[:, ctx:ctx + T] = np.concatenate([c_kv.reshape(B, T, lkv), new_pe], axis=-1)
    return o @ W("mla.w_o"), {"mla.cache": new_cache, "mla.lengths": lengths + T}


def initial_state(cfg, shape, rng: np.random.Generator) -> dict:
    rows = shape.context + shape.tokens_per_seq
    cache = np.zeros((shape.batch, rows, cfg.kv_lora_rank + cfg.qk_rope_dim))  # [B, S, Lkv+R]
    cache[:, :shape.context] = round_fp8(rng.standard_normal((shape.batch, shape.context, cache.shape[-1])))
    return {"mla.cache": cache, "mla.lengths": np.full(shape.batch, shape.context, dtype=np.int64)}


def shard(state: dict, tp: int) -> list[dict]:
    """The latent cache is replicated: a copy per rank, so ranks never alias one another."""
    if "mla.cache" not in state:
        return [{} for _ in range(tp)]
    return [{"mla.cache": state["mla.cache"].copy(), "mla.lengths": state["mla.lengths"].copy()} for _ in range(tp)]


def unshard(rank_bufs: list[dict], like: dict, advance: int) -> dict:
    if "mla.cache" not in like:
        return {}
    for b in rank_bufs[1:]:
        if not np.array_equal(b["mla.cache"], rank_bufs[0]["mla.cache"]):
            raise AssertionError("the replicated MLA cache differs between ranks")
    return {"mla.cache": rank_bufs[0]["mla.cache"], "mla.lengths": rank_bufs[0]["mla.lengths"] + advance}


def state_errors(state: dict, ref: dict, shape) -> list[tuple[str, np.ndarray, np.ndarray, str]]:
    new = slice(shape.context, shape.context + shape.tokens_per_seq)  # the rows this step wrote
    return [("mla.cache[new]", state["mla.cache"][:, new], ref["mla.cache"][:, new], "fp8"),
            ("mla.lengths", state["mla.lengths"], ref["mla.lengths"], "exact")]


def state_elements(cfg, tp: int, shape) -> int:
    """The cache, replicated: one copy per simulated rank and the reference's."""
    return (tp + 1) * shape.batch * (shape.context + shape.tokens_per_seq) * (cfg.kv_lora_rank + cfg.qk_rope_dim)


def cache_bytes(cfg, tp: int, shape) -> int:
    """Latent cache rows B x (context + T), (Lkv + R) elements each, every MLA layer, on every rank."""
    rows = shape.batch * (shape.context + shape.tokens_per_seq) * cfg.attn_kinds.count("mla")
    return rows * (cfg.kv_lora_rank + cfg.qk_rope_dim) * CACHE_BYTES


KIND = AttentionKind(name="mla", label="MLA", standard=standard, specialized=specialized, reference=reference,
                    initial_state=initial_state, shard=shard, unshard=unshard, state_errors=state_errors,
                    state_elements=state_elements, memory=("mla_cache", "MLA cache", cache_bytes), reads_context=True,
                    reshaped_weights=("mla.w_uk", "mla.w_uv"),
                    impl_names={"flashmla_fp8": {"mla_decode": "flash_fwd_splitkv_mla_kernel"},  # vLLM on Hopper
                                "triton_split_kv": {"mla_decode": "mla_split_kernel"}})  # benchmarks/gpu suite
