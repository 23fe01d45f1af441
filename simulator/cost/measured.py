"""Price a measured GPU point with the cost model: the join between calibration CSVs and the plans.

A measurement row (benchmarks/gpu/points.py, calibration/h200/*.csv) names a family, an implementation,
the plan kernel it measures (`plan_key`) and its shape. `point_kernel` rebuilds that kernel: for plan
kernels it builds the plan at the row's shape and takes the kernel by key (so the bytes and FLOPs are
the plan's own declarations); synthetic rows (ceilings, N sweep, fixed-U MoE sweeps) get a kernel of
the same kind with the measured tensors. `price_row` then prices it the way the timeline would, with
the launch gap of a kernel that follows another one in a CUDA graph (no PDL): the suite replays the
same kernel back to back, so each measured launch pays one gap.

Collectives are priced with the algorithm the implementation runs: NCCL all-reduce with the model's
NCCL ring, symmetric-memory one-shot / two-shot with those, reduce-scatter and all-gather with theirs.

Dimension legend: M tokens, K x N a GEMM weight, U unique experts, B sequences, T tokens per sequence,
S cached tokens, P ranks, n_bytes collective payload per rank.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any, Mapping

from simulator.cost import collectives as coll
from simulator.cost.laws import COLLECTIVE_ALGORITHM
from simulator.cost.pricing import price_kernel
from simulator.hardware import HardwareProfile
from simulator.plans.kernel import Collective, DecodeShape, Kernel, Tensor

INT_FIELDS = ("tp", "M", "K", "N", "U", "B", "heads", "T", "S", "n_src", "P", "n_bytes")
# KDA implementations priced as vLLM's split-V recurrence (the suite's copy of its grid, and vLLM's own
# Triton kernels: the verify's fused_recurrent and the one-token packed decode)
SPLIT_V_IMPLS = ("triton_split_v", "vllm_fused_recurrent", "vllm_packed_decode")
# value columns per program of the grid each ran: the suite's copy 8, the packed decode 32; vLLM's fused_recurrent
# picks by sequences x heads at every T (kda.kda_bv's verify rule: 4 at B = 1 on Kimi K3)
RECURRENT_BV = {"triton_split_v": 8, "vllm_packed_decode": 32}


def normalise(row: Mapping[str, Any]) -> dict[str, Any]:
    """CSV strings -> typed fields (ints for sizes; empty strings stay empty)."""
    out = dict(row)
    for f in INT_FIELDS:
        out[f] = int(float(out.get(f) or 0))
    out["T"] = out["T"] or 1
    return out


@lru_cache(maxsize=512)
def _plan(model: str, variant: str, tp: int, batch: int, tokens: int, context: int, layer: str):
    from simulator.config import load_model
    from simulator.cost.step import head_plan
    cfg, shape = load_model(model), DecodeShape(batch, tokens, context)
    if layer == "head":
        return head_plan(cfg, tp, shape, variant, False)
    if variant == "standard":  # the rows are H200 (SM90) measurements: the stock kernels Hopper runs
        from simulator.cost.step import representative_layer
        from simulator.plans import standard
        return standard.build(cfg, tp, shape, layer, representative_layer(cfg, layer), arch="sm90")
    from simulator.cost.step import representative_layer
    from simulator.plans import specialized  # the kernels the measurements were taken of, at any size
    return specialized.build(cfg, tp, shape, layer, representative_layer(cfg, layer),
                             frozenset(specialized.FUSIONS) - specialized.SOURCE_MERGES, fallback=False)


def _act(name: str, *shape: int, dtype: str = "bf16") -> Tensor:
    return Tensor(name, tuple(shape), dtype)


def point_kernel(row: Mapping[str, Any]) -> Kernel:
    """The kernel the cost model prices for one measured point (module docstring)."""
    r = normalise(row)
    builder = {"ceiling": _ceiling, "gemm": _gemm, "moe": _moe, "small": _small, "kda": _kda, "mla": _mla,
               "gqa": _gqa, "collective": _collective}
    if r["family"] not in builder:
        raise ValueError(f"no kernel for family {r['family']!r}")
    return replace(builder[r["family"]](r), pdl=False, prefetch_bytes=0)


def _ceiling(r: dict) -> Kernel:
    if r["variant"] == "large_gemm":
        return _gemm(r)
    n = r["n_bytes"]
    writes = (_act("dst", n // 2),) if r["variant"] == "copy" else ()
    return Kernel("ceiling", r["impl"], "pointwise", family="small", reads=(_act("src", n // 2),), writes=writes)


def _gemm(r: dict) -> Kernel:
    kind = _plan_kind(r) if r["plan_key"] and r["model"] else "gemm"
    out = "fp32" if r["variant"] == "out_fp32" else "bf16"
    M, K, N = r["M"], r["K"], r["N"]
    bias = (_act("b", N),) if r["impl"] == "torch_addmm" else ()  # y = x W^T + b: the bias epilogue reads N
    return Kernel(r["plan_key"] or "gemm", r["impl"], kind, family="gemm",
                  reads=(_act("x", M, K),), writes=(_act("y", M, N, dtype=out),),
                  weights=(_act("w", K, N),) + bias, flops=2 * M * K * N)


def _plan_kind(r: dict) -> str:
    """The plan kernel's kind (the router is priced as a 'router' kernel, other GEMMs as 'gemm')."""
    for variant in ("standard", "specialized"):
        plan = _plan(r["model"], variant, r["tp"], 1, 1, 512, r["layer"])
        for k in plan:
            if k.key == r["plan_key"]:
                return k.kind
    raise ValueError(f"plan kernel {r['plan_key']!r} not found in {r['model']} TP{r['tp']} {r['layer']}")


