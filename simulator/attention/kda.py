"""Kimi Delta Attention (KDA): a gated delta-rule recurrence over a fixed-size per-head state.

    plans      in_proj (q, k, v, g, f_a, b) -> f_b -> conv -> recurrence -> gated norm   (stock fallback)
                                                      -> one fused decode kernel              (stock at 12/24/48/96
                                                         local heads; the specialized path at any count)
    reference  ops/kda.py's token-by-token `kda_decode_reference`, then o_proj
    state      S [B, Nh, H, H] FP32 (S[i=key][j=value]) and the short-conv history [B, 3 Nh H, W-1] of the
                      last W-1 pre-conv q, k, v inputs (channels: all q, then all k, then all v); sharded by head
                      under TP: rank r owns heads r Nh/P .. (r+1) Nh/P of S and of each q/k/v block
    memory     B x [(Nh/P) H H x 4 B + 3 (Nh/P) H (W-1) x 2 B] per layer, whatever the context
                      (96/8 heads x 128 x 128 x 4 B = 0.75 MiB per sequence per layer for K3 at TP8;
               docs/sources.md §K1c)

Dimension legend: M tokens (B sequences x T tokens), D hidden, Nh heads (on a rank: /P), H head dim,
C = Nh H channels, W conv width.
"""

from __future__ import annotations

import numpy as np

from simulator.attention.kind import AttentionKind
from simulator.dtypes import round_bf16
from simulator.ops import kda as kda_ops
from simulator.plans import common as c
from simulator.plans import kda_kernels as kda
from simulator.plans import moe_kernels as moe
from simulator.plans.fuse import cite
from simulator.plans.kernel import SD, Kernel

F64 = np.float64
STATE_BYTES, CONV_BYTES = 4, 2  # FP32 state, BF16 conv history: vLLM's defaults (docs/sources.md §K2)
KDA_SPLIT_MAX_TOKENS = 2  # run_kda_projection_overlap: TP8, <= 2 tokens under graph capture


def standard(d: c.Dims, c1: c.Launch, arch: str = "sm100") -> list[Kernel]:
    """The stock path: on sm100 at TP8 up to KDA_SPLIT_MAX_TOKENS tokens the projections overlap on two streams
    (run_kda_projection_overlap); the fused decode kernel at the head counts it serves, else the FLA chain."""
    gemm = c1 if d.single_request else c.PDL
    if arch == "sm100" and d.P == 8 and d.M <= KDA_SPLIT_MAX_TOKENS and kda.stock_fused_kda(d):
        overlap = cite(c.kda_fb_proj(d, gemm, stream="aux"), kda.OVERLAP + ".run_fab_fb")
        return kda.kda_in_proj_overlap(d, gemm) + [overlap, cite(kda.kda_decode(d, "fused_kda_decode", c1),
                                                                 kda.KDA_STOCK, deps=("kda_fb_proj",))]
    kernels = [c.kda_in_proj(d, "cutlass_gemm_in_proj_qkvgfab", gemm), c.kda_fb_proj(d, gemm)]
    if kda.stock_fused_kda(d):
        return kernels + [kda.kda_decode(d, "fused_kda_decode", c1)]
    copy = [kda.kda_out_copy(d)] if d.shape.tokens_per_seq == 1 else []
    bv = None if arch == "sm100" else kda.KDA_BV  # the GB300-tuned grid; Hopper's measurements ran BV = 8
    return kernels + [kda.kda_conv(d, c1), kda.kda_recurrent(d, c1, bv)] + copy + [kda.kda_gated_norm(d, c1)]


def specialized(d: c.Dims, on: frozenset[str], go) -> list[Kernel]:
    if "fused_kda" not in on:
        return standard(d, c.PLAIN if go.c1 is c.PLAIN else c.EARLY)
    proj = [c.kda_in_proj(d, "skinny_gemm_in_proj_qkvgfab", go.c1, source=c.projection_source(d))]
    if "l2_prefetch" in on and d.P == 8 and 5 <= d.M <= 8:
        proj.append(moe.l2_prefetch(d, "attention_moe", after="kda_in_proj"))
    if "kda_fb_in_kernel" in on:
        return proj + [kda.kda_split(d, go.c1)]
    return proj + [c.kda_fb_proj(d, go.c1), kda.kda_decode(d, "kda_decode_specialized", go.c1, fusions=("fused_kda",),
                                                         source=SD + "cutedsl/kda/prepared.py:PreparedKda.run")]


