"""Grouped-query attention (GQA) over a paged KV cache: gpt-oss, Qwen3-MoE, Mixtral (ops/gqa.py has the math).

    plans      fused q/k/v projection (column shard by head, + bias) -> [per-head q/k RMSNorm] -> RoPE
               -> paged cache insert -> decode attention over the cache (window, sinks) -> o_proj (common)
    reference  the same equations over a contiguous cache gathered from the pages, token by token and head by
               head (ops/gqa.py `attention_reference`), then o_proj
    state      pools [NB, BS, Nkv, H] of K (stored rotated) and V in bf16, each sequence's block table
               [B, blocks] and `lengths` [B]; TP shards the pools by key/value head (above P = Nkv each head is
               replicated on P / Nkv ranks, as vLLM does), the tables are replicated
    memory     B x rows x 2 (K, V) x max(1, Nkv/P) x H x 2 B per layer, rows = context + T, or the window on a
               sliding-window layer (vLLM frees the blocks a window has left behind)

vLLM's paged decode attention on Hopper and Blackwell (FlashAttention / FlashInfer) reads the sequence's blocks
through the table; BS = 16 positions per block is vLLM's default block size for those backends. On ROCm
(arch gfx942 / gfx950) vLLM's ROCM_AITER_UNIFIED_ATTN backend runs aiter's Triton unified attention: one program
per sequence and key/value head (the 2d kernel), or split-KV (the 3d kernel, then reduce_segments), by aiter's
rule (`rocm_split`). gpt-oss's fp32 YaRN table is cast to bf16 in every layer past the first (`rope_cache_cast`).
A sliding-window decode reads only its window's positions: its bytes (`traffic_bytes`) say so, while the pools it
declares are whole (the op indexes them through the table).

Dimension legend: M tokens (B sequences x T tokens), D hidden, Nq / Nkv query / key-value heads (on a rank:
/P), H head dim, NB pool blocks, BS positions per block, S cached positions after this step, W window.
"""

from __future__ import annotations

import numpy as np

from simulator.attention.kind import AttentionKind
from simulator.dtypes import round_bf16
from simulator.ops import gqa as gqa_ops
from simulator.ops import norm, pointwise
from simulator.ops.linear import gemm_flops
from simulator.plans import common as c
from simulator.plans.kernel import Kernel, Tensor

F64 = np.float64
BLOCK = 16  # positions per cache block (vLLM's default block size)
CACHE_BYTES = 2  # bf16 K and V (vLLM's --kv-cache-dtype auto for a bf16 model)
ROCM_CUS = {"gfx942": 304, "gfx950": 256}  # compute units of MI300X / MI355X (hardware/mi300x.toml, mi355x.toml)
CTAS_PER_CU = 4  # aiter's decode config: 2 waves per SIMD (waves_per_eu) x 4 SIMDs / 2 waves per program
# the decode attention of vLLM's ROCM_AITER_UNIFIED_ATTN backend (v1/attention/backends/rocm_aiter_unified_attn.py)
UNIFIED = "aiter/ops/triton/unified_attention.py:unified_attention"


