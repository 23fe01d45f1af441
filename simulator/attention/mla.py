"""Multi-head Latent Attention (MLA): low-rank q and kv, decode in the absorbed form over a latent cache.

    plans      fused q_a / kv_a GEMM -> [g_proj] -> q_a / kv_a RMSNorm -> q_b -> absorb (W_UK) -> q concat +
                      FP8 quant + cache insert -> decode attention over the FP8 latent cache -> W_UV -> [output gate]
    kernels    the factories below, as stock vLLM launches them for decode tokens (V-MLA), each bound to its op
               in ops/mla.py, ops/norm.py or ops/linear.py; MlaQuery / MlaValue fuse them
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
from simulator.ops import linear as lin
from simulator.ops import mla as mla_ops
from simulator.ops import norm
from simulator.plans import common as c
from simulator.plans import moe_kernels as moe
from simulator.plans.common import PLAIN, Dims, Launch, act, context_free, packed, pre_norm_key, weight
from simulator.plans.fuse import fuse
from simulator.plans.kernel import K3, SD, Kernel

SMALL_BATCH_MAX_TOKENS = 64  # the published specialized path supports non-speculative decode up to batch 64
CACHE_BYTES = 1  # FP8 latent cache: vLLM --kv-cache-dtype fp8, as in the Kimi K3 serving recipes (docs/sources.md §K2)
MLA = K3 + "mla.py:"


def _heads(d: Dims) -> int:
    """MLA heads on one rank."""
    return d.cfg.mla_heads // d.tp


@context_free
def mla_qkv_a(d: Dims, name: str, fusions: tuple[str, ...] = (), with_g: bool = False,
              launch: Launch = PLAIN, source: str = MLA + "MultiHeadLatentAttention._forward_q_lora") -> Kernel:
    """x @ [W_qa | W_kva] (replicated on every rank; N = 1536 + 512 + 64 = 2112 for K3), optionally
    with the g_proj column shard appended (one skinny GEMM instead of two launches)."""
    cfg, M, D = d.cfg, d.M, d.D
    rq, n_kv = cfg.q_lora_rank, cfg.kv_lora_rank + cfg.qk_rope_dim
    n_g = _heads(d) * cfg.v_head_dim if with_g else 0
    parts = (("mla.w_qa", "full"), ("mla.w_kva", "full")) + ((("mla.w_g", "col"),) if with_g else ())
    writes = (act("mla.qa", M, rq), act("mla.kva", M, n_kv)) + ((act("mla.g", M, n_g),) if with_g else ())
    return Kernel(key="mla_qkv_a", name=name, kind="gemm", family="gemm", op=lin.linear_split,
                  consts=(("widths", (rq, n_kv) + ((n_g,) if with_g else ())),),
                  reads=(act("x", M, D),), weights=(packed(parts, D, rq + n_kv + n_g),), writes=writes,
                  flops=lin.gemm_flops(M, D, rq + n_kv + n_g), fusions=fusions, **launch.kw, source=source,
                  replaces=("mla_qkv_a", "mla_g_proj") if with_g else (),
                  note="fused_qkv_a_proj, replicated (V-MLA, V-LLG dsv3_fused_a)" +
                       ("; g_proj shard appended to the same skinny GEMM" if with_g else ""))


@context_free
def mla_g_proj(d: Dims, launch: Launch = PLAIN) -> Kernel:
    M, D, n = d.M, d.D, _heads(d) * d.cfg.v_head_dim
    return Kernel(key="mla_g_proj", name="gemm_g_proj", kind="gemm", family="gemm", op=lin.linear, stream="aux",
                  deps=(pre_norm_key(d),), reads=(act("x", M, D),), weights=(weight("mla.w_g", D, n, shard="col"),),
                  writes=(act("mla.g", M, n),), flops=lin.gemm_flops(M, D, n), **launch.kw,
                  source=MLA + "MultiHeadLatentAttention._forward_q_lora",
                  note="output-gate projection on an aux stream, overlapped while tokens < 512 (V-MLA)")


@context_free
def mla_norm(d: Dims, launch: Launch = PLAIN) -> Kernel:
    cfg, M = d.cfg, d.M
    rq, lkv, r = cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_dim
    return Kernel(key="mla_norm", name="fused_qk_rmsnorm", kind="pointwise", family="small",
                  floor="reduction", op=mla_ops.mla_qkv_a_norm,
                  consts=(("kv_lora", lkv), ("eps", cfg.mla_lora_eps)),
                  reads=(act("mla.qa", M, rq), act("mla.kva", M, lkv + r)),
                  weights=(weight("mla.q_a_norm", rq), weight("mla.kv_a_norm", lkv)),
                  writes=(act("mla.cq", M, rq), act("mla.ckv", M, lkv), act("mla.kpe", M, r)),
                  flops=norm.rms_norm_flops(M, rq + lkv), **launch.kw,
                  source="vllm/models/common/ops/fused_qk_rmsnorm.py:fused_q_kv_rmsnorm",
                  note="q_a and kv_a RMSNorms in one kernel (V-MLA)")


def _q(d: Dims, window: tuple[int, int, int] | None = None):
    cfg = d.cfg  # per head [q_nope (Dn) | q_pe (R)]
    width = cfg.mla_qk_head_dim if window is None else window[2] - window[1]
    return act("mla.q", d.M, _heads(d), width, window=window)


@context_free
def mla_q_b(d: Dims, launch: Launch = PLAIN) -> Kernel:
    cfg, M = d.cfg, d.M
    n = _heads(d) * cfg.mla_qk_head_dim
    return Kernel(key="mla_q_b", name="gemm_q_b_proj", kind="gemm", family="gemm", op=mla_ops.linear_heads,
                  consts=(("heads", _heads(d)),), reads=(act("mla.cq", M, cfg.q_lora_rank),),
                  weights=(weight("mla.w_qb", cfg.q_lora_rank, n, shard="col"),), writes=(_q(d),),
                  flops=lin.gemm_flops(M, cfg.q_lora_rank, n), **launch.kw,
                  source=MLA + "_apply_q_lora_attention",
                  note="q_b_proj column shard by head (2304x1536 at TP8; V-LLG)")


@context_free
def mla_absorb(d: Dims, launch: Launch = PLAIN) -> Kernel:
    cfg, M, Nh = d.cfg, d.M, _heads(d)
    return Kernel(key="mla_absorb", name="bmm_absorb_w_uk", kind="gemm", family="gemm", op=mla_ops.mla_absorb_step,
                  consts=(("nope_dim", cfg.qk_nope_dim),), reads=(_q(d),),
                  weights=(weight("mla.w_uk", cfg.kv_lora_rank, Nh * cfg.qk_nope_dim, shard="col"),),
                  writes=(act("mla.qlat", M, Nh, cfg.kv_lora_rank),),
                  flops=lin.gemm_flops(M * Nh, cfg.qk_nope_dim, cfg.kv_lora_rank), **launch.kw,
                  source=MLA + "MultiHeadLatentAttention._attention",
                  note="absorbed decode: q_nope . W_UK -> 512-wide latent query per head (V-MLA)")


def mla_cache_insert(d: Dims, launch: Launch = PLAIN) -> Kernel:
    """[RoPE]; q = [q_lat | q_pe] quantized to FP8; c_kv, k_pe appended to the FP8 latent cache."""
    cfg, M, Nh, B, T, ctx = d.cfg, d.M, _heads(d), d.shape.batch, d.shape.tokens_per_seq, d.shape.context
    lkv, r, dn = cfg.kv_lora_rank, cfg.qk_rope_dim, cfg.qk_nope_dim
    return Kernel(key="mla_cache_insert", name="fused_concat_fp8_quant_cache_insert", kind="pointwise", family="small",
                  op=mla_ops.mla_cache_insert_step,
                  consts=(("batch", B), ("context", ctx), ("rope_theta", None if cfg.mla_nope else cfg.rope_theta),
                          ("rope_scaling", cfg.rope_scaling)),
                  reads=(act("mla.qlat", M, Nh, lkv), _q(d, window=(2, dn, dn + r)), act("mla.ckv", M, lkv),
                         act("mla.kpe", M, r)), **launch.kw,
                  writes=(act("mla.qcat", M, Nh, lkv + r, dtype="fp8"),
                          act("mla.cache", B, T, lkv + r, dtype="fp8", window=(1, ctx, ctx + T))),
                  source=K3 + "ops/fused_mla_key_concat_kv_cache.py:fused_mla_decode_q_concat_kv_cache_insert",
                  note="decode q-concat + FP8 quant + latent KV-cache insert in one kernel (vLLM PR #54896)")


def mla_decode(d: Dims, launch: Launch = PLAIN, source: str = MLA + "MultiHeadLatentAttention._attention",
               name: str = "trtllm_gen_mla_decode") -> Kernel:
    cfg, M, Nh, B = d.cfg, d.M, _heads(d), d.shape.batch
    lkv, r, S = cfg.kv_lora_rank, cfg.qk_rope_dim, d.cache_len
    return Kernel(key="mla_decode", name=name, kind="attention", family="mla",
                  floor="attention", op=mla_ops.mla_decode_step,
                  consts=(("batch", B), ("latent", lkv), ("context", d.shape.context),
                          ("scale", cfg.mla_softmax_scale)),
                  reads=(act("mla.qcat", M, Nh, lkv + r, dtype="fp8"), act("mla.cache", B, S, lkv + r, dtype="fp8")),
                  writes=(act("mla.olat", M, Nh, lkv),), flops=mla_ops.mla_decode_flops(M, Nh, S, lkv, r),
                  math="fp8", **launch.kw, source=source,
                  note="MLA decode attention over the FP8 latent cache (FlashInfer TRTLLM-gen MLA; V-MLA)")


@context_free
def mla_w_uv(d: Dims, launch: Launch = PLAIN) -> Kernel:
    cfg, M, Nh = d.cfg, d.M, _heads(d)
    out = "mla.o" if cfg.mla_output_gate else "attn.core"
    return Kernel(key="mla_w_uv", name="bmm_w_uv", kind="gemm", family="gemm", op=mla_ops.mla_uv_step,
                  reads=(act("mla.olat", M, Nh, cfg.kv_lora_rank),),
                  weights=(weight("mla.w_uv", cfg.kv_lora_rank, Nh * cfg.v_head_dim, shard="col"),),
                  writes=(act(out, M, Nh * cfg.v_head_dim),),
                  flops=lin.gemm_flops(M * Nh, cfg.kv_lora_rank, cfg.v_head_dim), **launch.kw,
                  source=MLA + "MultiHeadLatentAttention._v_up_proj",
                  note="latent -> 128 per head (V-MLA)")


@context_free
def mla_gate_mul(d: Dims, deps: tuple[str, ...] = ("mla_g_proj",), launch: Launch = PLAIN) -> Kernel:
    M, n = d.M, _heads(d) * d.cfg.v_head_dim
    return Kernel(key="mla_gate_mul", name="sigmoid_gate_mul", kind="pointwise", family="small",
                  op=mla_ops.sigmoid_gate, deps=deps, reads=(act("mla.o", M, n), act("mla.g", M, n)),
                  writes=(act("attn.core", M, n),), flops=mla_ops.sigmoid_gate_flops(M, n), **launch.kw,
                  source=MLA + "_gate_sigmoid_mul",
                  note="o * sigmoid(g_proj x), a compiled elementwise kernel (V-MLA)")


def mla_query(d: Dims, launch: Launch = PLAIN) -> Kernel:
    """MlaQuery: q_a / kv_a RMSNorm, q_b, the W_UK absorption, FP8 quantisation and the paged FP8 cache insert
    in one launch (the normed latents, q and the latent query stay on chip)."""
    parts = [mla_norm(d), mla_q_b(d), mla_absorb(d), mla_cache_insert(d)]
    return fuse(parts, "mla_query", "MlaQuery", "gemm", "gemm", ("mla.qcat", "mla.cache"),
                SD + "cutedsl/mla/prepared.py:PreparedMla.run", **launch.kw,
                note="norms, q_b, W_UK, FP8 quant and cache insert: one kernel of the specialized MLA (P11)")


def mla_value(d: Dims, launch: Launch = PLAIN) -> Kernel:
    """MlaValue: W_UV and the sigmoid output gate in one launch."""
    parts = [mla_w_uv(d)] + ([mla_gate_mul(d, deps=())] if d.cfg.mla_output_gate else [])
    return fuse(parts, "mla_value", "MlaValue", "gemm", "gemm", ("attn.core",),
                SD + "cutedsl/mla/prepared.py:PreparedMla.run", **launch.kw,
                note="W_UV and the output gate: one kernel of the specialized MLA (P11)")


def standard(d: c.Dims, c1: c.Launch, arch: str = "sm100") -> list[Kernel]:
    gate, pdl = d.cfg.mla_output_gate, c.PDL
    return ([mla_qkv_a(d, "dsv3_fused_a_gemm", launch=pdl)] + ([mla_g_proj(d, pdl)] if gate else [])
            + [mla_norm(d), mla_q_b(d, pdl), mla_absorb(d), mla_cache_insert(d), mla_decode(d),
               mla_w_uv(d)] + ([mla_gate_mul(d)] if gate else []))


def specialized(d: c.Dims, on: frozenset[str], go) -> list[Kernel]:
    e = go.every
    if not (d.cfg.mla_output_gate and "small_batch_proj" in on and d.M <= SMALL_BATCH_MAX_TOKENS):
        return standard(d, go.c1)
    proj = mla_qkv_a(d, "skinny_gemm_qkv_a_g", fusions=("small_batch_proj",), with_g=True, launch=e,
                         source=c.projection_source(d))
    tokenspeed = d.M < 16 or d.shape.tokens_per_seq > 1  # tokenspeed split-KV below 16 tokens and for verifies
    core = mla_decode(d, e, SD + ("cutedsl/mla/dcp.py:stock_decode" if tokenspeed
                                      else "cutedsl/mla/prepared.py:trtllm_decode"),
                          "tokenspeed_mla_decode" if tokenspeed else "trtllm_gen_mla_decode")
    # TP8 at 8 tokens: the front and shared weights are pulled into L2 once the MLA core is launched
    l2 = "l2_prefetch" in on and d.P == 8 and d.M == 8
    prefetch = [moe.l2_prefetch(d, "attention_moe", after="mla_decode")] if l2 else []
    if "mla_query_value" in on:
        return [proj, mla_query(d, e), core, mla_value(d, e)] + prefetch
    return ([proj, mla_norm(d, e), mla_q_b(d, e), mla_absorb(d, e), mla_cache_insert(d, e), core,
             mla_w_uv(d, e), mla_gate_mul(d, deps=(), launch=e)] + prefetch)


# ===================================================================== reference and state
def reference(cfg, layer: int, shape, W, x: np.ndarray, state: dict) -> tuple[np.ndarray, dict]:
    B, T, ctx = shape.batch, shape.tokens_per_seq, shape.context
    N, lkv = cfg.mla_heads, cfg.kv_lora_rank
    c_q, c_kv, k_pe = mla_ops.mla_qkv_a_norm(x @ W("mla.w_qa"), x @ W("mla.w_kva"), W("mla.q_a_norm"),
                                                    W("mla.kv_a_norm"), lkv, cfg.mla_lora_eps)
    cache, lengths = state["mla.cache"].astype(np.float64), state["mla.lengths"]
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
        o = mla_ops.sigmoid_gate(o, x @ W("mla.w_g"))
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