def _moe(r: dict) -> Kernel:
    """The plan's fc1 / fc2 at M tokens with exactly U experts' shards in the measured format."""
    kernel = _plan(r["model"], "standard", r["tp"], r["M"], 1, 512, r["layer"]).kernel(r["plan_key"])
    w = kernel.weights[0]
    return replace(kernel, weights=(Tensor(w.name, (r["U"],) + w.shape[1:], r["fmt"]),))


def _small(r: dict) -> Kernel:
    if r["variant"] == "launch_floor":
        return Kernel("empty_kernel", "empty_kernel", "pointwise", family="small")
    t = r["T"] or 1  # a kernel of the verify plans only (the KDA conv, its gated norm) is measured at T > 1
    plan = _plan(r["model"], "standard", r["tp"], r["M"] // t, t, 512, r["layer"])
    if r["plan_key"] in ATTN_RES_STAND_IN.values() and r["plan_key"] not in {k.key for k in plan.kernels}:
        return attn_res_stand_in(r["model"], r["tp"], r["M"] // t, t, r["layer"], r["plan_key"])
    return plan.kernel(r["plan_key"])


# a plain residual's add + norm kernel -> the AttnRes kernel measured in its place at one source (DeepSeek-V3's
# rows of calibration/h200/production, taken when its plans ran the AttnRes kernel)
ATTN_RES_STAND_IN = {"input_norm": "attn_res_pre", "post_attn_norm": "attn_res_post"}


def attn_res_stand_in(model: str, tp: int, batch: int, tokens: int, layer: str, key: str) -> Kernel:
    """vLLM's AttnRes + norm kernel `key` at a plain-residual model's shape, launched with PDL: what was measured,
    though that model's plans run fused_add_rms_norm instead (plans/common.py `residual_pre`)."""
    from simulator.config import load_model
    from simulator.cost.step import representative_layer
    from simulator.plans import common as c
    cfg = load_model(model)
    d = c.make_dims(cfg, tp, DecodeShape(batch, tokens, 512), representative_layer(cfg, layer), layer)
    return (c.attn_res_pre if key == "attn_res_pre" else c.attn_res_post)(d, c.PDL)


def _kda(r: dict) -> Kernel:
    """A split-V row is vLLM's fused_recurrent (the standard fallback's recurrence, 16 one-warp programs per
    head, a round trip per token: the suite's copy of its grid and vLLM's own Triton kernels); the
    one-program-per-head rows are the fused KDA decode kernel of the specialized plan (one CTA per head).
    Each stores the states the row's variant says: the final one, or one per token of a verify
    ([B, T - 1, heads, H, H] beside the final state)."""
    if r["impl"] in SPLIT_V_IMPLS:
        from simulator.config import load_model
        from simulator.cost.step import representative_layer
        from simulator.attention import kda
        from simulator.plans.common import Dims
        cfg = load_model(r["model"])
        d = Dims(cfg, r["tp"], DecodeShape(r["B"], r["T"], 512), representative_layer(cfg, "kda"))
        kernel = kda.kda_recurrent(d, bv=RECURRENT_BV.get(r["impl"]) or kda.kda_bv(
            Dims(cfg, r["tp"], DecodeShape(r["B"], max(r["T"], 2), 512), representative_layer(cfg, "kda"))))
    else:
        kernel = _plan(r["model"], "specialized", r["tp"], r["B"], r["T"], 512, "kda").kernel("kda_decode")
    final = tuple(t for t in kernel.writes if len(t.shape) != 5)
    state = next(t for t in kernel.reads if len(t.shape) == 4)
    b, heads, h, _ = state.shape
    per_token = (Tensor("kda.state_tokens", (b, r["T"] - 1, heads, h, h), "fp32"),)
    return replace(kernel, writes=final + (per_token if r["variant"] == "per_token" and r["T"] > 1 else ()))


def _mla(r: dict) -> Kernel:
    """The plan's MLA decode at a cache of S tokens after this step, the cache in the measured format."""
    kernel = _plan(r["model"], "standard", r["tp"], r["B"], r["T"], r["S"] - r["T"], "mla").kernel("mla_decode")
    reads = tuple(Tensor(t.name, t.shape, r["fmt"]) if t.name in ("mla.cache", "mla.qcat") else t for t in kernel.reads)
    return replace(kernel, reads=reads)


def _gqa(r: dict) -> Kernel:
    """The plan's paged GQA decode at B sequences of S cached positions before this step (T tokens each), on the
    model's first layer with the row's window: variant "sliding" or "full" (gpt-oss alternates them)."""
    from simulator.config import load_model
    from simulator.plans import standard
    cfg = load_model(r["model"])
    layers = [i for i in range(cfg.num_layers) if cfg.layer_type(i) == "gqa"
              and bool(cfg.gqa_window(i)) == (r["variant"] == "sliding")]
    if not layers:
        raise ValueError(f"{r['model']} has no {r['variant'] or 'full'} GQA layer")
    plan = standard.build(cfg, r["tp"], DecodeShape(r["B"], r["T"], r["S"]), "gqa", layers[0], arch="sm90")
    return plan.kernel("gqa_decode")


COLLECTIVE_OP = {"nccl_all_reduce": "all_reduce", "symm_one_shot": "all_reduce", "symm_two_shot": "all_reduce",
                 "nccl_reduce_scatter": "reduce_scatter", "nccl_all_gather": "all_gather"}


def _collective(r: dict) -> Kernel:
    """A standalone exchange of n_bytes per rank over P ranks (the op the implementation runs)."""
    op = COLLECTIVE_OP[r["impl"]]
    return Kernel(r["plan_key"] or op, r["impl"], "collective", family="collective",
                  collective=Collective(op, r["n_bytes"], r["P"]))


def price_row(row: Mapping[str, Any], hw: HardwareProfile) -> dict[str, Any]:
    """{model_us, launch_us, fixed_us, mem_us, math_us, comm_us, bytes, flops, bound, algorithm} of one row."""
    r = normalise(row)
    if r["family"] == "collective":
        return _price_collective(r, hw)
    cost = price_kernel(point_kernel(r), hw)
    return {"model_us": cost.launch_us + cost.duration_us, "launch_us": cost.launch_us, "fixed_us": cost.fixed_us,
            "mem_us": cost.mem_us, "math_us": cost.math_us, "comm_us": cost.comm_us, "bytes": cost.bytes,
            "flops": cost.flops, "bound": cost.bound, "algorithm": ""}


def _price_collective(r: dict, hw: HardwareProfile) -> dict[str, Any]:
    algo = COLLECTIVE_ALGORITHM[r["impl"]]
    fn = {"ring": coll.ring, "one_shot": coll.one_shot, "two_shot": coll.two_shot,
          "reduce_scatter": coll.reduce_scatter, "all_gather": coll.all_gather}[algo]
    cost = fn(r["n_bytes"], r["P"], hw)
    return {"model_us": hw.launch_gap_us + cost.time_us, "launch_us": hw.launch_gap_us, "fixed_us": 0.0,
            "mem_us": 0.0, "math_us": 0.0, "comm_us": cost.time_us, "bytes": r["n_bytes"], "flops": 0,
            "bound": "latency" if cost.latency_bound else "communication", "algorithm": algo}
