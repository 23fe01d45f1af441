"""Fit a GPU profile's fitted constants to the published figures, each inside its sourced range.

The published figures (docs/published.md) are four GB300 TP16 times: the per-layer trace (130 / 69 µs,
taken as a KDA + MoE layer verifying 8 tokens at batch 1, docs/cost-model.md §6.1) and the batch-1
decode step (7.38 / 3.90 ms, context 1 -> 1,024, priced at its middle, 512). The constants fitted to
them are the ones whose TOML entry says `fitted_to = "docs/published.md ..."`; each has a `range` from
its sources, and the fit never leaves it.

    loss(c) = sum over fitted figures f of (model_f(c) / published_f - 1)^2,   c in its box of ranges

minimised by coordinate descent (golden-section search along one constant at a time, sweeps until the
loss stops moving), started from the profile's values. Deterministic; several hundred model evaluations.

Figures not used in the fit are priced with the fitted constants and reported beside their published
values: they are the out-of-sample check (the July standard vLLM throughputs, BLOG-D0, sources.md §K2).

Napkin: 4 figures, 4 constants -> 0 degrees of freedom: the fit can always get close, so the residuals
say little; the unfitted figures and the constants sitting on a range edge are what to read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from simulator.config import ModelConfig
from simulator.cost.timeline import Makespan, makespan_us
from simulator.errors import UserError
from simulator.hardware import HardwareProfile

GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
PUBLISHED_PREFIX = "docs/published.md"  # a constant fitted to the published figures says so in fitted_to


@dataclass(frozen=True)
class Figure:
    """One published number and the configuration that reproduces it."""

    name: str
    metric: str  # "layer_us" | "step_ms" | "tokens_per_s"
    variant: str
    tp: int
    batch: int
    tokens_per_seq: int
    context: int
    layer: str | None  # the layer type of a per-layer figure
    published: float
    source: str


FITTED = (
    Figure("per-layer trace, standard", "layer_us", "standard", 16, 1, 8, 512, "kda", 130.0,
           "vLLM PR #61867 / blog 2026-10-16 (docs/published.md)"),
    Figure("per-layer trace, specialized", "layer_us", "specialized", 16, 1, 8, 512, "kda", 69.0,
           "vLLM PR #61867 / blog 2026-10-16 (docs/published.md)"),
    Figure("decode step, standard, batch 1", "step_ms", "standard", 16, 1, 1, 512, None, 7.38,
           "vLLM PR #61867 / blog 2026-10-16 (docs/published.md)"),
    Figure("decode step, specialized, batch 1", "step_ms", "specialized", 16, 1, 1, 512, None, 3.90,
           "vLLM PR #61867 / blog 2026-10-16 (docs/published.md)"),
)
CHECKS = (
    Figure("July standard vLLM, TP8, batch 1", "tokens_per_s", "standard", 8, 1, 1, 512, None, 111.0,
           "BLOG-D0, vLLM day-0 Kimi K3 post 2026-07-27 (docs/sources.md §K2); older software"),
    Figure("July standard vLLM, TP16, batch 1", "tokens_per_s", "standard", 16, 1, 1, 512, None, 118.0,
           "BLOG-D0 (docs/sources.md §K2); older software than the October 7.38 ms"),
    Figure("August standard vLLM main, TP8, batch 1", "step_ms", "standard", 8, 1, 1, 384, None, 8.469,
           "vLLM PR #53526, 2026-08-24 (docs/sources.md §K2): mean TPOT before its change, main at 2ec6f0d71e, "
           "TP8, concurrency 1, prompt 128, output 512 (mean context 384), FP8 KV cache, no speculation, GB300"),
)


def model_value(fig: Figure, cfg: ModelConfig, hw: HardwareProfile, makespan: Makespan = makespan_us) -> float:
    """The model's number for one figure, in the figure's metric."""
    from simulator.cost.step import estimate_step, layer_timeline
    from simulator.plans.kernel import DecodeShape
    if fig.metric == "layer_us":
        shape = DecodeShape(fig.batch, fig.tokens_per_seq, fig.context)
        return layer_timeline(cfg, hw, fig.variant, fig.tp, shape, fig.layer or "kda", makespan=makespan).layer_us
    step = estimate_step(cfg, hw, fig.variant, fig.tp, fig.batch, fig.context, makespan=makespan)
    if fig.metric == "step_ms":
        return step.step_us / 1000.0
    if fig.metric == "tokens_per_s":
        return fig.batch * step.tokens_per_step / (step.step_us * 1e-6)
    raise ValueError(f"unknown metric {fig.metric!r}")


def fitted_names(hw: HardwareProfile) -> tuple[str, ...]:
    """The profile's constants fitted to the published figures (their fitted_to says so)."""
    return tuple(sorted(k for k, fit in hw.fits.items() if fit.fitted_to.startswith(PUBLISHED_PREFIX)))


