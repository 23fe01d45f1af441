"""Numerical equivalence check: reference vs standard vs specialized for one or more layer types.

For every layer type the check builds both plans, runs them over P simulated ranks in the chosen
precision, runs the float64 single-device reference on the same weights, inputs and state, and
reports per output tensor and per state tensor:

    max_abs_error  = max |x - x_ref|
    rel_rms_error  = ||x - x_ref||_2 / ||x_ref||_2          (scale-free, STYLE item 18)

and the routing agreement: a token "flips" when its selected expert set differs from the
reference's. A flip is legitimate only when the reference's selection margin (gap between the
k-th and (k+1)-th biased score) is below the precision's flip bound: rounding cannot move a
score by more than that. Rows of flipped tokens are excluded from the output errors (they are
reported as flips instead), so the tolerance measures rounding, not discrete decisions.

Tolerances (one table, tuned on the tiny and full-size models with a safety factor):
    fp64 : rel RMS 1e-12  (algebraic identity: only re-association differs)
    fp32 : rel RMS 1e-5
    bf16 : rel RMS 3e-2 for bf16 tensors, 8e-2 for the FP8 cache rows; flips only below margin 2e-2
       (observed max 1.1e-2 on tiny-deepseek, 3e-3 on tiny-k3: about the score shift of a 1% upstream error)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator import attention
from simulator.config import ModelConfig
from simulator.dtypes import Precision
from simulator.errors import UserError
from simulator.execute import DEFAULT_BACKEND, run_plan
from simulator.plans.builders import BUILDERS
from simulator.plans.common import Dims, make_dims
from simulator.plans.kernel import DecodeShape
from simulator.reference import reference_layer
from simulator.state import LayerIO, LayerState
from simulator.weights import FP32_KINDS, LayerWeights, weight_spec, weight_table

REL_RMS_TOL = {"fp64": 1e-12, "fp32": 1e-5, "bf16": 3e-2}
FP8_REL_RMS_TOL = {"fp64": 1e-12, "fp32": 1e-5, "bf16": 8e-2}
FLIP_MARGIN = {"fp64": 1e-9, "fp32": 1e-4, "bf16": 2e-2}


@dataclass
class TensorError:
    name: str
    max_abs_error: float
    rel_rms_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return bool(self.rel_rms_error <= self.tolerance)


@dataclass
class VariantResult:
    variant: str
    kernel_count: int
    tensors: list[TensorError]
    flips: list[dict[str, float]]  # {"token": t, "margin": m}
    flip_bound: float

    @property
    def max_abs_error(self) -> float:
        return max(t.max_abs_error for t in self.tensors)

    @property
    def rel_rms_error(self) -> float:
        return max(t.rel_rms_error for t in self.tensors)

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tensors) and all(f["margin"] < self.flip_bound for f in self.flips)


@dataclass
class LayerCheck:
    layer: str
    layer_index: int
    variants: dict[str, VariantResult] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.variants.values())


def make_inputs(cfg: ModelConfig, d: Dims, rng: np.random.Generator) -> tuple[LayerIO, LayerState]:
    """A residual stream entering layer d.layer (O(1) rows) and a state for `context` past tokens."""
    M, D = d.M, d.D
    io = LayerIO(prefix=rng.standard_normal((M, D)), delta=rng.standard_normal((M, D)) * 0.5,
                 blocks=[rng.standard_normal((M, D)) for _ in range(d.n_blocks)])
    return io, attention.initial_state(cfg, cfg.attn_kinds[d.layer], d.shape, rng)


def check_layer(cfg: ModelConfig, layer_type: str, tp: int, shape: DecodeShape, precision: str,
                seed: int = 0, all_reduce: str = "one_shot", layer: int | None = None,
                weights: LayerWeights | None = None, backend: str = DEFAULT_BACKEND) -> LayerCheck:
    prec = Precision(precision)
    d = make_dims(cfg, tp, shape, layer, layer_type)
    plans = {name: build(cfg, tp, shape, layer_type, d.layer) for name, build in BUILDERS.items()}
    io, state = make_inputs(cfg, d, np.random.default_rng(seed))
    if weights is None:
        weights = LayerWeights(cfg, d.layer, seed)
        weights.materialize(n for n, size in _layer_weight_sizes(cfg, layer_type).items() if size)  # on every core
    ref_io, ref_state, ref_diag = reference_layer(cfg, d.layer, d.shape, weights, io, state)
    result = LayerCheck(layer_type, d.layer)
    for name, plan in plans.items():
        out, new_state, diag = run_plan(plan, d, weights, io, state, prec, all_reduce, backend)
        flips = _flips(ref_diag, diag, d.shape.tokens)
        keep = np.ones(d.M, dtype=bool)
        keep[[f["token"] for f in flips]] = False
        tensors = _output_errors(out, ref_io, keep, precision) + _state_errors(new_state, ref_state, d, precision)
        result.variants[name] = VariantResult(name, len(plan), tensors, flips, FLIP_MARGIN[precision])
    return result


def _flips(ref_diag: dict[str, Any], diag: dict[str, Any], tokens: int) -> list[dict[str, float]]:
    if "topk_idx" not in ref_diag:
        return []
    flips = []
    for t in range(tokens):
        if set(ref_diag["topk_idx"][t].tolist()) != set(diag["topk_idx"][t].tolist()):
            flips.append({"token": t, "margin": float(ref_diag["margin"][t])})
    return flips


ERR_BLOCK = 1 << 21  # elements a step when comparing: a batch-64 KDA state is 67 M float64 values (0.5 GB)


def _err(name: str, x: np.ndarray, ref: np.ndarray, tol: float) -> TensorError:
    """Max |x - ref| and ||x - ref|| / ||ref|| in float64, ERR_BLOCK elements at a time: whole-array
    temporaries (two float64 copies, the difference, its absolute value) were 2 GB for that state."""
    xs, refs = x.reshape(-1), ref.reshape(-1)
    max_abs, sq_diff, sq_ref = 0.0, 0.0, 0.0
    for i in range(0, xs.size, ERR_BLOCK):
        r = refs[i:i + ERR_BLOCK].astype(np.float64)
        diff = xs[i:i + ERR_BLOCK].astype(np.float64) - r
        max_abs = max(max_abs, float(np.max(np.abs(diff))))
        sq_diff, sq_ref = sq_diff + float(diff @ diff), sq_ref + float(r @ r)
    return TensorError(name, max_abs, float(np.sqrt(sq_diff)) / (float(np.sqrt(sq_ref)) or 1.0), tol)


def _output_errors(out: LayerIO, ref: LayerIO, keep: np.ndarray, precision: str) -> list[TensorError]:
    tol = REL_RMS_TOL[precision]
    errors = [_err("prefix", out.prefix, ref.prefix, tol), _err("moe_out", out.delta[keep], ref.delta[keep], tol)]
    errors += [_err(f"block.{i}", b, rb, tol) for i, (b, rb) in enumerate(zip(out.blocks, ref.blocks))]
    return errors


def _state_errors(state: LayerState, ref: LayerState, d: Dims, precision: str) -> list[TensorError]:
    """The state tensors the layer's attention kind compares (its registry entry's `state_errors`): within the
    precision's tolerance, the FP8 one for a tensor stored in FP8, or exactly (listed only when they differ)."""
    errors = []
    for name, x, want, tol in attention.kind(d.attn).state_errors(state, ref, d.shape):
        if tol == "exact":
            if not np.array_equal(x, want):
                errors.append(TensorError(name, float("inf"), float("inf"), 0.0))
            continue
        errors.append(_err(name, x, want, (FP8_REL_RMS_TOL if tol == "fp8" else REL_RMS_TOL)[precision]))
    return errors


