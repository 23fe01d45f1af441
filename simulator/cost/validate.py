"""Hold the cost model to GPU measurements: the laws of cost/laws.py fitted on one half, judged on the other.

Input: a folder of measurement CSVs written by benchmarks/gpu/suite.py (one per family; rows with
`status` ok), optionally beside `predictions.csv` written by benchmarks/gpu/predict.py before the run.

Every row is rebuilt as the kernel it measured (cost/measured.py) and its regressors are the ones pricing
computes for a plan's kernel (laws.features): no law is written twice. Figures per family, each
|predicted / measured - 1| in percent:
- **pre-registered**: predictions.csv, made with the profile as it stood before the measurements;
- **model**: the law the profile carries for the row's implementation (simulator/hardware/laws/<gpu>.toml,
  what `step`, `layer` and `run` price with), on the held-back half; the datasheet law where the profile
  has none;
- **refit**: the same law fitted afresh on these CSVs' fitted half, on the held-back half. When the profile
  is the fit of these CSVs (`moe-sim validate --fit` wrote it) the two columns are one.

Each group's constants are non-negative, no rate beats the GPU's peak, and the fit minimises the relative
squared error. Points alternate between the fit and the held-back half in grid order within each group and
kernel, so the held-back points interleave the fitted ones (an interpolation test, not an extrapolation test).
"""

from __future__ import annotations

import csv
import itertools
import math
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simulator.cost import laws
from simulator.cost.laws import LawKey
from simulator.cost.engine_tiles import Tile
from simulator.hardware.kernel_sets import (DATASHEET, Fit, KernelSet, dump_sets, evaluate, laws_path, load_sets,
                                            parse_set, roof_of)
from simulator.cost.measured import normalise, point_kernel, price_row
from simulator.plans.kernel import FAMILIES as KERNEL_FAMILIES
from simulator.errors import UserError
from simulator.hardware import HardwareProfile

FAMILIES = ("ceiling",) + KERNEL_FAMILIES  # the plans' kernel families, and the suite's bandwidth ceilings


# ---------------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------------

def read_measurements(folder: str | Path) -> list[dict[str, Any]]:
    """Every ok row of every family CSV (<family>.csv) in `folder`, typed, and the rows its kernel_set.toml
    borrows (borrowed_csvs); a row that kernel_set.toml's [repeats] measured again on other machines reads the
    median of all its runs (`runs` says how many)."""
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"--measurements {folder}: not a folder of measurement CSVs.")
    rows = []
    own = [(p, None) for p in sorted(root.glob("*.csv")) if p.stem in FAMILIES]  # not predictions, side tables
    for path, impls in own + borrowed_csvs(root):
        with path.open(newline="") as f:
            for raw in csv.DictReader(f):
                if raw.get("status", "ok") != "ok" or not raw.get("median_us"):
                    continue
                if impls is not None and raw.get("impl") not in impls:
                    continue
                row = normalise(raw)
                row["measured_us"] = float(raw["median_us"])
                row["source_file"] = path.name
                rows.append(row)
    again = repeated_runs(root)
    for row in rows:
        runs = [row["measured_us"]] + again.get((row["family"], row["id"]), [])
        row["measured_us"], row["runs"] = statistics.median(runs), len(runs)
    if not rows:
        raise UserError(f"--measurements {folder}: no measured rows (CSV files from benchmarks/gpu/suite.py).")
    return rows


def repeated_runs(root: Path) -> dict[tuple[str, str], list[float]]:
    """(family, id) -> µs of the same rows measured again on other fresh machines: kernel_set.toml's [repeats]
    table, family = ["path/of/repeat.csv", ...] relative to the folder (the same points, the same code)."""
    repeats = _set_meta(root).get("repeats", {})
    at = f"{root / SET_FILE}"
    if not isinstance(repeats, dict) or not all(isinstance(v, list) for v in repeats.values()):
        raise UserError(f"{at}: [repeats] must be a table of family = [\"path/to/repeat.csv\", ...].")
    out: dict[tuple[str, str], list[float]] = {}
    for family, paths in repeats.items():
        for rel in paths:
            path = root / rel if isinstance(rel, str) else None
            if family not in FAMILIES or path is None or path.suffix != ".csv" or not path.is_file():
                raise UserError(f"{at}: repeats.{family} must name a family ({', '.join(FAMILIES)}) and existing "
                                f".csv files relative to {root}.")
            with path.open(newline="") as f:
                for raw in csv.DictReader(f):
                    if raw.get("status", "ok") == "ok" and raw.get("median_us") and raw.get("family") == family:
                        out.setdefault((family, raw["id"]), []).append(float(raw["median_us"]))
    return out


