"""vLLM's Triton fused_moe tile, the programs an SM holds of it, and the law's round trips (round 5 of
calibration/h200/README.md)."""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

import pytest

from simulator.cost import engine_tiles as et
from simulator.cost import laws
from simulator.cost.measured import point_kernel
from simulator.cost.validate import normalise, read_measurements

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = ROOT / "calibration" / "h200" / "production"
TILES = PRODUCTION / "tiles"
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))


def rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def vllm_pick(row: dict) -> et.Tile:
    """The tile the module says vLLM launches for a measured row (num_stages forced where its variant says)."""
    kernel = point_kernel(normalise(row))
    _, _, _, k, n = laws.moe_shape(kernel)
    inter = n // 2 if row["plan_key"] == "fc1" else k
    tile = et.vllm_fused_moe_tile(int(row["M"]), kernel.group_experts, inter, laws.TRITON_MOE[row["impl"]])[0]
    if row["variant"].startswith("stages="):
        tile = et.Tile(tile.block_m, tile.block_n, tile.block_k, tile.warps, int(row["variant"].split("=")[1]))
    return tile


def test_the_module_picks_the_tile_every_triton_row_launched():
    """The tables (package data from the wheel) and the restated default rules give, for each of the grid's and
    the probe's Triton MoE rows, the tile config the GPU run recorded from vLLM's own code."""
    triton = [r for r in rows(PRODUCTION / "moe.csv") if r["impl"] in laws.TRITON_MOE]
    assert len(triton) == 56
    for r in triton:
        assert vllm_pick(r) == et.Tile.parse(r["tile_config"]), r["id"]
    sources = {r["tile_config"].split(":")[0] for r in triton}
    assert "default" in sources and any(s.startswith("E=256,N=256") for s in sources)


@pytest.mark.parametrize("m, fp8, want", [
    (4, True, et.Tile(16, 64, 128, 4, 4)), (8, True, et.Tile(16, 64, 128, 4, 3)),
    (16, True, et.Tile(16, 128, 128, 4, 3)),
    (128, True, et.Tile(64, 128, 128, 4, 3)), (32, False, et.Tile(16, 64, 128, 4, 4)),
    (64, False, et.Tile(32, 64, 128, 4, 3)), (256, False, et.Tile(64, 128, 64, 8, 3)),
    (1024, False, et.Tile(128, 128, 64, 8, 3))])
def test_default_rules(m, fp8, want):
    assert et.default_tile(m, fp8) == want


def test_a_shape_without_a_table_takes_the_default_rules_and_the_nearest_m_wins():
    assert et.vllm_fused_moe_tile(32, 999, 256, True) == (et.default_tile(32, True), "default")
    tile, source = et.vllm_fused_moe_tile(30, 256, 256, True)  # nearest tuned batch size: 32
    assert source == "E=256,N=256,fp8_block" and tile.stages == 5 and tile.block_n == 128


OCCUPANCY = (TILES / "moe_tiles.csv", PRODUCTION / "others" / "moe.csv")  # the grid's and probe's tiles; new models'


def compiled_tiles() -> dict[str, dict]:
    """Every tile an H200 run compiled: key -> its occupancy row (shared bytes, registers, programs per SM)."""
    out = {}
    for path in OCCUPANCY:
        for r in rows(path):
            if r.get("resident"):
                fp8 = r["impl"].endswith("fp8")
                out[et.Tile.parse(r["tile_config"]).key(fp8)] = r
    return out


def test_programs_per_sm_are_the_driver_counts_of_the_occupancy_runs():
    """The tiles file's [resident] holds what the occupancy runs measured for every compiled tile: the 13 of the
    grid and probe, the 16 more the Qwen3-MoE / Mixtral run compiled."""
    measured = {key: int(r["resident"]) for key, r in compiled_tiles().items()}
    assert len(measured) == 29
    assert dict(et._tables()[1]) == measured
    for key, held in measured.items():
        assert et.Tile(*map(int, key.split(":")[1].split(","))).resident(key.startswith("fp8")) == held


def test_the_buffer_rule_gives_every_compiled_shared_size():
    """num_stages buffers for a warp-group MMA (64-row blocks, block-FP8 from 16), num_stages - 1 for mma.sync:
    every compiled tile's shared memory, within the 512 bytes a block-FP8 128-wide tile keeps beside. Read off the
    first 13 tiles; the 16 of the new models' run were compiled after it was written."""
    tiles = compiled_tiles()
    for key, r in tiles.items():
        tile, fp8 = et.Tile(*map(int, key.split(":")[1].split(","))), key.startswith("fp8")
        assert 0 <= int(r["shared_bytes"]) - tile.shared_bytes(fp8) <= 512, key
    assert {k.startswith("fp8") for k in tiles} == {True, False}
    assert et.Tile(16, 64, 128, 4, 2).buffers(False) == 1 and et.Tile(64, 128, 64, 8, 3).buffers(False) == 3
    assert et.Tile(16, 128, 128, 4, 3).buffers(True) == 3 and et.Tile(8, 32, 128, 4, 4).buffers(True) == 3


