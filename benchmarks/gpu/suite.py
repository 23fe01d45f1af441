"""The GPU measurement suite: measure every point of points.py on a real GPU and write CSVs.

    python benchmarks/gpu/suite.py --part A1 --out DIR          # ceilings, dense GEMMs, MoE, small kernels
    python benchmarks/gpu/suite.py --part A2 --out DIR          # KDA and MLA decode (Triton)
    torchrun --nproc-per-node 2 benchmarks/gpu/suite.py --part B --out DIR   # collectives on two GPUs
    python benchmarks/gpu/suite.py --check                      # numerical checks of the custom kernels
    TRITON_INTERPRET=1 python benchmarks/gpu/suite.py --check --device cpu   # the same on a CPU, tiny shapes

One CSV per family (DIR/<family>.csv) with the point's fields, the environment (GPU, driver, torch,
Triton) and median / p10 / p90 µs per launch; rows are appended as each point finishes, so a run cut
short keeps what it measured. A point that fails is written with its error and the run goes on.
Method: harness.py. Points and their shapes: points.py. Predictions of the same points: predict.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]  # points/harness/fam_* and the simulator package

import points as pts  # noqa: E402
from harness import say_no_gpu, warm_up  # noqa: E402
from rows import ENV_FIELDS, measured_ids, write_row  # noqa: E402

FAMILY_MODULE = {"ceiling": "fam_dense", "gemm": "fam_dense", "moe": "fam_moe", "small": "fam_small",
                 "kda": "fam_attention", "mla": "fam_attention", "collective": "fam_collective"}
def measure_points(points: list, out: Path, env: dict, budget_s: float) -> None:
    import torch
    warm_up(torch)
    t0 = time.time()
    for i, p in enumerate(points):
        if time.time() - t0 > budget_s:
            print(f"budget of {budget_s:.0f} s spent: stopping before point {i} of {len(points)}", flush=True)
            return
        mod = importlib.import_module(FAMILY_MODULE[p.family])
        try:
            res = {"status": "ok", **mod.measure(p, torch)}
        except Exception as exc:  # one bad point must not cost the rest of the run
            traceback.print_exc()
            res = {"status": f"error: {type(exc).__name__}: {exc}"[:300]}
            torch.cuda.empty_cache()
        write_row(out / f"{p.family}.csv", {**p.row(), **{k: env.get(k, "") for k in ENV_FIELDS}, **res})
        print(f"[{time.time() - t0:6.1f}s] {p.id}: {res.get('median_us', '-')} us {res['status']}", flush=True)


def record_environment(out: Path, part: str, env: dict) -> None:
    """One env.json per folder, one entry per part (the device returns at most 8 files per run)."""
    path = out / "env.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc[part] = env
    path.write_text(json.dumps(doc, indent=2))


def run_checks(device: str) -> int:
    """Each custom-kernel module's `check(device)` compares its kernels with simulator/ops; 0 = all pass."""
    failures = 0
    for name in sorted(set(FAMILY_MODULE.values())):
        try:
            mod = importlib.import_module(name)
        except ImportError as exc:
            failures += 1
            print(f"FAIL {name}: cannot import ({exc})", flush=True)
            continue
        if not hasattr(mod, "check"):
            continue
        for label, ok, detail in mod.check(device):
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}.{label}: {detail}", flush=True)
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("A1", "A2", "B"))
    ap.add_argument("--family", action="append", help="only these families (repeatable)")
    ap.add_argument("--impl", action="append", help="only these implementations (repeatable)")
    ap.add_argument("--variant", action="append", help="only points of these variants (repeatable), e.g. bm64_sweep")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--skip-measured", type=Path, metavar="FOLDER",
                    help="leave out points already measured in this folder's CSVs (e.g. calibration/h200)")
    ap.add_argument("--limit", type=int, default=0, help="at most this many points per family (0 = all)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting new points after this long")
    ap.add_argument("--check", action="store_true", help="numerical checks of the custom kernels")
    ap.add_argument("--device", default="cuda", help="device for --check (cpu needs TRITON_INTERPRET=1)")
    args = ap.parse_args()
    if args.check:
        return run_checks(args.device)
    if not args.part or not args.out:
        ap.error("--part and --out are required (or --check)")
    if say_no_gpu("moe-sim GPU suite", "nothing measured (run it on a machine with an NVIDIA GPU)"):
        return 0
    import torch
    from harness import environment
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = [p for p in pts.points_of(part=args.part) if (not args.family or p.family in args.family)
              and (not args.impl or p.impl in args.impl) and (not args.variant or p.variant in args.variant)]
    if args.skip_measured:
        done = measured_ids(args.skip_measured)
        chosen = [p for p in chosen if p.id not in done]
    if args.limit:
        chosen = [p for f in dict.fromkeys(p.family for p in chosen)
                  for p in [q for q in chosen if q.family == f][:args.limit]]
    if args.part == "B":
        return importlib.import_module("fam_collective").run_distributed(chosen, args.out, args.budget_s)
    env = environment(torch)
    record_environment(args.out, args.part, env)
    print(json.dumps(env), flush=True)
    measure_points(chosen, args.out, env, args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