def layer_types(cfg: ModelConfig, which: str) -> list[str]:
    return [t for t, n in cfg.layer_counts().items() if n] if which == "all" else [which]


# ---------------------------------------------------------------------------------------
# memory estimate: refuse before allocating what the machine does not have
# ---------------------------------------------------------------------------------------

STATE_COPIES = 6  # initial + reference (astype, update) + ranks' shards and their updates + unshard
BUFFERS_PER_RANK = 12  # [M, widest]-sized float64 buffers a rank holds: stream, blocks, norms, partial sums, MoE rows
PACKED_EXPERT_BYTES = 17 / 32  # MXFP4: half a byte per weight + one E8M0 scale byte per 32
EXPERT_CACHE_BYTES = LayerWeights.expert_cache_bytes  # the bound of the packed expert cache (4 GB)
COPY_CACHE_BYTES = LayerWeights.copy_cache_bytes  # and of the kept float copies (512 MB)
EXPERT_DRAW_BYTES = 8  # per element of an expert part being drawn: float32 draw + scaled float32 (then packed)
# measured: `check --model tiny-k3 --batch 1` peaks at 188,952 kB (Python, NumPy, Numba, JIT code)
BASELINE_BYTES = 200_000_000
SAFETY = 1.1


def _layer_weight_sizes(cfg: ModelConfig, layer_type: str) -> dict[str, int]:
    """name -> element count of the dense weights one layer's check generates: its attention and its FFN."""
    attn = cfg.attn_kinds[cfg.first_layer_of(layer_type)]
    ffn = ("dense.",) if layer_type == "dense" else ("router.", "shared.", "latent.", "expert_bias.")
    return {name: int(np.prod(shape, dtype=object)) for name, (shape, _) in weight_table(cfg).items()
            if "." not in name or name.startswith((f"{attn}.", "o_proj.") + ffn)}


