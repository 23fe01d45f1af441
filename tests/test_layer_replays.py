"""The whole-layer replays (issue 30, item 2): vLLM 0.33.0's Hopper kernels in the standard plan's order.

tests/data/traces/vllm-h200-*.json.gz were captured by benchmarks/gpu/layer_replay.py on an H200 (the
Kimi K3 KDA layer and the DeepSeek-V3 MLA layer at TP8, batch 1 / 8 / 64, 1 and 1 + 3 tokens per sequence,
4 layers per CUDA graph, all-reduces left out); calibration/h200/production/layers/predictions.csv holds
the model's makespans, committed before the run. These tests read only committed files: compare-trace
matches every launch of every replay, and the errors the docs quote (comparison.csv) are the ones the
traces and the pre-committed predictions give.
"""

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "benchmarks" / "gpu"
LAYERS_DIR = ROOT / "calibration" / "h200" / "production" / "layers"
sys.path[:0] = [str(GPU)]

from rows import read_rows  # noqa: E402
import layer_table  # noqa: E402
import predict_layers  # noqa: E402


@pytest.fixture(scope="module")
def table() -> list[dict]:
    return layer_table.table(LAYERS_DIR / "predictions.csv", layer_table.TRACES, layer_table.PREFIX)


def test_predictions_cover_every_replay_once():
    names = [r["replay"] for r in read_rows(LAYERS_DIR / "predictions.csv")]
    want = [predict_layers.replay_name(m, b, t) for m, _ in predict_layers.LAYERS for b in predict_layers.BATCHES
            for t in predict_layers.TOKENS]
    assert sorted(names) == sorted(want) and len(want) == 12
    for r in read_rows(LAYERS_DIR / "predictions.csv"):  # the all-reduces, and only they, are left out
        assert r["left_out"] == "attn_all_reduce;moe_all_reduce" and float(r["left_out_us"]) > 0


def test_each_trace_is_the_replay_its_name_says():
    for p in read_rows(LAYERS_DIR / "predictions.csv"):
        meta = layer_table.read_trace(layer_table.TRACES / f"vllm-h200-{p['replay']}.json.gz")["moeSimReplay"]
        assert (meta["model"], meta["batch"], meta["tokens_per_seq"], meta["context"], meta["tp"]) == (
            p["model"], int(p["batch"]), int(p["tokens_per_seq"]), int(p["context"]), int(p["tp"]))
        assert meta["package"] == "vllm==0.33.0" and meta["layers"] == 4


def test_compare_trace_matches_every_launch_of_every_replay(table):
    for r in table:
        assert r["matched"] == r["plan_kernels"] > 15, r["replay"]
        assert r["unmatched_measured"] == 0 and r["unmatched_plan"] == 0, r["replay"]


def test_engine_launches_the_plan_does_not_count_are_folded_into_their_plan_kernel():
    """The router's top-k is followed by vLLM's two alignment launches wherever vLLM aligns (Marlin always),
    FlashMLA's decode by its combine: one plan kernel, several launches. The activation after fc1 is a plan kernel
    of its own on Hopper (moe_act), so fc1 is one launch."""
    from simulator.config import load_model
    from simulator.hardware import load_hardware
    from simulator.plans.kernel import DecodeShape
    from simulator.report.trace_compare import compare_trace
    for name, model, layer, b, t, want in (("kda-b8t1", "kimi-k3", "kda", 8, 1, {"topk": 3, "fc1": 1, "moe_act": 1}),
                                            ("mla-b8t4", "deepseek-v3", "mla", 8, 4,
                                             {"topk": 3, "fc1": 1, "moe_act": 1, "mla_decode": 2}),
                                            ("mla-b1t1", "deepseek-v3", "mla", 1, 1, {"topk": 1, "mla_decode": 2})):
        doc, _ = compare_trace(str(layer_table.TRACES / f"vllm-h200-{name}.json.gz"), load_model(model),
                               load_hardware("h200", "vllm"), 8, DecodeShape(b, t, predict_layers.CONTEXT), layer,
                               engine="vllm-h200", plan_keys=predict_layers.replay_keys(model, b, t))
        launches = {r["plan"]: r["launches"] for r in doc["kernels"]}
        assert {k: launches[k] for k in want} == want, name


