"""MLA attention kernels, as stock vLLM launches them for decode tokens (V-MLA), shared by both plans,
each bound to its op in `ops/mla.py`, `ops/norm.py`, `ops/linear.py` or `ops/pointwise.py`.

    fused_qkv_a GEMM (replicated) -> [g_proj on aux] -> q_a / kv_a RMSNorm -> q_b GEMM -> absorb (W_UK)
    -> q concat + FP8 quant + latent cache insert -> decode attention over the FP8 cache -> W_UV
    -> sigmoid output gate

Dimension legend: M tokens (B sequences x T tokens), D hidden, Nh heads on this rank, Lkv latent (512),
R rope slot (64), Dn / Dv nope / value head dims, S cached tokens after this step.
"""

from __future__ import annotations

from simulator.ops import linear as lin
from simulator.ops import mla as mla_ops
from simulator.ops import norm
from simulator.ops.pointwise import sigmoid_gate, sigmoid_gate_flops
from simulator.plans.common import PLAIN, Dims, Launch, act, context_free, packed, weight
from simulator.plans.fuse import fuse
from simulator.plans.kernel import K3, SD, Kernel

MLA = K3 + "mla.py:"


@context_free
def mla_qkv_a(d: Dims, name: str, fusions: tuple[str, ...] = (), with_g: bool = False,
              launch: Launch = PLAIN, source: str = MLA + "MultiHeadLatentAttention._forward_q_lora") -> Kernel:
    """x @ [W_qa | W_kva] (replicated on every rank; N = 1536 + 512 + 64 = 2112 for K3), optionally
    with the g_proj column shard appended (one skinny GEMM instead of two launches)."""
    cfg, M, D = d.cfg, d.M, d.D
    rq, n_kv = cfg.q_lora_rank, cfg.kv_lora_rank + cfg.qk_rope_dim
    n_g = d.mla_heads_r * cfg.v_head_dim if with_g else 0
    parts = (("mla.w_qa", "full"), ("mla.w_kva", "full")) + ((("mla.w_g", "col"),) if with_g else ())
    writes = (act("mla.qa", M, rq), act("mla.kva", M, n_kv)) + ((act("mla.g", M, n_g),) if with_g else ())
    return Kernel(key="mla_qkv_a", name=name, kind="gemm", family="gemm", op=lin.linear_split,
                  consts=(("widths", (rq, n_kv) + ((n_g,) if with_g else ())),),
                  reads=(act("x", M, D),), weights=(packed(parts, D, rq + n_kv + n_g),), writes=writes,
                  flops=lin.gemm_flops(M, D, rq + n_kv + n_g), fusions=fusions,
                  pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes, source=source,
                  replaces=("mla_qkv_a", "mla_g_proj") if with_g else (),
                  note="fused_qkv_a_proj, replicated (V-MLA, V-LLG dsv3_fused_a)" +
                       ("; g_proj shard appended to the same skinny GEMM" if with_g else ""))


@context_free
def mla_g_proj(d: Dims, launch: Launch = PLAIN) -> Kernel:
    M, D, n = d.M, d.D, d.mla_heads_r * d.cfg.v_head_dim
    return Kernel(key="mla_g_proj", name="gemm_g_proj", kind="gemm", family="gemm", op=lin.linear, stream="aux",
                  deps=("attn_res_pre",), reads=(act("x", M, D),), weights=(weight("mla.w_g", D, n, shard="col"),),
                  writes=(act("mla.g", M, n),), flops=lin.gemm_flops(M, D, n),
                  pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
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
                  flops=norm.rms_norm_flops(M, rq + lkv), pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
                  source="vllm/models/common/ops/fused_qk_rmsnorm.py:fused_q_kv_rmsnorm",
                  note="q_a and kv_a RMSNorms in one kernel (V-MLA)")


