"""Which cuBLAS kernels torch.matmul launches for each GEMM point: the tile shape and split-K the library
chose, the facts the GEMM law's tile and wave terms stand for.

    python benchmarks/gpu/gemm_kernels.py --out DIR     (one H200; ~1 minute for every gemm point)

Writes DIR/gemm_kernels.csv: id, M, K, N, launches, and the kernel names of one eager call in launch order
('|'-joined; memcpy/memset left out). Nothing is timed: `suite.py` times the same calls.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

import points as pts  # noqa: E402
from harness import kernel_names, say_no_gpu  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if say_no_gpu("gemm_kernels", "nothing recorded"):
        return 0
    import torch
    from fam_dense import gemm_calls
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gemm_kernels.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "M", "K", "N", "launches", "kernels"])
        for p in pts.points_of(family="gemm"):
            names = kernel_names(torch, gemm_calls(p, torch)[0])
            w.writerow([p.id, p.M, p.K, p.N, len(names), "|".join(names)])
            f.flush()
            torch.cuda.empty_cache()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
