"""The GPU suite's measurement points: one record per kernel x shape, shared by the suite (which measures
them) and by predict.py (which prices them with the cost model). Pure Python: runs without torch.

Shapes come from the plans themselves wherever a plan kernel exists (`plan_key` names it), so a
measured point is, by construction, the per-rank shape the cost model prices. Points with no plan
kernel (ceilings, the N sweep, fixed-U MoE sweeps, collectives by size) are synthetic and say so.

Families and their parts (suite.py --part):
    A1  ceiling     device copy, pure reads by size, one large bf16 GEMM (the roofs)
        gemm        every 2-D dense GEMM of the plans (Kimi K3 TP8/TP16, DeepSeek-V3 TP8) x M, an N sweep
        moe         routed-expert grouped GEMMs: MXFP4 W4A16 (Triton), bf16 (torch grouped GEMM), FP8;
                    M sweeps at the model's U(M), a U sweep at M = 64, an M sweep at U = 128
        small       the plans' pointwise / reduction kernels x M, and the launch floor of an empty kernel
    A2  kda         KDA decode (Triton), heads 12 (TP8) / 6 (TP16), B x T, final vs per-token state writes
        mla         split-KV MLA decode over the latent cache (Triton), heads 12 / 6 / 16, B x S
    B   collective  two GPUs: NCCL all-reduce / reduce-scatter / all-gather, symmetric-memory one-shot /
                    two-shot all-reduce, 1 KiB to 64 MiB and the plans' sizes

Dimension legend: M tokens (B sequences x T tokens each), K x N a GEMM's weight, U unique experts touched,
S cached tokens (MLA) , P ranks, n_bytes a collective's per-rank input payload.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache

# ---------------------------------------------------------------------------------------------------
# the record
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One thing to measure. Zero means "does not apply"; `id` is the join key of the CSVs."""

    family: str  # ceiling | gemm | moe | small | kda | mla | collective
    impl: str  # what runs it: torch_matmul, triton_w4a16, grouped_mm_bf16, nccl_all_reduce, ...
    plan_key: str = ""  # the plan kernel this point measures ("" for synthetic points)
    model: str = ""
    layer: str = ""  # kda | mla | dense | head: the plan the kernel comes from
    tp: int = 0
    M: int = 0  # tokens in the forward
    K: int = 0
    N: int = 0
    U: int = 0  # unique experts touched (moe)
    B: int = 0  # sequences (kda, mla)
    heads: int = 0  # heads on this rank (kda, mla)
    T: int = 1  # tokens per sequence (kda, mla)
    S: int = 0  # cached tokens after this step (mla)
    n_src: int = 0  # AttnRes sources (small)
    P: int = 1  # ranks (collective)
    n_bytes: int = 0  # bytes: collective payload per rank, or a ceiling kernel's buffer
    fmt: str = "bf16"  # weight / cache format: bf16, fp8, mxfp4, fp32
    variant: str = ""  # free modifier: out_fp32, final / per_token state writes, n_sweep, u_sweep, ...

    @property
    def id(self) -> str:
        """Stable, human-readable join key: family/impl/plan_key then every non-default field."""
        parts = [self.family, self.impl, self.plan_key or "-"]
        for f in fields(self):
            if f.name in ("family", "impl", "plan_key"):
                continue
            value = getattr(self, f.name)
            if value != f.default:
                parts.append(f"{f.name}={value}")
        return "/".join(parts)

    @property
    def part(self) -> str:
        return PART_OF[self.family]

    def row(self) -> dict:
        return {"id": self.id, **asdict(self)}


PART_OF = {"ceiling": "A1", "gemm": "A1", "moe": "A1", "small": "A1", "kda": "A2", "mla": "A2", "collective": "B"}
FIELDS = ["id"] + [f.name for f in fields(Point)]

# ---------------------------------------------------------------------------------------------------
# grids
# ---------------------------------------------------------------------------------------------------

