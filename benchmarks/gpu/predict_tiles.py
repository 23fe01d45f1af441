"""Register the Triton MoE tile probe's times before it runs (points.tile_probe_points).

    python benchmarks/gpu/predict_tiles.py --out calibration/h200/production/tiles/predictions_timing.csv

The law priced is the one simulator/cost/laws.py states for vLLM's Triton fused_moe (t0 + max(bytes, round trips)
+ experts), its constants fitted on every row of calibration/h200/production/moe.csv of the same group (not
half: the grid's held-back half holds the only point where the round trips bind, DeepSeek-V3's down projection
at M = 32), each probe launch at the tile it will run (vLLM's pick, num_stages forced where the point says) and
the programs per SM the occupancy run measured for that tile (hardware/tiles/h200_vllm_fused_moe.toml).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

import numpy as np  # noqa: E402

import points as pts  # noqa: E402
from rows import simulator_commit, write_rows  # noqa: E402

PRODUCTION = HERE.parent.parent / "calibration" / "h200" / "production"


def probe_tile(p) -> str:
    """The tile_config a probe point will launch, in the CSV's spelling."""
    from simulator.cost import engine_tiles, laws
    from simulator.cost.measured import point_kernel
    from simulator.cost.validate import normalise
    kernel = point_kernel(normalise(p.row()))
    _, _, _, k, n = laws.moe_shape(kernel)
    tile, source = engine_tiles.vllm_fused_moe_tile(p.M, kernel.group_experts, n // 2 if p.plan_key == "fc1" else k,
                                                    laws.TRITON_MOE[p.impl])
    stages = int(p.variant.split("=")[1]) if p.variant.startswith("stages=") else tile.stages
    return (f"{source}: BLOCK_SIZE_M={tile.block_m},BLOCK_SIZE_N={tile.block_n},BLOCK_SIZE_K={tile.block_k},"
            f"num_warps={tile.warps},num_stages={stages}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from simulator.cost.validate import fit_group, read_measurements, row_law
    from simulator.cost.validate import normalise
    from simulator.hardware import load_hardware
    hw = load_hardware("h200")
    impls = {"moe.bf16": ("vllm_triton_moe_bf16",), "moe.fp8": ("vllm_triton_moe_fp8",)}
    grid = [r for r in read_measurements(PRODUCTION) if r["impl"].startswith("vllm_triton_moe")]
    groups: dict[str, list] = {}
    for r in grid:
        group, feats = row_law(r, hw, impls)
        groups.setdefault(group, []).append((feats, r["measured_us"]))
    fits = {}
    for group, rows in groups.items():
        names = tuple(sorted({n for f, _ in rows for n in f}, key=lambda n: not n.startswith("t0")))
        X = np.array([[f.get(n, 0.0) for n in names] for f, _ in rows])
        fits[group] = fit_group(X, np.array([t for _, t in rows]), names, 1, hw)
        print(f"{group}: {fits[group].constants()}")
    out = []
    for p in pts.tile_probe_points():
        row = {**normalise(p.row()), "tile_config": probe_tile(p)}
        group, feats = row_law(row, hw, impls)
        out.append({"id": p.id, "tile_config": row["tile_config"],
                    "model_us": round(fits[group].predict(feats), 3), "rounds": round(feats["rounds"], 3),
                    "bytes": int(feats["bytes"]), "model_commit": simulator_commit()})
        print(f"{p.id}: {out[-1]['model_us']} us ({out[-1]['rounds']} rounds)")
    write_rows(args.out, out, list(out[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
