"""Kimi Delta Attention (KDA): a gated delta-rule recurrence over a fixed-size per-head state.

    plans      in_proj (q, k, v, g, f_a, b) -> f_b -> conv -> recurrence -> gated norm   (stock fallback)
                                                      -> one fused decode kernel              (stock at 12/24/48/96
                                                         local heads; the specialized path at any count)
    kernels    in_proj (q|k|v|g column shards + replicated f_a, b), f_b, the FLA chain (conv, recurrent, gated
               norm), the fused decode, KdaSplit (f_b inside it): factories below, each bound to its op in ops/kda.py
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
from simulator.ops import linear as lin
from simulator.ops import pointwise
from simulator.plans import common as c
from simulator.plans import moe_kernels as moe
from simulator.plans.common import PLAIN, Dims, Launch, act, packed, weight
from simulator.plans.fuse import cite, fuse
from simulator.plans.kernel import K3, LLG, SD, Kernel, Tensor

STATE_BYTES, CONV_BYTES = 4, 2  # FP32 state, BF16 conv history: vLLM's defaults (docs/sources.md §K2)
KDA_SPLIT_MAX_TOKENS = 2  # run_kda_projection_overlap: TP8, <= 2 tokens under graph capture
FLA = "vllm/model_executor/layers/mamba/ops/causal_conv1d.py:causal_conv1d_update"
RECURRENT = K3 + "ops/third_party/kda/fused_recurrent.py:"
KDA_STOCK = K3 + "kda.py:KimiK3DeltaAttention._forward"
OVERLAP = K3 + "low_latency_gemm.py:run_kda_projection_overlap"

# Local head counts the stock fused KDA decode kernel supports (V-KDA: 12/24/48/96 with head_dim 128,
# conv width 4, no speculative tokens). A kernel capability, not a model dimension.
STOCK_FUSED_KDA_HEADS = frozenset({12, 24, 48, 96})


def stock_fused_kda(d: Dims) -> bool:
    return (d.kda_heads_r in STOCK_FUSED_KDA_HEADS and d.cfg.kda_head_dim == 128
            and d.cfg.conv_size == 4 and d.shape.tokens_per_seq == 1)


def _conv_w(d: Dims) -> Tensor:
    """[3C, W]: the rank's channel rows of the q, k and v depthwise conv weights (head-major)."""
    C, W = d.kda_w_r, d.cfg.conv_size
    return packed((("kda.conv_q", "row"), ("kda.conv_k", "row"), ("kda.conv_v", "row")), 3 * C, W, axis=0)


def _state(d: Dims) -> Tensor:
    H = d.cfg.kda_head_dim
    return act("kda.state", d.shape.batch, d.kda_heads_r, H, H, dtype="fp32")


def _conv_hist(d: Dims) -> Tensor:
    return act("kda.conv", d.shape.batch, 3 * d.kda_w_r, d.cfg.conv_size - 1)


def _gate_weights(d: Dims) -> tuple[Tensor, Tensor]:
    return (weight("kda.dt_bias", d.kda_w_r, shard="row", dtype="fp32"),
            weight("kda.a_log", d.kda_heads_r, shard="row", dtype="fp32"))


