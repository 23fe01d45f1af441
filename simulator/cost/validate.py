"""Hold the cost model to GPU measurements: error per family before and after a refit on held-back points.

Input: a folder of measurement CSVs written by benchmarks/gpu/suite.py (one per family; rows with
`status` ok), optionally beside `predictions.csv` written by benchmarks/gpu/predict.py before the run.

Three figures per family, each |predicted / measured - 1| in percent:
- **pre-registered**: predictions.csv, made with the profile as it stood before the measurements;
- **model**: the cost model as it stands now (simulator.cost.measured.price_row), all points;
- **refit (held back)**: a family law fitted on one half of each grid and tested on the other half.

The refit law is linear in a few physical constants and fitted per group (family x implementation,
and fc1 / fc2 apart for the MoE GEMMs, since fc2's short K is not fc1):

    t = t0 + max(bytes / bw, flops / R) [+ U c_U]        t = t0 + wire bytes / beta  (collectives)

t0 the per-launch latency (launch gap + fixed cost), bw the achieved HBM bandwidth, R the achieved
FLOP rate, c_U a per-touched-expert cost; every constant >= 0, chosen to minimise the relative
squared error. Points of a group alternate between the fit and the held-back half in grid order, so
the held-back points interleave the fitted ones (an interpolation test, not an extrapolation test).

Dimension legend: bytes through HBM as the plan declares them, flops, U unique experts, n payload.
"""

from __future__ import annotations

import csv
import itertools
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from simulator.cost.measured import normalise, price_row
from simulator.errors import UserError
from simulator.hardware import HardwareProfile

FAMILIES = ("ceiling", "gemm", "moe", "small", "kda", "mla", "collective")


# ---------------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------------

def read_measurements(folder: str | Path) -> list[dict[str, Any]]:
    """Every ok row of every family CSV in `folder` (predictions.csv excluded), typed."""
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"--measurements {folder}: not a folder of measurement CSVs.")
    rows = []
    for path in sorted(root.glob("*.csv")):
        if path.name == "predictions.csv":
            continue
        with path.open(newline="") as f:
            for raw in csv.DictReader(f):
                if raw.get("status", "ok") != "ok" or not raw.get("median_us"):
                    continue
                row = normalise(raw)
                row["measured_us"] = float(raw["median_us"])
                row["source_file"] = path.name
                rows.append(row)
    if not rows:
        raise UserError(f"--measurements {folder}: no measured rows (CSV files from benchmarks/gpu/suite.py).")
    return rows


def read_predictions(folder: str | Path) -> dict[str, float]:
    path = Path(folder) / "predictions.csv"
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        return {r["id"]: float(r["model_us"]) for r in csv.DictReader(f)}


# ---------------------------------------------------------------------------------------------------
# the refit law
# ---------------------------------------------------------------------------------------------------

def group_of(row: Mapping[str, Any]) -> str:
    """Constants are shared within a group: one implementation of one family (fc1 and fc2 apart)."""
    if row["family"] in ("ceiling", "small"):
        return row["family"]
    g = f"{row['family']}/{row['impl']}"
    return g + f"/{row['plan_key']}" if row["family"] == "moe" else g


def wire_bytes(row: Mapping[str, Any], algorithm: str) -> float:
    """Bytes each rank sends over NVLink for the collective's algorithm (collectives.py)."""
    n, p = row["n_bytes"], max(row["P"], 1)
    return {"one_shot": (p - 1) * n, "all_gather": (p - 1) * n, "reduce_scatter": (p - 1) / p * n}.get(
        algorithm, 2 * (p - 1) / p * n)


def features(row: Mapping[str, Any], priced: Mapping[str, Any]) -> dict[str, float]:
    """Named regressors of the family law (module docstring): each multiplies one constant."""
    if row["family"] == "collective":
        return {"t0": 1.0, "wire_bytes": wire_bytes(row, priced["algorithm"])}
    f = {"t0": 1.0, "bytes": float(priced["bytes"]), "flops": float(priced["flops"])}
    if row["family"] == "moe":
        f["experts"] = float(row["U"])
    return f


@dataclass
class Fit:
    """Constants of one group's law: coefficient per regressor (µs per unit)."""

    names: tuple[str, ...]
    coef: tuple[float, ...]
    n: int

    def predict(self, feats: Mapping[str, float]) -> float:
        """The law: t0 + max(bytes term, flops term) + the other terms."""
        terms = {n: c * feats[n] for n, c in zip(self.names, self.coef)}
        roof = max(terms.pop("bytes", 0.0), terms.pop("flops", 0.0))
        return roof + sum(terms.values())

    def constants(self) -> dict[str, float]:
        """Physical reading: t0 µs, bw GB/s, R TFLOP/s, c_U µs per expert, beta GB/s."""
        out = {}
        for name, c in zip(self.names, self.coef):
            if name == "t0":
                out["t0_us"] = c
            elif name in ("bytes", "wire_bytes"):
                out["bw_gbps" if name == "bytes" else "beta_gbps"] = 1e-3 / c if c > 0 else None
            elif name == "flops":
                out["tflops"] = 1e-6 / c if c > 0 else None
            elif name == "experts":
                out["per_expert_us"] = c
        return out


