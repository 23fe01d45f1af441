"""Tile configurations of the Triton W4A16 MXFP4 grouped GEMM (fam_moe.py), timed on three K3 shapes.

    python benchmarks/gpu/tune_w4a16.py [--out FILE]

Engines tune fused-MoE tiles per shape (vLLM ships a JSON of configs per GPU and shape); this does the
same for our kernel so the measured points use a sensible configuration, not the first one written.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

import fam_moe  # noqa: E402
import points as pts  # noqa: E402
from harness import time_graph  # noqa: E402

SHAPES = [p for p in pts.points_of(family="moe") if p.impl == "triton_w4a16" and p.tp == 8 and (
    (p.plan_key == "fc1" and p.M in (1, 64) and not p.variant) or (p.plan_key == "fc2" and p.M == 8 and not p.variant))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("tune_w4a16.csv"))
    args = ap.parse_args()
    import torch
    rows = []
    for p in SHAPES:
        hp = fam_moe.plan(p)
        wd = fam_moe._weights(torch, p, hp["E"])
        a, a_div = fam_moe._a_rows(torch, p, hp)
        sorted_ids = torch.tensor(hp["sorted_ids"], device="cuda")
        c = torch.empty(hp["rows"], p.N, device="cuda", dtype=torch.bfloat16)
        bes = [torch.tensor(hp["block_experts"] + i * p.U, device="cuda") for i in range(hp["slots"])]
        for bn, bk, warps, stages in itertools.product((32, 64, 128), (128, 256), (2, 4, 8), (2, 3, 4)):
            fam_moe.BLOCK_K = bk
            t0 = time.time()
            try:
                calls = [(lambda be=be: fam_moe.w4a16_launch(a, wd["w"], wd["s"], c, sorted_ids, be,
                                                             len(hp["block_experts"]), a_div, hp["block_m"],
                                                             num_warps=warps, num_stages=stages, block_n=bn))
                         for be in bes]
                us = time_graph(torch, calls, reps=max(16, len(calls)), replays=10)["median_us"]
            except Exception as exc:  # a config that does not compile or fit
                us = float("nan")
                print(f"{p.plan_key} M={p.M} U={p.U} bn={bn} bk={bk} w={warps} s={stages}: {type(exc).__name__}")
            rows.append({"id": p.id, "block_n": bn, "block_k": bk, "warps": warps, "stages": stages, "us": us})
            print(f"{p.plan_key} M={p.M} U={p.U} bn={bn} bk={bk} w={warps} s={stages}: {us:.2f} us "
                  f"({time.time() - t0:.1f}s)", flush=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
