"""Benchmark: `moe-sim run` throughput, grid points per second, on all cores.

    python benchmarks/bench_sweep.py                   # the 100,800-point grid below, all cores
    python benchmarks/bench_sweep.py --points 5000 --workers 1 --json
    python benchmarks/bench_sweep.py --no-interval           # central values only (no 100-draw band a point)

The grid (kind "step", Kimi K3 at TP16 on the two GPUs it fits at TP16, GB300 and GB200; the innermost
axis last): batch {1, 2, 4, ..., 128} x context {512, 1024, ..., 35840} x draft tokens {1, 3, 7} x
expert skew {0, 1.01, 1.2} x draft correlation {0, 0.5} x acceptance length {1, 1.25, ..., 2} x
hardware = 100,800 whole-step estimates, both variants: 201,600 rows.
`--points N` takes the first N points in grid order. Each run starts with empty caches (a fresh
process per worker). What is shared between points, and why it is exact: a layer's plan and its
makespan are priced once per `cost.step.plan_shape` and GPU (a KDA layer does not read the context,
a dense one not the routing), the head and drafting forwards once per their arguments, and a step's
times, central and drawn, once per point but its acceptance length (it scales the tokens, no time);
everything a point differs in is recomputed.

Every row carries the 90 % interval of 100 seeded draws (issue 12): a new plan is priced 101 times, its
draws scheduled by the compiled rows loop (`cost/streams.py`, ~2.5 µs a (plan, draw) row) a chunk of
points at a time, which with the new plans' building sets the rate; `--no-interval` measures the same
sweep with central values only.

Napkin math (central values): 10,080 distinct MLA plan shapes x 2 variants x ~0.3 ms (build ~0.15 ms: the
~25 kernels that do not read the context are shared by every context's plan, `memo.context_free`;
price on 2 GPUs ~0.05-0.1 ms each, each kernel's terms remembered per GPU) = ~6 s of one core, ~0.06 ms a point.
Intervals: ~0.22 newly drawn (plan, GPU) pairs a point (a drafter's five equal dense layers are one plan)
x 100 draws x ~3 µs a row (compiled without reference counts: ~11 µs with them on a Xeon VM) = ~0.07 ms,
their drawn terms ~0.1 ms, naming the plans, pricing the steps and seven quantiles ~0.25 ms: ~0.4 ms a
point. Each worker freezes its caches out of the cyclic collector (`sweep._evaluate_chunk`): full
collections walked them all, ~10 % of a worker's time. Measured: ~0.85 ms a point of one core in all, the
grid in 41-45 s on two workers (2026-12-01, fourth session; 62-70 s for the build before it, same hour).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from simulator import sweep
from simulator.scenario import DEFAULTS, Scenario

GRID = {"tp": [16], "batch": [1, 2, 4, 8, 16, 32, 64, 128], "context": [512 * i for i in range(1, 71)],
        "draft_tokens": [1, 3, 7], "expert_skew": [0.0, 1.01, 1.2], "draft_correlation": [0.0, 0.5],
        "acceptance_length": [1.0, 1.25, 1.5, 1.75, 2.0], "hardware": ["gb300", "gb200"]}


def grid(points: int) -> Scenario:
    sc = Scenario("bench-sweep", "benchmarks/bench_sweep.py", "How fast does a sweep run?", "step",
                  DEFAULTS | {"model": "kimi-k3"}, GRID)
    if not 1 <= points <= sc.count:
        print(f"--points must lie in [1, {sc.count:,}].", file=sys.stderr)
        raise SystemExit(2)
    return sc


def measure(points: int, workers: int, interval: bool = True) -> dict:
    sc = grid(points)
    limited = Scenario(sc.name, sc.path, sc.question, sc.kind, sc.base, sc.sweep)
    todo = (p for _, p in zip(range(points), limited.points()))
    t0 = time.perf_counter()
    rows = [r for point_rows in sweep.evaluate_points(todo, sc.kind, points, workers, interval) for r in point_rows]
    seconds = time.perf_counter() - t0
    ok = sum(r["status"] == "ok" for r in rows)
    return {"points": points, "seconds": round(seconds, 3), "points_per_s": round(points / seconds, 1),
            "rows": len(rows), "rows_ok": ok, "workers": workers, "grid_points": sc.count, "interval": interval}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=100_800)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--no-interval", action="store_true", help="central values only (rows without the 90 %% band)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    doc = measure(args.points, args.workers, not args.no_interval)
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"{doc['points']:,} points ({doc['rows_ok']:,} of {doc['rows']:,} rows ok"
              f"{'' if doc['interval'] else ', no interval'}) in {doc['seconds']} s on {doc['workers']} processes: "
              f"{doc['points_per_s']:,} points/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
