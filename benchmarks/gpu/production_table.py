"""Print the production-kernel table of docs/production-kernels.md from the measured rows.

    python benchmarks/gpu/production_table.py [--folder calibration/h200/production] [--ceilings calibration/h200]

Per implementation: the points measured, the range of µs per launch, and the best achieved rate: bytes the
plan declares for the kernel (predictions.csv, the model's own count: weights, cache or state, activations)
over the measured median, as GB/s and as a share of the H200's measured read ceiling (a 4 GiB read,
ceiling.csv); for dense GEMMs also FLOP/s against the measured 8192^3 bf16 GEMM. Rows whose status is not
ok are left out.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import points as pts  # noqa: E402


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return [r for r in csv.DictReader(f) if r.get("status", "ok") == "ok"]


def ceilings(folder: Path) -> tuple[float, float]:
    """(read GB/s, bf16 GEMM TFLOP/s) measured on the same kind of GPU (the suite's ceiling rows)."""
    rows = {r["variant"]: r for r in _rows(folder / "ceiling.csv") if r["variant"] in ("read", "large_gemm")
            and (r["variant"] == "large_gemm" or int(r["n_bytes"]) == 4 << 30)}
    read = int(rows["read"]["n_bytes"]) / float(rows["read"]["median_us"]) / 1e3
    g = rows["large_gemm"]
    return read, 2 * int(g["M"]) * int(g["K"]) * int(g["N"]) / float(g["median_us"]) / 1e6


def table(folder: Path, ceiling_folder: Path) -> list[str]:
    read_gbps, gemm_tflops = ceilings(ceiling_folder)
    by_impl: dict[str, list[tuple[float, float, float, str]]] = defaultdict(list)
    # the grid, and the layout probe (the grid's GEMMs on nn.Linear's weight, production/layout: not fitted on)
    for path in sorted(folder.glob("*.csv")) + sorted((folder / "layout").glob("*.csv")):
        if path.name == "predictions.csv":
            continue
        priced = {r["id"]: r for r in _rows(path.parent / "predictions.csv")}
        for r in _rows(path):
            us, p = float(r["median_us"]), priced[r["id"]]
            by_impl[r["impl"]].append((us, float(p["bytes"]) / us / 1e3, float(p["flops"]) / us / 1e6, r["id"]))
    out = [f"read ceiling {read_gbps:,.0f} GB/s, bf16 GEMM ceiling {gemm_tflops:,.0f} TFLOP/s (measured)", "",
           "| impl | package | kernel | points | µs per launch | best GB/s (share of read ceiling) | at |",
           "|---|---|---|---|---|---|---|"]
    for impl, runs in sorted(by_impl.items()):
        package, kernel, standin = pts.PRODUCTION_IMPLS[impl]
        us = [r[0] for r in runs]
        best = max(runs, key=lambda r: r[1])
        rate = f"{best[1]:,.0f} ({best[1] / read_gbps:.0%})"
        if impl == "torch_matmul":
            top = max(runs, key=lambda r: r[2])
            m = top[3].split('/M=')[1].split('/')[0]
            rate += f"; {top[2]:,.0f} TFLOP/s ({top[2] / gemm_tflops:.0%}) at M = {m}"
        note = f" ({standin})" if standin else ""
        out.append(f"| `{impl}` | {package} | {kernel}{note} | {len(runs)} | {min(us):.1f} - {max(us):,.1f} | {rate} "
                   f"| `{best[3]}` |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, default=ROOT / "calibration" / "h200" / "production")
    ap.add_argument("--ceilings", type=Path, default=ROOT / "calibration" / "h200")
    args = ap.parse_args()
    for path in (args.folder / "predictions.csv", args.ceilings / "ceiling.csv"):
        if not path.is_file():
            print(f"{path}: no such file (the production rows need their predictions and the suite's ceilings).",
                  file=sys.stderr)
            return 2
    print("\n".join(table(args.folder, args.ceilings)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