def _q(d: Dims, window: tuple[int, int, int] | None = None):
    cfg = d.cfg  # per head [q_nope (Dn) | q_pe (R)]
    width = cfg.mla_qk_head_dim if window is None else window[2] - window[1]
    return act("mla.q", d.M, d.mla_heads_r, width, window=window)


@context_free
def mla_q_b(d: Dims, launch: Launch = PLAIN) -> Kernel:
    cfg, M = d.cfg, d.M
    n = d.mla_heads_r * cfg.mla_qk_head_dim
    return Kernel(key="mla_q_b", name="gemm_q_b_proj", kind="gemm", family="gemm", op=lin.linear_heads,
                  consts=(("heads", d.mla_heads_r),), reads=(act("mla.cq", M, cfg.q_lora_rank),),
                  weights=(weight("mla.w_qb", cfg.q_lora_rank, n, shard="col"),), writes=(_q(d),),
                  flops=lin.gemm_flops(M, cfg.q_lora_rank, n), pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
                  source=MLA + "_apply_q_lora_attention",
                  note="q_b_proj column shard by head (2304x1536 at TP8; V-LLG)")


@context_free
def mla_absorb(d: Dims, launch: Launch = PLAIN) -> Kernel:
    cfg, M, Nh = d.cfg, d.M, d.mla_heads_r
    return Kernel(key="mla_absorb", name="bmm_absorb_w_uk", kind="gemm", family="gemm", op=mla_ops.mla_absorb_step,
                  consts=(("nope_dim", cfg.qk_nope_dim),), reads=(_q(d),),
                  weights=(weight("mla.w_uk", cfg.kv_lora_rank, Nh * cfg.qk_nope_dim, shard="col"),),
                  writes=(act("mla.qlat", M, Nh, cfg.kv_lora_rank),),
                  flops=lin.gemm_flops(M * Nh, cfg.qk_nope_dim, cfg.kv_lora_rank),
                  pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
                  source=MLA + "MultiHeadLatentAttention._attention",
                  note="absorbed decode: q_nope . W_UK -> 512-wide latent query per head (V-MLA)")


def mla_cache_insert(d: Dims, launch: Launch = PLAIN) -> Kernel:
    """[RoPE]; q = [q_lat | q_pe] quantized to FP8; c_kv, k_pe appended to the FP8 latent cache."""
    cfg, M, Nh, B, T, ctx = d.cfg, d.M, d.mla_heads_r, d.shape.batch, d.shape.tokens_per_seq, d.shape.context
    lkv, r, dn = cfg.kv_lora_rank, cfg.qk_rope_dim, cfg.qk_nope_dim
    return Kernel(key="mla_cache_insert", name="fused_concat_fp8_quant_cache_insert", kind="pointwise", family="small",
                  op=mla_ops.mla_cache_insert_step,
                  consts=(("batch", B), ("context", ctx), ("rope_theta", None if cfg.mla_nope else cfg.rope_theta),
                          ("rope_scaling", cfg.rope_scaling)),
                  reads=(act("mla.qlat", M, Nh, lkv), _q(d, window=(2, dn, dn + r)), act("mla.ckv", M, lkv),
                         act("mla.kpe", M, r)),
                  writes=(act("mla.qcat", M, Nh, lkv + r, dtype="fp8"),
                          act("mla.cache", B, T, lkv + r, dtype="fp8", window=(1, ctx, ctx + T))),
                  pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
                  source=K3 + "ops/fused_mla_key_concat_kv_cache.py:fused_mla_decode_q_concat_kv_cache_insert",
                  note="decode q-concat + FP8 quant + latent KV-cache insert in one kernel (vLLM PR #54896)")


