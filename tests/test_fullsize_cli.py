"""benchmarks/fullsize.py refuses bad arguments before it draws anything: one sentence, exit 2, no traceback."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fullsize.py"


@pytest.mark.parametrize("args, names", [(["--batch", "0"], "--batch"), (["--repeats", "0"], "--repeats"), (["--spill-dir", "FILE/sub"], "--spill-dir")])
def test_fullsize_refuses_bad_arguments_in_one_sentence(tmp_path, args, names):
    file = tmp_path / "a-file"
    file.write_text("")
    args = [a.replace("FILE", str(file)) for a in args]  # a folder cannot be made under a file
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and names in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and run.stdout == ""


def test_fullsize_repeats_pair_each_kernel_run_with_a_copy():
    """A tiny-model run with 3 repeats: every standard and specialized run is kept, wall_s is their median, and
    each specialized run has its own copy figure and ratio; the headline is best kernel over best copy, the
    same statistic on both sides."""
    run = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-k3", "--tp", "2", "--repeats", "3", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["repeats"] == 3 and len(doc["wall_s_runs"]["reference"]) == 1
    assert isinstance(doc["cpu"], str) and doc["cpu"]  # the conditions travel with the figures
    for path in ("standard", "specialized"):
        assert len(doc["wall_s_runs"][path]) == 3
        assert doc["wall_s"][path] == pytest.approx(statistics.median(doc["wall_s_runs"][path]), abs=1e-3)
    for key in ("copy_gbps_runs", "read_gbps_runs", "expert_gbps_runs", "expert_vs_copy_runs"):
        assert len(doc[key]) == 3 and all(v > 0 for v in doc[key])
    assert doc["copy_gbps"] == max(doc["copy_gbps_runs"]) and doc["expert_gbps"] == max(doc["expert_gbps_runs"])
    assert doc["expert_vs_copy"] == pytest.approx(doc["expert_gbps"] / doc["copy_gbps"], rel=0.01)
    assert doc["expert_vs_copy_median"] == pytest.approx(statistics.median(doc["expert_vs_copy_runs"]), abs=1e-3)
    for g, c, r in zip(doc["expert_gbps_runs"], doc["copy_gbps_runs"], doc["expert_vs_copy_runs"]):
        assert r == pytest.approx(g / c, rel=0.02)  # each run's ratio is to its own copy
    assert doc["read_gbps"] == max(doc["read_gbps_runs"])  # the read alone: the same statistic, its own ratios
    assert doc["expert_vs_read"] == pytest.approx(doc["expert_gbps"] / doc["read_gbps"], rel=0.01)
    by_run = [g / r for g, r in zip(doc["expert_gbps_runs"], doc["read_gbps_runs"])]
    assert doc["expert_vs_read_median"] == pytest.approx(statistics.median(by_run), rel=0.02)
    assert max(doc["max_rel_rms_error"].values()) < 1e-12  # fp64: the fast paths agree with the reference
    if os.access("/proc/self/clear_refs", os.W_OK):  # the copy's and the read's buffers are not the simulation's peak
        assert doc["peak_rss_gb"] < 0.45