def borrowed_csvs(root: Path) -> list[tuple[Path, set[str]]]:
    """(CSV, implementations read from it) of each family a kernel set takes from another folder's rows: its
    kernel_set.toml's [borrow] table, family = "path/of.csv" relative to the folder (a family measured
    elsewhere, such as collectives that need two GPUs), read for the set's own implementations only."""
    meta = _set_meta(root)
    borrow = meta.get("borrow", {})
    at = f"{root / SET_FILE}"
    if not isinstance(borrow, dict):
        raise UserError(f"{at}: [borrow] must be a table of family = \"path/to/family.csv\".")
    mapped = {n for names in (meta.get("impls") or {}).values() for n in names}
    out = []
    for family, rel in borrow.items():
        path = root / rel if isinstance(rel, str) else None
        if family not in FAMILIES or (root / f"{family}.csv").is_file():
            raise UserError(f"{at}: borrow.{family} names no family this folder lacks (families: "
                            f"{', '.join(FAMILIES)}).")
        if path is None or path.suffix != ".csv" or not path.is_file():
            raise UserError(f"{at}: borrow.{family} must name an existing .csv file relative to {root}.")
        out.append((path, mapped))
    return out


def read_predictions(folder: str | Path) -> dict[str, float]:
    """id -> µs registered before the run: the folder's predictions.csv and those beside its borrowed rows."""
    out = {}
    for path in [Path(folder) / "predictions.csv"] + [p.parent / "predictions.csv" for p, _ in
                                                      borrowed_csvs(Path(folder))]:
        if path.is_file():
            with path.open(newline="") as f:
                out.update({r["id"]: float(r["model_us"]) for r in csv.DictReader(f) if r["id"] not in out})
    return out


# ---------------------------------------------------------------------------------------------------
# the refit law
# ---------------------------------------------------------------------------------------------------

def law_key(row: Mapping[str, Any]) -> LawKey:
    """The law a measured row tests: its family, its implementation, and its role (a small kernel's own
    floor, fc1 or fc2 of the experts)."""
    role = (row["plan_key"] or row["impl"]) if row["family"] in ("small", "moe") else ""
    return LawKey(row["family"], row["impl"], role)


def row_law(row: Mapping[str, Any], hw: HardwareProfile,
            impls: Mapping[str, tuple[str, ...]] = {}) -> tuple[str, dict[str, float]]:
    """(group, regressors) of a measured row: the kernel it measured, through the laws pricing reads, with the
    implementations `impls` of the set the row belongs to (what the engine launches around the kernel)."""
    key, kernel = law_key(row), point_kernel(row)
    tile = Tile.parse(row["tile_config"]) if row.get("tile_config") and row["impl"] in laws.TRITON_MOE else None
    return key.group(kernel), laws.features(kernel, key, hw.sm_count, hw.l2_bytes, impls, tile)


def _nnls(A: np.ndarray, b: np.ndarray, lower: np.ndarray | None = None) -> np.ndarray:
    """min |A c - b|^2 with c >= 0, by trying every subset of the used columns (at most ~10 here). A used
    column's coefficient must also reach `lower` (no bandwidth above the HBM peak, no FLOP rate above the
    tensor-core peak): a fit that needs an unphysical constant is not taken."""
    lower = np.zeros(A.shape[1]) if lower is None else lower
    best, best_err = np.zeros(A.shape[1]), math.inf
    cols_used = [j for j in range(A.shape[1]) if np.any(A[:, j])]
    if len(cols_used) > ENUMERATE and not np.any(lower):  # the small kernels' floors: too many subsets to try
        return _sparsest(A, b, _lawson_hanson(A, b))
    for k in range(1, len(cols_used) + 1):
        for cols in itertools.combinations(cols_used, k):
            if len(cols) > len(b):
                continue
            c, *_ = np.linalg.lstsq(A[:, cols], b, rcond=None)
            if np.any(c < lower[list(cols)]):
                continue
            err = float(np.sum((A[:, cols] @ c - b) ** 2))
            if err < best_err - 1e-15:
                best_err, best = err, np.zeros(A.shape[1])
                best[list(cols)] = c
    return best


