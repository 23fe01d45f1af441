"""The production laws on models they were never fitted on: Qwen3-MoE and Mixtral on one H200
(calibration/h200/production/others, registered before the run)."""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from simulator.cost import laws
from simulator.cost.measured import point_kernel, price_row
from simulator.cost.validate import normalise, read_measurements
from simulator.hardware import load_hardware

ROOT = Path(__file__).resolve().parent.parent
OTHERS = ROOT / "calibration" / "h200" / "production" / "others"
GRID = ROOT / "calibration" / "h200" / "production"
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))


def rows(name: str) -> list[dict]:
    with (OTHERS / name).open(newline="") as f:
        return list(csv.DictReader(f))


def test_every_point_was_registered_and_measured():
    import points
    planned = {p.id for p in points.other_model_points()}
    registered = {r["id"]: r for r in rows("predictions.csv")}
    measured = [r for f in ("gemm.csv", "moe.csv", "gqa.csv") for r in rows(f)]
    assert set(registered) == planned and len(planned) == 165
    assert {r["id"] for r in measured} == planned and all(r["status"] == "ok" for r in measured)
    # priced with the laws as committed before the run (no model change between registering and measuring)
    assert {r["model_commit"] for r in registered.values()} == {"d45b53b"}


def test_none_of_these_shapes_is_in_the_grid_the_laws_were_fitted_on():
    grid = {(r["family"], r["model"]) for r in read_measurements(GRID)}
    assert not any(model in {"qwen3-moe-30b", "qwen3-moe-235b", "mixtral-8x7b"} for _, model in grid)


def errors(name: str) -> list[float]:
    hw = load_hardware("h200")
    return [price_row(normalise(r), hw)["model_us"] / float(r["median_us"]) - 1 for r in rows(name)]


def test_the_laws_predict_the_other_models_within_the_grids_target():
    """Median |error| <= 8 % per family and at most one point in 25 beyond 25 % (README: O1 after the buffer
    rule and the FA3 block bytes; the registered predictions missed MoE and GQA)."""
    for name in ("gemm.csv", "moe.csv", "gqa.csv"):
        e = [abs(x) for x in errors(name)]
        assert statistics.median(e) <= 0.08, name
        assert sum(x > 0.25 for x in e) <= len(e) / 25, name


def test_the_registered_misses_stay_on_record():
    """What the laws as committed before the run predicted: FA3 at head dim 128 under by ~40 %, the Triton tiles
    the shared-memory formula held too few of over by up to ~60 %. These rows are never re-registered."""
    pred = {r["id"]: float(r["model_us"]) for r in rows("predictions.csv")}
    gqa = [pred[r["id"]] / float(r["median_us"]) - 1 for r in rows("gqa.csv")]
    moe = [pred[r["id"]] / float(r["median_us"]) - 1 for r in rows("moe.csv")]
    assert statistics.median(gqa) < -0.3 and max(moe) > 0.5


def test_fa3_streams_bytes_per_key_block():
    """Qwen3-MoE's head dim 128 doubles each key block's bytes against gpt-oss's 64 at the same grid."""
    by_id = {r["id"]: r for r in rows("gqa.csv")}
    qwen = point_kernel(normalise(by_id["gqa/vllm_fa3/gqa_decode/model=qwen3-moe-30b/layer=gqa/tp=1/M=64/B=64/"
                                        "S=8192/variant=full"]))
    oss = next(r for r in read_measurements(GRID) if r["family"] == "gqa" and r["M"] == 64 and r["S"] == 8192
               and r["variant"] == "full")
    assert laws.fa3_block_bytes(qwen) == 2 * laws.fa3_block_bytes(point_kernel(oss)) == 2 * 2 * 128 * 64 * 2