def estimate_layer_bytes(cfg: ModelConfig, layer_type: str, tp: int, shape: DecodeShape) -> int:
    """Peak bytes of one layer's check: the held weights + the touched experts + the largest transient
    + float64 state copies + rank buffers.

    Held (weights.LayerWeights): dense weights in their checkpoint format, 2 B (bf16) or 4 B (FP32) each; touched
    MXFP4 experts packed, 17/32 B per weight (other expert formats: 4 B, float32), at most the expert cache's 4 GB.
    Transient, the largest of: float64 copies of the weights that are not GEMM operands (vectors, conv taps; at most
    the 512 MB copy cache); drawing experts on every core (8 B per element of a part each); a float64 copy of the
    largest weight that is not a GEMM operand of a plan (the MLA up-projections the reference reshapes). GEMM weights
    are never copied whole: plans read bf16 bits, the reference widens 8 MB chunks, dense weights are drawn 16 MB at a
    time.

    Calibration, `moe-sim check --model kimi-k3 --tp 16 --batch 1` (fp64, context 64): its largest layer is
    layer 0 (KDA attention + the 33,792-wide dense FFN, 2.34 GB held), estimated at 2.97 GB against a
    measured peak RSS of 2.74 GB for the whole check (2,678,712 KiB, /usr/bin/time -v). On tiny-k3 the
    state and buffer terms dominate and stay above the measured peaks (MLA --batch 8 --context 100000
    --tp 4: 4.4 GB estimated, 3.5 GB measured; KDA --batch 4000: 0.85 vs 0.74 GB; dense --batch 2000:
    0.52 vs 0.46 GB).
    """
    attn = cfg.attn_kinds[cfg.first_layer_of(layer_type)]
    sizes = _layer_weight_sizes(cfg, layer_type)
    held = sum(n * (4 if weight_spec(cfg, name)[1] in FP32_KINDS else 2) for name, n in sizes.items())
    part = cfg.expert_in_dim * cfg.moe_intermediate
    touched = 0 if layer_type == "dense" else min(cfg.num_experts, shape.tokens * cfg.top_k)
    experts = min(3 * touched * part * (PACKED_EXPERT_BYTES if cfg.expert_dtype == "mxfp4" else 4), EXPERT_CACHE_BYTES)
    reshaped = max([n for name, n in sizes.items() if name in attention.kind(attn).reshaped_weights], default=0)
    copies = min(COPY_CACHE_BYTES, 8 * sum(n for name, n in sizes.items() if len(weight_spec(cfg, name)[0]) == 1
                                            or weight_spec(cfg, name)[1] == "conv"))
    transient = max(copies, (os.cpu_count() or 1) * EXPERT_DRAW_BYTES * part * bool(touched), 8 * reshaped)
    state = 8 * STATE_COPIES * attention.kind(attn).state_elements(cfg, tp, shape)
    widest = max(cfg.hidden_size, cfg.expert_in_dim * cfg.top_k, cfg.dense_intermediate, cfg.shared_intermediate)
    buffers = 8 * BUFFERS_PER_RANK * (tp + 1) * shape.tokens * widest
    return int(SAFETY * (held + experts + transient + state + buffers)) + BASELINE_BYTES


def available_memory() -> int:
    """Bytes the OS says a new allocation can get: MemAvailable of /proc/meminfo, else free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def guard_memory(cfg: ModelConfig, which: str, tp: int, shape: DecodeShape) -> int:
    """The check's estimated peak (the largest layer type: each is built, checked and freed in turn);
    one sentence instead of a numpy _ArrayMemoryError minutes later when it exceeds available memory."""
    need = max(estimate_layer_bytes(cfg, t, tp, shape) for t in layer_types(cfg, which))
    have = available_memory()
    if need > have:
        raise UserError(f"this check needs about {need / 1e9:,.1f} GB of memory (weights, state and {tp} "
                        f"simulated ranks) but {have / 1e9:,.1f} GB is available: use a smaller model, "
                        "--tp, --batch, --tokens-per-seq or --context.")
    return need


def run_check(cfg: ModelConfig, which: str, tp: int, shape: DecodeShape, precision: str, seed: int = 0,
              all_reduce: str = "one_shot", backend: str = DEFAULT_BACKEND) -> list[LayerCheck]:
    return [check_layer(cfg, t, tp, shape, precision, seed, all_reduce, backend=backend)
            for t in layer_types(cfg, which)]


def report_json(checks: list[LayerCheck], precision: str, cfg: ModelConfig, tp: int, shape: DecodeShape) -> dict:
    layers = []
    for ch in checks:
        worst = max(ch.variants.values(), key=lambda v: v.rel_rms_error)
        layers.append({
            "layer": ch.layer, "layer_index": ch.layer_index, "passed": ch.passed,
            "kernel_counts": {n: v.kernel_count for n, v in ch.variants.items()},
            "max_abs_error": max(v.max_abs_error for v in ch.variants.values()),
            "rel_rms_error": worst.rel_rms_error,
            "routing_flips": max(len(v.flips) for v in ch.variants.values()),
            "variants": {n: {"passed": v.passed, "kernel_count": v.kernel_count, "flip_bound": v.flip_bound,
                             "flips": v.flips,
                             "tensors": [vars(t) | {"passed": t.passed} for t in v.tensors]}
                         for n, v in ch.variants.items()},
        })
    return {"passed": all(c.passed for c in checks), "precision": precision, "model": cfg.name, "tp": tp,
            "batch": shape.batch, "tokens_per_seq": shape.tokens_per_seq, "context": shape.context,
            "metric": "errors vs the float64 single-device reference on the same weights and inputs",
            "layers": layers}