def reference(cfg, layer: int, shape, W, x: np.ndarray, state: dict) -> tuple[np.ndarray, dict]:
    B, T = shape.batch, shape.tokens_per_seq
    bt = lambda y: y.reshape(B, T, -1)  # noqa: E731   [M, n] -> [B, T, n]
    qkv = np.concatenate([x @ W(f"kda.w_{p}") for p in "qkv"], axis=-1)  # [M, 3C]
    conv_w = np.concatenate([W(f"kda.conv_{p}") for p in "qkv"], axis=0)  # [3C, W]
    z = (x @ W("kda.w_fa")) @ W("kda.w_fb")  # [M, C]
    # the state as float64 without a copy of its own when it is one: kda_decode_reference updates a copy (at
    # batch 64 the state is 0.5 GB, and a second copy cost ~1 s and 0.5 GB of peak)
    out, s, hist = kda_ops.kda_decode_reference(
        bt(qkv), conv_w, np.asarray(state["kda.conv"], F64), bt(z), W("kda.dt_bias"), W("kda.a_log"),
        bt(x @ W("kda.w_b")), bt(x @ W("kda.w_g")), W("kda.o_norm"), np.asarray(state["kda.state"], F64),
        lower_bound=cfg.gate_lower_bound, eps=cfg.rms_norm_eps)
    return out.reshape(B * T, -1) @ W("kda.w_o"), {"kda.state": s, "kda.conv": hist}


def initial_state(cfg, shape, rng: np.random.Generator) -> dict:
    b, nh, h, w = shape.batch, cfg.kda_heads, cfg.kda_head_dim, cfg.conv_size
    state = rng.standard_normal((b, nh, h, h)).astype(np.float32) * np.float32(0.3)  # [B, Nh, H, H]
    conv = round_bf16(rng.standard_normal((b, 3 * nh * h, w - 1)))  # [B, 3C, W-1]
    return {"kda.state": state.astype(np.float64), "kda.conv": conv}


def _qkv_blocks(conv: np.ndarray) -> list[np.ndarray]:
    return np.split(conv, 3, axis=1)  # q, k, v channel blocks


def shard(state: dict, tp: int) -> list[dict]:
    """Rank r's heads of the state and its channels of each q, k, v block of the conv history (copies)."""
    if "kda.state" not in state:
        return [{} for _ in range(tp)]
    out = []
    for r in range(tp):
        s = state["kda.state"]
        n = s.shape[1] // tp
        blocks = _qkv_blocks(state["kda.conv"])
        ch = blocks[0].shape[1] // tp
        out.append({"kda.state": s[:, r * n:(r + 1) * n].copy(),
                           "kda.conv": np.concatenate([blk[:, r * ch:(r + 1) * ch] for blk in blocks], axis=1)})
    return out


def unshard(rank_bufs: list[dict], like: dict, advance: int) -> dict:
    if "kda.state" not in like:
        return {}
    per_rank = [_qkv_blocks(b["kda.conv"]) for b in rank_bufs]
    return {"kda.state": np.concatenate([b["kda.state"] for b in rank_bufs], axis=1),
            "kda.conv": np.concatenate([np.concatenate([blocks[i] for blocks in per_rank], axis=1)
                                               for i in range(3)], axis=1)}


def state_errors(state: dict, ref: dict, shape) -> list[tuple[str, np.ndarray, np.ndarray, str]]:
    return [("kda.state", state["kda.state"], ref["kda.state"], ""),
            ("kda.conv", state["kda.conv"], ref["kda.conv"], "")]


def state_elements(cfg, tp: int, shape) -> int:
    """The full state and conv history (the ranks' shards add up to one more copy)."""
    return shape.batch * cfg.kda_heads * cfg.kda_head_dim * (cfg.kda_head_dim + 3 * cfg.conv_size)


def state_bytes(cfg, tp: int, shape) -> int:
    """Recurrent state [Nh/P, H, H] plus conv history [3 Nh/P H, W-1] per sequence, every KDA layer, one GPU."""
    heads, h = cfg.kda_heads // tp, cfg.kda_head_dim
    per_seq = heads * h * h * STATE_BYTES + 3 * heads * h * (cfg.conv_size - 1) * CONV_BYTES
    return shape.batch * cfg.attn_kinds.count("kda") * per_seq


KIND = AttentionKind(name="kda", label="KDA", standard=standard, specialized=specialized, reference=reference,
                    initial_state=initial_state, shard=shard, unshard=unshard, state_errors=state_errors,
                    state_elements=state_elements, memory=("kda_state", "KDA state", state_bytes), reads_context=False,
                    impl_names={"triton_split_v": {"kda_recurrent": "kda_split_v_kernel"},  # benchmarks/gpu suite
                                "triton": {"kda_decode": "kda_decode_kernel"}})