def mla_decode(d: Dims, launch: Launch = PLAIN, source: str = MLA + "MultiHeadLatentAttention._attention",
               name: str = "trtllm_gen_mla_decode") -> Kernel:
    cfg, M, Nh, B = d.cfg, d.M, d.mla_heads_r, d.shape.batch
    lkv, r, S = cfg.kv_lora_rank, cfg.qk_rope_dim, d.cache_len
    return Kernel(key="mla_decode", name=name, kind="attention", family="mla",
                  floor="attention", op=mla_ops.mla_decode_step,
                  consts=(("batch", B), ("latent", lkv), ("context", d.shape.context),
                          ("scale", cfg.mla_softmax_scale)),
                  reads=(act("mla.qcat", M, Nh, lkv + r, dtype="fp8"), act("mla.cache", B, S, lkv + r, dtype="fp8")),
                  writes=(act("mla.olat", M, Nh, lkv),), flops=mla_ops.mla_decode_flops(M, Nh, S, lkv, r),
                  math="fp8", pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes, source=source,
                  note="MLA decode attention over the FP8 latent cache (FlashInfer TRTLLM-gen MLA; V-MLA)")


@context_free
def mla_w_uv(d: Dims, launch: Launch = PLAIN) -> Kernel:
    cfg, M, Nh = d.cfg, d.M, d.mla_heads_r
    out = "mla.o" if cfg.mla_output_gate else "attn.core"
    return Kernel(key="mla_w_uv", name="bmm_w_uv", kind="gemm", family="gemm", op=mla_ops.mla_uv_step,
                  reads=(act("mla.olat", M, Nh, cfg.kv_lora_rank),),
                  weights=(weight("mla.w_uv", cfg.kv_lora_rank, Nh * cfg.v_head_dim, shard="col"),),
                  writes=(act(out, M, Nh * cfg.v_head_dim),),
                  flops=lin.gemm_flops(M * Nh, cfg.kv_lora_rank, cfg.v_head_dim),
                  pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
                  source=MLA + "MultiHeadLatentAttention._v_up_proj",
                  note="latent -> 128 per head (V-MLA)")


@context_free
def mla_gate_mul(d: Dims, deps: tuple[str, ...] = ("mla_g_proj",), launch: Launch = PLAIN) -> Kernel:
    M, n = d.M, d.mla_heads_r * d.cfg.v_head_dim
    return Kernel(key="mla_gate_mul", name="sigmoid_gate_mul", kind="pointwise", family="small",
                  op=sigmoid_gate, deps=deps,
                  reads=(act("mla.o", M, n), act("mla.g", M, n)), writes=(act("attn.core", M, n),),
                  flops=sigmoid_gate_flops(M, n), pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
                  source=MLA + "_gate_sigmoid_mul",
                  note="o * sigmoid(g_proj x), a compiled elementwise kernel (V-MLA)")


def mla_query(d: Dims, launch: Launch = PLAIN) -> Kernel:
    """MlaQuery: q_a / kv_a RMSNorm, q_b, the W_UK absorption, FP8 quantisation and the paged FP8 cache insert
    in one launch (the normed latents, q and the latent query stay on chip)."""
    parts = [mla_norm(d), mla_q_b(d), mla_absorb(d), mla_cache_insert(d)]
    return fuse(parts, "mla_query", "MlaQuery", "gemm", "gemm", ("mla.qcat", "mla.cache"),
                SD + "cutedsl/mla/prepared.py:PreparedMla.run", pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
                note="norms, q_b, W_UK, FP8 quant and cache insert: one kernel of the specialized MLA (P11)")


def mla_value(d: Dims, launch: Launch = PLAIN) -> Kernel:
    """MlaValue: W_UV and the sigmoid output gate in one launch."""
    parts = [mla_w_uv(d)] + ([mla_gate_mul(d, deps=())] if d.cfg.mla_output_gate else [])
    return fuse(parts, "mla_value", "MlaValue", "gemm", "gemm", ("attn.core",),
                SD + "cutedsl/mla/prepared.py:PreparedMla.run", pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
                note="W_UV and the output gate: one kernel of the specialized MLA (P11)")
