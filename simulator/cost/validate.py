"""Hold the cost model to GPU measurements: error per family before and after a refit on held-back points.

Input: a folder of measurement CSVs written by benchmarks/gpu/suite.py (one per family; rows with
`status` ok), optionally beside `predictions.csv` written by benchmarks/gpu/predict.py before the run.

Three figures per family, each |predicted / measured - 1| in percent:
- **pre-registered**: predictions.csv, made with the profile as it stood before the measurements;
- **model**: the cost model as it stands now (simulator.cost.measured.price_row), all points;
- **refit (held back)**: a family law fitted on one half of each grid and tested on the other half.

The refit law of each family (`features` lists them) is linear in a few physical constants apart from
one max(bytes / bw, flops / R) roof, and is fitted per group: one implementation of one family, short- and
long-K GEMMs apart, fc1 and fc2 apart (fc2's short K is not fc1), one floor per small kernel. t0 is the
per-launch latency (launch gap + fixed cost), bw an achieved HBM bandwidth, R an achieved FLOP rate;
every constant is >= 0 and no rate beats the GPU's peak; the fit minimises the relative squared error.
Points alternate between the fit and the held-back half in grid order within each group and kernel, so
the held-back points interleave the fitted ones (an interpolation test, not an extrapolation test).

Dimension legend: bytes through HBM as the plan declares them, flops, U unique experts, n payload.
"""

from __future__ import annotations

import csv
import functools
import itertools
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simulator.cost.measured import normalise, price_row
from simulator.plans.kda_kernels import KDA_BV, KDA_RESIDENT
from simulator.plans.kernel import FAMILIES as KERNEL_FAMILIES
from simulator.errors import UserError
from simulator.hardware import HardwareProfile

FAMILIES = ("ceiling",) + KERNEL_FAMILIES  # the plans' kernel families, and the suite's bandwidth ceilings


# ---------------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------------

def read_measurements(folder: str | Path) -> list[dict[str, Any]]:
    """Every ok row of every family CSV (<family>.csv) in `folder`, typed."""
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"--measurements {folder}: not a folder of measurement CSVs.")
    rows = []
    for path in sorted(root.glob("*.csv")):
        if path.stem not in FAMILIES:  # predictions.csv, tuning and skew side tables
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
    """Constants are shared within a group: one implementation of one family; fc1 and fc2 apart, and each
    small kernel apart (a norm, a top-k and a copy have different floors)."""
    if row["family"] in ("ceiling", "small"):
        return row["family"]
    g = f"{row['family']}/{row['impl']}"
    if row["family"] == "gemm":  # a short K (<= 1024) cannot hide its prologue / epilogue behind the K loop
        return g + ("/short_k" if row["K"] <= SHORT_K else "/long_k")
    if row["family"] != "moe":
        return g
    g += f"/{row['plan_key']}"  # the suite's W4A16 kernel compiles one tile config per BLOCK_M (TILE_CONFIG)
    return g + f"/block_m{moe_block(row)}" if row["impl"] == "triton_w4a16" else g


def wire_bytes(row: Mapping[str, Any], algorithm: str) -> float:
    """Bytes each rank sends over NVLink for the collective's algorithm (collectives.py)."""
    n, p = row["n_bytes"], max(row["P"], 1)
    return {"one_shot": (p - 1) * n, "all_gather": (p - 1) * n, "reduce_scatter": (p - 1) / p * n}.get(
        algorithm, 2 * (p - 1) / p * n)


MLA_TILE = 64  # cache slots per tile of the suite's split-KV kernel
SHORT_K = 1024  # reduction depth at or below which a GEMM tile runs <= 8 K-steps of 128
W4A16_BLOCK_N = {16: 32, 64: 64}  # the suite's W4A16 tile config: BLOCK_M -> BLOCK_N (fam_moe.TILE_CONFIG)
NARROW_N = 1024  # output width at or below which cuBLAS splits K (two launches in calibration/h200/gemm.csv)


GEMM_TILE = (64, 128)  # output rows x columns of one CTA's tile, as assumed for cuBLAS on Hopper
SPLIT_K = (1, 2, 3, 4, 6, 8)  # K splits a library may choose; each split keeps >= MIN_SPLIT_DEPTH of K
MIN_SPLIT_DEPTH = 512


