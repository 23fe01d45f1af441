"""`moe-sim validate`: the committed H200 measurements against the cost model, and the fitting machinery.

calibration/h200/*.csv were measured with benchmarks/gpu/suite.py on an H200 (two for the collectives);
predictions.csv was written by benchmarks/gpu/predict.py and committed before the first GPU run.
"""

import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.cost import laws
from simulator.cost.measured import normalise, point_kernel
from simulator.cost.validate import FAMILIES, fit_group, law_key, validate
from simulator.hardware import load_hardware
from simulator.hardware.kernel_sets import evaluate as _law

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "calibration" / "h200"
runner = CliRunner()


@pytest.fixture(scope="module")
def report():
    return validate(DATA, load_hardware("h200", "gpu-suite"))


def test_every_family_measured_and_at_least_100_kernels_held_back(report):
    assert set(report["by_family"]) == set(FAMILIES) - {"gqa"}  # GQA decode is not measured yet (issue 33 item 4)
    assert report["held_back_points"] >= 100 and report["kernel_set"] == "gpu-suite"
    assert all(s["n"] >= 3 for s in report["by_family"].values())


def test_held_back_error_meets_the_targets(report):
    """Issue 8's targets over all held-back kernels: median <= 10 %, worst <= 30 %."""
    assert report["median_abs_pct_error"] <= 10.0, report["by_family"]
    assert report["worst_abs_pct_error"] <= 30.0, report["by_family"]


def test_issue9_family_targets(report):
    """Issue 9's per-family target (held-back median <= 8 %, worst <= 25 %), every family. moe meets it since
    W4A16 points are grouped by the tile config the kernel compiles (BLOCK_M 16 / 64, confirmed by the
    pre-registered bm64_sweep run); gemm since its law counts whole tiles in waves; kda since its law takes
    the slower of the kernel's own work and HBM draining the state writes L2 cannot hold (both laws then
    tested on points registered first: calibration/h200/README.md)."""
    for fam, got in report["by_family"].items():
        assert got["median_abs_pct_error"] <= 8.0 and got["worst_abs_pct_error"] <= 25.0, (fam, got)


def test_preregistered_predictions_cover_every_measured_point(report):
    with (DATA / "predictions.csv").open() as f:
        predicted = {r["id"] for r in csv.DictReader(f)}
    measured = {p["id"] for p in report["points"]}
    assert measured <= predicted and report["preregistered"]["n"] == len(measured)


def test_predictions_are_the_suite_points():
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import points
    with (DATA / "predictions.csv").open() as f:
        assert [r["id"] for r in csv.DictReader(f)] == [p.id for p in points.all_points()]


def test_no_measurement_beats_the_bandwidth_floor():
    """Speed of light: a kernel cannot move its HBM bytes faster than the datasheet bandwidth."""
    hw = load_hardware("h200")
    from simulator.cost.measured import price_row
    from simulator.cost.validate import read_measurements
    for row in read_measurements(DATA):
        if row["family"] in ("collective",) or row["variant"] == "large_gemm":
            continue
        floor_us = price_row(row, hw)["bytes"] / hw.hbm_bandwidth * 1e6
        assert row["measured_us"] > floor_us, row["id"]


def test_fit_recovers_known_constants():
    """A synthetic family t = 2 + max(bytes / 3 TB/s, flops / 500 TF/s): the fit finds its constants."""
    rng = np.random.default_rng(0)
    nbytes, flops = rng.uniform(1e5, 1e9, 60), rng.uniform(1e6, 1e12, 60)
    t = 2 + np.maximum(nbytes / 3e6, flops / 5e8)
    names = ("t0", "bytes", "flops")
    fit = fit_group(np.column_stack([np.ones(60), nbytes, flops]), t, names)
    c = fit.constants()
    assert c["t0_us"] == pytest.approx(2, rel=1e-6) and c["bytes_gbps"] == pytest.approx(3000, rel=1e-6)
    assert c["tflops"] == pytest.approx(500, rel=1e-6)


