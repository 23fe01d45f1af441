"""Measure the production kernels (points.production_points) on a GPU: vLLM 0.33.0's, loaded from its wheel.

    python benchmarks/gpu/vllm_wheel.py --wheel vllm-0.33.0-...whl --out WHEEL_DIR     # here: unpack
    python benchmarks/gpu/production.py --wheel-dir WHEEL_DIR --family moe --out DIR    # on the GPU machine
    python benchmarks/gpu/production.py --wheel-dir WHEEL_DIR --family moe --out DIR --probe

Per family (moe, mla, kda, small, gemm; run each in its own process, so a kernel that faults the CUDA
context costs one family only): the correctness checks of fam_production first, then every point, each
row appended to DIR/<family>.csv as it finishes (the suite's columns, rows.py, plus the package, the
production kernel, what it stands in for, the kernels launched, and the seconds the point took).
DIR/runs.json gets the family's checks, wall time, GPU name and points measured. --probe: the checks and
the first point of each implementation, plan kernel and token count only. Commit predict.py --set production's
file before the run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

import points as pts  # noqa: E402
from harness import say_no_gpu, warm_up  # noqa: E402
from rows import time_points  # noqa: E402

FAMILIES = ("moe", "mla", "kda", "small", "gemm")
EXTRA = ("package", "kernel", "stands_in_for", "kernel_names", "block_m", "tile_config", "point_s", "cold", "flush_us",
         "shared_bytes", "regs", "spills", "resident")


def chosen(family: str, impls: list[str] | None, probe: bool, points: str = "grid") -> list:
    """The points of a run: the production grid, the Triton MoE tile probe (points.tile_probe_points), or
    ("tiles") every Triton MoE point of both, for their tiles and occupancy only."""
    every = {"grid": pts.production_points, "tile_probe": pts.tile_probe_points,
             "tiles": lambda: [p for p in pts.production_points() + pts.tile_probe_points()
                               if p.impl.startswith("vllm_triton_moe")],
             "others": pts.other_model_points, "layout": pts.linear_points,
             "others_tiles": lambda: [p for p in pts.other_model_points() if p.impl.startswith("vllm_triton_moe")]
             }[points]()
    todo = [p for p in every if p.family == family and (not impls or p.impl in impls)]
    if probe:
        todo = list({(p.impl, p.plan_key, p.T): p for p in reversed(todo)}.values())[::-1]  # first of each kind
    return todo


def measure(p, points: str = "grid"):
    """What measures a point: the replay's own launches for its small kernels with no other row
    (points.REPLAY_SMALL, layer_replay.kernel_row), one untimed launch for the tiles, else fam_production."""
    import fam_production as fp
    if points.endswith("tiles"):
        return fp.triton_moe_tile
    if pts.REPLAY_SMALL.get(p.plan_key) == p.impl:
        import layer_replay
        return layer_replay.kernel_row
    return fp.measure


def record_run(out: Path, family: str, doc: dict) -> None:
    path = out / "runs.json"
    runs = json.loads(path.read_text()) if path.exists() else {}
    runs[family + ("_probe" if doc.get("probe") else "")] = doc
    path.write_text(json.dumps(runs, indent=2))


OUTPUT = {"grid": "{family}.csv", "tile_probe": "{family}_probe.csv", "tiles": "{family}_tiles.csv",
          "others": "{family}.csv", "others_tiles": "{family}_tiles.csv", "layout": "{family}.csv"}


def run_family(family: str, wheel, torch, out: Path, env: dict, probe: bool, budget_s: float,
               impls: list[str] | None, points: str = "grid") -> dict:
    import fam_production as fp
    t0 = time.time()
    doc = {"probe": probe, "package": wheel.version, "gpu": env.get("gpu", ""), "checks": []}
    for label, err, bound in (fp.checks(torch, wheel, family) if not points.endswith("tiles") else ()):
        ok = fp.within(err, bound)
        doc["checks"].append({"check": label, "error": err, "bound": bound, "ok": ok})
        print(f"{'ok  ' if ok else 'FAIL'} {family} check {label}: error {err:.3g} (bound {bound:g})", flush=True)
    warm_up(torch)
    todo = chosen(family, impls, probe, points)
    done, failed = time_points(todo, lambda p: measure(p, points)(p, torch, wheel), torch,
                               out / OUTPUT[points].format(family=family), env, EXTRA, t0, budget_s)
    doc.update(wall_s=round(time.time() - t0, 1), points_ok=done, points_failed=failed, points_planned=len(todo))
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel-dir", type=Path, required=True, help="what vllm_wheel.py unpacked")
    ap.add_argument("--family", choices=FAMILIES, required=True)
    ap.add_argument("--impl", action="append", help="only these implementations (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--probe", action="store_true", help="checks and one point per implementation")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new points after this long")
    ap.add_argument("--points", choices=tuple(OUTPUT), default="grid",
                    help="grid: the production grid; tile_probe: the Triton MoE tile probe (-> <family>_probe.csv); "
                         "tiles: every Triton MoE point's tile and occupancy, untimed (-> <family>_tiles.csv); "
                         "others / others_tiles: the same at models the laws were not fitted on "
                         "(points.other_model_points; give them their own --out); layout: the grid's GEMMs on "
                         "nn.Linear's [N, K] weight (points.linear_points; their own --out)")
    args = ap.parse_args()
    if say_no_gpu("moe-sim production kernels", "nothing measured (run it on a machine with an NVIDIA GPU)"):
        return 0
    import torch
    from harness import environment
    import vllm_wheel
    wheel = vllm_wheel.load(args.wheel_dir, torch)
    if wheel is None:
        return 2
    if args.family == "small":  # the replay's small kernels (AttnRes, conv, gated norm) from the extra sources
        from layer_replay import load_extra
        wheel.extra = load_extra(args.wheel_dir, torch)
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment(torch)
    env_path = args.out / "env.json"
    doc = json.loads(env_path.read_text()) if env_path.exists() else {}
    doc["production"] = {**env, "package": wheel.version}
    env_path.write_text(json.dumps(doc, indent=2))
    run = run_family(args.family, wheel, torch, args.out, env, args.probe, args.budget_s, args.impl, args.points)
    record_run(args.out, args.family + ("" if args.points == "grid" else f"_{args.points}"), run)
    print(json.dumps({args.family: {k: v for k, v in run.items() if k != "checks"}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