def test_committed_comparison_is_what_the_traces_and_predictions_give(table):
    committed = {r["replay"]: r for r in read_rows(LAYERS_DIR / "comparison.csv")}
    assert set(committed) == {r["replay"] for r in table}
    for r in table:
        c = committed[r["replay"]]
        assert float(c["predicted_us"]) == pytest.approx(r["predicted_us"])
        assert float(c["measured_us"]) == pytest.approx(r["measured_us"], abs=1e-3)
        assert float(c["error_pct"]) == pytest.approx((r["measured_us"] / r["predicted_us"] - 1) * 100, abs=0.01)


def test_errors_against_the_precommitted_makespans(table):
    """The figures calibration/h200/README.md records: 8 of 12 replays within 10 %; the four misses are
    under-predictions, the largest at batch 1 of the KDA layer."""
    errors = {r["replay"]: r["error_pct"] for r in table}
    misses = {k: v for k, v in errors.items() if abs(v) > 10}
    assert sorted(misses) == ["kda-b1t1", "kda-b1t4", "kda-b8t1", "mla-b8t4"]
    assert all(v > 0 for v in misses.values()) and max(misses, key=misses.get) == "kda-b1t1"
    assert errors["kda-b1t1"] > errors["kda-b8t1"] > errors["kda-b64t1"] > 0


def test_compare_trace_finds_every_replayed_layer(table):
    """The graph runs each KDA layer's branches on other stream ids than the layer before (latent_down forks
    onto a second stream); compare-trace groups layers by their streams' labels in start order, not by the
    ids, so it finds all four layers of every replay, and its makespan is the median over all four (the
    kernel-count cut of layer_table agrees)."""
    for r in table:
        assert r["layers_found"] == r["layers_replayed"] == 4, r["replay"]
        assert r["all_layers_us"] == pytest.approx(r["measured_us"], rel=1e-3), r["replay"]


def test_layers_on_changing_stream_ids_are_one_signature():
    """Two layers of the same kernels whose second stream (and the main stream after the join) change ids
    between layers: one signature of two layers; a layer with another kernel order stays a signature apart."""
    from types import SimpleNamespace

    from simulator.report.trace_layers import layer_shapes
    from simulator.report.trace_reader import KernelEvent

    class Labels:  # every name its own label; "a" is the layer's anchor (plan kernel 0)
        plan = [0, 1, 2]
        engine = SimpleNamespace(name="toy")

        def label(self, k):
            return k.name

        def __call__(self, label):
            return frozenset({"abc".index(label)})

    def layer(t0: float, streams: tuple[int, int, int], names=("a", "b", "c")) -> list:
        return [KernelEvent(name=n, ts=t0 + 10.0 * i, dur=5.0, stream=(0, s), key=None)
                for i, (n, s) in enumerate(zip(names, streams))]

    kernels = layer(0.0, (7, 158, 159)) + layer(100.0, (158, 160, 161)) + layer(200.0, (7, 7, 7), ("a", "c", "b"))
    shapes = layer_shapes(kernels, Labels())
    assert [len(s.layers) for s in shapes] == [2, 1]
    assert [stream for stream, _ in shapes[0].signature] == [(0, 7), (0, 158), (0, 159)]  # the first layer's ids


def test_repeat_on_a_fresh_machine_reproduces_the_makespans(table):
    for again in ("repeat", "round2", "round3", "round4"):  # rounds 2-4: the same script on other fresh H200s
        repeat = {r["replay"]: r for r in read_rows(LAYERS_DIR / again / "comparison.csv")}
        for r in table:
            assert abs(float(repeat[r["replay"]]["measured_us"]) / r["measured_us"] - 1) < 0.03, (again, r["replay"])


# ---- round 2: the replay's small kernels measured as kernel rows, the laws refit, new predictions first
@pytest.fixture(scope="module")
def table2() -> list[dict]:
    return layer_table.table(LAYERS_DIR / "predictions_round2.csv", LAYERS_DIR / "round2", "")


def test_round2_predictions_price_the_same_replays_with_the_refit_laws():
    first = {r["replay"]: r for r in read_rows(LAYERS_DIR / "predictions.csv")}
    second = {r["replay"]: r for r in read_rows(LAYERS_DIR / "predictions_round2.csv")}
    assert set(first) == set(second)
    keep = ("model", "batch", "tokens_per_seq", "context", "kernels", "left_out", "kernel_set")
    assert all({k: second[n][k] for k in keep} == {k: first[n][k] for k in keep} for n in first)
    assert any(second[n]["makespan_us"] != first[n]["makespan_us"] for n in first)  # the refit moved them