@functools.lru_cache(maxsize=4096)
def tiled_gemm_flops(m: int, k: int, n: int, sms: int) -> float:
    """FLOPs of a dense [m, k] x [k, n] GEMM as the SMs spend them: whole 64 x 128 output tiles, in waves
    of one tile per SM, with the split of K that makes the fewest waves of work.

        tiles = ceil(m / 64) ceil(n / 128);  waves(s) = ceil(tiles s / SMs)
        F_tiled = min over s of  waves(s) x SMs x 2 x 64 x 128 x k / s

    Every SM runs as long as the busiest one: a grid smaller than the GPU leaves SMs idle and a partial tile
    computes its padding. At decode m the 64-row tile is mostly padding, so a narrow GEMM costs about as
    much at n = 256 as at n = 896 (the H200 router at m <= 64 takes 8.6-10.5 µs across that range). The
    tile and the cheapest split are assumptions: cuBLAS chooses otherwise (calibration/h200/gemm_kernels.csv;
    the n = 560 router at m = 2048 runs 128 x 80 tiles unsplit, one wave, and this law misses it by ~20 %).
    Large GEMMs approach the useful FLOPs."""
    bm, bn = GEMM_TILE
    tiles = -(-m // bm) * -(-n // bn)
    best = math.inf
    for s in SPLIT_K:
        if s > 1 and k / s < MIN_SPLIT_DEPTH:
            break
        best = min(best, -(-tiles * s // sms) * sms * 2.0 * bm * bn * k / s)
    return best


def kda_grid(impl: str, head_dim: int) -> tuple[int, int]:
    """(programs per (sequence, head), programs resident per SM) of a KDA decode grid: one program per head
    (four warps, the whole head_dim x head_dim state) against vLLM's split-V grid, as the plans declare it
    (kda_kernels)."""
    return (head_dim // KDA_BV, KDA_RESIDENT) if impl == "triton_split_v" else (1, 1)


def mla_splits(batch: int, cached: int, sms: int, tile: int = MLA_TILE) -> tuple[int, int]:
    """(splits, chunk) of a flash-decoding grid: B x splits >= 2 x SMs where the cache has enough tiles."""
    want = max(1, min(-(-2 * sms // batch), -(-cached // tile)))
    chunk = -(-(-(-cached // want)) // tile) * tile
    return -(-cached // chunk), chunk


def topk(row: Mapping[str, Any]) -> int:
    from simulator.config import load_model
    return load_model(row["model"]).top_k


def moe_tiles(row: Mapping[str, Any]) -> tuple[float, int]:
    """(expected row tiles, BLOCK_M) of the suite's grouped GEMM at this point (pricing.expected_tiles)."""
    from simulator.cost.pricing import expected_tiles
    return expected_tiles(row["M"], row["M"] * topk(row), row["U"])


def moe_block(row: Mapping[str, Any]) -> int:
    return moe_tiles(row)[1]


def features(row: Mapping[str, Any], priced: Mapping[str, Any], hw: HardwareProfile) -> dict[str, float]:
    """Named regressors of the family law: each multiplies one constant. `bytes` and `flops` are the two
    roofs (the law takes their max); every other term adds. Family by family:
      gemm       t0 + max(W + X bytes / bw, tiled flops / R) + out bytes / bw_out + K c_narrow [N <= 1024]
                 (tiled: 64 x 128 output tiles in waves over the SMs, tiled_gemm_flops; a narrow
                 output splits K and reduces the partial sums in a second pass)
      moe        t0 + max(bytes / bw, padded flops / R) + U c_U   (padded: whole BLOCK_M-row tiles)
      W4A16      t0 + bytes / bw + tiles K N c_dq + M k K ceil(N / BLOCK_N) c_a + U c_U  (per tile config:
                 each tile dequantises its slab, each N-program re-reads the routed rows)
      small      t0[kernel] + bytes / bw         (a floor per kernel: a top-k is not a copy; one bw)
      kda        t0 + max(waves T c_token + state bytes / bw + per-token state bytes / bw_L2,
                          written bytes beyond L2 / bw_drain + state bytes read / bw_r)
                 (each program runs its T tokens in order, waves of the grid, kda_grid, and writes its
                 states into L2; what L2 cannot hold drains to HBM meanwhile, and the slower of the two
                 ends the kernel. vLLM's verify writes T states)
      mla        t0 + ceil(B splits row-blocks / SMs) ceil(chunk / 64) c_tile + splits c_combine
                 (split-KV flash decoding: waves of programs, each over its chunk; a combine pass)
      collective t0 + wire bytes / beta                                     (NCCL: two protocols)
    """
    fam = row["family"]
    if fam == "collective":
        return {"t0": 1.0, "wire_bytes": wire_bytes(row, priced["algorithm"])}
    if fam == "kda":
        from simulator.config import load_model
        d = load_model(row["model"]).kda_head_dim
        state = row["B"] * row["heads"] * d * d * 4  # fp32 [d, d] per (sequence, head)
        extra = (row["T"] - 1) * state if row["variant"] == "per_token" else 0
        split, resident = kda_grid(row.get("impl", "triton"), d)
        waves = -(-row["B"] * row["heads"] * split // (hw.sm_count * resident))
        return {"t0": 1.0, "serial": float(waves * row["T"]), "state_bytes": 2.0 * state,  # L2 holds what it can:
                "token_state_bytes": float(extra), "drain_bytes": float(max(0, state + extra - hw.l2_bytes)),
                "drain_state_bytes": float(state)}
    if fam == "mla":
        splits, chunk = mla_splits(row["B"], row["S"], hw.sm_count)
        programs = row["B"] * splits * -(-row["T"] * row["heads"] // 16)
        return {"t0": 1.0, "tile_steps": float(-(-programs // hw.sm_count) * -(-chunk // MLA_TILE)),
                "splits": float(splits)}
    f = {"t0": 1.0, "bytes": float(priced["bytes"]), "flops": float(priced["flops"])}
    if fam == "gemm":
        out = row["M"] * row["N"] * (4 if row["variant"] == "out_fp32" else 2)
        f["bytes"] -= out
        f["out_bytes"] = float(out)
        f["narrow_k"] = row["K"] / 1000.0 if row["N"] <= NARROW_N else 0.0
        f["flops"] = tiled_gemm_flops(row["M"], row["K"], row["N"], hw.sm_count)  # whole tiles, in waves
    if fam == "moe":  # padded tile math: every BLOCK_M-row block of an expert runs a full tile
        tiles, block = moe_tiles(row)  # as the cost model counts them: U experts share M k rows
        f["experts"] = float(row["U"])
        if row.get("fmt") in ("mxfp4", "nvfp4"):  # W4A16: CUDA-core work per tile, not tensor-core math
            del f["flops"]
            f["dequant"] = tiles * row["K"] * row["N"] / 1e6
            f["a_rereads"] = row["M"] * topk(row) * row["K"] * 2 * -(-row["N"] // W4A16_BLOCK_N[block]) / 1e6
        else:
            f["flops"] = 2.0 * tiles * block * row["K"] * row["N"]
    if fam == "small":  # each kernel its own floor, one bandwidth for all
        del f["flops"], f["t0"]
        f[f"t0_{row['plan_key'] or row['impl']}"] = 1.0
    return f


@dataclass
class Fit:
    """Constants of one group's law: a coefficient per regressor (µs per unit) for each regime. A law
    with two regimes (NCCL's small- and large-message protocols) predicts the cheaper one."""

    names: tuple[str, ...]
    regimes: tuple[tuple[float, ...], ...]
    n: int

    def predict(self, feats: Mapping[str, float]) -> float:
        return min(_law(self.names, coef, feats) for coef in self.regimes)

    def constants(self) -> dict[str, float | None]:
        """Physical reading: t0 µs, bw GB/s, R TFLOP/s, beta GB/s, other terms in µs per unit."""
        out: dict[str, float | None] = {}
        for i, coef in enumerate(self.regimes):
            tag = "" if len(self.regimes) == 1 else f"_regime{i + 1}"
            for name, c in zip(self.names, coef):
                if name.endswith("bytes"):
                    out[f"{name}_gbps{tag}"] = 1e-3 / c if c > 0 else None
                elif name == "flops":
                    out[f"tflops{tag}"] = 1e-6 / c if c > 0 else None
                else:
                    out[f"{name}_us{tag}"] = c
        return out


# Roofs: a law whose features include both sides of a pair takes the slower side, not their sum.
ROOFS = ((("bytes",), ("flops",)),  # a kernel's streaming against its math
         (("serial", "state_bytes", "token_state_bytes"), ("drain_bytes", "drain_state_bytes")))  # KDA: own work against HBM


def roof_of(names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The pair of roofs a law with these features takes the max of (at most one pair applies)."""
    found = [r for r in ROOFS if all(any(n in names for n in side) for side in r)]
    return found[0] if found else None


def _law(names: tuple[str, ...], coef: tuple[float, ...], feats: Mapping[str, float]) -> float:
    """t = max(one roof's terms, the other's) + every other term (ROOFS)."""
    terms = {n: c * feats[n] for n, c in zip(names, coef)}
    roof = roof_of(names)
    if roof is None:
        return sum(terms.values())
    sides = [sum(terms.pop(n, 0.0) for n in side) for side in roof]
    return max(sides) + sum(terms.values())


def _nnls(A: np.ndarray, b: np.ndarray, lower: np.ndarray | None = None) -> np.ndarray:
    """min |A c - b|^2 with c >= 0, by trying every subset of the used columns (at most ~10 here). A used
    column's coefficient must also reach `lower` (no bandwidth above the HBM peak, no FLOP rate above the
    tensor-core peak): a fit that needs an unphysical constant is not taken."""
    lower = np.zeros(A.shape[1]) if lower is None else lower
    best, best_err = np.zeros(A.shape[1]), math.inf
    cols_used = [j for j in range(A.shape[1]) if np.any(A[:, j])]
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
    best, best_err = np.zeros(len(names)), math.inf
    for cut in [-math.inf, math.inf] + list(np.quantile(ratio, (0.2, 0.4, 0.6, 0.8))) + [0.005, 0.01, 0.02, 0.05]:
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
        err = float(np.sum((np.array([_law(names, tuple(coef), dict(zip(names, x))) for x in X]) / t - 1) ** 2))
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
        g = group_of(p.row) + "/" + p.row["plan_key"]  # small kernels: each kernel's own grid
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
                law = law_us(normalise(raw), fits, hw)
                if law is not None:
                    errors.append(pct(law, float(raw["median_us"])))
        out[path.stem.removesuffix("_probe")] = summary(errors)
    return out


def law_us(row: Mapping[str, Any], fits: Mapping[str, Fit], hw: HardwareProfile) -> float | None:
    """What the group law fitted on the grid predicts for a row that was not fitted (None: no law for its group)."""
    fit = fits.get(group_of(row))
    if fit is None:
        return None
    feats = features(row, price_row(row, hw), hw)
    return fit.predict({n: feats.get(n, 0.0) for n in fit.names})


def fitted_points(folder: str | Path, hw: HardwareProfile) -> tuple[list[Point], dict[str, Fit]]:
    """Every measured point priced, split into halves and refit: (points, the group laws)."""
    prereg = read_predictions(folder)
    points = []
    for row in read_measurements(folder):
        priced = price_row(row, hw)
        points.append(Point(row, row["measured_us"], priced["model_us"], prereg.get(row["id"]), False,
                            feats=features(row, priced, hw)))
    split_halves(points)
    return points, refit(points, hw)


def refit(points: list[Point], hw: HardwareProfile | None = None) -> dict[str, Fit]:
    fits = {}
    for g in dict.fromkeys(group_of(p.row) for p in points):
        mine = [p for p in points if group_of(p.row) == g]
        train = [p for p in mine if not p.held_back] or mine
        names = tuple(dict.fromkeys(n for p in mine for n in p.feats))
        for p in mine:
            p.feats = {n: p.feats.get(n, 0.0) for n in names}
        X = np.array([[p.feats[n] for n in names] for p in train])
        regimes = 2 if g.startswith("collective/nccl") else 1
        # small kernels write their outputs into L2 (write-back): their slope may beat the HBM read peak
        fits[g] = fit_group(X, np.array([p.measured for p in train]), names, regimes, None if g == "small" else hw)
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