def kv_split(nkv: int, tp: int) -> tuple[int, str]:
    """(key/value heads on a rank, their weights' shard). vLLM's QKVParallelLinear splits the Nkv heads over
    the P ranks while P <= Nkv; above, each head is replicated on P / Nkv ranks and rank r holds head r Nkv / P
    (`num_kv_head_replicas`, `shard_rank = tp_rank // num_kv_head_replicas` in vllm/model_executor/layers/
    linear.py, vLLM 0.33.0); config.validate_tp refuses a P that neither divides Nkv nor is a multiple of it."""
    return (nkv // tp, "col") if tp <= nkv else (1, f"col/{nkv}")


def _heads(d: c.Dims) -> tuple[int, int, int]:
    """(Nq, Nkv, H) on one rank."""
    return d.cfg.gqa_heads // d.tp, kv_split(d.cfg.gqa_kv_heads, d.tp)[0], d.cfg.gqa_head_dim


def blocks_per_seq(shape) -> int:
    return -(-(shape.context + shape.tokens_per_seq) // BLOCK)


def _pools(d: c.Dims) -> tuple[Tensor, Tensor]:
    _, nkv, h = _heads(d)
    nb = d.shape.batch * blocks_per_seq(d.shape)
    return c.act("gqa.k_cache", nb, BLOCK, nkv, h), c.act("gqa.v_cache", nb, BLOCK, nkv, h)


def _table(d: c.Dims) -> tuple[Tensor, Tensor]:
    B = d.shape.batch
    return c.act("gqa.block_table", B, blocks_per_seq(d.shape), dtype="int32"), c.act("gqa.lengths", B, dtype="int32")


def _qkv(d: c.Dims) -> tuple[Tensor, Tensor, Tensor]:
    nq, nkv, h = _heads(d)
    return c.act("gqa.q", d.M, nq, h), c.act("gqa.k", d.M, nkv, h), c.act("gqa.v", d.M, nkv, h)


@c.context_free
def gqa_qkv_proj(d: c.Dims, launch: c.Launch = c.PLAIN) -> Kernel:
    """x @ [W_q | W_k | W_v] (+ bias), column shards of whole heads: [Nq | Nkv | Nkv] x H per rank."""
    nq, nkv, h = _heads(d)
    n = (nq + 2 * nkv) * h
    kv = kv_split(d.cfg.gqa_kv_heads, d.tp)[1]
    parts = (("gqa.w_q", "col"), ("gqa.w_k", kv), ("gqa.w_v", kv))
    bias = (c.packed(tuple((f"gqa.b_{p}", s) for p, s in zip("qkv", ("col", kv, kv))), n, dtype="fp32"),
            ) if d.cfg.gqa_qkv_bias else ()
    return Kernel(key="gqa_qkv_proj", name="gemm_qkv_proj", kind="gemm", family="gemm", op=gqa_ops.qkv_proj,
                  consts=(("heads", nq), ("kv_heads", nkv), ("head_dim", h)),
                  reads=(c.act("x", d.M, d.D),), weights=(c.packed(parts, d.D, n),) + bias, writes=_qkv(d),
                  flops=gemm_flops(d.M, d.D, n), **launch.kw,
                  note="QKVParallelLinear: one GEMM over the rank's q, k and v heads (+ bias for gpt-oss)")


@c.context_free
def gqa_qk_norm(d: c.Dims, launch: c.Launch = c.PLAIN) -> Kernel:
    q, k, _ = _qkv(d)
    h = d.cfg.gqa_head_dim
    return Kernel(key="gqa_qk_norm", name="qk_rmsnorm", kind="pointwise", family="small", floor="reduction",
                  op=gqa_ops.qk_norm, consts=(("eps", d.cfg.rms_norm_eps),), reads=(q, k),
                  weights=(c.weight("gqa.q_norm", h), c.weight("gqa.k_norm", h)), writes=(q, k),
                  flops=norm.rms_norm_flops(d.M, q.shape[1] * h + k.shape[1] * h),
                  **launch.kw,
                  note="per-head RMSNorm of q and k before RoPE (Qwen3's q_norm / k_norm)")


def gqa_rope(d: c.Dims, launch: c.Launch = c.PLAIN) -> Kernel:
    q, k, _ = _qkv(d)
    cfg = d.cfg
    return Kernel(key="gqa_rope", name="rotary_embedding", kind="pointwise", family="small", op=gqa_ops.rope_qk,
                  consts=(("batch", d.shape.batch), ("theta", cfg.rope_theta), ("scaling", cfg.rope_scaling)),
                  reads=(q, k, _table(d)[1]), writes=(q, k), flops=3 * q.numel + 3 * k.numel,
                  **launch.kw,
                  note="RoPE of q and k in place at each token's position (half layout; YaRN when configured)")


def gqa_cache_insert(d: c.Dims, launch: c.Launch = c.PLAIN) -> Kernel:
    _, k, v = _qkv(d)
    kc, vc = _pools(d)
    table, lengths = _table(d)
    return Kernel(key="gqa_cache_insert", name="reshape_and_cache_flash", kind="pointwise", family="small",
                  op=gqa_ops.cache_insert, consts=(("batch", d.shape.batch),),
                  reads=(k, v, kc, vc, table, lengths), writes=(kc, vc), **launch.kw,
                  traffic_bytes=2 * (k.nbytes + v.nbytes) + table.nbytes + lengths.nbytes,
                  note="k, v written to their slots of the paged cache (vLLM reshape_and_cache_flash); declared "
                       "as the whole pool in and out, it moves the M new rows (read, then written)")


def kv_bytes(d: c.Dims) -> int:
    """K and V bytes one decode reads: each sequence's last `seen` positions (its window on a sliding layer)."""
    _, nkv, h = _heads(d)
    return d.shape.batch * seen_positions(d) * 2 * nkv * h * CACHE_BYTES


def seen_positions(d: c.Dims) -> int:
    window = d.cfg.gqa_window(d.layer)
    return min(d.cache_len, window) if window else d.cache_len


def rocm_split(d: c.Dims, arch: str) -> int:
    """Segments of aiter's unified attention on ROCm (aiter ops/triton/unified_attention.py, use_2d_kernel and
    select_3d_config): 1 (the 2d kernel) on a sliding layer, at <= 512 cached positions, or when the 2d grid,
    (M / BLOCK_Q + B) x Nkv programs, exceeds 4 per CU; else the 3d split-KV kernel with next_pow2(ceil(4 CUs /
    that grid)) segments, at least 16 (tiles of 16 positions), at most 128."""
    nq, nkv, _ = _heads(d)
    group = nq // nkv
    block_q = max(1, (16 if group <= 16 else 1 << (group - 1).bit_length()) // group)
    grid_2d = (d.M // block_q + d.shape.batch) * nkv
    target = 4 * ROCM_CUS[arch]
    if d.cfg.gqa_window(d.layer) or d.cache_len <= 512 or grid_2d > target:
        return 1
    return min(128, max(16, 1 << (-(-target // grid_2d) - 1).bit_length()))


def gqa_decode(d: c.Dims, launch: c.Launch = c.PLAIN, arch: str = "sm100") -> Kernel:
    cfg = d.cfg
    nq, nkv, h = _heads(d)
    q, _, _ = _qkv(d)
    kc, vc = _pools(d)
    table, lengths = _table(d)
    window = cfg.gqa_window(d.layer)
    sinks = (c.weight("gqa.sinks", nq, shard="col", dtype="fp32"),) if cfg.gqa_sinks else ()
    mscale = cfg.rope_scaling.softmax_mscale if cfg.rope_scaling else 1.0
    rocm = arch in ROCM_CUS
    segments = rocm_split(d, arch) if rocm else 1
    partials = d.M * nq * segments * (h + 2) * 4 if segments > 1 else 0  # fp32 out, max and exp-sum per segment
    name = ("kernel_unified_attention_3d" if segments > 1 else "kernel_unified_attention_2d") if rocm \
        else "paged_attention_decode"
    return Kernel(key="gqa_decode", name=name, kind="attention", family="gqa",
                  floor="attention", op=gqa_ops.paged_decode,
                  consts=(("batch", d.shape.batch), ("window", window), ("scale", h ** -0.5 * mscale * mscale)),
                  reads=(q, kc, vc, table, lengths), weights=sinks, writes=(c.act("attn.core", d.M, nq * h),),
                  flops=gqa_ops.decode_flops(d.M, nq, seen_positions(d), h), **launch.kw,
                  ctas=d.shape.batch * nkv * segments, ctas_per_sm=CTAS_PER_CU,
                  traffic_bytes=q.nbytes + kv_bytes(d) + sum(t.nbytes for t in sinks) + d.M * nq * h * 2 + partials,
                  source=UNIFIED if rocm else "",
                  note=(("aiter's Triton unified attention on ROCm, " + (
                      f"split-KV over {segments} segments per sequence (fp32 partials; the combine is reduce_segments)"
                      if segments > 1 else "one program per sequence and key/value head")) if rocm else
                      "decode attention over the paged cache through the block table (FlashAttention / FlashInfer)")
                  + (f"; sliding window of {window}: reads at most its window's positions" if window else "")
                  + ("; one sink logit per head" if cfg.gqa_sinks else "")
                  + "; the op computes the exact softmax in this launch")


def reduce_segments(d: c.Dims, segments: int, launch: c.Launch = c.PLAIN) -> Kernel:
    """The split-KV combine: each query head's segments rescaled to the global max and summed; moe-sim's decode op
    already returned the combined output, so this launch passes it on (its bytes are the fp32 partials it reads)."""
    nq, _, h = _heads(d)
    out = c.act("attn.core", d.M, nq * h)
    return Kernel(key="gqa_reduce", name="reduce_segments", kind="pointwise", family="small", floor="reduction",
                  op=pointwise.add, reads=(out,), writes=(out,), flops=d.M * nq * segments * (h + 4),
                  traffic_bytes=d.M * nq * segments * (h + 2) * 4 + out.nbytes, pdl=launch.pdl, source=UNIFIED,
                  note=f"combine of the {segments} segments' fp32 partials (aiter reduce_segments, grid M x Nq)")


def rope_cache_cast(d: c.Dims, launch: c.Launch = c.PLAIN) -> Kernel | None:
    """vLLM builds gpt-oss's rotary embedding in fp32 (models/gpt_oss.py: get_rope(..., dtype=torch.float32)), a
    YaRN cos/sin cache of original_max x factor rows of H, and inside each compiled piece of the graph casts it
    to the query's bf16 before the rotary kernel (RotaryEmbedding._match_cos_sin_cache_dtype: under torch.compile
    the cast is never stored back). Layer 0's cast is fused into the step's embedding kernel. No numerical effect
    in moe-sim (its RoPE computes its angles); its bytes are the table read and written."""
    scaling = d.cfg.rope_scaling
    if d.cfg.family != "gpt_oss" or scaling is None or d.layer == 0:
        return None
    rows, h = int(scaling.original_max * scaling.factor), d.cfg.gqa_head_dim
    return Kernel(key="gqa_rope_cache", name="triton_poi_fused__to_copy", kind="pointwise", family="small",
                  op=pointwise.nothing, traffic_bytes=rows * h * (4 + 2), flops=rows * h, pdl=launch.pdl,
                  source="vllm/model_executor/layers/rotary_embedding/base.py:RotaryEmbedding._match_cos_sin_cache_dtype",
                  note=f"fp32 -> bf16 cast of the {rows} x {h} cos/sin cache in every layer's compiled piece "
                       "(torch.compile keeps it; vLLM's AITER path later reuses a bf16 copy)")


def standard(d: c.Dims, c1: c.Launch, arch: str = "sm100", launch: c.Launch = c.PLAIN) -> list[Kernel]:
    """qkv -> [qk-norm] -> [the rope cache cast] -> RoPE -> cache insert -> decode [-> combine] (ROCm: aiter's
    2d or split-KV 3d unified attention, rocm_split)."""
    e = launch
    cast = rope_cache_cast(d, e)
    decode = gqa_decode(d, e, arch)
    segments = rocm_split(d, arch) if arch in ROCM_CUS else 1
    return ([gqa_qkv_proj(d, e)] + ([gqa_qk_norm(d, e)] if d.cfg.gqa_qk_norm else []) + ([cast] if cast else [])
            + [gqa_rope(d, e), gqa_cache_insert(d, e), decode] + ([reduce_segments(d, segments, e)] if segments > 1
                                                                    else []))


def specialized(d: c.Dims, on: frozenset[str], go) -> list[Kernel]:
    return standard(d, go.c1, launch=go.every)


# ===================================================================== reference and state
def reference(cfg, layer: int, shape, W, x: np.ndarray, state: dict) -> tuple[np.ndarray, dict]:
    B, T, nq, nkv, h = shape.batch, shape.tokens_per_seq, cfg.gqa_heads, cfg.gqa_kv_heads, cfg.gqa_head_dim
    lengths, table = state["gqa.lengths"], state["gqa.block_table"]
    q, k, v = (x @ W(f"gqa.w_{p}") for p in "qkv")
    if cfg.gqa_qkv_bias:
        q, k, v = q + W("gqa.b_q"), k + W("gqa.b_k"), v + W("gqa.b_v")
    q, k, v = q.reshape(B, T, nq, h), k.reshape(B, T, nkv, h), v.reshape(B, T, nkv, h)
    if cfg.gqa_qk_norm:
        q, k = (gqa_ops.head_rms_norm(y, W(f"gqa.{p}_norm"), cfg.rms_norm_eps) for y, p in ((q, "q"), (k, "k")))
    pos = gqa_ops.positions(lengths, T)
    q, k = (gqa_ops.rope(y, pos, cfg.rope_theta, cfg.rope_scaling) for y in (q, k))
    ctx = int(lengths.max())
    old = gqa_ops.slots(table, np.broadcast_to(np.arange(ctx), (B, ctx)), BLOCK)  # [B, ctx] pool slots
    k_pool, v_pool = (state[f"gqa.{p}_cache"].astype(F64) for p in "kv")
    flat = lambda pool: pool.reshape(-1, nkv, h)  # noqa: E731
    K = np.concatenate([flat(k_pool)[old], k], axis=1)  # [B, ctx + T, Nkv, H]: every length is ctx here
    V = np.concatenate([flat(v_pool)[old], v], axis=1)
    mscale = cfg.rope_scaling.softmax_mscale if cfg.rope_scaling else 1.0
    o = gqa_ops.attention_reference(q, K, V, lengths, W("gqa.sinks") if cfg.gqa_sinks else None,
                                    window=cfg.gqa_window(layer), scale=h ** -0.5 * mscale * mscale)
    new = gqa_ops.slots(table, pos, BLOCK).reshape(-1)
    k_new, v_new = flat(k_pool).copy(), flat(v_pool).copy()
    k_new[new], v_new[new] = k.reshape(B * T, nkv, h), v.reshape(B * T, nkv, h)
    out = {"gqa.k_cache": k_new.reshape(k_pool.shape), "gqa.v_cache": v_new.reshape(v_pool.shape),
           "gqa.block_table": table, "gqa.lengths": lengths + T}
    return o.reshape(B * T, nq * h) @ W("gqa.w_o"), out


def initial_state(cfg, shape, rng: np.random.Generator) -> dict:
    """Pools of B x blocks_per_seq blocks handed out in a shuffled order (so pages are not contiguous), the
    first `context` positions of each sequence filled with bf16 values."""
    B, ctx, nkv, h = shape.batch, shape.context, cfg.gqa_kv_heads, cfg.gqa_head_dim
    nblk = blocks_per_seq(shape)
    table = rng.permutation(B * nblk).reshape(B, nblk).astype(np.int64)
    pools = []
    for _ in "kv":
        pool = np.zeros((B * nblk * BLOCK, nkv, h))
        where = gqa_ops.slots(table, np.broadcast_to(np.arange(ctx), (B, ctx)), BLOCK).reshape(-1)
        pool[where] = round_bf16(rng.standard_normal((B * ctx, nkv, h)))
        pools.append(pool.reshape(B * nblk, BLOCK, nkv, h))
    return {"gqa.k_cache": pools[0], "gqa.v_cache": pools[1], "gqa.block_table": table,
            "gqa.lengths": np.full(B, ctx, dtype=np.int64)}


def _owners(nkv: int, tp: int) -> list[tuple[int, int]]:
    """Rank r's first key/value head and head count (kv_split: above Nkv ranks a head is held by P / Nkv)."""
    n = kv_split(nkv, tp)[0]
    return [(r * n, n) if tp <= nkv else (r * nkv // tp, 1) for r in range(tp)]


def shard(state: dict, tp: int) -> list[dict]:
    """Rank r's key/value heads of both pools (a replicated head copied to each rank holding it); the block
    table and lengths replicated (copies)."""
    if "gqa.k_cache" not in state:
        return [{} for _ in range(tp)]
    return [{"gqa.k_cache": state["gqa.k_cache"][:, :, lo:lo + n].copy(),
             "gqa.v_cache": state["gqa.v_cache"][:, :, lo:lo + n].copy(),
             "gqa.block_table": state["gqa.block_table"].copy(), "gqa.lengths": state["gqa.lengths"].copy()}
            for lo, n in _owners(state["gqa.k_cache"].shape[2], tp)]


def unshard(rank_bufs: list[dict], like: dict, advance: int) -> dict:
    """The pools from the first rank holding each head (a replica writes the same rows: state_errors compares
    the pools gathered here with the reference, and the equivalence tests compare every rank's output)."""
    if "gqa.k_cache" not in like:
        return {}
    first: dict[int, int] = {}  # first head -> the first rank holding it
    for r, (lo, _) in enumerate(_owners(like["gqa.k_cache"].shape[2], len(rank_bufs))):
        first.setdefault(lo, r)
    firsts = list(first.values())
    return {"gqa.k_cache": np.concatenate([rank_bufs[r]["gqa.k_cache"] for r in firsts], axis=2),
            "gqa.v_cache": np.concatenate([rank_bufs[r]["gqa.v_cache"] for r in firsts], axis=2),
            "gqa.block_table": rank_bufs[0]["gqa.block_table"], "gqa.lengths": rank_bufs[0]["gqa.lengths"] + advance}


def state_errors(state: dict, ref: dict, shape) -> list[tuple[str, np.ndarray, np.ndarray, str]]:
    """The rows this step wrote, gathered through the block table, and the table and lengths exactly."""
    T = shape.tokens_per_seq
    new = gqa_ops.slots(ref["gqa.block_table"], gqa_ops.positions(ref["gqa.lengths"] - T, T), BLOCK).reshape(-1)
    rows = lambda s, p: s[f"gqa.{p}_cache"].reshape(-1, *s[f"gqa.{p}_cache"].shape[2:])[new]  # noqa: E731
    return [("gqa.k_cache[new]", rows(state, "k"), rows(ref, "k"), ""),
            ("gqa.v_cache[new]", rows(state, "v"), rows(ref, "v"), ""),
            ("gqa.block_table", state["gqa.block_table"], ref["gqa.block_table"], "exact"),
            ("gqa.lengths", state["gqa.lengths"], ref["gqa.lengths"], "exact")]


def state_elements(cfg, tp: int, shape) -> int:
    """Both pools, once whole and once over the ranks' shards."""
    return 2 * 2 * shape.batch * blocks_per_seq(shape) * BLOCK * cfg.gqa_kv_heads * cfg.gqa_head_dim


def cache_bytes(cfg, tp: int, shape) -> int:
    """K and V of every GQA layer on one GPU: each layer's rows (its window, or all), its Nkv/P heads."""
    rows = 0
    for layer, kind in enumerate(cfg.attn_kinds):
        if kind == "gqa":
            window, cached = cfg.gqa_window(layer), shape.context + shape.tokens_per_seq
            rows += min(cached, window) if window else cached
    return shape.batch * rows * 2 * kv_split(cfg.gqa_kv_heads, tp)[0] * cfg.gqa_head_dim * CACHE_BYTES


KIND = AttentionKind(name="gqa", label="GQA", standard=standard, specialized=specialized, reference=reference,
                     initial_state=initial_state, shard=shard, unshard=unshard, state_errors=state_errors,
                     state_elements=state_elements, memory=("kv_cache", "KV cache", cache_bytes), reads_context=True)