def test_round2_committed_comparison_and_registered_outcome(table2):
    """calibration/h200/README.md registered before the round-2 replays that kda-b1t1 and mla-b8t4 would
    still miss 10 % (the small law's one floor per plan kernel, shared by both models; the block-FP8 fc2
    law at M = 32) and that the others need not: 10 of 12 within 10 %, both misses under-predictions."""
    committed = {r["replay"]: r for r in read_rows(LAYERS_DIR / "round2" / "comparison.csv")}
    for r in table2:
        assert r["matched"] == r["plan_kernels"] and r["unmatched_measured"] == r["unmatched_plan"] == 0
        assert float(committed[r["replay"]]["measured_us"]) == pytest.approx(r["measured_us"], abs=1e-3)
    misses = {r["replay"]: r["error_pct"] for r in table2 if abs(r["error_pct"]) > 10}
    assert sorted(misses) == ["kda-b1t1", "mla-b8t4"] and all(v > 0 for v in misses.values())


# ---- round 3: the small law prices the engine's launches; registered as vLLM prices and as the replay launches
@pytest.mark.parametrize("predictions, comparison, misses", [
    ("predictions_round3.csv", "comparison.csv", ["kda-b1t1", "mla-b8t4"]),
    ("predictions_round3_launched.csv", "comparison_launched.csv", ["mla-b8t4"])])
def test_round3_committed_comparisons_and_registered_outcomes(predictions, comparison, misses):
    """calibration/h200/README.md registered before the round-3 replays: with the set's PDL (S1) kda-b1t1 and
    mla-b8t4 miss 10 %; priced as the replay launches its cuBLAS GEMMs, without PDL (S6), only mla-b8t4 does,
    the other eleven under 5 %. Both misses are under-predictions."""
    table = layer_table.table(LAYERS_DIR / predictions, LAYERS_DIR / "round3", "")
    committed = {r["replay"]: r for r in read_rows(LAYERS_DIR / "round3" / comparison)}
    for r in table:
        assert r["matched"] == r["plan_kernels"] and r["unmatched_measured"] == r["unmatched_plan"] == 0
        assert r["layers_found"] == 4
        assert float(committed[r["replay"]]["error_pct"]) == pytest.approx(r["error_pct"], abs=0.01)
    missed = {r["replay"]: r["error_pct"] for r in table if abs(r["error_pct"]) > 10}
    assert sorted(missed) == misses and all(v > 0 for v in missed.values())
    if predictions.endswith("launched.csv"):
        assert max(abs(r["error_pct"]) for r in table if r["replay"] not in missed) < 5
        pdl = {r["pdl"] for r in read_rows(LAYERS_DIR / predictions)}
        assert pdl == {"False"}


def test_round4_registered_outcome_with_the_laws_refit_on_cold_rows():
    """calibration/h200/README.md (round 4, repeated) registered before this run, with the laws refit on the
    cold small and KDA rows and no layer fitted: 11 of 12 within 10 %, median |error| <= 3 %, mla-b8t4 the
    one out (the block-FP8 fc2 at M = 32), an under-prediction."""
    table = layer_table.table(LAYERS_DIR / "predictions_round4_launched.csv", LAYERS_DIR / "round4", "")
    committed = {r["replay"]: r for r in read_rows(LAYERS_DIR / "round4" / "comparison.csv")}
    for r in table:
        assert r["matched"] == r["plan_kernels"] and r["unmatched_measured"] == r["unmatched_plan"] == 0
        assert float(committed[r["replay"]]["error_pct"]) == pytest.approx(r["error_pct"], abs=0.01)
    missed = {r["replay"]: r["error_pct"] for r in table if abs(r["error_pct"]) > 10}
    assert list(missed) == ["mla-b8t4"] and missed["mla-b8t4"] > 0
    assert statistics.median(abs(r["error_pct"]) for r in table) <= 3


