"""Benchmark: how fast the cost model estimates whole decode steps, on one core.

    python benchmarks/bench_cost_model.py            # 1,000-configuration sweep, wall time and rate

The sweep: 5 GPUs x TP {4, 8} x variant {standard, specialized} x batch 1..50 = 1,000 whole-step
estimates of Kimi K3 (every layer type scheduled, plus the head). Target: under one second.
Each repeat starts with empty plan caches; within a sweep a plan built for one GPU is reused for the
other four (plans do not depend on the hardware), as in any sweep with a hardware axis.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from simulator.config import load_model  # noqa: E402
from simulator.cost import step  # noqa: E402
from simulator.cost.step import estimate_step  # noqa: E402
from simulator.hardware import list_hardware, load_hardware  # noqa: E402


def sweep(batches: int) -> int:
    for cache in (step.build_plan, step.head_plan, step._layer_us, step.head_us, step.draft_us, step.step_times):
        cache.cache_clear()  # every repeat starts cold: no plan or price survives from an earlier run
    cfg = load_model("kimi-k3")
    n = 0
    for name in list_hardware():
        hw = load_hardware(name)
        for tp in (4, 8):
            for variant in ("standard", "specialized"):
                for batch in range(1, batches + 1):
                    estimate_step(cfg, hw, variant, tp, batch, 512)
                    n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=50, help="batch sizes per (GPU, TP, variant)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    best = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        n = sweep(args.batches)
        best = min(best, time.perf_counter() - start)
    print(f"{n} whole-step estimates in {best:.3f} s (best of {args.repeat}) = {n / best:,.0f} estimates/s "
          f"= {best / n * 1e3:.2f} ms each; target: 1,000 in < 1 s")


if __name__ == "__main__":
    main()
