"""Benchmark: what the intervals cost `moe-sim step` (issue 12: interactive, under one second).

    python benchmarks/bench_intervals.py

Prints, for the default step (Kimi K3, GB300, TP16, batch 1, both variants) and for H200 TP8:
- the whole command in a fresh process with intervals and with --no-interval (what a user waits for,
  Python start-up, imports and the Numba cache load included), best of 3;
- in one warm process: the draws (for GB300 the conditioning on the published figures) and pricing both
  variants' steps under them from scratch, best of 3 (the command itself reuses the conditioning's
  batch-1 steps when it asks for exactly those).
The machine's load moves the command times by a few tenths of a second; run it twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from simulator.config import load_model  # noqa: E402
from simulator.cost import uncertainty as u  # noqa: E402
from simulator.cost.step import estimate_step  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402


def best(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def command(args: list[str]) -> float:
    return best(lambda: subprocess.run([sys.executable, "-m", "simulator", "step", *args], check=True,
                                       capture_output=True))


def warm(hardware: str, tp: int) -> tuple[float, float]:
    cfg, hw, spec = load_model("kimi-k3"), load_hardware(hardware), u.IntervalSpec()
    estimate_step(cfg, hw, "standard", tp, 1, 512)  # plans built, Numba loaded

    def draws():
        return u.uncertainty(hw, spec)
    unc = draws()

    def price():
        unc.sample.timelines.clear()  # the conditioning's figures would otherwise be reused (GB300 batch 1)
        return [estimate_step(cfg, hw, v, tp, 1, 512, makespan=unc.makespan) for v in ("standard", "specialized")]
    return best(draws), best(price)


def main() -> None:
    for hardware, tp in (("gb300", 16), ("h200", 8)):
        args = ["--hardware", hardware, "--tp", str(tp)]
        on, off = command(args), command(args + ["--no-interval"])
        sample_s, price_s = warm(hardware, tp)
        print(f"{hardware} TP{tp} batch 1, both variants, {u.DEFAULT_DRAWS} draws: `moe-sim step` {on:.2f} s with "
              f"intervals, {off:.2f} s without (+{on - off:.2f} s); warm process: draws {sample_s:.3f} s, "
              f"pricing the two steps under them {price_s:.3f} s")


if __name__ == "__main__":
    main()
