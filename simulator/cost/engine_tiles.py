"""The tile vLLM's Triton grouped GEMM launches with, and how many of its programs one SM holds at once.

vLLM 0.33.0's `fused_moe_kernel` (model_executor/layers/fused_moe/fused_moe.py) takes its tile from
`try_get_optimal_moe_config`: the tuned table for the GPU and the expert shape (configs/E=<experts>,N=<per-rank
intermediate>,device_name=NVIDIA_H200[,dtype=...].json) at the table's batch size nearest M, else the rules of
`get_default_config`. The H200 tables of the two implementations the laws model (BF16 and block-FP8 experts) are
package data, hardware/tiles/h200_vllm_fused_moe.toml, written from the wheel by benchmarks/gpu/engine_tiles.py;
the default rules are restated below from that source.

Why the tile matters to time: Triton's software pipeline keeps buffers of one A tile (BLOCK_M x BLOCK_K
activations) and one B tile (BLOCK_K x BLOCK_N weights) in shared memory, so the tile and its stage count fix a
program's shared memory, and Hopper's 228 KB per SM caps how many programs an SM runs at once. How many buffers:
`num_stages` where the dot runs as Hopper's warp-group MMA (wgmma: 64-row blocks and up, and block-FP8 from 16
rows), whose asynchronous MMA still reads the buffer the next load would refill; `num_stages - 1` where it runs as
mma.sync (BF16 blocks of 16 and 32 rows, FP8 of 8). The rule was read off the 13 tiles the first occupancy run
compiled and holds for all 16 new ones of the Qwen3-MoE / Mixtral run (calibration/h200/production/others):
every compiled shared size within the 512 bytes a block-FP8 128-wide tile keeps beside. A program
keeps at most num_stages - 1 loads in flight, and no more than its K loop has steps. A grouped GEMM at decode
streams every touched expert's weights once, so it runs at the slower of HBM and of the loads its resident
programs keep in flight: Little's law, one memory round trip per window of in-flight loads. vLLM's tuned table
gives the block-FP8 down projection of DeepSeek-V3 (K = 256, two K steps) five stages at M = 32: the two extra
buffers buy no deeper pipeline, and they halve the programs an SM holds (calibration/h200/production/moe.csv:
134 µs at M = 32 against 122 µs at M = 64, which streams a third more weights).
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

TABLES = Path(__file__).resolve().parent.parent / "hardware" / "tiles" / "h200_vllm_fused_moe.toml"

# Hopper (compute capability 9.0) per-SM limits, CUDA C++ Programming Guide, "Technical Specifications per Compute
# Capability": 228 KB of shared memory per SM (227 KB usable by one block, 1 KB reserved per resident block),
# 2,048 resident threads, 32 resident blocks.
SM90_SHARED_BYTES = 228 * 1024
SM90_BLOCK_RESERVED_BYTES = 1024
SM90_THREADS = 2048
SM90_BLOCKS = 32
WGMMA_ROWS = 64  # a warp group's MMA spans 64 rows (PTX ISA wgmma.mma_async m64nNk16); smaller BF16 blocks: mma.sync
WGMMA_FP8_ROWS = 16  # Triton still issues wgmma for FP8 blocks of 16 rows (the occupancy run: full stages there)
SPARSITY = 4  # vLLM's SPARSITY_FACTOR: at M top_k SPARSITY <= E each routed row is a block of its own


@dataclass(frozen=True)
class Tile:
    """One launch configuration of fused_moe_kernel (the fields of vLLM's tile dicts that set its resources)."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int

    def buffers(self, fp8_block: bool) -> int:
        """Pipeline buffers Triton 3.6 compiles on SM90 (module docstring): num_stages for a warp-group MMA,
        num_stages - 1 for mma.sync."""
        wgmma = self.block_m >= WGMMA_ROWS or (fp8_block and self.block_m >= WGMMA_FP8_ROWS)
        return self.stages if wgmma else max(1, self.stages - 1)

    def shared_bytes(self, fp8_block: bool) -> int:
        """Shared memory of the pipeline's buffers: buffers x (an A tile + a B tile), one byte an element for
        block-FP8 and two for BF16."""
        width = 1 if fp8_block else 2
        return self.buffers(fp8_block) * self.block_k * (self.block_m + self.block_n) * width

    def key(self, fp8_block: bool) -> str:
        return f"{'fp8_block' if fp8_block else 'bf16'}:{self.block_m},{self.block_n},{self.block_k},{self.warps}," \
               f"{self.stages}"

    def resident(self, fp8_block: bool) -> int:
        """Programs one SM holds at once: as measured on H200 for the compiled tile (the tables' [resident]),
        else as SM90's shared memory (at `shared_bytes`), threads and block limit allow."""
        held = _tables()[1].get(self.key(fp8_block))
        if held is not None:
            return held
        smem = SM90_SHARED_BYTES // (self.shared_bytes(fp8_block) + SM90_BLOCK_RESERVED_BYTES)
        return max(1, min(smem, SM90_THREADS // (32 * self.warps), SM90_BLOCKS))

    def windows(self, k: int) -> int:
        """Memory round trips one program's K loop takes: its K steps, num_stages - 1 in flight at a time (all
        at once where the loop is shorter)."""
        steps = -(-k // self.block_k)
        return -(-steps // max(1, min(self.stages - 1, steps)))

    @classmethod
    def parse(cls, text: str) -> "Tile":
        """A CSV row's tile_config ("<source>: BLOCK_SIZE_M=16,BLOCK_SIZE_N=128,...,num_stages=5")."""
        fields = dict(kv.split("=") for kv in text.rsplit(": ", 1)[-1].split(","))
        return cls(*(int(fields[f]) for f in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps",
                                               "num_stages")))


@functools.cache
def _tables() -> tuple[dict[str, dict[int, Tile]], dict[str, int]]:
    """(vLLM's tuned tables, the programs per SM measured for each compiled tile)."""
    raw = tomllib.loads(TABLES.read_text())
    tables = {key: {int(m): Tile(*cfg) for m, cfg in rows.items()} for key, rows in raw["tables"].items()}
    return tables, {key: v[0] for key, v in raw.get("resident", {}).items()}


def default_tile(m: int, fp8_block: bool) -> Tile:
    """vLLM 0.33.0's get_default_config on CUDA, for block-FP8 ([128, 128] scales) and for BF16 experts."""
    if fp8_block:
        narrow = m <= 8  # the smallest batches take 64-wide N tiles and, up to M = 4, a fourth stage
        return Tile(16 if m <= 64 else 64, 64 if narrow else 128, 128, 4, (4 if m <= 4 else 3) if narrow else 3)
    block_m = 16 if m <= 32 else 32 if m <= 96 else 64 if m <= 512 else 128
    return Tile(block_m, 64 if m <= 64 else 128, 128 if m <= 64 else 64, 4 if m <= 128 else 8, 4 if m <= 32 else 3)


def vllm_fused_moe_tile(m: int, experts: int, intermediate: int, fp8_block: bool) -> tuple[Tile, str]:
    """(tile, where it came from) as try_get_optimal_moe_config picks it on H200 for M tokens over `experts`
    experts of per-rank intermediate size `intermediate`; the block-FP8 kernel clamps BLOCK_K to the 128-wide
    scale block."""
    key = f"E={experts},N={intermediate},{'fp8_block' if fp8_block else 'bf16'}"
    table = _tables()[0].get(key)
    if table is None:
        tile, source = default_tile(m, fp8_block), "default"
    else:
        tile, source = table[min(table, key=lambda x: abs(x - m))], key
    if fp8_block and tile.block_k > 128:
        tile = Tile(tile.block_m, tile.block_n, 128, tile.warps, tile.stages)
    return tile, source