def test_every_replayed_plan_kernel_has_a_launch():
    """Each non-collective kernel of every replayed plan maps to a launch builder of layer_replay.Layer, checked
    without a GPU (round 3's MLA replays first stopped on DeepSeek-V3's renamed residual norms)."""
    import layer_replay
    for model, _ in predict_layers.LAYERS:
        for b in predict_layers.BATCHES:
            for t in predict_layers.TOKENS:
                plan = predict_layers._plan(model, b, t)
                missing = [k.key for k in plan if k.kind != "collective" and layer_replay.Layer.launcher(k) is None]
                assert not missing, (model, b, t, missing)


def test_all_layers_makespan_refuses_runs_that_are_not_one_layer_each():
    def doc(names: list[str], layers: int) -> dict:
        events = [{"ph": "X", "name": n, "ts": 10.0 * i, "dur": 5.0} for i, n in enumerate(names)]
        return {"moeSimReplay": {"layers": layers}, "traceEvents": events}

    assert layer_table.all_layers_makespan(doc(["a", "b", "a", "b"], 2)) == pytest.approx(15.0)
    assert layer_table.all_layers_makespan(doc(["a", "b", "b", "a"], 2)) == pytest.approx(15.0)
    assert layer_table.all_layers_makespan(doc(["a", "b", "a", "c"], 2)) is None
    assert layer_table.all_layers_makespan(doc(["a", "b", "a"], 2)) is None


def test_layer_table_answers_a_missing_trace_in_one_sentence(tmp_path):
    r = subprocess.run([sys.executable, str(GPU / "layer_table.py"), "--traces", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "no trace vllm-h200-" in r.stderr and "Traceback" not in r.stderr


def test_replay_and_prediction_scripts_without_a_gpu_say_so(tmp_path):
    r = subprocess.run([sys.executable, str(GPU / "layer_replay.py"), "--wheel-dir", str(tmp_path), "--layer",
                        "kda", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0 and "nothing replayed" in r.stdout and not (tmp_path / "out").exists()


def test_round5_registered_outcome_after_the_tile_and_attn_res_laws():
    """L1 (calibration/h200/README.md, round 5), registered before the run with the laws refit on the kernel rows
    (the tile probe's among them) and no layer fitted: 12 of 12 within 10 %, median |error| <= 4 %, mla-b8t4
    (its M = 32 down projection at five stages) within 8 %."""
    table = layer_table.table(LAYERS_DIR / "predictions_round5_launched.csv", LAYERS_DIR / "round5", "")
    committed = {r["replay"]: r for r in read_rows(LAYERS_DIR / "round5" / "comparison.csv")}
    assert len(table) == 12
    for r in table:
        assert r["matched"] == r["plan_kernels"] and r["unmatched_measured"] == r["unmatched_plan"] == 0
        assert float(committed[r["replay"]]["error_pct"]) == pytest.approx(r["error_pct"], abs=0.01)
    assert max(abs(r["error_pct"]) for r in table) < 10
    assert statistics.median(abs(r["error_pct"]) for r in table) <= 4
    assert abs(next(r["error_pct"] for r in table if r["replay"] == "mla-b8t4")) <= 8


def test_round9_registered_outcome_with_hoppers_activation_launch():
    """L2 and L3 (calibration/h200/README.md, round 9), registered before a fresh run with the activation between
    the expert GEMMs a plan kernel of its own (moe_act): 12 of 12 within 10 %, median |error| <= 4 %, every plan
    kernel matched to a launch of its own, none unmatched; the makespans reproduce round 5's within 5 %."""
    table = layer_table.table(LAYERS_DIR / "predictions_round9_launched.csv", LAYERS_DIR / "round9", "")
    committed = {r["replay"]: r for r in read_rows(LAYERS_DIR / "round9" / "comparison.csv")}
    before = {r["replay"]: float(r["measured_us"]) for r in read_rows(LAYERS_DIR / "round5" / "comparison.csv")}
    assert len(table) == 12
    for r in table:
        assert r["matched"] == r["plan_kernels"] and r["unmatched_measured"] == r["unmatched_plan"] == 0
        assert float(committed[r["replay"]]["error_pct"]) == pytest.approx(r["error_pct"], abs=0.01)
        assert abs(r["measured_us"] / before[r["replay"]] - 1) < 0.05
    assert max(abs(r["error_pct"]) for r in table) < 10
    assert statistics.median(abs(r["error_pct"]) for r in table) <= 4