def test_roof_fit_recovers_a_max_of_two_roofs():
    """A law max(a x1 + b x2, c x3) + t0 fitted on points where each roof wins somewhere recovers its constants
    (the KDA law's own work against its HBM drain)."""
    rng = np.random.default_rng(3)
    names = ("t0", "serial", "state_bytes", "token_state_bytes", "drain_bytes", "drain_state_bytes")
    X = np.column_stack([np.ones(40), rng.uniform(1, 50, 40), rng.uniform(1e6, 2e8, 40), rng.uniform(0, 5e8, 40),
                         rng.uniform(0, 6e8, 40), rng.uniform(1e6, 2e8, 40)])
    truth = (3.0, 1.0, 1 / 1.9e3, 1 / 6e3, 1 / 0.83e3, 1 / 0.92e3)  # µs per unit (bytes: per B at GB/s x 1e3)
    t = np.array([_law(names, truth, dict(zip(names, x))) for x in X])
    fit = fit_group(X, t, names)
    pred = np.array([fit.predict(dict(zip(names, x))) for x in X])
    assert np.max(np.abs(pred / t - 1)) < 1e-6


def test_two_regime_fit_finds_the_protocol_switch():
    wire = np.geomspace(1e3, 6e7, 30)
    t = np.minimum(10 + wire / 2e5, 25 + wire / 4e5)  # a latency line and a bandwidth line
    fit = fit_group(np.column_stack([np.ones(30), wire]), t, ("t0", "wire_bytes"), regimes=2)
    pred = np.array([fit.predict({"t0": 1.0, "wire_bytes": w}) for w in wire])
    assert np.max(np.abs(pred / t - 1)) < 1e-6


def features(row: dict, hw) -> dict:
    """The law's regressors of the kernel a (partial) measurement row describes."""
    r = normalise({"plan_key": "kda_decode" if row["family"] == "kda" else "mla_decode", "tp": 8,
                   "layer": row["family"],
                   "impl": "triton" if row["family"] == "kda" else "triton_split_kv", "fmt": "fp8", **row})
    return laws.features(point_kernel(r), law_key(r), hw.sm_count, hw.l2_bytes)


def test_features_follow_the_kernel_physics():
    hw = load_hardware("h200")
    kda = {"family": "kda", "model": "kimi-k3", "B": 256, "heads": 12, "T": 8, "variant": "per_token"}
    f = features(kda, hw)
    writes = 7 * 256 * 12 * 128 * 128 * 4  # seven more states written than the final one
    assert f["serial"] == math.ceil(256 * 12 / hw.sm_count) * 8 and f["state_bytes"] == 2 * 256 * 12 * 128 * 128 * 4
    state = 256 * 12 * 128 * 128 * 4
    assert f["token_state_bytes"] == writes and f["drain_bytes"] == state + writes - hw.l2_bytes
    assert f["drain_state_bytes"] == state
    small = features(kda | {"B": 1}, hw)  # 5 MB written: L2 holds it all, nothing drains
    assert small["drain_bytes"] == 0.0
    split_v = features(kda | {"impl": "triton_split_v"}, hw)  # 16 one-warp programs per head, 8 resident per SM
    assert split_v["serial"] == math.ceil(256 * 12 * 16 / (hw.sm_count * 8)) * 8
    mla = {"family": "mla", "model": "kimi-k3", "B": 1, "S": 32768, "T": 1}
    assert features(mla, hw)["splits"] >= hw.sm_count  # a single sequence splits its cache over the SMs