GEMM_M = (1, 8, 64, 128, 256, 512, 1024, 2048)
N_SWEEP = (256, 512, 896, 1536, 2112, 3216, 3584, 6288, 7168, 10240, 20480)  # K = 7168, M = 1
# shapes no plan has, to test the GEMM law where it was not fitted: M between the grid's powers of two,
# output widths that leave partial 128-column tiles, three depths (variant "probe")
GEMM_PROBE_M = (32, 96, 192, 384, 768, 1536)
GEMM_PROBE_N = (200, 320, 640, 1000, 1408, 2304, 4608)
GEMM_PROBE_K = (1024, 2560, 7168)
MOE_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MOE_U_AT_64 = (16, 64, 128, 256, 512, 613, 896)
MOE_M_AT_U128 = (8, 32, 128, 256)
MOE_BM64_U, MOE_BM64_M = (16, 32, 64), (128, 256, 512, 1024)  # > 16 rows per expert: the BLOCK_M = 64 kernel
SMALL_M = (1, 8, 64, 256)
KDA_B = (1, 4, 16, 64, 256)
KDA_B_L2 = (8, 12, 24, 32, 48)  # split-V only: per-token state writes of 5-100 MB, around the H200's 60 MB L2
KDA_B_ABSORB = {8: (6, 20, 40), 16: (20, 40, 80, 96)}  # split-V only, T = 8 and T = 4: where L2 stops absorbing
KDA_B_DRAIN = {8: (2, 10, 28, 56, 96), 16: (10, 28, 56, 112, 160)}  # split-V only, T = 2 and 6: the drain law's test
MLA_B = (1, 8, 32, 64)
MLA_S = (512, 2048, 8192, 32768, 131072)
MLA_MAX_TOKENS = 8_400_000  # B x S: ~4.8 GB of FP8 latent cache
COLLECTIVE_SIZES = tuple(2 ** e for e in range(10, 27))  # 1 KiB .. 64 MiB
PLAN_AR_M = (1, 8, 16, 32, 64, 128, 256)

# (model, TP, layer type) whose plans the GEMM and small-kernel points come from
PLAN_SOURCES = (("kimi-k3", 8, "kda"), ("kimi-k3", 8, "mla"), ("kimi-k3", 16, "kda"), ("kimi-k3", 16, "mla"),
                ("deepseek-v3", 8, "mla"))
SMALL_KEYS = ("attn_res_pre", "attn_res_post", "shared_act", "topk", "finalize", "tail_concat", "latent_norm",
              "tail_add")


def _plan(model: str, variant: str, tp: int, batch: int, tokens: int, context: int, layer: str):
    """The plan the H200 suite measures: the stock kernels Hopper runs, the specialized kernels at any size."""
    from simulator.cost.measured import _plan as measured_plan
    return measured_plan(model, variant, tp, batch, tokens, context, layer)


def _dense_gemm_shapes() -> list[tuple[str, str, str, int, int, int, str]]:
    """(plan_key, model, layer, tp, K, N, out dtype) of every 2-D dense GEMM in the plans, first seen wins."""
    seen, out = set(), []
    for model, tp, layer in PLAN_SOURCES + tuple((m, t, "head") for m, t, _ in PLAN_SOURCES[::2][:2]) + (
            ("deepseek-v3", 8, "head"),):
        for variant in ("standard", "specialized"):
            for k in _plan(model, variant, tp, 1, 1, 512, layer):
                if k.kind not in ("gemm", "router") or len(k.weights) != 1 or len(k.reads) != 1:
                    continue
                w, x = k.weights[0], k.reads[0]
                if len(w.shape) != 2 or len(x.shape) != 2 or w.dtype != "bf16" or k.key in ("mla_absorb", "mla_w_uv"):
                    continue
                out_dtype = k.writes[0].dtype if len(k.writes) == 1 else "bf16"
                shape = (w.shape[0], w.shape[1], out_dtype)
                if shape not in seen:
                    seen.add(shape)
                    out.append((k.key, model, layer, tp, w.shape[0], w.shape[1], out_dtype))
    return out


def gemm_points() -> list[Point]:
    pts = [Point("gemm", "torch_matmul", key, model, layer, tp, M=m, K=K, N=N, fmt="bf16",
                 variant="out_fp32" if out == "fp32" else "")
           for key, model, layer, tp, K, N, out in _dense_gemm_shapes() for m in GEMM_M]
    pts += [Point("gemm", "torch_matmul", M=1, K=7168, N=n, variant="n_sweep") for n in N_SWEEP]
    pts += [Point("gemm", "torch_matmul", M=m, K=k, N=n, variant="probe")
            for k in GEMM_PROBE_K for n in GEMM_PROBE_N for m in GEMM_PROBE_M]
    return pts