def test_without_a_measured_count_the_rule_gives_the_drivers_where_registers_do_not_cap():
    """The fallback (shared memory at the buffer rule, threads, blocks) against the driver's count of each
    compiled tile whose registers (allocated per thread in eights) leave room for more programs than that."""
    checked = 0
    for key, r in compiled_tiles().items():
        tile, fp8 = et.Tile(*map(int, key.split(":")[1].split(","))), key.startswith("fp8")
        by_regs = 65536 // (-(-int(r["regs"]) // 8) * 8 * 32 * tile.warps)
        smem = et.SM90_SHARED_BYTES // (tile.shared_bytes(fp8) + et.SM90_BLOCK_RESERVED_BYTES)
        rule = max(1, min(smem, et.SM90_THREADS // (32 * tile.warps), et.SM90_BLOCKS))
        assert min(rule, by_regs) == int(r["resident"]), key
        if by_regs >= rule:
            checked += 1
    assert checked >= 20  # 22 of the 29; registers cap the other 7
    # not compiled, so the fallback: threads cap a small 8-warp tile at 8; shared memory a deep 4-stage tile at 2
    assert et.Tile(16, 16, 32, 8, 2).resident(False) == 8 and et.Tile(64, 128, 64, 4, 5).resident(False) == 1


def _probe_kernel(stages: int, key: str = "fc2"):
    row = next(r for r in read_measurements(PRODUCTION)
               if r["impl"] == "vllm_triton_moe_fp8" and r["plan_key"] == key and r["M"] == 32 and not r["variant"])
    tile = et.Tile.parse(row["tile_config"])
    return point_kernel(row), et.Tile(tile.block_m, tile.block_n, tile.block_k, tile.warps, stages)


def test_stages_change_a_short_k_loops_round_trips_only_through_the_programs_an_sm_holds():
    """The two-step down projection has both K steps in flight at 3 stages or 5; 5 stages halve the programs an
    SM holds (2 against 4), so its round trips double. The 56-step fc1 keeps 4 steps in flight at 5 stages and
    2 at 3: the same loads in flight per SM, the same round trips."""
    kernel, five = _probe_kernel(5)
    _, three = _probe_kernel(3)
    r5, r3 = (laws.triton_moe_rounds(kernel, "vllm_triton_moe_fp8", 132, t) for t in (five, three))
    assert r5 == pytest.approx(2 * r3)
    kernel, five = _probe_kernel(5, "fc1")
    _, three = _probe_kernel(3, "fc1")
    assert laws.triton_moe_rounds(kernel, "vllm_triton_moe_fp8", 132, five) == pytest.approx(
        laws.triton_moe_rounds(kernel, "vllm_triton_moe_fp8", 132, three))


def test_round5_tile_probe_registered_outcome():
    """T1, T2 and T4 (calibration/h200/README.md, round 5), registered before the run: fewer stages speed the FP8
    down projection at M = 32, five slow it at M = 48 and 64, each within 15 % of its prediction; 26 of 28
    probe rows within 15 %. T3 failed for the BF16 down projection, which five stages slow by 30 %."""
    pred = {r["id"]: float(r["model_us"]) for r in rows(TILES / "predictions_timing.csv")}
    got = {r["id"]: float(r["median_us"]) for r in rows(TILES / "run" / "moe_probe.csv")}
    assert set(pred) == set(got) and len(got) == 28
    errors = {i: pred[i] / got[i] - 1 for i in got}
    assert sum(abs(e) <= 0.15 for e in errors.values()) == 26
    assert statistics.median(abs(e) for e in errors.values()) < 0.05
    grid = {r["id"]: float(r["median_us"]) for r in rows(PRODUCTION / "moe.csv")}
    fc2 = "moe/vllm_triton_moe_fp8/fc2/model=deepseek-v3/layer=mla/tp=8/M={m}/K=256/N=7168/U={u}/fmt=fp8{v}"
    five_at_32 = grid[fc2.format(m=32, u=163, v="")]
    for stages in (3, 4):
        i = fc2.format(m=32, u=163, v=f"/variant=stages={stages}")
        assert got[i] <= 0.80 * five_at_32 and abs(errors[i]) <= 0.15
    for m, u, vllm in ((48, 200, got), (64, 222, grid)):
        i = fc2.format(m=m, u=u, v="/variant=stages=5")
        assert got[i] >= 1.25 * vllm[fc2.format(m=m, u=u, v="")] and abs(errors[i]) <= 0.15
    bf16 = "moe/vllm_triton_moe_bf16/fc2/model=kimi-k3/layer=kda/tp=8/M=32/K=384/N=3584/U=393"
    assert got[bf16 + "/variant=stages=5"] > 1.25 * got[bf16 + "/variant=stages=3"]


def test_the_tiles_file_is_what_the_generator_writes(tmp_path):
    """hardware/tiles/h200_vllm_fused_moe.toml is regenerated, never edited: its [resident] section is
    engine_tiles.py's rendering of the committed occupancy runs."""
    import engine_tiles as gen
    text = et.TABLES.read_text()
    held = dict(sorted({k: v for path in OCCUPANCY for k, v in gen.occupancy(path).items()}.items()))
    block = text[text.index("# Programs one SM held"):]
    tail = gen.render({}, "0.33.0", held, ", ".join(p.relative_to(ROOT).as_posix() for p in OCCUPANCY))
    assert block.strip() == tail[tail.index("# Programs one SM held"):].strip()
