"""Which constant matters: each uncertain parameter's share of the step time's variance over the draws.

The draws behind the interval already vary every parameter at once (cost/uncertainty.py). For each
parameter k, the step time T is regressed on its normal score z_k across those N draws:

    share_k = corr(T, z_k)^2                 the first-order (Sobol) variance share of k for a T close to
                                             linear in z_k: the part of Var T that knowing z_k alone removes
    low_k, high_k = a_k + b_k q5(z_k), a_k + b_k q95(z_k)    (T ~ a_k + b_k z_k: the tornado bar)

(moments and percentiles weighted by the draws' importance weights where the draws were conditioned).

No extra pricing: the ranking reads the draws the interval came from. Where the draws were conditioned on
the published figures (GB300) the parameters are correlated (a longer launch gap goes with a shorter GEMM
fixed cost), and a parameter's share includes what it explains through its partners, so the shares may
add up to more than 1 (`sum_of_shares`); with independent parameters they add up to about 1 at most (plus
sampling noise of ~K / N), the rest being interactions and the curvature of the residual quantiles.

Dimension legend: K parameters, N draws.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.config import ModelConfig
from simulator.cost.step import estimate_step
from simulator.cost.uncertainty import IntervalSpec, uncertainty_for, weighted_quantile
from simulator.hardware import HardwareProfile
from simulator.routing import UNIFORM, RoutingStats
from simulator.plans import VARIANTS


def ranking(times: np.ndarray, z: np.ndarray, labels: list[str], weights: np.ndarray) -> list[dict[str, Any]]:
    """Parameters by share of Var(times) [N] explained by their normal scores z [N, K] over draws of the given
    weights (the conditioning's importance weights, else uniform), largest first."""
    rows = []
    t = times - weights @ times
    for k, label in enumerate(labels):
        zk = z[:, k] - weights @ z[:, k]
        var_z, var_t = weights @ zk ** 2, weights @ t ** 2
        slope = (weights @ (zk * t)) / var_z if var_z > 0 else 0.0
        share = slope ** 2 * var_z / var_t if var_t > 0 else 0.0
        lo, hi = weights @ times + slope * (weighted_quantile(z[:, k], weights, [0.05, 0.95]) - weights @ z[:, k])
        rows.append({"parameter": label, "share": round(float(share), 4), "low_ms": round(float(lo), 4),
                     "high_ms": round(float(hi), 4), "swing_ms": round(float(hi - lo), 4)})
    return sorted(rows, key=lambda row: -row["share"])


def step_sensitivity(cfg: ModelConfig, hw: HardwareProfile, spec: IntervalSpec, tp: int, batch: int, context: int,
                     draft_tokens: int = 0, acceptance_length: float | None = None, variant: str = "both",
                     drafter: str = "dspark-k3", fusions: frozenset[str] | None = None,
                     routing: RoutingStats = UNIFORM) -> dict[str, Any]:
    """Per variant: the parameters ranked by their share of the step time's variance (module docstring)."""
    unc = uncertainty_for(hw, spec)
    labels = [p.label for p in unc.sample.params]
    out: dict[str, Any] = {"metric": "share of the step time's variance over the interval's draws explained by "
                                     "each parameter alone (squared correlation; first-order Sobol for a near-linear "
                                     "step time)", "variants": {}}
    for v in VARIANTS if variant == "both" else (variant,):
        args = (cfg, hw, v, tp, batch, context, draft_tokens, acceptance_length, drafter, fusions, routing)
        times = estimate_step(*args, makespan=unc.makespan).step_us / 1000
        rows = ranking(times, unc.sample.z, labels, unc.weights)
        out["variants"][v] = {"central_ms": round(float(estimate_step(*args).step_us / 1000), 4),
                              "interval_ms": unc.interval(times, 4),
                              "sum_of_shares": round(sum(r["share"] for r in rows), 3), "ranking": rows}
    return out
