"""Write vLLM's tuned H200 Triton fused_moe tile tables into the package, as data the cost model reads.

    python benchmarks/gpu/engine_tiles.py --configs DIR [--occupancy CSV ...]
    # DIR: vllm_wheel.py's unpacked configs/ folder; CSV: production.py --points tiles' moe_tiles.csv, or any
    # timed Triton MoE rows (they record the same occupancy columns), e.g. production/others/moe.csv

vLLM picks the tile of its Triton grouped GEMM (fused_moe_kernel) from a tuned JSON file per GPU and expert
shape (E experts, N = the per-rank intermediate size, dtype, weight-scale block) at the batch size nearest M,
and from its default rules where no file exists. Only the tables of the two implementations the H200 laws
model are kept: BF16 experts (no dtype in the name) and block-FP8 experts (dtype=fp8_w8a8,
block_shape=[128,128]). With --occupancy, the programs one H200 SM held of each tile the run compiled
(cuOccupancyMaxActiveBlocksPerMultiprocessor at the compiled kernel's shared memory and registers) are kept
beside the tables. The output, simulator/hardware/tiles/h200_vllm_fused_moe.toml, is regenerated, never
edited by hand; simulator/cost/engine_tiles.py reads it.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "simulator" / "hardware" / "tiles" / "h200_vllm_fused_moe.toml"
NAME = re.compile(r"^E=(\d+),N=(\d+),device_name=NVIDIA_H200(,dtype=fp8_w8a8,block_shape=\[128,128\])?\.json$")
FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps", "num_stages")


def tables(folder: Path) -> dict[str, dict[int, list[int]]]:
    """{"E=..,N=..,bf16" or "..,fp8_block": {M: [BLOCK_M, BLOCK_N, BLOCK_K, warps, stages]}} of every kept file."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        match = NAME.match(path.name)
        if match is None:
            continue
        e, n, fp8 = match.groups()
        raw = json.loads(path.read_text())
        out[f"E={e},N={n},{'fp8_block' if fp8 else 'bf16'}"] = {
            int(m): [int(raw[m][f]) for f in FIELDS] for m in sorted((m for m in raw if m.isdigit()), key=int)}
    return out


def occupancy(path: Path) -> dict[str, list[int]]:
    """{"<bf16|fp8_block>:BM,BN,BK,warps,stages": [resident programs, shared bytes, registers]} of a tiles run."""
    out = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("status") != "ok" or not row.get("resident"):
                continue
            cfg = dict(kv.split("=") for kv in row["tile_config"].rsplit(": ", 1)[-1].split(","))
            kind = "fp8_block" if row["impl"].endswith("fp8") else "bf16"
            out[f"{kind}:" + ",".join(cfg[f] for f in FIELDS)] = [int(row[c]) for c in ("resident", "shared_bytes",
                                                                                       "regs")]
    return dict(sorted(out.items()))


def render(found: dict[str, dict[int, list[int]]], version: str, held: dict[str, list[int]] | None = None,
           held_from: str = "") -> str:
    lines = [f"# vLLM {version}'s tuned Triton fused_moe tiles on NVIDIA H200 "
             "(model_executor/layers/fused_moe/configs/",
             "# E=<experts>,N=<per-rank intermediate>,device_name=NVIDIA_H200"
             "[,dtype=fp8_w8a8,block_shape=[128,128]].json),",
             "# the BF16 and block-FP8 tables only. Written by benchmarks/gpu/engine_tiles.py; do not edit.",
             "# Each row: M = [BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, num_warps, num_stages]",
             f'source = "vllm=={version} vllm/model_executor/layers/fused_moe/configs/"', ""]
    for key, rows in found.items():
        lines.append(f'[tables."{key}"]')
        lines += [f'{m} = [{", ".join(map(str, cfg))}]' for m, cfg in rows.items()]
        lines.append("")
    if held:
        lines += [f"# Programs one SM held, measured: {held_from}",
                  "# (Triton 3.6 on NVIDIA H200; cuOccupancyMaxActiveBlocksPerMultiprocessor on the compiled kernel)",
                  "# tile = [resident programs per SM, shared bytes, registers per thread]", "[resident]"]
        lines += [f'"{key}" = [{", ".join(map(str, v))}]' for key, v in held.items()]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=Path, required=True, help="vllm_wheel.py's unpacked configs/ folder")
    ap.add_argument("--occupancy", type=Path, action="append",
                    help="a CSV with occupancy columns (production.py's Triton MoE rows; repeatable)")
    ap.add_argument("--version", default="0.33.0")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    found = tables(args.configs)
    if not found:
        raise SystemExit(f"{args.configs}: no H200 BF16 or block-FP8 fused_moe table found")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    held = {k: v for path in args.occupancy or [] for k, v in occupancy(path).items()} or None
    args.out.write_text(render(found, args.version, dict(sorted(held.items())) if held else None,
                               ", ".join(p.as_posix() for p in args.occupancy or [])))
    print(f"wrote {args.out}: {len(found)} tables")


if __name__ == "__main__":
    main()