# ===================================================================== kernels, each bound to its op in ops/kda.py
def kda_in_proj(d: Dims, name: str, launch: Launch = PLAIN, source: str = LLG) -> Kernel:
    """x @ [W_q | W_k | W_v | W_g | W_fa | W_b] per rank: q, k, v, g column shards, f_a replicated."""
    M, D, C, Nh, H = d.M, d.D, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim
    n = 4 * C + H + Nh
    n_pad = -(-n // 16) * 16  # vLLM pads the fused projection to a multiple of 16 rows (the GEMM runs over them)
    w = packed((("kda.w_q", "col"), ("kda.w_k", "col"), ("kda.w_v", "col"), ("kda.w_g", "col"),
                ("kda.w_fa", "full"), ("kda.w_b", "col")), D, n, padded=(D, n_pad))
    return Kernel(
        key="kda_in_proj", name=name, kind="gemm", family="gemm", op=lin.linear_split,
        consts=(("widths", (3 * C, C, H, Nh)),), reads=(act("x", M, D),), weights=(w,),
        writes=(act("kda.qkv", M, 3 * C), act("kda.g", M, C), act("kda.fa", M, H), act("kda.b", M, Nh)),
        flops=lin.gemm_flops(M, D, n_pad), **launch.kw, source=source,
        note="in_proj_qkvgfab: 4 column shards + replicated f_a (N = 6288 at TP8, 3216 at TP16; V-LLG)")


def kda_fb_proj(d: Dims, launch: Launch = PLAIN, stream: str = "main", deps: tuple[str, ...] = ()) -> Kernel:
    """z = f_a(x) @ W_fb (column shard): the low-rank decay path."""
    M, C, H = d.M, d.kda_w_r, d.cfg.kda_head_dim
    return Kernel(key="kda_fb_proj", name="gemm_f_b_proj", kind="gemm", family="gemm", op=lin.linear,
                  reads=(act("kda.fa", M, H),), weights=(weight("kda.w_fb", H, C, shard="col"),),
                  writes=(act("kda.z", M, C),), flops=lin.gemm_flops(M, H, C), stream=stream, deps=deps, **launch.kw,
                  source=LLG,
                  note="f_b_proj GEMM (1536x128 at TP8; V-LLG dsv3_fused_a table)")


def kda_conv(d: Dims, launch: Launch = PLAIN) -> Kernel:
    M, C, W = d.M, d.kda_w_r, d.cfg.conv_size
    return Kernel(key="kda_conv", name="causal_conv1d_update", kind="pointwise", family="small",
                  op=kda_ops.kda_conv_step, consts=(("batch", d.shape.batch),),
                  reads=(act("kda.qkv", M, 3 * C), _conv_hist(d)), weights=(_conv_w(d),),
                  writes=(act("kda.qkv_conv", M, 3 * C), _conv_hist(d)), flops=kda_ops.conv_flops(M, 3 * C, W),
                  **launch.kw, source=FLA,
                  note="short causal conv + SiLU on q, k, v, conv history updated in place (V-KDA fallback)")


KDA_BV = 8  # value columns per program of vLLM's fused_recurrent grid (one warp each), above the tuned sizes
PACKED_BV = 32  # the one-token packed decode's value columns per program (fused_recurrent_kda_packed_decode)


def kda_bv(d: Dims) -> int:
    """Value columns per program: the one-token packed decode takes 32; the verify kernel, tuned on GB300 for
    Kimi K3, takes 4 while sequences x heads <= 48, 8 up to 96, 16 up to 192, 8 above
    (fused_recurrent.py:fused_recurrent_kda_fwd)."""
    if d.shape.tokens_per_seq == 1:
        return PACKED_BV
    n = d.shape.batch * d.kda_heads_r
    return 4 if n <= 48 else 8 if n <= 96 else 16 if n <= 192 else KDA_BV
# such programs resident per SM (the H200 split-V rows: per-token time scales with B x heads x 16 / 1056)
KDA_RESIDENT = 8


def kda_recurrent(d: Dims, launch: Launch = PLAIN, bv: int | None = None) -> Kernel:
    """vLLM's fused_recurrent: grid (B x heads, H / BV) of one-warp programs (`kda_bv`), about
    8 resident per SM; each runs its T tokens in order, loading each token's q, k, v, g inside the loop, so
    every token after the first is a dependent DRAM round trip (calibration/h200 kda split-V rows: ~0.9 µs
    per token per wave, docs/cost-model.md §6.6); a verify (T > 1) stores the state after every token for
    rollback."""
    M, C, Nh, H, B, T = d.M, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim, d.shape.batch, d.shape.tokens_per_seq
    checkpoints = (act("kda.state_tokens", B, T - 1, Nh, H, H, dtype="fp32"),) if T > 1 else ()
    return Kernel(key="kda_recurrent", name="fused_recurrent_kda", kind="attention", family="kda", impl="split_v",
                  op=kda_ops.kda_recurrent_step,
                  consts=(("batch", B), ("lower_bound", d.cfg.gate_lower_bound), ("checkpoints", T > 1)),
                  reads=(act("kda.qkv_conv", M, 3 * C), act("kda.z", M, C), act("kda.b", M, Nh), _state(d)),
                  weights=_gate_weights(d), writes=(act("kda.o", M, C), _state(d)) + checkpoints,
                  flops=kda_ops.delta_rule_flops(M, Nh, H), math="fp32", ctas=B * Nh * (H // (bv or kda_bv(d))),
                  ctas_per_sm=KDA_RESIDENT, serial_steps=T - 1, **launch.kw,
                  source=RECURRENT + ("fused_recurrent_kda" if T > 1 else "fused_recurrent_kda_packed_decode"),
                  note="gate + beta + L2 norm + delta-rule update of the FP32 state; grid (B x heads, H/BV) of "
                       "one-warp programs, the T tokens in order, the state stored after every token of a verify "
                       "(V-KDA fallback chain; vLLM fused_recurrent)")


def kda_gated_norm(d: Dims, launch: Launch = PLAIN) -> Kernel:
    M, C, Nh, H = d.M, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim
    return Kernel(key="kda_gated_norm", name="fused_rms_norm_gated", kind="pointwise", family="small",
                  floor="reduction", op=kda_ops.kda_gated_norm_step,
                  consts=(("heads", Nh), ("eps", d.cfg.rms_norm_eps)), reads=(act("kda.o", M, C), act("kda.g", M, C)),
                  weights=(weight("kda.o_norm", H, dtype="fp32"),), writes=(act("attn.core", M, C),),
                  flops=kda_ops.gated_norm_flops(M, C), **launch.kw,
                  source="vllm/third_party/flash_linear_attention/ops/kda.py:FusedRMSNormGated",
                  note="per-head RMSNorm then sigmoid output gate (V-KDA fallback chain)")


def kda_decode(d: Dims, name: str, launch: Launch = PLAIN, fusions: tuple[str, ...] = (),
               source: str = KDA_STOCK) -> Kernel:
    """conv update + SiLU + L2 norm + gate + beta + delta rule + per-head RMSNorm + output gate."""
    M, C, Nh, H, B, W = d.M, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim, d.shape.batch, d.cfg.conv_size
    return Kernel(key="kda_decode", name=name, kind="attention", family="kda", impl="per_head",
                  op=kda_ops.kda_decode_step,
                  consts=(("batch", B), ("lower_bound", d.cfg.gate_lower_bound), ("eps", d.cfg.rms_norm_eps)),
                  reads=(act("kda.qkv", M, 3 * C), act("kda.z", M, C), act("kda.b", M, Nh), act("kda.g", M, C),
                         _state(d), _conv_hist(d)),
                  weights=(_conv_w(d),) + _gate_weights(d) + (weight("kda.o_norm", H, dtype="fp32"),),
                  writes=(act("attn.core", M, C), _state(d), _conv_hist(d)),
                  flops=kda_ops.delta_rule_flops(M, Nh, H) + kda_ops.conv_flops(M, 3 * C, W), math="fp32",
                  fusions=fusions, ctas=B * Nh, **launch.kw, source=source,
                  replaces=("kda_conv", "kda_recurrent", "kda_gated_norm"),
                  note="one pass per (sequence, head): conv, gate, delta rule, norm, output gate; "
                       "q/k/v/o intermediates stay on chip (V-KDA fused_kda_decode; FlashInfer PR #4243). "
                       "No serial term: the T tokens' inputs do not depend on the state and are loaded up front, "
                       "so a token's step is on-chip math, not the DRAM round trip vLLM's fused_recurrent pays")


def kda_out_copy(d: Dims) -> Kernel:
    """The one-token fallback's packed decode returns a new tensor that the layer copies into its output."""
    M, C = d.M, d.kda_w_r
    return Kernel(key="kda_out_copy", name="copy_core_attn_out", kind="pointwise", family="small", op=pointwise.add,
                  reads=(act("kda.o", M, C),), writes=(act("kda.o", M, C),), source=KDA_STOCK,
                  note="core_attn_out[0, :n] = packed decode output: one elementwise copy launch "
                       "(one token per sequence)")


def kda_split(d: Dims, launch: Launch = PLAIN) -> Kernel:
    """KdaSplit: the f_b projection (a fifth warp's MMA) and the fused decode in one launch; z stays on chip."""
    decode = kda_decode(d, "KdaSplit", launch, fusions=("fused_kda",))
    return fuse([kda_fb_proj(d), decode], "kda_decode", "KdaSplit", "attention", "kda",
                ("attn.core", "kda.state", "kda.conv"), SD + "cutedsl/kda/prepared.py:PreparedKda.run",
                impl="per_head", math="fp32", ctas=decode.ctas, **launch.kw,
                note="conv, f_b projection, gate, beta, L2 norm, delta rule on the FP32 state, per-head RMSNorm and "
                     "output gate in one launch; state, conv rows and weights load before the PDL wait")


def kda_in_proj_overlap(d: Dims, launch: Launch = PLAIN) -> list[Kernel]:
    """TP8, <= 2 tokens: the q|k|v|g rows on the main stream, the f_a|beta rows (padded to 16) on the attention
    aux stream, where f_b follows them (run_kda_projection_overlap)."""
    M, D, C, Nh, H = d.M, d.D, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim
    n_fab = H + Nh
    qkvg = packed((("kda.w_q", "col"), ("kda.w_k", "col"), ("kda.w_v", "col"), ("kda.w_g", "col")), D, 4 * C)
    fab = packed((("kda.w_fa", "full"), ("kda.w_b", "col")), D, n_fab, padded=(D, -(-n_fab // 16) * 16))
    on = dict(kind="gemm", family="gemm", op=lin.linear_split, reads=(act("x", M, D),), **launch.kw)
    return [Kernel(key="kda_in_proj", name="skinny_gemm_qkvg", consts=(("widths", (3 * C, C)),), weights=(qkvg,),
                   writes=(act("kda.qkv", M, 3 * C), act("kda.g", M, C)), flops=lin.gemm_flops(M, D, 4 * C),
                   source=OVERLAP + ".run_qkvg", note="q|k|v|g rows of in_proj_qkvgfab (KDA_QKVG_CONFIGS)", **on),
            Kernel(key="kda_fab_proj", name="skinny_gemm_fab", consts=(("widths", (H, Nh)),), weights=(fab,),
                   writes=(act("kda.fa", M, H), act("kda.b", M, Nh)), flops=lin.gemm_flops(M, D, fab.shape[1]),
                   stream="aux", deps=("attn_res_pre",), source=OVERLAP + ".run_fab_fb",
                   note="f_a|beta rows (+ pad) of in_proj_qkvgfab on the attention aux stream", **on)]


# ===================================================================== the plans
def standard(d: c.Dims, c1: c.Launch, arch: str = "sm100") -> list[Kernel]:
    """The stock path: on sm100 at TP8 up to KDA_SPLIT_MAX_TOKENS tokens the projections overlap on two streams
    (run_kda_projection_overlap); the fused decode kernel at the head counts it serves, else the FLA chain."""
    gemm = c1 if d.single_request else c.PDL
    if arch == "sm100" and d.P == 8 and d.M <= KDA_SPLIT_MAX_TOKENS and stock_fused_kda(d):
        overlap = cite(kda_fb_proj(d, gemm, stream="aux"), OVERLAP + ".run_fab_fb")
        return kda_in_proj_overlap(d, gemm) + [overlap, cite(kda_decode(d, "fused_kda_decode", c1),
                                                                 KDA_STOCK, deps=("kda_fb_proj",))]
    kernels = [kda_in_proj(d, "cutlass_gemm_in_proj_qkvgfab", gemm), kda_fb_proj(d, gemm)]
    if stock_fused_kda(d):
        return kernels + [kda_decode(d, "fused_kda_decode", c1)]
    copy = [kda_out_copy(d)] if d.shape.tokens_per_seq == 1 else []
    bv = None if arch == "sm100" else KDA_BV  # the GB300-tuned grid; Hopper's measurements ran BV = 8
    return kernels + [kda_conv(d, c1), kda_recurrent(d, c1, bv)] + copy + [kda_gated_norm(d, c1)]


def specialized(d: c.Dims, on: frozenset[str], go) -> list[Kernel]:
    if "fused_kda" not in on:
        return standard(d, c.PLAIN if go.c1 is c.PLAIN else c.EARLY)
    proj = [kda_in_proj(d, "skinny_gemm_in_proj_qkvgfab", go.c1, source=c.projection_source(d))]
    if "l2_prefetch" in on and d.P == 8 and 5 <= d.M <= 8:
        proj.append(moe.l2_prefetch(d, "attention_moe", after="kda_in_proj"))
    if "kda_fb_in_kernel" in on:
        return proj + [kda_split(d, go.c1)]
    return proj + [kda_fb_proj(d, go.c1), kda_decode(d, "kda_decode_specialized", go.c1, fusions=("fused_kda",),
                                                         source=SD + "cutedsl/kda/prepared.py:PreparedKda.run")]


# ===================================================================== reference and state
def reference(cfg, layer: int, shape, W, x: np.ndarray, state: dict) -> tuple[np.ndarray, dict]:
    B, T = shape.batch, shape.tokens_per_seq
    bt = lambda y: y.reshape(B, T, -1)  # noqa: E731   [M, n] -> [B, T, n]
    qkv = np.concatenate([x @ W(f"kda.w_{p}") for p in "qkv"], axis=-1)  # [M, 3C]
    conv_w = np.concatenate([W(f"kda.conv_{p}") for p in "qkv"], axis=0)  # [3C, W]
    z = (x @ W("kda.w_fa")) @ W("kda.w_fb")  # [M, C]
    # the state as float64 without a copy of its own when it is one: kda_decode_reference updates a copy (at
    # batch 64 the state is 0.5 GB, and a second copy cost ~1 s and 0.5 GB of peak)
    out, s, hist = kda_ops.kda_decode_reference(
        bt(qkv), conv_w, np.asarray(state["kda.conv"], np.float64), bt(z), W("kda.dt_bias"), W("kda.a_log"),
        bt(x @ W("kda.w_b")), bt(x @ W("kda.w_g")), W("kda.o_norm"), np.asarray(state["kda.state"], np.float64),
        lower_bound=cfg.gate_lower_bound, eps=cfg.rms_norm_eps)
    return out.reshape(B * T, -1) @ W("kda.w_o"), {"kda.state": s, "kda.conv": hist}


def initial_state(cfg, shape, rng: np.random.Generator) -> dict:
    b, nh, h, w = shape.batch, cfg.kda_heads, cfg.kda_head_dim, cfg.conv_size
    state = rng.standard_normal((b, nh, h, h)).astype(np.float32) * np.float32(0.3)  # [B, Nh, H, H]
    conv = round_bf16(rng.standard_normal((b, 3 * nh * h, w - 1)))  # [B, 3C, W-1]
    return {"kda.state": state.astype(np.float64), "kda.conv": conv}


def shard(state: dict, tp: int) -> list[dict]:
    """Rank r's heads of the state and its channels of each q, k, v block of the conv history (copies)."""
    if "kda.state" not in state:
        return [{} for _ in range(tp)]
    s, blocks = state["kda.state"], np.split(state["kda.conv"], 3, axis=1)  # q, k, v channel blocks
    n, ch = s.shape[1] // tp, blocks[0].shape[1] // tp
    return [{"kda.state": s[:, r * n:(r + 1) * n].copy(),
             "kda.conv": np.concatenate([blk[:, r * ch:(r + 1) * ch] for blk in blocks], axis=1)} for r in range(tp)]


def unshard(rank_bufs: list[dict], like: dict, advance: int) -> dict:
    if "kda.state" not in like:
        return {}
    per_rank = [np.split(b["kda.conv"], 3, axis=1) for b in rank_bufs]  # each rank's q, k, v channel blocks
    return {"kda.state": np.concatenate([b["kda.state"] for b in rank_bufs], axis=1),
            "kda.conv": np.concatenate([np.concatenate(block, axis=1) for block in zip(*per_rank)], axis=1)}


def state_errors(state: dict, ref: dict, shape) -> list[tuple[str, np.ndarray, np.ndarray, str]]:
    return [(name, state[name], ref[name], "") for name in ("kda.state", "kda.conv")]


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
