"""Benchmark: the bf16 decode GEMM (`fast.bf16_matmul`) on TP16 shards of full-size weights, by prefetch distance.

    python benchmarks/bf16_gemv.py [--dtype float32|float64] [--rounds N] [--json]

At batch 1 the plans' dense projections are x [1, K] @ W_r for each simulated rank r's shard of a bf16
weight W [K, N] held once: a column shard is a strided view, K rows of 2 N/16 bytes, one whole row
(2 N bytes: 7-24 KB here) apart, so every row sits in a page of its own. Each figure is GB/s of bf16 bytes
read (the shard's K x N x 2), the median (and best) over N rounds of the 16 ranks' calls in turn, for
`fast.bf16_matmul`'s `ahead` = 0 (no software prefetch), 2, 4 (its default, `fast.BF16_AHEAD`) and 8 KB,
next to the STREAM copy and a read alone of benchmarks/fullsize.py measured in the same process. (The form
before 2026-12-01, rows sliced from the view, read these shards at 0.7-2.2 GB/s in the layer.)

The shapes are those a K3 KDA + MoE layer's plans multiply at TP16 (benchmarks/fullsize.py at batch 1,
counted by shape): column shards [7168, 768] of [7168, 12288], [7168, 384] of [7168, 6144], [7168, 224]
of [7168, 3584] and [3584, 448] of [3584, 7168], and row shards [768, 7168] of [12288, 7168] (contiguous
rows). Weights are bfloat16 draws of N(0, 0.02^2), the scale of the model's: random bit patterns would
include subnormal float32s, whose products take microcode assists and time something else.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import ml_dtypes
import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fullsize import copy_gbps, read_gbps  # noqa: E402

from simulator import jit  # noqa: E402
from simulator.fast import kernels as fast  # noqa: E402
from simulator.weights import column_shard, row_shard  # noqa: E402

TP = 16
SHAPES = {"col 7168x768 of 12288": (7168, 12288, "col"), "col 7168x384 of 6144": (7168, 6144, "col"),
          "col 7168x224 of 3584": (7168, 3584, "col"), "col 3584x448 of 7168": (3584, 7168, "col"),
          "row 768x7168 of 12288": (12288, 7168, "row")}
AHEAD = (0, 2048, 4096, 8192)


def shard(whole: np.ndarray, how: str, r: int) -> np.ndarray:
    """Rank r's TP16 shard of a whole weight, the view the plans multiply (`weights.column_shard` / `row_shard`)."""
    return (column_shard if how == "col" else row_shard)(whole, r, TP)


def measure(dtype: type, rounds: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    doc: dict[str, dict[str, float]] = {}
    for name, (k, n, how) in SHAPES.items():
        whole = (rng.standard_normal((k, n), dtype=np.float32) * np.float32(0.02)).astype(ml_dtypes.bfloat16)
        bits = whole.view(np.uint16)
        x = rng.standard_normal((1, shard(bits, how, 0).shape[0])).astype(dtype)
        want = fast.bf16_matmul(x, shard(bits, how, 0))  # compiles; every distance gives these bits
        for ahead in AHEAD:
            assert np.array_equal(fast.bf16_matmul(x, shard(bits, how, 0), ahead), want)
        rates: dict[int, list[float]] = {a: [] for a in AHEAD}
        for _ in range(rounds):
            for ahead in AHEAD:  # in turns, so that every distance sees the same spells of this VM
                for r in range(TP):
                    s = shard(bits, how, r)
                    t0 = time.perf_counter()
                    fast.bf16_matmul(x, s, ahead)
                    rates[ahead].append(s.size * 2 / (time.perf_counter() - t0) / 1e9)
        for ahead, v in rates.items():
            doc.setdefault(name, {})[f"ahead_{ahead}_gbps"] = round(float(np.median(v)), 2)
            doc[name][f"ahead_{ahead}_best_gbps"] = round(max(v), 2)
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                    help="x's dtype: float32 at --precision bf16, float64 at fp64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1:
        print("--rounds must be a positive integer.", file=sys.stderr)
        return 2
    jit.compile_all()
    doc = {"dtype": args.dtype, "threads": numba.get_num_threads(), "rounds": args.rounds,
           "bf16_ahead_bytes": fast.BF16_AHEAD, "copy_gbps": round(copy_gbps(), 1), "read_gbps": round(read_gbps(), 1),
           "shapes": measure(np.dtype(args.dtype).type, args.rounds)}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"bf16 GEMM, x [1, K] {args.dtype}, {doc['threads']} threads, GB/s of bf16 bytes read (median / best "
              f"of {args.rounds} rounds x {TP} shards); copy {doc['copy_gbps']}, read alone {doc['read_gbps']} GB/s")
        for name, figs in doc["shapes"].items():
            cells = "  ".join(f"{a // 1024} KB {figs[f'ahead_{a}_gbps']:5.2f}/{figs[f'ahead_{a}_best_gbps']:5.2f}"
                              for a in AHEAD)
            print(f"  {name:24s} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
