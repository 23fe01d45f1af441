"""Pre-register the cost model's predictions for every point of the GPU suite, before measuring.

    python benchmarks/gpu/predict.py [--hardware h200] [--out calibration/h200/predictions.csv]
    python benchmarks/gpu/predict.py --set production --out calibration/h200/production/predictions.csv
    python benchmarks/gpu/predict.py --set others --out calibration/h200/production/others/predictions.csv

Prices each point of points.py with the named hardware profile *as it stands* (no refit) through
simulator.cost.measured.price_row, the same function `moe-sim validate` uses, and writes one row per
point: the point's fields, the model's time and its terms. Commit the file before the GPU run: the
error of these numbers against the measurements is the model's out-of-sample error.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import points as pts  # noqa: E402
from rows import simulator_commit, write_rows  # noqa: E402
from simulator.cost.measured import price_row  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

TERMS = ["model_us", "launch_us", "fixed_us", "mem_us", "math_us", "comm_us", "bytes", "flops", "bound", "algorithm"]


def profile_digest(name: str) -> str:
    """sha256 of the profile file: which constants the predictions were made with."""
    from simulator.hardware import PROFILES_DIR
    path = Path(name) if name.endswith(".toml") else PROFILES_DIR / f"{name}.toml"
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--out", type=Path, default=ROOT / "calibration" / "h200" / "predictions.csv")
    ap.add_argument("--set", choices=("suite", "production", "others", "layout"), default="suite",
                    help="the points to price: the suite's (points.all_points), the production kernels' "
                         "(points.production_points and tile_probe_points, measured by production.py; "
                         "points.gqa_points, by gqa_rows.py), or the production kernels at models the laws were "
                         "not fitted on (points.other_model_points, production.py / gqa_rows.py --points others), or "
                         "the grid's GEMMs on nn.Linear's weight layout (points.linear_points, --points layout)")
    ap.add_argument("--add-new", action="store_true",
                    help="keep every row already in --out (its predictions were registered before their run) "
                         "and price only the points it lacks")
    args = ap.parse_args()
    hw = load_hardware(args.hardware)
    commit = simulator_commit()
    kept: dict[str, dict] = {}
    if args.add_new and args.out.exists():
        with args.out.open(newline="") as f:
            kept = {r["id"]: r for r in csv.DictReader(f)}
    rows = []
    production = pts.production_points() + pts.tile_probe_points() + pts.gqa_points()
    chosen = {"suite": pts.all_points, "production": lambda: production, "others": pts.other_model_points,
              "layout": pts.linear_points}[args.set]
    for p in chosen():
        if p.id in kept:
            rows.append(kept[p.id])
            continue
        rows.append({**p.row(), **{k: (round(v, 4) if isinstance(v, float) else v)
                                   for k, v in price_row(p.row(), hw).items()},
                     "hardware": hw.name, "profile_sha256": profile_digest(args.hardware), "model_commit": commit})
    write_rows(args.out, rows, pts.FIELDS + TERMS + ["hardware", "profile_sha256", "model_commit"])
    print(f"wrote {args.out}: {len(rows)} predictions, {len(rows) - len(kept)} new, with the {hw.name} profile "
          f"as it stands (commit {commit}); {len(kept)} kept as registered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
