"""Benchmark: what `moe-sim step` costs from a cold shell, with and without its 90 % intervals (issue 12:
interactive, under one second).

    python benchmarks/bench_intervals.py                  # 7 runs of each, a table
    python benchmarks/bench_intervals.py --runs 11 --json

For the default step (Kimi K3, GB300, TP16, batch 1, both variants) and for H200 TP8:
- the whole command in a fresh process (Python start-up and every import included), with intervals and
  with --no-interval: median wall seconds, and median CPU seconds (user + system of the child: on a
  machine shared with other work, CPU time moves less than wall time). Python as installed caches each
  module's bytecode (`__pycache__`, written at install or first import); an environment with
  PYTHONDONTWRITEBYTECODE set (this development machine's) compiles every source again each run, so the
  default step is also timed both ways;
- in one warm process: drawing the sample (for GB300 the conditioning on the published figures) and
  pricing both variants' steps under it from scratch, median CPU seconds;
- for reference, `moe-sim step --help` (start-up, typer and the imports every command pays), and a fresh
  `python -c "import numpy"` beside `"import numpy, numba"` (what importing Numba would add: the kernels
  compile on first call, simulator/jit.py, so `step` imports none).
Each set of commands takes turns run by run, so that load from other work falls on them alike.
Medians of `--runs` runs; ratios in the text of docs/cost-model.md section 8 come from here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

from simulator.config import load_model  # noqa: E402
from simulator.cost import uncertainty as u  # noqa: E402
from simulator.cost.step import estimate_step  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402

CASES = (("gb300", 16), ("h200", 8))


def fresh(*commands: list[str], runs: int, env: dict[str, str] | None = None) -> list[dict[str, float]]:
    """Median wall and CPU seconds of each command in a new process each run; the commands take turns, so
    that load from other work falls on all of them alike."""
    walls: list[list[float]] = [[] for _ in commands]
    cpus: list[list[float]] = [[] for _ in commands]
    for _ in range(runs):
        for i, args in enumerate(commands):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run(args, check=True, capture_output=True, env=env)
            walls[i].append(time.perf_counter() - t)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus[i].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return [{"wall_s": round(statistics.median(w), 3), "cpu_s": round(statistics.median(c), 3)}
            for w, c in zip(walls, cpus)]


def warm_cpu(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return round(statistics.median(times), 4)


def warm(hardware: str, tp: int, runs: int) -> dict[str, float]:
    """CPU seconds, in a process that has built the plans: drawing the sample, pricing the two steps under it."""
    cfg, hw, spec = load_model("kimi-k3"), load_hardware(hardware), u.IntervalSpec()
    estimate_step(cfg, hw, "standard", tp, 1, 512)
    unc = u.uncertainty(hw, spec)

    def price() -> object:
        unc.sample.timelines.clear()  # the conditioning's schedules would otherwise be reused (GB300 batch 1)
        return unc.price(lambda makespan: [estimate_step(cfg, hw, v, tp, 1, 512, makespan=makespan)
                                           for v in ("standard", "specialized")])
    return {"draws_cpu_s": warm_cpu(lambda: u.uncertainty(hw, spec), runs), "pricing_cpu_s": warm_cpu(price, runs)}


def measure(runs: int) -> dict[str, object]:
    step = [sys.executable, "-m", "simulator", "step"]
    help_, numpy, numba = fresh(step + ["--help"], [sys.executable, "-c", "import numpy"],
                                [sys.executable, "-c", "import numpy, numba"], runs=runs)
    doc: dict[str, object] = {"runs": runs, "draws": u.DEFAULT_DRAWS,
                              "reference": {"step_help": help_, "import_numpy": numpy, "import_numpy_numba": numba}}
    for hardware, tp in CASES:
        args = step + ["--hardware", hardware, "--tp", str(tp)]
        on, off = fresh(args, args + ["--no-interval"], runs=runs)
        doc[f"{hardware}_tp{tp}"] = {"with_interval": on, "no_interval": off, "warm": warm(hardware, tp, runs)}
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(step, check=True, capture_output=True, env=cached)  # writes the bytecode caches
    on, off = fresh(step, step + ["--no-interval"], runs=runs, env=cached)
    doc["bytecode_cached"] = {"default_step": {"with_interval": on, "no_interval": off},
                              "environment_compiles_sources": bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))}
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each measurement (medians are reported)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    opts = parser.parse_args()
    doc = measure(opts.runs)
    if opts.json:
        print(json.dumps(doc, indent=1))
        return
    ref = doc["reference"]
    print(f"median of {opts.runs} fresh processes, wall / CPU seconds; `moe-sim step --help` "
          f"{ref['step_help']['wall_s']:.2f} / {ref['step_help']['cpu_s']:.2f}, `import numpy` "
          f"{ref['import_numpy']['wall_s']:.2f} / {ref['import_numpy']['cpu_s']:.2f}, `import numpy, numba` "
          f"{ref['import_numpy_numba']['wall_s']:.2f} / {ref['import_numpy_numba']['cpu_s']:.2f}")
    for hardware, tp in CASES:
        d = doc[f"{hardware}_tp{tp}"]
        on, off, w = d["with_interval"], d["no_interval"], d["warm"]
        print(f"{hardware} TP{tp} batch 1, both variants, {u.DEFAULT_DRAWS} draws: `moe-sim step` {on['wall_s']:.2f} / "
              f"{on['cpu_s']:.2f} s with intervals, {off['wall_s']:.2f} / {off['cpu_s']:.2f} s without "
              f"(CPU x{on['cpu_s'] / off['cpu_s']:.2f}); warm CPU: draws {w['draws_cpu_s']:.3f} s, pricing the two "
              f"steps under them {w['pricing_cpu_s']:.3f} s")
    c = doc["bytecode_cached"]
    note = " (the rows above compile every source each run: PYTHONDONTWRITEBYTECODE is set here)" \
        if c["environment_compiles_sources"] else ""
    with_, without = c["default_step"]["with_interval"], c["default_step"]["no_interval"]
    print(f"default `moe-sim step` with bytecode cached, as installed: {with_['wall_s']:.2f} / "
          f"{with_['cpu_s']:.2f} s with intervals, {without['wall_s']:.2f} / {without['cpu_s']:.2f} s without{note}")


if __name__ == "__main__":
    main()
