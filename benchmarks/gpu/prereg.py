"""Pre-register what `moe-sim validate`'s family laws say about points not measured yet.

    python benchmarks/gpu/prereg.py --out calibration/h200/prereg_X.csv [--family gemm] [--variant probe]
                                    [--impl triton_split_v] [--column law_us]

Fits every group's law on the fitted half of the measurements (as `validate` does) and writes, for each
point of points.py that is not measured yet and passes the filters, the law's prediction: id, group,
and one column of µs. Commit the file before the GPU run; `--column` with an existing --out adds a column
(the same points priced by another law, e.g. before and after a change), keeping the rows it has.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import points as pts  # noqa: E402
from rows import measured_ids  # noqa: E402
from simulator.cost import validate as V  # noqa: E402
from simulator.cost.measured import normalise  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402


def law_predictions(folder: Path, todo: list, hw) -> dict[str, tuple[str, float]]:
    """{id: (group, µs)} of the refit laws for the points in `todo`."""
    _, fits = V.fitted_points(folder, hw)
    out = {}
    for p in todo:
        row = normalise(p.row())
        law = V.law_us(row, fits, hw)
        if law is not None:
            out[p.id] = (V.group_of(row), law)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--measurements", type=Path, default=ROOT / "calibration" / "h200")
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--family", action="append")
    ap.add_argument("--impl", action="append")
    ap.add_argument("--variant", action="append")
    ap.add_argument("--column", default="law_us")
    args = ap.parse_args()
    done = measured_ids(args.measurements)
    todo = [p for p in pts.all_points() if p.id not in done and (not args.family or p.family in args.family)
            and (not args.impl or p.impl in args.impl) and (not args.variant or p.variant in args.variant)]
    laws = law_predictions(args.measurements, todo, load_hardware(args.hardware))
    rows: dict[str, dict] = {}
    if args.out.exists():
        with args.out.open(newline="") as f:
            rows = {r["id"]: r for r in csv.DictReader(f)}
    for pid, (group, us) in laws.items():
        rows.setdefault(pid, {"id": pid, "group": group})[args.column] = f"{us:.2f}"
    columns = list(dict.fromkeys(["id", "group"] + [c for r in rows.values() for c in r]))
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows.values())
    print(f"{len(laws)} points -> {args.out} ({args.column})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
