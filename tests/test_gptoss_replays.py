"""gpt-oss-20b decode layers replayed on an H200 with vLLM 0.33.0's Hopper kernels (issue 33 on a measured profile).

tests/data/traces/vllm-h200-gptoss-*.json.gz were captured by benchmarks/gpu/gptoss_replay.py (TP1 and one TP2
rank, batch 1 / 8 / 32 / 64, context 1,720 / 8,192, the sliding layer 0 and the full layer 1, 4 layers per CUDA
graph); calibration/h200/production/gptoss/predictions.csv holds the model's makespans with the `vllm` and
`datasheet` kernel sets, committed before the run. These tests read only committed files: compare-trace matches
every launch of every replay, the committed comparisons are what the traces and predictions give, and the
figures docs/gpt-oss.md quotes hold.
"""

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "benchmarks" / "gpu"
DIR = ROOT / "calibration" / "h200" / "production" / "gptoss"
sys.path[:0] = [str(GPU)]

from rows import read_rows  # noqa: E402
import gptoss_replay  # noqa: E402
import gptoss_table  # noqa: E402
import layer_table  # noqa: E402
import predict_gptoss  # noqa: E402


@pytest.fixture(scope="module")
def table() -> list[dict]:
    return layer_table.table(DIR / "predictions.csv", layer_table.TRACES, layer_table.PREFIX, gptoss_table.compare)


def test_predictions_cover_every_replay_once_per_kernel_set():
    rows = read_rows(DIR / "predictions.csv")
    want = [predict_gptoss.replay_name(*c) for c in predict_gptoss.configurations()]
    assert len(want) == 32
    for ks in predict_gptoss.KERNEL_SETS:
        assert sorted(r["replay"] for r in rows if r["kernel_set"] == ks) == sorted(want)
    for r in rows:  # one GPU: TP1 leaves nothing out, a TP2 rank exactly its two all-reduces
        if r["tp"] == "1":
            assert r["left_out"] == "" and float(r["left_out_us"]) == 0
        else:
            assert r["left_out"] == "attn_all_reduce;moe_all_reduce" and float(r["left_out_us"]) > 0


def test_each_trace_is_the_replay_its_name_says():
    for tp, b, c, li in predict_gptoss.configurations():
        name = predict_gptoss.replay_name(tp, b, c, li)
        meta = layer_table.read_trace(layer_table.TRACES / f"vllm-h200-{name}.json.gz")["moeSimReplay"]
        assert (meta["model"], meta["tp"], meta["batch"], meta["context"], meta["layer_index"]) == (
            "gpt-oss-20b", tp, b, c, li)
        assert meta["package"] == "vllm==0.33.0" and meta["layers"] == 4 and meta["tokens_per_seq"] == 1


def test_compare_trace_matches_every_launch_of_every_replay(table):
    """The sliding layer has no rope-table cast (15 plan kernels), the full one has (16); every launch the replay
    made (replays.csv) is a plan kernel or folded into one (cuBLAS's splitKreduce, the split-KV decode's
    reduce_segments)."""
    replayed = {r["replay"]: r for r in read_rows(DIR / "replays.csv")}
    for r in table:
        full = r["replay"].endswith("-l1")
        assert r["matched"] == r["plan_kernels"] == 15 + full, r["replay"]
        assert r["unmatched_measured"] == 0 and r["unmatched_plan"] == 0, r["replay"]
        assert r["layers_found"] == r["layers_replayed"] == 4, r["replay"]
        assert r["launches_per_layer"] == int(replayed[r["replay"]]["kernels_per_layer"]), r["replay"]
    from simulator.config import load_model
    from simulator.hardware import load_hardware
    from simulator.plans.kernel import DecodeShape
    from simulator.report.trace_compare import compare_trace
    for tp, b, c, li in ((1, 1, 1720, 0), (2, 64, 8192, 1)):
        keys = tuple(k.key for k in predict_gptoss.plan_of(tp, b, c, li) if k.kind != "collective")
        trace = layer_table.TRACES / f"vllm-h200-{predict_gptoss.replay_name(tp, b, c, li)}.json.gz"
        doc, _ = compare_trace(str(trace),
                               load_model("gpt-oss-20b"), load_hardware("h200", "vllm"), tp, DecodeShape(b, 1, c),
                               "gqa", engine="vllm-h200", plan_keys=keys, layer=li)
        assert {n.split("<")[0].split()[-1].split("::")[-1] for n in doc["folded_measured"]} <= {
            "splitKreduce_kernel", "reduce_segments"}
        names = {k["plan"]: k["measured"] for k in doc["kernels"]}
        assert "_matmul_ogs_" in names["fc1"] and names["fc1"].endswith("_swiglu") and "_reduce_grouped" in names[
            "finalize"]