def _expected_u(model: str, m: int) -> int:
    from simulator.config import load_model
    from simulator.routing import expected_unique_experts
    cfg = load_model(model)
    return max(cfg.top_k, round(expected_unique_experts(m, cfg.num_experts, cfg.top_k)))


def _layer_of(model: str) -> str:
    """The layer type most of a model's layers have: its MoE layers' attention kind."""
    from simulator.config import load_model
    from simulator.report.summary import default_layer
    return default_layer(load_model(model))


def _expert_dims(model: str, tp: int) -> tuple[int, int]:
    """(L, F_padded) of one expert's TP shard, read off the standard plan's fc2 weight [U, F, L]."""
    fc2 = _plan(model, "standard", tp, 1, 1, 512, _layer_of(model)).kernel("fc2")
    _, f, latent = fc2.weights[0].shape
    return latent, f


def moe_points() -> list[Point]:
    """fc1 is [L -> 2F] (gate|up, activation in the epilogue), fc2 is [F -> L]; K x N per expert."""
    pts = []
    configs = (("kimi-k3", 8, "mxfp4", "triton_w4a16", True), ("kimi-k3", 16, "mxfp4", "triton_w4a16", False),
               ("kimi-k3", 8, "bf16", "grouped_mm_bf16", False),
               ("deepseek-v3", 8, "fp8", "scaled_grouped_mm_fp8", False))
    for model, tp, fmt, impl, sweeps in configs:
        L, F = _expert_dims(model, tp)
        layer = "kda" if model == "kimi-k3" else "mla"
        grid = [(m, _expected_u(model, m), "") for m in MOE_M]
        if sweeps:
            grid += [(64, u, "u_sweep") for u in MOE_U_AT_64] + [(m, 128, "m_sweep") for m in MOE_M_AT_U128]
            grid += [(m, u, "bm64_sweep") for u in MOE_BM64_U for m in MOE_BM64_M]
        for m, u, variant in grid:
            pts.append(Point("moe", impl, "fc1", model, layer, tp, M=m, K=L, N=2 * F, U=u, fmt=fmt, variant=variant))
            pts.append(Point("moe", impl, "fc2", model, layer, tp, M=m, K=F, N=L, U=u, fmt=fmt, variant=variant))
    return pts


def small_points() -> list[Point]:
    return [Point("small", "empty_kernel", variant="launch_floor")] + [
        _small("triton", key, m) for m in SMALL_M for key in SMALL_KEYS]


