"""KDA attention kernels: the stock fallback chain (conv, recurrence, gated norm) and the one-pass
fused decode kernel, each bound to its op in `ops/kda.py`.

    kda_in_proj (common) -> kda_fb_proj (common) -> conv -> recurrent -> gated norm      (fallback)
                                                 -> kda_decode                          (fused)

Dimension legend: M tokens (B sequences x T tokens), C = Nh H channels per rank (q, k, v each),
Nh heads on this rank, H head dim, W conv width.
"""

from __future__ import annotations

from simulator.ops import kda as kda_ops
from simulator.ops import linear as lin
from simulator.ops import pointwise
from simulator.plans.common import PLAIN, Dims, Launch, act, kda_fb_proj, packed, weight
from simulator.plans.fuse import fuse
from simulator.plans.kernel import K3, SD, Kernel, Tensor

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


def kda_conv(d: Dims, launch: Launch = PLAIN) -> Kernel:
    M, C, W = d.M, d.kda_w_r, d.cfg.conv_size
    return Kernel(key="kda_conv", name="causal_conv1d_update", kind="pointwise", family="small",
                  op=kda_ops.kda_conv_step, consts=(("batch", d.shape.batch),),
                  reads=(act("kda.qkv", M, 3 * C), _conv_hist(d)), weights=(_conv_w(d),),
                  writes=(act("kda.qkv_conv", M, 3 * C), _conv_hist(d)), flops=kda_ops.conv_flops(M, 3 * C, W),
                  pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes, source=FLA,
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
                  ctas_per_sm=KDA_RESIDENT,
                  serial_steps=T - 1, pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
                  source=RECURRENT + ("fused_recurrent_kda" if T > 1 else "fused_recurrent_kda_packed_decode"),
                  note="gate + beta + L2 norm + delta-rule update of the FP32 state; grid (B x heads, H/BV) of "
                       "one-warp programs, the T tokens in order, the state stored after every token of a verify "
                       "(V-KDA fallback chain; vLLM fused_recurrent)")


def kda_gated_norm(d: Dims, launch: Launch = PLAIN) -> Kernel:
    M, C, Nh, H = d.M, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim
    return Kernel(key="kda_gated_norm", name="fused_rms_norm_gated", kind="pointwise", family="small",
                  floor="reduction",
                  op=kda_ops.kda_gated_norm_step, consts=(("heads", Nh), ("eps", d.cfg.rms_norm_eps)),
                  reads=(act("kda.o", M, C), act("kda.g", M, C)), weights=(weight("kda.o_norm", H, dtype="fp32"),),
                  writes=(act("attn.core", M, C),), flops=kda_ops.gated_norm_flops(M, C),
                  pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
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
                  fusions=fusions, ctas=B * Nh, pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes, source=source,
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
                impl="per_head", math="fp32", ctas=decode.ctas, pdl=launch.pdl, prefetch_bytes=launch.prefetch_bytes,
                note="conv, f_b projection, gate, beta, L2 norm, delta rule on the FP32 state, per-head RMSNorm and "
                     "output gate in one launch; state, conv rows and weights load before the PDL wait")


def kda_in_proj_overlap(d: Dims, launch: Launch = PLAIN) -> list[Kernel]:
    """TP8, <= 2 tokens: the q|k|v|g rows on the main stream, the f_a|beta rows (padded to 16) on the attention
    aux stream, where f_b follows them (run_kda_projection_overlap)."""
    M, D, C, Nh, H = d.M, d.D, d.kda_w_r, d.kda_heads_r, d.cfg.kda_head_dim
    n_fab = H + Nh
    qkvg = packed((("kda.w_q", "col"), ("kda.w_k", "col"), ("kda.w_v", "col"), ("kda.w_g", "col")), D, 4 * C)
    fab = packed((("kda.w_fa", "full"), ("kda.w_b", "col")), D, n_fab, padded=(D, -(-n_fab // 16) * 16))
    on = dict(kind="gemm", family="gemm", op=lin.linear_split, reads=(act("x", M, D),), pdl=launch.pdl,
              prefetch_bytes=launch.prefetch_bytes)
    return [Kernel(key="kda_in_proj", name="skinny_gemm_qkvg", consts=(("widths", (3 * C, C)),), weights=(qkvg,),
                   writes=(act("kda.qkv", M, 3 * C), act("kda.g", M, C)), flops=lin.gemm_flops(M, D, 4 * C),
                   source=OVERLAP + ".run_qkvg", note="q|k|v|g rows of in_proj_qkvgfab (KDA_QKVG_CONFIGS)", **on),
            Kernel(key="kda_fab_proj", name="skinny_gemm_fab", consts=(("widths", (H, Nh)),), weights=(fab,),
                   writes=(act("kda.fa", M, H), act("kda.b", M, Nh)), flops=lin.gemm_flops(M, D, fab.shape[1]),
                   stream="aux", deps=("attn_res_pre",), source=OVERLAP + ".run_fab_fb",
                   note="f_a|beta rows (+ pad) of in_proj_qkvgfab on the attention aux stream", **on)]