def test_committed_comparisons_are_what_the_traces_and_predictions_give(table):
    committed = {(r["replay"], r["kernel_set"]): r for r in read_rows(DIR / "comparison.csv")}
    assert set(committed) == {(r["replay"], r["kernel_set"]) for r in table}
    for r in table:
        c = committed[(r["replay"], r["kernel_set"])]
        assert float(c["measured_us"]) == pytest.approx(r["measured_us"], abs=1e-3)
        assert float(c["error_pct"]) == pytest.approx((r["measured_us"] / r["predicted_us"] - 1) * 100, abs=0.01)
        for fam in gptoss_table.FAMILIES:
            assert float(c[f"{fam}_error_pct"]) == pytest.approx(r[f"{fam}_error_pct"], abs=0.01)
    split = layer_table.table(DIR / "predictions.csv", DIR / "split_kv", "", gptoss_table.compare, present=True)
    committed = {(r["replay"], r["kernel_set"]): r for r in read_rows(DIR / "split_kv" / "comparison.csv")}
    assert len(split) == len(committed) == 32
    for r in split:
        assert float(committed[(r["replay"], r["kernel_set"])]["measured_us"]) == pytest.approx(r["measured_us"],
                                                                                                 abs=1e-3)


def test_the_figures_docs_quote(table):
    """docs/gpt-oss.md: with the measured (vllm) laws the median |error| is ~11 % (15 of 32 within 10 %, 23
    within 25 %); the datasheet set under-predicts every replay, median ~41 %; the matmul_ogs experts, with
    their own law (round 8; the makespans above were registered with Marlin's), land within 13 % in all but one
    replay; the three worst misses are full layers at 8,192 positions and batch >= 32, where the Triton stand-in's
    decode runs far behind the law."""
    vllm = {r["replay"]: r for r in table if r["kernel_set"] == "vllm"}
    sheet = {r["replay"]: r for r in table if r["kernel_set"] == "datasheet"}
    errs = [abs(r["error_pct"]) for r in vllm.values()]
    assert 10 <= statistics.median(errs) <= 12
    assert sum(e <= 10 for e in errs) == 15 and sum(e <= 25 for e in errs) == 23
    assert all(r["error_pct"] > 0 for r in sheet.values())
    assert 40 <= statistics.median(r["error_pct"] for r in sheet.values()) <= 42
    moe = sorted(abs(r["moe_error_pct"]) for r in vllm.values())
    assert moe[-2] <= 13 and moe[-1] <= 30
    worst = sorted(vllm, key=lambda n: vllm[n]["error_pct"])[-3:]
    assert all(n.endswith("-c8192-l1") and vllm[n]["gqa_error_pct"] > 60 for n in worst)


def test_kernel_rows_cover_both_ranks_and_every_batch():
    rows = read_rows(DIR / "ogs_rows.csv")
    assert all(r["status"] == "ok" and r["package"] == "vllm==0.33.0" for r in rows)
    for tp, f in ((1, 2880), (2, gptoss_replay.padded(1440))):
        mine = [r for r in rows if int(r["tp"]) == tp]
        assert sorted({int(r["batch"]) for r in mine}) == list(gptoss_replay.OGS_BATCHES)
        fc2 = [r for r in mine if r["kernel"] == "fc2"]
        assert all(int(r["K"]) == f and r["launches"] == "2" and "_reduce_grouped" in r["kernel_names"] for r in fc2)
    assert gptoss_replay.padded(1440) == 1472 and gptoss_replay.padded(2880) == 2880


def test_scripts_without_a_gpu_or_with_bad_input_answer_in_one_sentence(tmp_path):
    r = subprocess.run([sys.executable, str(GPU / "gptoss_replay.py"), "--carry", str(tmp_path), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0 and "nothing replayed" in r.stdout and not (tmp_path / "out").exists()
    r = subprocess.run([sys.executable, str(GPU / "gptoss_replay.py"), "--carry", str(tmp_path / "c"),
                        "--unpack-from", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "c").exists()
    r = subprocess.run([sys.executable, str(GPU / "gptoss_table.py"), "--traces", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no trace vllm-h200-gptoss-" in r.stderr