def test_validate_cli_json_contract(tmp_path):
    r = runner.invoke(app, ["validate", "--measurements", str(DATA), "--json", "--plot", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    for key in ("kernel_set", "held_back_points", "median_abs_pct_error", "worst_abs_pct_error", "by_family"):
        assert key in doc
    for fam in doc["by_family"].values():
        assert {"median_abs_pct_error", "worst_abs_pct_error", "n"} <= set(fam)
    assert all(Path(p).stat().st_size > 0 for p in doc["plots"])


@pytest.mark.parametrize("make", ["missing", "empty", "file"])
def test_validate_bad_folder_is_one_sentence(tmp_path, make):
    target = tmp_path / "m"
    if make == "empty":
        target.mkdir()
    elif make == "file":
        target.write_text("x")
    r = runner.invoke(app, ["validate", "--measurements", str(target)])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_gpu_suite_says_one_sentence_without_a_gpu(tmp_path):
    """CI has no GPU: the suite says why in one line, measures nothing and exits 0."""
    import subprocess
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "suite.py"), "--part", "A1", "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 1 and "nothing measured" in r.stdout
    assert not (tmp_path / "out").exists()


def test_compute_efficiency_is_the_measured_gemm_rate(report):
    """No GEMM runs at the datasheet peak: the H200 profile's compute efficiency is within 0.05 of the
    long-K cuBLAS rate the validate law finds (760 of 989 TFLOP/s on whole tiles: the law counts the tiles'
    padding and idle SMs, so its rate is a little above the 8192^3 ceiling's 0.69-0.73 the profile takes),
    and it brings the 8192^3 ceiling within 10 %."""
    hw = load_hardware("h200")
    measured_rate = report["fits"]["gemm/torch_matmul/long_k"]["tflops"] * 1e12 / hw.bf16_flops
    assert abs(hw.compute_efficiency - measured_rate) < 0.05
    big = next(p for p in report["points"] if p["id"].endswith("variant=large_gemm"))
    assert abs(big["model_us"] / big["measured_us"] - 1) < 0.10
    at_peak = 2 * 8192 ** 3 / hw.bf16_flops * 1e6
    assert at_peak < 0.75 * big["measured_us"]  # the datasheet peak alone would be > 25 % fast


def _probe_errors() -> dict[str, float]:
    """|law / measured - 1| in % on each of the 126 GEMM probe shapes (calibration/h200/gemm_probe.csv), the
    law fitted on the grid's fitted half: shapes no plan has, measured after the law was registered."""
    from simulator.cost import validate as v
    from simulator.cost.measured import normalise
    hw = load_hardware("h200")
    _, fits = v.fitted_points(DATA, hw)
    out = {}
    with (DATA / "gemm_probe.csv").open(newline="") as f:
        for raw in csv.DictReader(f):
            out[raw["id"]] = v.pct(v.law_us(normalise(raw), fits, hw), float(raw["median_us"]))
    return out


def test_validate_reports_the_probe_as_the_test_computes_it(report):
    errors = sorted(_probe_errors().values())
    assert report["probes"]["gemm"]["n"] == len(errors) == 126
    assert report["probes"]["gemm"]["worst_abs_pct_error"] == round(errors[-1], 2)


def test_tiled_gemm_law_out_of_sample(monkeypatch):
    """The pre-registered probe (calibration/h200/README.md): the tiled GEMM law misses its own H1 (median
    <= 8 %, worst <= 25 %: it scores ~8.4 / ~35 %), but where it and the untiled law disagree by more than
    10 % it is the better one by far (~8 / ~24 % against ~18 / ~32 %). Held here as measured, so a change to
    the law that loses either shows."""
    import csv
    import statistics

    tiled = _probe_errors()
    monkeypatch.setattr(laws, "tiled_gemm_flops", lambda m, k, n, sms: 2.0 * m * k * n)
    flat = _probe_errors()
    assert len(tiled) == len(flat) == 126
    assert statistics.median(tiled.values()) <= 9.0 and max(tiled.values()) <= 40.0
    assert statistics.median(tiled.values()) < statistics.median(flat.values())
    with (DATA / "prereg_gemm_probe.csv").open(newline="") as f:  # the registered laws, before the run
        differ = [r["id"] for r in csv.DictReader(f)
                  if abs(float(r["law_after_us"]) / float(r["law_before_us"]) - 1) > 0.10]
    assert len(differ) >= 20
    assert statistics.median(tiled[i] for i in differ) < statistics.median(flat[i] for i in differ) - 5
    assert max(tiled[i] for i in differ) < max(flat[i] for i in differ)
