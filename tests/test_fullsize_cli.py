"""benchmarks/fullsize.py (and bf16_gemv.py) refuse bad arguments before they draw anything: one sentence, exit
2, no traceback; fullsize's figures keep their statistics straight, and its timing helpers time what they say."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fullsize.py"


@pytest.mark.parametrize("args, names", [(["--batch", "0"], "--batch"), (["--repeats", "0"], "--repeats"),
                                         (["--spill-dir", "FILE/sub"], "--spill-dir")])
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
    assert doc["copy_vs_read"] == pytest.approx(doc["copy_gbps"] / doc["read_gbps"], rel=0.01)
    assert doc["expert_vs_read"] == pytest.approx(doc["expert_gbps"] / doc["read_gbps"], rel=0.01)
    by_run = [g / r for g, r in zip(doc["expert_gbps_runs"], doc["read_gbps_runs"])]
    assert doc["expert_vs_read_median"] == pytest.approx(statistics.median(by_run), rel=0.02)
    assert max(doc["max_rel_rms_error"].values()) < 1e-12  # fp64: the fast paths agree with the reference
    if os.access("/proc/self/clear_refs", os.W_OK):  # the copy's and the read's buffers are not the simulation's peak
        assert doc["peak_rss_gb"] < 0.45


def _fullsize_module():
    """benchmarks/fullsize.py as a module (benchmarks/ is not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("fullsize_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_timed_grouped_calls_times_the_grouped_products_and_puts_them_back():
    """Inside `timed_grouped_calls`, the grouped products that fast/packed.grouped_matmul runs are timed into
    clock["calls"] (on AVX-512 hosts, where it runs them) and return what they would; after the block, even
    one left by an error, `fast.mxfp4_grouped` is the library's own again."""
    import numpy as np

    from simulator.fast import kernels as fast
    from simulator.fast.packed import MXFP4Weight, grouped_matmul
    fullsize, original = _fullsize_module(), fast.mxfp4_grouped
    rng = np.random.default_rng(0)
    w = MXFP4Weight(*fast.mxfp4_quantize_t(rng.standard_normal((64, 64), dtype=np.float32)))
    x = rng.standard_normal((2, 64))
    want = grouped_matmul([x], [(np.arange(2), (w,))])
    clock = {}
    with fullsize.timed_grouped_calls(clock):
        assert fast.mxfp4_grouped is not original
        got = grouped_matmul([x], [(np.arange(2), (w,))])
    assert fast.mxfp4_grouped is original
    if fast.has_avx512():
        np.testing.assert_array_equal(got, want)
        assert clock["calls"] > 0
    else:  # grouped_matmul declines; nothing to time
        assert got is None and "calls" not in clock
    with pytest.raises(ZeroDivisionError):
        with fullsize.timed_grouped_calls(clock):
            1 / 0
    assert fast.mxfp4_grouped is original


def test_roofline_kernel_args_replay_the_grouped_call():
    """mxfp4_roofline.py's `kernel_args`: the arguments grouped_matmul handed `fast.mxfp4_grouped`, which
    called again give the same product, and the library's own function back in place after (an error too)."""
    import importlib.util

    import numpy as np

    from simulator.fast import kernels as fast
    from simulator.fast.packed import MXFP4Weight, grouped_matmul
    if not fast.has_avx512():
        pytest.skip("grouped_matmul declines without AVX-512: there is no call to capture")
    spec = importlib.util.spec_from_file_location("roofline_bench", SCRIPT.parent / "mxfp4_roofline.py")
    roofline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roofline)
    original, rng = fast.mxfp4_grouped, np.random.default_rng(1)
    w = MXFP4Weight(*fast.mxfp4_quantize_t(rng.standard_normal((64, 96), dtype=np.float32)))
    x = rng.standard_normal((3, 64))
    want = grouped_matmul([x], [(np.arange(3), (w,))])
    args = roofline.kernel_args(lambda: grouped_matmul([x], [(np.arange(3), (w,))]))
    assert fast.mxfp4_grouped is original
    np.testing.assert_array_equal(fast.mxfp4_grouped(*args), want[0])
    with pytest.raises(ZeroDivisionError):
        roofline.kernel_args(lambda: 1 / 0)
    assert fast.mxfp4_grouped is original


def test_expert_split_takes_every_figure_from_the_best_run():
    """The ops' times and the grouped products' come from one run, the one with the least expert time, so that
    they subtract; the products' GB/s is that run's, against the best copy and read; no products, no split."""
    fullsize = _fullsize_module()
    clocks = [{"s": 0.030, "calls": 0.020, "moe_fc1": 0.016, "moe_fc2": 0.014},
              {"s": 0.025, "calls": 0.021, "moe_fc1": 0.013, "moe_fc2": 0.012},  # the best run: least time
              {"s": 0.040, "calls": 0.019, "moe_fc1": 0.020, "moe_fc2": 0.020}]  # fastest products, not best
    split = fullsize.expert_split(clocks, int(0.21e9), 42.0, 21.0)
    assert split["expert_op_s"] == {"moe_fc1": 0.013, "moe_fc2": 0.012} and split["expert_calls_s"] == 0.021
    assert split["expert_calls_s_runs"] == [0.02, 0.021, 0.019]
    assert split["expert_calls_gbps"] == pytest.approx(10.0, rel=1e-3)
    assert split["expert_calls_vs_copy"] == pytest.approx(10.0 / 42, rel=1e-2)
    assert split["expert_calls_vs_read"] == pytest.approx(10.0 / 21, rel=1e-2)
    assert fullsize.expert_split([{"s": 0.03}], int(0.21e9), 42.0, 21.0) == {}
    assert fullsize.expert_split([], int(0.21e9), 42.0, 21.0) == {}


def test_fullsize_report_prints_the_split_with_its_conditions():
    """The text report puts each op's time and the grouped products' figures on one line with what they are."""
    fullsize = _fullsize_module()
    run = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-k3", "--tp", "2", "--repeats", "1", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert "expert_calls_s" not in doc  # the tiny model's shards are not whole 32-blocks: no grouped products
    clocks = [{"s": 0.0278, "calls": 0.0227, "moe_fc1_gate_up_act": 0.0143, "moe_fc2_down_finalize": 0.0135}]
    doc |= fullsize.expert_split(clocks, int(0.281e9), 38.4, 19.9) | {"expert_kernel_s": 0.0278}
    line = next(x for x in fullsize.report(doc).splitlines() if "grouped products" in x)
    for figure in ("moe_fc1_gate_up_act 0.0143 s", "moe_fc2_down_finalize 0.0135 s", "of its 0.0278 s",
                   "took 0.0227 s = 12.4 GB/s", "0.322 of the copy", "0.622 of a read alone"):
        assert figure in line, (figure, line)
    doc |= {"expert_gbps": 10.1, "read_gbps": 19.9, "copy_gbps": 38.4, "copy_vs_read": 1.93}
    line = next(x for x in fullsize.report(doc).splitlines() if "a read alone" in x)
    assert "the copy counts 1.93x a read alone, so half the copy is 0.965 of what" in line, line


def test_bf16_gemv_benchmark_refuses_bad_rounds():
    """bf16_gemv.py: --rounds 0 is one sentence and exit 2, before anything is measured."""
    script = SCRIPT.parent / "bf16_gemv.py"
    run = subprocess.run([sys.executable, str(script), "--rounds", "0"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--rounds" in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and run.stdout == ""


@pytest.mark.parametrize("precision, dtype", [("fp64", "float64"), ("bf16", "float32")])
def test_warm_parallel_forms_calls_what_the_full_size_calls(monkeypatch, precision, dtype):
    """Before any timed path, the full-size run's parallel kernels are called with the types the full size
    passes, so that their compile lands there: the bf16 GEMM's on a whole and on a column-sliced weight, and
    the grouped MXFP4 product's, at the precision's x dtype. (A size threshold the warm-up did not lower once
    let the standard path's first run compile the GEMM's: 8.9 s.) The thresholds are put back after."""
    from simulator import jit
    from simulator.fast import kernels as fast
    jit.compile_all()
    calls = []

    def recording(name, kernel):
        def call(*args):
            calls.append((name, str(args[0].dtype), args[1].flags.c_contiguous))
            return kernel(*args)
        return call
    monkeypatch.setattr(fast, "_bf16_matmul_parallel", recording("gemm", fast._bf16_matmul_parallel))
    monkeypatch.setattr(fast, "_mxfp4_grouped_parallel", recording("grouped", fast._mxfp4_grouped_parallel))
    thresholds = fast.PARALLEL_BYTES, fast.BF16_PARALLEL_BYTES
    _fullsize_module().warm_parallel_forms(precision)
    if jit.threads() > 1:  # on one thread the GEMM never goes parallel, here or at full size
        assert {("gemm", dtype, True), ("gemm", dtype, False)} <= set(calls)  # whole, and a column slice
    if fast.has_avx512():  # elsewhere grouped_matmul declines and the plans multiply shard by shard
        x = "uint16" if precision == "bf16" and fast.has_bf16_dot() else dtype
        assert ("grouped", x, True) in calls
    assert (fast.PARALLEL_BYTES, fast.BF16_PARALLEL_BYTES) == thresholds