def _nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |A c - b|^2 with c >= 0, by trying every subset of columns (at most 4 here)."""
    best, best_err = np.zeros(A.shape[1]), math.inf
    cols_used = [j for j in range(A.shape[1]) if np.any(A[:, j])]
    for k in range(1, len(cols_used) + 1):
        for cols in itertools.combinations(cols_used, k):
            if len(cols) > len(b):
                continue
            c, *_ = np.linalg.lstsq(A[:, cols], b, rcond=None)
            if np.any(c < 0):
                continue
            err = float(np.sum((A[:, cols] @ c - b) ** 2))
            if err < best_err - 1e-15:
                best_err, best = err, np.zeros(A.shape[1])
                best[list(cols)] = c
    return best


def fit_group(X: np.ndarray, t: np.ndarray, names: tuple[str, ...], ridge: float = 206.0) -> Fit:
    """Fit t = t0 + max(bytes / bw, flops / R) + U c_U (+ wire / beta) on relative error, constants >= 0.
    The max makes it piecewise linear: assign each point to the memory or the compute side, solve a
    non-negative least squares, reassign by the fitted terms, repeat until the sides stop changing.
    The first assignment puts a point on the compute side when its FLOP/B exceeds the GPU's `ridge`."""
    ib, iflop = names.index("bytes") if "bytes" in names else -1, names.index("flops") if "flops" in names else -1
    memory_side = np.ones(len(t), dtype=bool) if ib < 0 or iflop < 0 else X[:, iflop] <= ridge * X[:, ib]
    coef = np.zeros(len(names))
    for _ in range(12):
        Xs = X.copy()
        if ib >= 0 and iflop >= 0:
            Xs[~memory_side, ib] = 0.0
            Xs[memory_side, iflop] = 0.0
        coef = _nnls(Xs / t[:, None], np.ones_like(t))
        if ib < 0 or iflop < 0:
            break
        side = X[:, ib] * coef[ib] >= X[:, iflop] * coef[iflop]
        if np.array_equal(side, memory_side):
            break
        memory_side = side
    return Fit(names, tuple(float(c) for c in coef), len(t))


# ---------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------

@dataclass
class Point:
    row: dict[str, Any]
    measured: float
    model: float
    prereg: float | None
    held_back: bool
    refit: float = math.nan
    feats: dict[str, float] = field(default_factory=dict)


def pct(pred: float, meas: float) -> float:
    return abs(pred / meas - 1.0) * 100.0


def summary(errors: list[float]) -> dict[str, Any]:
    if not errors:
        return {"n": 0, "median_abs_pct_error": None, "worst_abs_pct_error": None}
    return {"n": len(errors), "median_abs_pct_error": round(statistics.median(errors), 2),
            "worst_abs_pct_error": round(max(errors), 2)}


def split_halves(points: list[Point]) -> None:
    """Alternate fit / held-back within each group, in the order the suite measured them (grid order)."""
    seen: dict[str, int] = {}
    for p in points:
        g = group_of(p.row)
        p.held_back = seen.get(g, 0) % 2 == 1
        seen[g] = seen.get(g, 0) + 1


def validate(folder: str | Path, hw: HardwareProfile) -> dict[str, Any]:
    rows = read_measurements(folder)
    prereg = read_predictions(folder)
    points = []
    for row in rows:
        priced = price_row(row, hw)
        points.append(Point(row, row["measured_us"], priced["model_us"], prereg.get(row["id"]), False,
                            feats=features(row, priced)))
    split_halves(points)
    fits = refit(points, hw.critical_intensity)
    return report(points, fits, hw)


def refit(points: list[Point], ridge: float) -> dict[str, Fit]:
    fits = {}
    for g in dict.fromkeys(group_of(p.row) for p in points):
        mine = [p for p in points if group_of(p.row) == g]
        train = [p for p in mine if not p.held_back] or mine
        names = tuple(train[0].feats)
        X = np.array([[p.feats[n] for n in names] for p in train])
        fits[g] = fit_group(X, np.array([p.measured for p in train]), names, ridge)
        for p in mine:
            p.refit = fits[g].predict(p.feats)
    return fits


def report(points: list[Point], fits: dict[str, Fit], hw: HardwareProfile) -> dict[str, Any]:
    held = [p for p in points if p.held_back]
    by_family = {}
    for fam in FAMILIES:
        mine = [p for p in points if p.row["family"] == fam]
        if not mine:
            continue
        mine_held = [p for p in mine if p.held_back]
        by_family[fam] = {**summary([pct(p.refit, p.measured) for p in mine_held]),
                          "model": summary([pct(p.model, p.measured) for p in mine]),
                          "preregistered": summary([pct(p.prereg, p.measured) for p in mine if p.prereg])}
    doc = {"hardware": hw.name, "measured_points": len(points), "kernels": len(held),
           **{k: v for k, v in summary([pct(p.refit, p.measured) for p in held]).items() if k != "n"},
           "model": summary([pct(p.model, p.measured) for p in points]),
           "preregistered": summary([pct(p.prereg, p.measured) for p in points if p.prereg]),
           "by_family": by_family,
           "fits": {g: {"n": f.n, **{k: (None if v is None else round(v, 4)) for k, v in f.constants().items()}}
                    for g, f in fits.items()},
           "metric": "|predicted / measured - 1| in %, per launch in CUDA-graph replay (median of replays); "
                     "headline = refit law on the held-back half of each grid",
           "points": [{"id": p.row["id"], "family": p.row["family"], "measured_us": round(p.measured, 3),
                       "model_us": round(p.model, 3), "refit_us": round(p.refit, 3),
                       "preregistered_us": p.prereg, "held_back": p.held_back} for p in points]}
    return doc