def loss(cfg: ModelConfig, hw: HardwareProfile, figures: tuple[Figure, ...] = FITTED,
         makespan: Makespan = makespan_us) -> float:
    return sum((model_value(f, cfg, hw, makespan) / f.published - 1.0) ** 2 for f in figures)


def _golden(f: Callable[[float], float], lo: float, hi: float, x0: float, tol: float) -> tuple[float, float]:
    """Minimise f on [lo, hi]; the start x0 is kept if nothing beats it (a flat or edge optimum)."""
    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = f(d)
    best = min([(f(x), x) for x in (a, b, x0, lo, hi)])
    return best[1], best[0]


@dataclass(frozen=True)
class FitResult:
    names: tuple[str, ...]
    start: dict[str, float]
    fitted: dict[str, float]
    ranges: dict[str, tuple[float, float]]
    loss_start: float
    loss_fitted: float
    evaluations: int

    def at_edge(self, name: str, rel: float = 1e-3) -> str:
        lo, hi = self.ranges[name]
        x, span = self.fitted[name], hi - lo
        return "low" if x - lo <= rel * span else "high" if hi - x <= rel * span else ""


def fit(cfg: ModelConfig, hw: HardwareProfile, names: tuple[str, ...] | None = None,
        figures: tuple[Figure, ...] = FITTED, sweeps: int = 30) -> FitResult:
    """Coordinate descent over `names` (default: the constants fitted to the published figures). Its several
    hundred evaluations schedule with the compiled loop, which repays Numba's ~0.7 s load many times over."""
    from simulator.cost.fastsim import makespan_us as compiled
    names = names or fitted_names(hw)
    ranges = {n: (hw.fits[n].low, hw.fits[n].high) for n in names}
    values = {n: float(getattr(hw, n)) for n in names}
    count = 0

    def at(vals: dict[str, float]) -> float:
        nonlocal count
        count += 1
        return loss(cfg, replace(hw, **vals), figures, compiled)

    start = at(values)
    current = start
    for _ in range(sweeps):
        before = current
        for n in names:
            lo, hi = ranges[n]
            x, current = _golden(lambda v, n=n: at(values | {n: v}), lo, hi, values[n], tol=1e-3 * (hi - lo))
            values[n] = x
        if before - current < 1e-10:
            break
    return FitResult(names, {n: float(getattr(hw, n)) for n in names}, values, ranges, start, current, count)


def trace_read_as(batch: int, tokens_per_seq: int, figures: tuple[Figure, ...] = FITTED) -> tuple[Figure, ...]:
    """The fitted figures with the per-layer trace read as `batch` sequences of `tokens_per_seq` tokens (its
    conditions are not published: docs/kernels.md lists the configurations that give its kernel counts)."""
    if batch < 1 or tokens_per_seq < 1:
        raise UserError(f"the trace's configuration {batch} x {tokens_per_seq} needs at least one sequence and "
                        "one token per sequence.")
    return tuple(replace(f, batch=batch, tokens_per_seq=tokens_per_seq) if f.metric == "layer_us" else f
                 for f in figures)


def report(cfg: ModelConfig, hw: HardwareProfile, result: FitResult, figures: tuple[Figure, ...] = FITTED) -> dict:
    """The document `moe-sim calibrate --json` prints: constants, fitted figures (with the configuration each
    is priced at), unfitted checks."""
    fitted_hw = replace(hw, **result.fitted)

    def rows(figs: tuple[Figure, ...]) -> list[dict]:
        out = []
        for f in figs:
            now, new = model_value(f, cfg, hw), model_value(f, cfg, fitted_hw)
            out.append({"figure": f.name, "metric": f.metric, "published": f.published, "source": f.source,
                        "tp": f.tp, "batch": f.batch, "tokens_per_seq": f.tokens_per_seq,
                        "model_now": round(now, 4), "model_fitted": round(new, 4),
                        "error_now_pct": round(100 * (now / f.published - 1), 2),
                        "error_fitted_pct": round(100 * (new / f.published - 1), 2)})
        return out

    return {
        "hardware": hw.name, "model": cfg.name,
        "constants": [{"name": n, "now": result.start[n], "fitted": round(result.fitted[n], 4),
                       "range": list(result.ranges[n]), "at_edge": result.at_edge(n),
                       "range_source": hw.fits[n].range_source} for n in result.names],
        "fitted_figures": rows(figures), "unfitted_figures": rows(CHECKS),
        "degrees_of_freedom": len(figures) - len(result.names),
        "loss_now": result.loss_start, "loss_fitted": result.loss_fitted, "evaluations": result.evaluations,
        "metric": "loss = sum of (model / published - 1)^2 over the fitted figures",
    }