ENUMERATE = 12  # columns up to which _nnls tries every subset (2^12 least-squares solves)


def _lawson_hanson(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |A c - b|^2 with c >= 0 (Lawson and Hanson's active set, columns scaled to unit norm): the
    convex problem's optimum, which the subset search also finds, in a few dozen solves."""
    norms = np.linalg.norm(A, axis=0)
    scale = np.where(norms > 0, norms, 1.0)
    As = A / scale
    n = A.shape[1]
    free, x = np.zeros(n, dtype=bool), np.zeros(n)
    for _ in range(3 * n):
        w = As.T @ (b - As @ x)
        w[free | (norms == 0)] = -math.inf
        if w.max() <= 1e-12:
            break
        free[int(np.argmax(w))] = True
        while True:
            z = np.zeros(n)
            z[free] = np.linalg.lstsq(As[:, free], b, rcond=None)[0]
            if np.all(z[free] > 0):
                x = z
                break
            neg = free & (z <= 0)
            x = x + np.min(x[neg] / (x[neg] - z[neg])) * (z - x)
            free &= x > 1e-15
            x[~free] = 0.0
    return x / scale


def _sparsest(A: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Drop each used column, last to first, whose loss leaves the error unchanged and the law with fewer terms
    (collinear columns: a shared term every row of one kernel has alike, beside that kernel's floor, an earlier
    column), as the subset search, which tries the fewest and the earliest columns first, would."""
    err = float(np.sum((A @ c - b) ** 2))
    for j in [j for j in range(len(c)) if c[j] > 0][::-1]:
        keep = np.ones(len(c), dtype=bool)
        keep[j] = False
        trial = np.zeros(len(c))
        trial[keep] = _lawson_hanson(A[:, keep], b)
        fewer = np.count_nonzero(trial) < np.count_nonzero(c)
        if fewer and float(np.sum((A @ trial - b) ** 2)) <= err * (1 + 1e-9) + 1e-15:
            c = trial
    return c


def _lower_bounds(names: tuple[str, ...], hw: HardwareProfile | None) -> np.ndarray:
    """Least µs per unit a physical kernel pays: bytes at the HBM peak, FLOPs at the fp8 peak."""
    if hw is None:
        return np.zeros(len(names))
    per = {"bytes": 1e6 / hw.hbm_bandwidth, "state_bytes": 1e6 / hw.hbm_bandwidth,  # token_state_bytes land in L2
           "drain_bytes": 1e6 / hw.hbm_bandwidth, "drain_state_bytes": 1e6 / hw.hbm_bandwidth,
           "flops": 1e6 / hw.peak_flops("fp8")}
    return np.array([per.get(n, 0.0) for n in names])


def _fit_roofs(X: np.ndarray, t: np.ndarray, names: tuple[str, ...], lower: np.ndarray) -> np.ndarray:
    """Fit a max(roof A, roof B) law on relative error: assign each point to one roof, solve non-negative
    least squares with the other roof's columns zeroed for it, reassign by the fitted terms until the
    sides settle; started from several splits (points ordered by the ratio of their roof features), the
    best fit kept."""
    roof = roof_of(names)
    if roof is None:
        return _nnls(X / t[:, None], np.ones_like(t), lower)
    a = [names.index(n) for n in roof[0] if n in names]
    b = [names.index(n) for n in roof[1] if n in names]
    ratio = (X[:, b].sum(axis=1) + 1e-30) / (X[:, a].sum(axis=1) + 1e-30)
    # candidate splits from the points the roof applies to (a group's other kernels have neither side)
    both = ratio[(X[:, a].sum(axis=1) > 0) & (X[:, b].sum(axis=1) > 0)]
    cuts = list(np.quantile(both, np.linspace(0.1, 0.9, 9))) if both.size else []
    best, best_err = np.zeros(len(names)), math.inf
    for cut in [-math.inf, math.inf] + cuts + [0.005, 0.01, 0.02, 0.05]:
        on_a = ratio <= cut
        for _ in range(12):
            Xs = X.copy()
            Xs[np.ix_(~on_a, a)] = 0.0
            Xs[np.ix_(on_a, b)] = 0.0
            coef = _nnls(Xs / t[:, None], np.ones_like(t), lower)
            side = X[:, a] @ coef[a] >= X[:, b] @ coef[b]
            if np.array_equal(side, on_a):
                break
            on_a = side
        err = float(np.sum((np.array([evaluate(names, tuple(coef), dict(zip(names, x))) for x in X]) / t - 1) ** 2))
        if err < best_err:
            best_err, best = err, coef
    return best


def _fit_two_regimes(X: np.ndarray, t: np.ndarray, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Two lines t = t0 + wire / beta, the cheaper one wins (NCCL picks its protocol by size): split the
    points by size at each candidate, fit each side, reassign to the cheaper line, keep the best."""
    iw = names.index("wire_bytes")
    order = np.argsort(X[:, iw])
    best, best_err = (np.zeros(len(names)), np.zeros(len(names))), math.inf
    for cut in range(2, len(t) - 1):
        small = np.zeros(len(t), dtype=bool)
        small[order[:cut]] = True
        for _ in range(8):
            lines = [_nnls(X[m] / t[m, None], np.ones(int(m.sum()))) for m in (small, ~small)]
            pred = np.stack([X @ c for c in lines])
            pred[pred <= 0] = math.inf
            new = pred[0] <= pred[1]
            if np.array_equal(new, small) or new.all() or not new.any():
                break
            small = new
        err = float(np.sum((pred.min(axis=0) / t - 1) ** 2))
        if err < best_err:
            best_err, best = err, (lines[0], lines[1])
    return best


def fit_group(X: np.ndarray, t: np.ndarray, names: tuple[str, ...], regimes: int = 1,
              hw: HardwareProfile | None = None) -> Fit:
    """Non-negative constants of one group's law, minimising the relative squared error; with `hw`, no
    constant may beat that GPU's peaks."""
    if regimes == 2 and len(t) >= 4:
        lines = _fit_two_regimes(X, t, names)
        return Fit(names, tuple(tuple(float(c) for c in line) for line in lines), len(t))
    return Fit(names, (tuple(float(c) for c in _fit_roofs(X, t, names, _lower_bounds(names, hw))),), len(t))


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
    group: str = ""
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
        g = p.group + "/" + p.row["plan_key"]  # small kernels: each kernel's own grid
        p.held_back = seen.get(g, 0) % 2 == 1
        seen[g] = seen.get(g, 0) + 1


def validate(folder: str | Path, hw: HardwareProfile) -> dict[str, Any]:
    points, fits = fitted_points(folder, hw)
    doc = report(points, fits, hw)
    doc["probes"] = probes(folder, fits, hw)
    return doc


def probes(folder: str | Path, fits: Mapping[str, Fit], hw: HardwareProfile) -> dict[str, Any]:
    """Out-of-sample sets, `<family>_probe.csv`: shapes no plan has, measured after the laws were registered
    and never fitted. Each is priced by the laws fitted on the grid: {family: {n, median, worst}}."""
    out = {}
    for path in (Path(folder) / f"{family}_probe.csv" for family in FAMILIES):
        if not path.is_file():
            continue
        errors = []
        with path.open(newline="") as f:
            for raw in csv.DictReader(f):
                if raw.get("status", "ok") != "ok" or not raw.get("median_us"):
                    continue
                law = law_us(normalise(raw), fits, hw, set_impls(folder))
                if law is not None:
                    errors.append(pct(law, float(raw["median_us"])))
        out[path.stem.removesuffix("_probe")] = summary(errors)
    return out


def law_us(row: Mapping[str, Any], fits: Mapping[str, Fit], hw: HardwareProfile,
           impls: Mapping[str, tuple[str, ...]] = {}) -> float | None:
    """What the group law fitted on the grid predicts for a row that was not fitted (None: no law for its group)."""
    group, feats = row_law(row, hw, impls)
    return fits[group].predict(feats) if group in fits else None


def profile_law_us(group: str, feats: Mapping[str, float], hw: HardwareProfile) -> float | None:
    """What the profile's kernel set predicts for a measured point (None: the set has no law for its group)."""
    fit = hw.kernel_set.fit(group) if hw.kernel_set is not None else None
    return fit.predict(feats) if fit is not None and fit.covers(feats) else None


def fitted_points(folder: str | Path, hw: HardwareProfile) -> tuple[list[Point], dict[str, Fit]]:
    """Every measured point priced by the profile, split into halves and refit: (points, the group laws)."""
    prereg = read_predictions(folder)
    impls = set_impls(folder)
    points = []
    for row in read_measurements(folder):
        group, feats = row_law(row, hw, impls)
        model = profile_law_us(group, feats, hw)
        if model is None:  # no measured law in the profile's set: the datasheet law
            model = price_row(row, hw)["model_us"]
        points.append(Point(row, row["measured_us"], model, prereg.get(row["id"]), False, group, feats=feats))
    split_halves(points)
    return points, refit(points, hw)


def refit(points: list[Point], hw: HardwareProfile | None = None) -> dict[str, Fit]:
    fits = {}
    for g in dict.fromkeys(p.group for p in points):
        mine = [p for p in points if p.group == g]
        train = [p for p in mine if not p.held_back] or mine
        # floors first: where a shared term and a kernel's floor are collinear, the floor is kept
        names = tuple(sorted(dict.fromkeys(n for p in mine for n in p.feats), key=lambda n: not n.startswith("t0")))
        for p in mine:
            p.feats = {n: p.feats.get(n, 0.0) for n in names}
        X = np.array([[p.feats[n] for n in names] for p in train])
        regimes = 2 if g.startswith("collective/nccl") else 1
        # small kernels write their outputs into L2 (write-back): their slope may beat the HBM read peak
        fits[g] = fit_group(X, np.array([p.measured for p in train]), names, regimes, None if g == "small" else hw)
        for p in mine:
            p.refit = fits[g].predict(p.feats)
    return fits


def family_residuals(points: list[Point], fits: Mapping[str, Fit]
                     ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """log(measured / refit law) per family: the fitted half (sorted, each group's widened by sqrt(n / (n - p))
    for the p constants it spent) and the held-back half in grid order."""
    fitted: dict[str, list[float]] = {}
    held: dict[str, list[float]] = {}
    for p in points:
        fam, fit = p.row["family"], fits[p.group]
        free = sum(1 for regime in fit.regimes for c in regime if c > 0)
        r = math.log(p.measured / p.refit)
        if p.held_back:
            held.setdefault(fam, []).append(round(r, 5))
        elif fit.n > free:  # a group with no degree of freedom left says nothing about its scatter
            fitted.setdefault(fam, []).append(round(r * math.sqrt(fit.n / (fit.n - free)), 5))
    return {f: sorted(r) for f, r in sorted(fitted.items())}, {f: r for f, r in sorted(held.items())}


def report(points: list[Point], fits: dict[str, Fit], hw: HardwareProfile) -> dict[str, Any]:
    held = [p for p in points if p.held_back]
    by_family = {}
    for fam in FAMILIES:
        mine = [p for p in points if p.row["family"] == fam]
        if not mine:
            continue
        mine_held = [p for p in mine if p.held_back]
        by_family[fam] = {**summary([pct(p.model, p.measured) for p in mine_held]),
                          "model_all_points": summary([pct(p.model, p.measured) for p in mine]),
                          "refit": summary([pct(p.refit, p.measured) for p in mine_held]),
                          "preregistered": summary([pct(p.prereg, p.measured) for p in mine if p.prereg])}
    current = hw.kernel_set is not None and all(hw.kernel_set.fit(g) == f for g, f in fits.items())
    doc = {"hardware": hw.name, "kernel_set": hw.kernels, "measured_points": len(points), "held_back_points": len(held),
           **{k: v for k, v in summary([pct(p.model, p.measured) for p in held]).items() if k != "n"},
           "model_all_points": summary([pct(p.model, p.measured) for p in points]),
           "refit": summary([pct(p.refit, p.measured) for p in held]),
           "preregistered": summary([pct(p.prereg, p.measured) for p in points if p.prereg]),
           "profile_is_the_fit": current,
           "by_family": by_family,
           "fits": {g: {"n": f.n, **{k: (None if v is None else round(v, 4)) for k, v in f.constants().items()}}
                    for g, f in fits.items()},
           "metric": "|predicted / measured - 1| in %, per launch in CUDA-graph replay (median of replays); "
                     f"headline = the profile's laws (kernel set {hw.kernels}) on the held-back half of each grid",
           "points": [{"id": p.row["id"], "family": p.row["family"], "group": p.group,
                       "measured_us": round(p.measured, 3), "model_us": round(p.model, 3),
                       "refit_us": round(p.refit, 3), "preregistered_us": p.prereg, "held_back": p.held_back}
                      for p in points]}
    return doc


# ---------------------------------------------------------------------------------------------------
# the profile's laws: `moe-sim validate --fit`
# ---------------------------------------------------------------------------------------------------

SET_FILE = "kernel_set.toml"  # beside the CSVs: the set's name, description and role -> implementations


def kernel_set_of(folder: str | Path, hw: HardwareProfile) -> KernelSet:
    """The kernel set these measurements define (their kernel_set.toml), its laws fitted on the fitted half."""
    root = Path(folder)
    path = root / SET_FILE
    if not path.is_file():
        raise UserError(f"--measurements {folder}: no {SET_FILE} names the kernel set these CSVs measure.")
    try:
        meta = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid TOML ({exc}).") from None
    points, fits = fitted_points(folder, hw)
    parts = root.resolve().parts  # calibration/h200[/production], from a clone or the installed package alike
    tail = parts[len(parts) - 1 - parts[::-1].index("calibration"):] if "calibration" in parts else parts[-2:]
    label = "/".join(tail)
    ranks = sorted({p.row["P"] for p in points if p.row["family"] == "collective" and p.row["P"] > 1})
    fitted_res, held = family_residuals(points, fits)
    mapped = {n for names in (meta.get("impls") or {}).values() for n in names}
    unmapped = sorted({p.row["impl"] for p in points if p.group.count("/") and p.row["impl"] not in mapped})
    body = {"description": meta.get("description"), "impls": meta.get("impls"), "ranks": ranks, "pdl": meta.get("pdl"),
            "unmapped": unmapped, "residuals": {f: {"fitted": r, "held_back": held.get(f, [])}
                                                for f, r in fitted_res.items()},
            "source": f"{label}: {len(points)} rows, each law fitted on the even half of its grid "
                      f"(moe-sim validate --measurements {label} --fit)",
            "laws": {g: {"n": f.n, "terms": list(f.names), "regimes": [list(c) for c in f.regimes]}
                     for g, f in fits.items()}}
    if not isinstance(meta.get("default", False), bool):
        raise UserError(f"{path}: 'default' must be true or false (do answers price with this set by default?).")
    return parse_set(str(meta.get("name", "")), body, path.name)


def _set_meta(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / SET_FILE
    try:
        return tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}


def set_name(folder: str | Path) -> str | None:
    """The kernel set a measurements folder defines (its kernel_set.toml's name), None without one."""
    name = _set_meta(folder).get("name")
    return name if isinstance(name, str) and name else None


def set_impls(folder: str | Path) -> dict[str, tuple[str, ...]]:
    """role -> implementations of the set a measurements folder defines ({} without a kernel_set.toml)."""
    impls = _set_meta(folder).get("impls")
    return {r: tuple(n) for r, n in impls.items()} if isinstance(impls, dict) else {}


def set_default(folder: str | Path) -> bool:
    """Whether the folder's set is to be its GPU's default (the best-measured production kernels)."""
    return _set_meta(folder).get("default") is True


def write_kernel_set(kset: KernelSet, hw: HardwareProfile, make_default: bool = False,
                     path: Path | None = None) -> Path:
    """Write (or replace) `kset` in the GPU's laws file, keeping its other sets; the file's default set (what
    an answer prices with unless --kernels says otherwise) becomes `kset` only when asked."""
    path = path or laws_path(hw.name)
    default, sets = load_sets(path) if path.is_file() else (DATASHEET, {})
    sets[kset.name] = kset
    default = kset.name if make_default else default
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_sets(hw.name, default, sets.values()), encoding="utf-8")
    return path