def _small(impl: str, key: str, m: int, model: str = "kimi-k3", layer: str = "kda", tp: int = 8, b: int = 0,
           t: int = 1) -> Point:
    """The plan's small kernel `key` at M tokens (B sequences of T where given; the Kimi K3 TP8 KDA layer
    unless named): width N, top_k K, AttnRes sources n_src."""
    from simulator.cost.measured import ATTN_RES_STAND_IN, attn_res_stand_in
    plan = _plan(model, "standard", tp, m // t, t, 512, layer)
    if key in ATTN_RES_STAND_IN.values() and key not in {k.key for k in plan.kernels}:
        k = attn_res_stand_in(model, tp, m // t, t, layer, key)  # DeepSeek-V3's residual, measured as AttnRes
    else:
        k = plan.kernel(key)
    n_src = next((x.shape[0] + 1 for x in k.reads if x.name == "blocks"), 0)  # snapshots + prefix
    width = k.reads[0].shape[-1] if key == "topk" else k.writes[0].shape[-1]  # topk: E scores in
    top_k = k.reads[0].shape[1] if key == "finalize" else (k.writes[0].shape[-1] if key == "topk" else 0)
    return Point("small", impl, key, model, layer, tp, M=m, K=top_k, N=width, n_src=n_src, B=b, T=t)


def ceiling_points() -> list[Point]:
    pts = [Point("ceiling", "torch_copy", n_bytes=4 << 30, variant="copy")]
    pts += [Point("ceiling", "triton_read", n_bytes=n, variant="read")
            for n in (1 << 16, 1 << 20, 16 << 20, 256 << 20, 4 << 30)]
    pts.append(Point("ceiling", "torch_matmul", M=8192, K=8192, N=8192, variant="large_gemm"))
    return pts


def kda_points() -> list[Point]:
    grid = ((1, "final"), (8, "final"), (8, "per_token"))  # T = 1; a T = 8 verify storing the final or every state
    pts = _kda("triton", {8: KDA_B, 16: KDA_B}, grid)
    # the same points on vLLM's split-V grid (16 one-warp programs per head, gated RMSNorm in a second launch)
    pts += [replace(p, impl="triton_split_v") for p in pts]
    pts += _kda("triton_split_v", {8: KDA_B_L2, 16: KDA_B_L2}, grid)
    pts += _kda("triton_split_v", KDA_B_ABSORB, ((8, "final"), (8, "per_token"), (4, "per_token")))
    return pts + _kda("triton_split_v", KDA_B_DRAIN, ((2, "per_token"), (6, "final"), (6, "per_token")))


def _kda(impl: str, batches: dict[int, tuple[int, ...]], runs: tuple[tuple[int, str], ...]) -> list[Point]:
    """KDA decode points: for each TP degree (96 / TP heads) its batches, each with the (T, state writes) runs."""
    return [Point("kda", impl, "kda_decode", "kimi-k3", "kda", tp, M=t * b, B=b, heads=96 // tp, T=t,
                  fmt="fp32", variant=write) for tp, bs in batches.items() for b in bs for t, write in runs]


def mla_points(cache_fmt: str = "fp8") -> list[Point]:
    pts = []
    for model, tp, heads in (("kimi-k3", 8, 12), ("kimi-k3", 16, 6), ("deepseek-v3", 8, 16)):
        for b in MLA_B:
            for s in MLA_S:
                if b * s <= MLA_MAX_TOKENS:
                    pts.append(Point("mla", "triton_split_kv", "mla_decode", model, "mla", tp, M=b, B=b, heads=heads,
                                     T=1, S=s, fmt=cache_fmt))
    for b in (1, 8):  # a DSpark verify: 8 query tokens per sequence share one pass over the cache
        pts.append(Point("mla", "triton_split_kv", "mla_decode", "kimi-k3", "mla", 8, M=8 * b, B=b, heads=12, T=8,
                         S=8192, fmt=cache_fmt))
    return pts


def collective_points(ranks: int = 2) -> list[Point]:
    sizes = sorted(set(COLLECTIVE_SIZES) | {m * w * 2 for m in PLAN_AR_M for w in (7168, 10752)})
    pts = []
    for n in sizes:
        key = "attn_all_reduce" if n % (7168 * 2) == 0 and n // (7168 * 2) in PLAN_AR_M else (
            "moe_all_reduce" if n % (10752 * 2) == 0 and n // (10752 * 2) in PLAN_AR_M else "")
        for impl in ("nccl_all_reduce", "symm_one_shot", "symm_two_shot"):
            pts.append(Point("collective", impl, key, P=ranks, n_bytes=n))
    for n in COLLECTIVE_SIZES:
        pts.append(Point("collective", "nccl_reduce_scatter", P=ranks, n_bytes=n))
        pts.append(Point("collective", "nccl_all_gather", P=ranks, n_bytes=n))  # n = this rank's shard
    return pts


# ---------------------------------------------------------------------------------------------------
# production kernels: what vLLM 0.33.0 launches on Hopper (benchmarks/gpu/production.py measures them)
# ---------------------------------------------------------------------------------------------------

VLLM = "vllm==0.33.0"
PROD_BATCH = (1, 8, 64)
PROD_TOKENS = (1, 4, 8)  # one token, and a verify of 1 + 3 or 1 + 7 drafts
PROD_M = tuple(sorted({b * t for b in PROD_BATCH for t in PROD_TOKENS}))  # 1, 4, 8, 32, 64, 256, 512
PROD_MLA_S = (2048, 8192, 32768, 131072)
# impl -> (package, production kernel, what stands in for what): the docs page and each CSV row name these
PRODUCTION_IMPLS = {
    "vllm_triton_moe_bf16": (VLLM, "Triton fused_moe_kernel (fused_moe.py), bf16 experts", ""),
    "vllm_triton_moe_fp8": (VLLM, "Triton fused_moe_kernel (fused_moe.py), FP8 experts in 128 x 128 blocks", ""),
    "vllm_marlin_moe": (VLLM, "_moe_C::moe_wna16_marlin_gemm (Marlin MoE, MXFP4 weights, bf16 activations)", ""),
    "flashmla_fp8": (VLLM, "_flashmla_extension_C::fwd_kvcache_mla_fp8 (FlashMLA decode, FP8 latent cache)", ""),
    "flashmla_bf16": (VLLM, "_flashmla_C::dense_decode_fwd (FlashMLA decode, bf16 latent cache)", ""),
    "vllm_fused_recurrent": (VLLM, "Triton fused_recurrent_kda_fwd_kernel (K3 third_party/kda)", ""),
    "vllm_packed_decode": (VLLM, "Triton fused_recurrent_kda_packed_decode_kernel (K3 third_party/kda)",
                           "stand-in for _C::fused_kda_decode (in the 92 MB _C_stable_libtorch, not carried)"),
    "vllm_topk_sigmoid": (VLLM, "_moe_C::topk_sigmoid (sigmoid scores, bias-corrected top-k, renormalise)", ""),
    "vllm_grouped_topk": (VLLM, "_moe_C::grouped_topk (one group: the K3 router's configuration)", ""),
    "vllm_moe_sum": (VLLM, "_moe_C::moe_sum (sum of the top-k expert outputs per token)", ""),
    "torch_rms_norm": ("torch", "torch.nn.functional.rms_norm",
                       "stand-in for _C::rms_norm (in the 92 MB _C_stable_libtorch, not carried)"),
    "torch_matmul": ("torch", "cuBLAS through torch.matmul", ""),
    "triton_matmul_ogs": (VLLM, "triton_kernels matmul_ogs (vllm/third_party/triton_kernels), MXFP4 experts in the "
                                "Hopper layouts: fc1 with the gather and fused SwiGLU, fc2's matmul", ""),
    "torch_linear": ("torch", "cuBLAS through F.linear on nn.Linear's [N, K] weight (vLLM's unquantized linear)", ""),
    "torch_addmm": ("torch", "cuBLAS through torch.addmm with the bias, weight [N, K] as nn.Linear holds it "
                             "(vLLM's F.linear for gpt-oss's biased projections)", ""),
    # the plan's small kernels as the whole-layer replay launches them (layer_replay.Layer, fam_production)
    "vllm_attn_res": (VLLM, "Triton _attn_res_kernel (kimi_k3/nvidia/ops/attn_res.py)",
                      "DeepSeek-V3 (no blocks): stand-in for _C::fused_add_rms_norm (not carried)"),
    "vllm_topk_align": (VLLM, "_moe_C::grouped_topk, then _moe_C::moe_align_block_size where vLLM aligns "
                              "(Marlin always; Triton fused_moe when M k 4 > E)", ""),
    "vllm_causal_conv1d": (VLLM, "Triton causal_conv1d_update (mamba/ops/causal_conv1d.py)", ""),
    "fla_gated_rms_norm": (VLLM, "FLA Triton rms_norm_gated, sigmoid gate (third_party/.../kda.py)", ""),
    "triton_situ_mul": ("moe-sim", "the GPU suite's Triton SiTU-and-mul (fam_small.situ_mul)",
                        "stand-in for _C::silu_and_mul / situ_and_mul (not carried)"),
    "vllm_fa3": (VLLM, "_vllm_fa3_C::fwd (FlashAttention 3, paged bf16 KV, sinks, num_splits 32)", ""),
    "vllm_triton_unified": (VLLM, "Triton kernel_unified_attention_2d / _3d + reduce_segments "
                                  "(v1/attention/ops/triton_unified_attention.py)",
                            "stand-in for FlashAttention 3 in the gpt-oss layer replays"),
    "torch_cat": ("torch", "torch.cat", ""),
    "torch_add": ("torch", "torch.add", ""),
    "torch_fp8_copy": ("torch", "one copy to FP8 of the query rows and the new cache row",
                       "stand-in for vLLM's fused concat + FP8 quantisation + cache insert"),
}
# plan key -> implementation of the replay's small kernels that had no production law (round 2);
# mla_norm: torch_rms_norm, one launch over the q and kv latents in 512-wide groups (a stand-in)
REPLAY_SMALL = {"attn_res_pre": "vllm_attn_res", "attn_res_post": "vllm_attn_res", "topk": "vllm_topk_align",
                "kda_conv": "vllm_causal_conv1d", "kda_gated_norm": "fla_gated_rms_norm",
                "shared_act": "triton_situ_mul", "tail_concat": "torch_cat", "tail_add": "torch_add",
                "mla_norm": "torch_rms_norm", "mla_cache_insert": "torch_fp8_copy"}


ADDMM_M = (1, 8, 32, 64, 256)


def addmm_points() -> list[Point]:
    """The GEMMs with a bias of gpt-oss-20b and -120b (qkv, o_proj, router) at TP1-8: cuBLAS through torch.addmm
    on nn.Linear's [N, K] weight, as vLLM's unquantized linear calls it (F.linear with the bias). The two models
    share their attention shapes; the routers differ (32 and 128 experts)."""
    sources = [(model, tp) for model in ("gpt-oss-20b", "gpt-oss-120b") for tp in (1, 2, 4, 8)]
    return _plan_gemm_points("torch_addmm", sources, ADDMM_M, bias=True, per_model=False)


def _plan_gemm_points(impl: str, sources, ms: tuple[int, ...], bias: bool, per_model: bool) -> list[Point]:
    """`impl`'s points at each M of `ms` for every GEMM of a 2-D weight (and a bias of its N outputs, where `bias`)
    in the standard plans of `sources` ((model, TP) pairs, each at its own layer type): the first plan kernel of
    each shape wins, the shape counted per model where `per_model`."""
    pts, seen = [], set()
    for model, tp in sources:
        layer = _layer_of(model)
        for k in _plan(model, "standard", tp, 1, 1, 512, layer):
            w = k.weights
            if (k.family != "gemm" or len(w) != 1 + bias or len(w[0].shape) != 2
                    or (bias and w[1].shape != (w[0].shape[1],))):
                continue
            K, N = w[0].shape
            shape = (model, K, N) if per_model else (K, N)
            if shape not in seen:
                seen.add(shape)
                pts += [Point("gemm", impl, k.key, model, layer, tp, M=m, K=K, N=N) for m in ms]
    return pts


OGS_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def ogs_points() -> list[Point]:
    """gpt-oss-20b's experts on Hopper as vLLM's TRITON MXFP4 backend runs them: triton_kernels' matmul_ogs,
    fc1 (gather + fused SwiGLU) and fc2's matmul (its scatter's reduce is the plan's `finalize`), at TP1 and
    one TP2 rank, M tokens routed to the expected U of the rank's 32 experts (gptoss_replay.py --ogs-points)."""
    pts = []
    for tp in (1, 2):
        L, F = _expert_dims("gpt-oss-20b", tp)
        for m in OGS_BATCHES:
            u = _expected_u("gpt-oss-20b", m)
            pts += [Point("moe", "triton_matmul_ogs", "fc1", "gpt-oss-20b", "gqa", tp, M=m, K=L, N=2 * F, U=u,
                          fmt="mxfp4"),
                    Point("moe", "triton_matmul_ogs", "fc2", "gpt-oss-20b", "gqa", tp, M=m, K=F, N=L, U=u, fmt="mxfp4")]
    return pts


def linear_points() -> list[Point]:
    """The grid's cuBLAS GEMMs (torch_matmul rows: x @ W on a [K, N] weight) launched as vLLM's unquantized
    linear launches them, F.linear on nn.Linear's [N, K] weight: the same shapes and M (a layout probe, its own
    folder, production/layout)."""
    return [replace(p, impl="torch_linear") for p in production_points()
            if p.family == "gemm" and p.impl == "torch_matmul" and p.variant != "out_fp32"]


def production_points() -> list[Point]:
    """The production kernels at the plans' per-rank shapes: Kimi K3 at TP8 and TP16 (DeepSeek-V3 TP8 for
    MLA), batches 1, 8, 64, one token and a 1 + 3 / 1 + 7 verify. Not part of all_points (another impl set)."""
    pts = []
    for tp in (8, 16):
        L, F = _expert_dims("kimi-k3", tp)
        for m in PROD_M:
            u = _expected_u("kimi-k3", m)
            pts.append(Point("moe", "vllm_marlin_moe", "fc1", "kimi-k3", "kda", tp, M=m, K=L, N=2 * F, U=u,
                             fmt="mxfp4"))
            pts.append(Point("moe", "vllm_marlin_moe", "fc2", "kimi-k3", "kda", tp, M=m, K=F, N=L, U=u, fmt="mxfp4"))
    for impl, model, fmt in (("vllm_triton_moe_bf16", "kimi-k3", "bf16"),
                             ("vllm_triton_moe_fp8", "deepseek-v3", "fp8")):
        L, F = _expert_dims(model, 8)  # Triton is vLLM's Hopper choice for bf16 and block-FP8 experts under TP
        layer = "kda" if model == "kimi-k3" else "mla"
        for m in PROD_M:
            u = _expected_u(model, m)
            pts.append(Point("moe", impl, "fc1", model, layer, 8, M=m, K=L, N=2 * F, U=u, fmt=fmt))
            pts.append(Point("moe", impl, "fc2", model, layer, 8, M=m, K=F, N=L, U=u, fmt=fmt))
    for impl, fmt in (("flashmla_fp8", "fp8"), ("flashmla_bf16", "bf16")):
        for model, tp, heads in (("kimi-k3", 8, 12), ("kimi-k3", 16, 6), ("deepseek-v3", 8, 16)):
            for b in PROD_BATCH:
                pts += [Point("mla", impl, "mla_decode", model, "mla", tp, M=b, B=b, heads=heads, S=s, fmt=fmt)
                        for s in PROD_MLA_S if b * s <= MLA_MAX_TOKENS]
                pts += [Point("mla", impl, "mla_decode", model, "mla", tp, M=b * t, B=b, heads=heads, T=t, S=8192,
                              fmt=fmt) for t in PROD_TOKENS[1:]]
    for tp in (8, 16):
        pts += _kda("vllm_packed_decode", {tp: PROD_BATCH}, ((1, "final"),))
        pts += _kda("vllm_fused_recurrent", {tp: PROD_BATCH}, ((1, "final"), (4, "per_token"), (8, "per_token")))
    for m in PROD_M:
        pts += [_small(impl, key, m) for impl, key in (
            ("vllm_topk_sigmoid", "topk"), ("vllm_grouped_topk", "topk"), ("vllm_moe_sum", "finalize"),
            ("torch_rms_norm", "latent_norm"))]
    pts += replay_small_points()
    shapes = [s for s in _dense_gemm_shapes() if s[3] == 8]
    pts += [Point("gemm", "torch_matmul", key, model, layer, tp, M=m, K=K, N=N, fmt="bf16",
                  variant="out_fp32" if out == "fp32" else "")
            for key, model, layer, tp, K, N, out in shapes for m in PROD_BATCH]
    pts += addmm_points() + ogs_points()
    return _unique(pts)


# impl -> (model, layer, format, batch sizes at vLLM's pick, M = 32's forced stage counts, batch sizes at 5 stages)
TILE_PROBE = {"vllm_triton_moe_fp8": ("deepseek-v3", "mla", "fp8", (16, 24, 48), (2, 3, 4), (16, 48, 64)),
              "vllm_triton_moe_bf16": ("kimi-k3", "kda", "bf16", (16, 48), (2, 3, 5), ())}


def tile_probe_points() -> list[Point]:
    """The Triton MoE's tile, probed (moe_probe.csv: priced by the laws, never fitted): vLLM's own picks at batch
    sizes the grid skips, and launches with num_stages forced off vLLM's pick (variant "stages=S": M = 32 at
    several, other batch sizes at five), which change only the programs an SM holds (simulator/cost/engine_tiles.py).
    Appended to the grid's moe.csv once measured: the rows that pin the law's round-trip term."""
    pts = []
    for impl, (model, layer, fmt, ms, stages, five) in TILE_PROBE.items():
        L, F = _expert_dims(model, 8)
        for m, variant in [(m, "") for m in ms] + [(32, f"stages={s}") for s in stages] + [(m, "stages=5")
                                                                                          for m in five]:
            u = _expected_u(model, m)
            pts += [Point("moe", impl, "fc1", model, layer, 8, M=m, K=L, N=2 * F, U=u, fmt=fmt, variant=variant),
                    Point("moe", impl, "fc2", model, layer, 8, M=m, K=F, N=L, U=u, fmt=fmt, variant=variant)]
    return pts


GQA_BATCH = (1, 4, 8, 16, 32, 64)
GQA_CONTEXT = {"full": (512, 1720, 8192, 32768), "sliding": (1720, 8192)}  # cached positions before the step


def gqa_points() -> list[Point]:
    """gpt-oss-20b's paged GQA decode (gqa_rows.py) at TP1 and one TP2 rank, one token per sequence, its sliding
    (128-position window) and full layers: FlashAttention 3, what vLLM runs on Hopper, and the Triton unified
    attention the layer replays stood in with. S: positions cached before the step."""
    return [Point("gqa", impl, "gqa_decode", "gpt-oss-20b", "gqa", tp, M=b, B=b, S=s, variant=kind)
            for impl in ("vllm_fa3", "vllm_triton_unified") for tp in (1, 2) for kind, ctxs in GQA_CONTEXT.items()
            for s in ctxs for b in GQA_BATCH]


# models the laws were never fitted on, at the TP degrees a deployment of each would use on H200s: the
# out-of-sample check of the production set's laws (predict.py --set others, before production.py / gqa_rows.py
# --points others measure them)
OTHER_MODELS = (("qwen3-moe-30b", 1), ("qwen3-moe-30b", 2), ("qwen3-moe-235b", 4), ("qwen3-moe-235b", 8),
                ("mixtral-8x7b", 2), ("mixtral-8x7b", 4))
OTHER_GEMM_M = (1, 8, 64)
OTHER_MOE_M = (1, 4, 8, 16, 32, 64, 256)
OTHER_GQA = (("qwen3-moe-30b", 1), ("qwen3-moe-235b", 8), ("mixtral-8x7b", 2))
OTHER_GQA_B = (1, 8, 32, 64)
OTHER_GQA_S = (2048, 8192, 32768)


def other_model_points() -> list[Point]:
    """Qwen3-30B-A3B, Qwen3-235B-A22B and Mixtral-8x7B (GQA, bf16 experts) as vLLM 0.33.0 runs them on Hopper:
    their dense GEMMs (cuBLAS), their experts (Triton fused_moe, vLLM's tuned H200 tile for their E and N) and
    their decode attention (FlashAttention 3, head dim 128, no sinks, no window). None of these shapes is in the
    grid the laws were fitted on."""
    pts = _plan_gemm_points("torch_matmul", OTHER_MODELS, OTHER_GEMM_M, bias=False, per_model=True)
    for model, tp in OTHER_MODELS:
        layer = _layer_of(model)
        L, F = _expert_dims(model, tp)
        for m in OTHER_MOE_M:
            u = _expected_u(model, m)
            pts += [Point("moe", "vllm_triton_moe_bf16", "fc1", model, layer, tp, M=m, K=L, N=2 * F, U=u),
                    Point("moe", "vllm_triton_moe_bf16", "fc2", model, layer, tp, M=m, K=F, N=L, U=u)]
    for model, tp in OTHER_GQA:
        pts += [Point("gqa", "vllm_fa3", "gqa_decode", model, "gqa", tp, M=b, B=b, S=s, variant="full")
                for s in OTHER_GQA_S for b in OTHER_GQA_B]
    return _unique(pts)


def replay_small_points() -> list[Point]:
    """REPLAY_SMALL's kernels at the standard plans' shapes: Kimi K3 TP8 and TP16 (KDA layer), DeepSeek-V3 TP8
    (MLA layer), M over PROD_M as one token per sequence; the KDA verify's conv and gated norm (plans with
    T > 1 only) at B in PROD_BATCH x T in 4, 8."""
    from simulator.cost.measured import ATTN_RES_STAND_IN
    pts = []
    for model, layer, tp in (("kimi-k3", "kda", 8), ("kimi-k3", "kda", 16), ("deepseek-v3", "mla", 8)):
        keys = [ATTN_RES_STAND_IN.get(k.key, k.key) for k in _plan(model, "standard", tp, 8, 4, 512, layer)]
        keys = [k for k in keys if k in REPLAY_SMALL]
        for key in keys:
            shapes = ([(b, t) for b in PROD_BATCH for t in PROD_TOKENS[1:]] if key.startswith("kda_")
                      else [(m, 1) for m in PROD_M])
            pts += [_small(REPLAY_SMALL[key], key, b * t, model, layer, tp, b, t) for b, t in shapes]
    return pts


def _unique(pts: list[Point]) -> list[Point]:
    ids = [p.id for p in pts]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise AssertionError(f"duplicate point ids: {sorted(dup)[:5]}")
    return pts


@lru_cache(maxsize=1)
def all_points() -> tuple[Point, ...]:
    pts = (ceiling_points() + gemm_points() + moe_points() + small_points() + kda_points() + mla_points()
           + collective_points())
    return tuple(_unique(pts))


def points_of(part: str | None = None, family: str | None = None) -> list[Point]:
    return [p for p in all_points() if (part is None or p.part == part) and (family is None or p.family == family)]


if __name__ == "__main__":
    from collections import Counter
    counts = Counter((p.part, p.family) for p in all_points())
    for (part, family), n in sorted(counts.items()):
        print(f"{part:3s} {family:11s} {n:4d}")
    print(f"total {len(all_points())}")
