"""`moe-sim compare-trace`: round trips through `moe-sim trace`, hand-made PyTorch-profiler traces (eager and
CUDA-graph replay, gzip), and one sentence + exit 2 for every file it cannot compare."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import UserError
from simulator.report.trace_compare import load_engine
from simulator.report.trace_reader import read_kernels

runner = CliRunner()
SHAPE = ["--hardware", "h200", "--tp", "8", "--batch", "32", "--tokens-per-seq", "1"]
MINI = ["--hardware", "h200", "--tp", "8", "--batch", "8", "--tokens-per-seq", "1", "--engine", "torch-mini"]


def _compare(path: Path, *args: str) -> dict:
    r = runner.invoke(app, ["compare-trace", str(path), *args, "--json"])
    assert r.exit_code == 0, r.output[-800:]
    return json.loads(r.output)


def _trace(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "moe-sim.json"
    r = runner.invoke(app, ["trace", "--out", str(out), *args])
    assert r.exit_code == 0, r.output
    return out


def _assert_exact(doc: dict) -> None:
    assert doc["unmatched_measured"] == [] and doc["unmatched_plan"] == []
    assert doc["matched"] == len(doc["plan_keys"]) == len(doc["kernels"])
    worst = max(abs(k["error_pct"]) for k in doc["kernels"])
    assert worst < 1.0 and doc["median_abs_pct_error"] < 1.0, f"worst kernel error {worst:.3f} %"
    span = doc["makespan_us"]
    assert abs(span["measured"] - span["model"]) < 0.01 * span["model"], span


# ============================================================================ round trips


@pytest.mark.parametrize("layer", ["kda", "mla"])
@pytest.mark.parametrize("variant", ["standard", "specialized"])
def test_round_trip_of_a_layer_trace_matches_every_kernel(tmp_path: Path, layer: str, variant: str) -> None:
    path = _trace(tmp_path, *SHAPE, "--layer", layer, "--variant", "both")
    doc = _compare(path, *SHAPE, "--layer", layer, "--variant", variant)
    _assert_exact(doc)
    assert doc["layers_found"] == 1
    model_gaps = [k["model_gap_us"] for k in doc["kernels"]]
    assert model_gaps == [k["measured_gap_us"] for k in doc["kernels"]]


@pytest.fixture(scope="module")
def step_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _trace(tmp_path_factory.mktemp("step"), *SHAPE, "--step", "--variant", "both")


@pytest.mark.parametrize("layer", ["kda", "mla"])
@pytest.mark.parametrize("variant", ["standard", "specialized"])
def test_round_trip_of_a_step_trace_finds_the_repeated_layers(step_trace: Path, layer: str, variant: str) -> None:
    doc = _compare(step_trace, *SHAPE, "--layer", layer, "--variant", variant)
    _assert_exact(doc)
    # every layer of that type but the last, which runs into the LM head and so has another shape
    assert doc["layers_found"] >= {"kda": 60, "mla": 20}[layer]


def test_gzip_trace_reads_like_the_plain_one(tmp_path: Path) -> None:
    path = _trace(tmp_path, *SHAPE, "--variant", "standard")
    packed = tmp_path / "moe-sim.json.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert _compare(packed, *SHAPE)["kernels"] == _compare(path, *SHAPE)["kernels"]


def test_table_output_names_the_unmatched_sides(tmp_path: Path) -> None:
    path = _trace(tmp_path, *SHAPE, "--variant", "standard")
    r = runner.invoke(app, ["compare-trace", str(path), *SHAPE])
    assert r.exit_code == 0 and "matched 22 kernels" in r.output and "unmatched plan kernels" in r.output


def test_plot_draws_measured_under_model(tmp_path: Path) -> None:
    path = _trace(tmp_path, *SHAPE, "--variant", "standard")
    doc = _compare(path, *SHAPE, "--plot", str(tmp_path / "plots"))
    assert sorted(Path(p).suffix for p in doc["plots"]) == [".png", ".svg"]
    assert all(Path(p).stat().st_size > 1000 for p in doc["plots"])


# ============================================================================ PyTorch-profiler-style traces

# The mini layer as torch + cuBLAS + Triton name it, in plan order; eager RMSNorm / sigmoid / topk launch
# extra kernels the plan does not count.
MINI_LAYER = [
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 6.1), ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", 2.2),
    ("nvjet_tst_128x8_64x12_2x1_v_bz_TNN", 4.8), ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 5.3),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel_cuda>", 1.1),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::mul_kernel_cuda>", 1.0),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 3.9),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::sigmoid_kernel_cuda>", 1.0),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>", 4.4),
    ("void at::native::bitonicSortKVInPlace<-2, -1, 16, 16, float, long>", 2.5),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", 1.2),
]


def torch_trace(layers: int = 4, graph: bool = False, gap_us: float = 2.0, **extra: object) -> dict:
    """A torch.profiler export_chrome_trace-shaped trace of `layers` mini layers on one stream."""
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
                          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1234, "tid": 1, "ts": 0.0,
                           "dur": 3.0}]
    ts, corr = 1000.0, 1
    for layer in range(layers):
        for node, (name, dur) in enumerate(MINI_LAYER):
            args = {"device": 0, "stream": 7, "correlation": corr, "grid": [132, 1, 1], "block": [128, 1, 1]}
            if graph:
                args |= {"graph id": 1, "graph node id": 100 + node + layer * len(MINI_LAYER)}
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts,
                           "dur": dur * (1.0 + 0.01 * layer), "args": args})
            events.append({"ph": "f", "cat": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": ts, "bp": "e"})
            ts += dur * (1.0 + 0.01 * layer) + gap_us
            corr += 1
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "traceEvents": events,
            "traceName": "mini.json", "displayTimeUnit": "ms", **extra}


def _write(path: Path, doc: object) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda-graph"])
def test_torch_profiler_mini_layer_matches_the_partial_plan(tmp_path: Path, graph: bool) -> None:
    doc = _compare(_write(tmp_path / "mini.json", torch_trace(graph=graph)), *MINI)
    assert doc["layers_found"] == 4
    assert doc["matched"] == 8 and doc["unmatched_plan"] == []
    assert [k["plan"] for k in doc["kernels"]] == list(load_engine("torch-mini").plan_keys or ())
    assert sorted(doc["unmatched_measured"]) == sorted([MINI_LAYER[5][0], MINI_LAYER[7][0], MINI_LAYER[9][0]])
    first = doc["kernels"][0]
    assert first["measured"].startswith("nvjet") and first["measured_us"] == pytest.approx(6.1 * 1.015, rel=1e-3)
    assert doc["kernels"][1]["measured_gap_us"] == pytest.approx(2.0)


def test_plan_keys_option_overrides_the_engine_subset(tmp_path: Path) -> None:
    doc = _compare(_write(tmp_path / "mini.json", torch_trace()), *MINI, "--plan-keys", "o_proj,router")
    assert doc["plan_keys"] == ["o_proj", "router"] and doc["matched"] == 2


def test_user_pattern_file_extends_the_table(tmp_path: Path) -> None:
    table = tmp_path / "mine.toml"
    table.write_text('[engine.mine]\nvariant = "standard"\nplan_keys = ["o_proj", "topk"]\n'
                     '[engine.mine.patterns]\no_proj = ["glob:nvjet_tst_64x8*"]\ntopk = ["gatherTopK"]\n')
    doc = _compare(_write(tmp_path / "mini.json", torch_trace()), *MINI[:-2], "--engine", "mine",
                   "--patterns", str(table))
    assert doc["matched"] == 2 and doc["layers_found"] == 4


def test_unmatched_plan_kernels_are_reported(tmp_path: Path) -> None:
    trace = torch_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if "topk" not in e.get("name", "").lower()]
    doc = _compare(_write(tmp_path / "mini.json", trace), *MINI)
    assert doc["unmatched_plan"] == ["topk"] and doc["matched"] == 7


# ============================================================================ files it refuses


def _refused(path: Path, *args: str) -> str:
    r = runner.invoke(app, ["compare-trace", str(path), *(args or MINI)])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output
    return lines[0]


def _overlapping() -> dict:
    trace = torch_trace()
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    kernels[3]["ts"], kernels[3]["dur"] = kernels[2]["ts"] + 0.1, 0.5 * kernels[2]["dur"]  # [3] inside [2]
    return trace


MALFORMED = {
    "not-json": ("this is not json", "not JSON"),
    "truncated": ('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1', "cut short"),
    "no-trace-events": ({"schemaVersion": 1}, "no traceEvents"),
    "no-kernels": ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1}]},
                   "no GPU kernel"),
    "unknown-names": ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "mystery", "pid": 0, "tid": 7, "ts": 0,
                                        "dur": 1}]},
                      "matches the"),
    "overlap": (_overlapping(), "lies inside"),
    "ns-declared": (torch_trace(otherData={"timeUnit": "ns"}), "declares its clock in ns"),
    "ns-magnitudes": ({"traceEvents": [{**e, "ts": e["ts"] * 1000, "dur": e["dur"] * 1000} if e.get("cat") == "kernel"
                                       else e for e in torch_trace()["traceEvents"]]}, "look like ns"),
    "empty": ("", "is empty"),
    "binary": (b"\x00\xff\xfe\x01", "not"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_trace_is_one_sentence_and_exit_2(tmp_path: Path, case: str) -> None:
    content, words = MALFORMED[case]
    path = tmp_path / f"{case}.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        _write(path, content)
    line = _refused(path)
    assert words in line and str(path) in line


def test_directory_and_missing_file_are_refused(tmp_path: Path) -> None:
    assert "is a directory" in _refused(tmp_path)
    assert "does not exist" in _refused(tmp_path / "nope.json")


def test_bad_pattern_file_and_plan_key_are_refused(tmp_path: Path) -> None:
    trace = _write(tmp_path / "mini.json", torch_trace())
    bad = tmp_path / "bad.toml"
    bad.write_text('[engine.x.patterns]\no_proj = ["(unclosed"]\n')
    assert "not a valid regex" in _refused(trace, "--engine", "x", "--patterns", str(bad))
    assert "not in the standard kda plan" in _refused(trace, *MINI, "--plan-keys", "o_proj,nonsense")
    assert "engine 'nope'" in _refused(trace, "--engine", "nope")


# ============================================================================ the reader


def test_reader_streams_across_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from simulator.report import trace_reader
    path = _write(tmp_path / "mini.json", torch_trace(layers=20))
    whole = read_kernels(path)
    monkeypatch.setattr(trace_reader, "CHUNK_CHARS", 7)  # every value straddles chunks
    small = read_kernels(path)
    assert small.kernels == whole.kernels and len(whole.kernels) == 20 * len(MINI_LAYER)
    assert small.metadata["traceName"] == "mini.json" and small.metadata["schemaVersion"] == 1


def test_reader_gives_up_on_a_broken_event_without_reading_the_rest(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from simulator.report import trace_reader
    good = json.dumps(torch_trace(layers=50))
    cut = good.index('{"ph": "X", "cat": "kernel"', len(good) // 2)
    path = tmp_path / "broken.json"
    path.write_text(good[:cut] + '{"ph": "X", "cat": kernel}, ' + good[cut:])
    monkeypatch.setattr(trace_reader, "CHUNK_CHARS", 256)
    monkeypatch.setattr(trace_reader, "MAX_VALUE_CHARS", 1024)
    with pytest.raises(UserError, match="not valid JSON"):
        read_kernels(path)


def test_reader_takes_a_bare_event_array_and_skips_prefetch_slices(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "gemm", "name": "g", "ts": 0, "dur": 2, "pid": 1, "tid": 1, "args": {"key": "o_proj"}},
              {"ph": "X", "cat": "prefetch", "name": "prefetch g", "ts": 0, "dur": 1, "pid": 1, "tid": 1,
               "args": {"key": "o_proj"}},
              {"ph": "X", "cat": "Kernel", "name": "k", "ts": 3, "dur": 1, "pid": 1, "tid": 1}]
    got = read_kernels(_write(tmp_path / "bare.json", events))
    assert [(k.name, k.key) for k in got.kernels] == [("g", "o_proj"), ("k", None)]


def test_reader_raises_user_errors_only(tmp_path: Path) -> None:
    with pytest.raises(UserError):
        read_kernels(_write(tmp_path / "list.json", [1, 2, 3]))


# ============================================================================ real H200 traces

# benchmarks/gpu/capture_traces.py on an H200 (torch 2.11, CUDA 13.0): 4 mini layers, eager and graph replay
REAL = sorted((Path(__file__).parent / "data" / "traces").glob("mini-*.json.gz"))
TORCH_EXTRAS = {"direct_copy_kernel_cuda": 1, "MulFunctor": 1, "sigmoid_kernel_cuda": 1,
                "CUDAFunctor_add": 1, "bitonicSortKVInPlace": 1}  # launches the plan does not count


@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_h200_trace_matches_every_mini_plan_kernel(path: Path) -> None:
    batch = path.name.split("-b")[1].split(".")[0]
    doc = _compare(path, *MINI[:5], batch, *MINI[6:])
    assert doc["layers_found"] == 4 and doc["matched"] == 8 and doc["unmatched_plan"] == []
    extras = {word: sum(word in name for name in doc["unmatched_measured"]) for word in TORCH_EXTRAS}
    assert extras == TORCH_EXTRAS and len(doc["unmatched_measured"]) == sum(TORCH_EXTRAS.values())
    # cuBLASLt splits K for the narrow router and the shared gate_up: the reduce is the GEMM's second launch
    assert len(doc["folded_measured"]) == 2 and all("splitKreduce" in n for n in doc["folded_measured"])
    split = {k["plan"]: k["launches"] for k in doc["kernels"]}
    assert split["router"] == 2 and split["shared_gate_up"] == 2 and split["o_proj"] == 1
    gemms = [k for k in doc["kernels"] if k["plan"] in ("o_proj", "router", "shared_gate_up", "shared_down")]
    assert all(k["measured"].startswith("nvjet") for k in gemms)
    # a graph replay launches back to back (sub-µs gaps); eager launches wait for the CPU (tens of µs)
    gap = doc["launch_gap_median_us"]["measured"]
    assert gap < 1.0 if "graph" in path.name else gap > 5.0


def test_real_eager_trace_keeps_its_pdl_overlap() -> None:
    """cuBLASLt's split-K reduce starts 64 ns before its GEMM ends (PDL): not an error."""
    eager = read_kernels(REAL[0])
    gemm_then_reduce = [(a, b) for a, b in zip(eager.kernels, eager.kernels[1:]) if b.ts < a.end]
    assert gemm_then_reduce and all("splitKreduce" in b.name for _, b in gemm_then_reduce)


def test_compare_trace_checks_flags_and_plot_folder_before_reading(tmp_path):
    """Issue 7's conventions reach the new command: a bad flag or an unusable --plot is one sentence, exit 2."""
    from typer.testing import CliRunner as _Runner

    from simulator.cli import app as _app
    trace = Path(__file__).resolve().parent / "data" / "traces" / "mini-graph-b8.json.gz"
    not_a_folder = tmp_path / "afile"
    not_a_folder.write_text("x")
    for args in (["--batch", "0"], ["--plot", str(not_a_folder)]):
        r = _Runner().invoke(_app, ["compare-trace", str(trace), *args])
        assert r.exit_code == 2 and r.output.startswith("error: ") and "Traceback" not in r.output


# ============================================================================ the suite layer against validate

# benchmarks/gpu/capture_traces.py --suite on the H200: the standard KDA layer (TP8, batch 1 and 64) run
# with exactly the kernels benchmarks/gpu/suite.py timed back to back for calibration/h200. The trace
# names the suite point of each plan kernel, so each in-layer kernel can be held against its isolated row.
SUITE = sorted((Path(__file__).parent / "data" / "traces").glob("suite-*.json.gz"))
CALIBRATION = Path(__file__).parent.parent / "calibration" / "h200"


def _isolated_rows() -> dict[str, dict]:
    import csv
    rows: dict[str, dict] = {}
    for f in CALIBRATION.glob("*.csv"):
        with f.open() as fh:
            rows.update({r["id"]: r for r in csv.DictReader(fh) if r.get("id") and r.get("median_us")})
    return rows


def suite_agreement(path: Path) -> list[dict]:
    """Per kernel: validate's error (model / isolated - 1) and the same error in the layer (model / in-layer
    slot - 1, slot = first start to last end of the plan kernel's launches + the measured graph gap, i.e.
    what one back-to-back launch costs), both against validate's price of the same point."""
    from simulator.cost.measured import price_row
    from simulator.hardware import load_hardware
    meta = json.loads(gzip.decompress(path.read_bytes()))["moeSimSuite"]
    doc = _compare(path, "--hardware", "h200", "--tp", str(meta["tp"]), "--batch", str(meta["batch"]),
                   "--tokens-per-seq", str(meta["tokens_per_seq"]), "--engine", "gpu-suite")
    assert doc["matched"] == 19 and doc["unmatched_plan"] == [] and doc["unmatched_measured"] == []
    # the datasheet law these bounds were registered with (the measured law would be the isolated rows' own fit)
    rows, hw, gap = _isolated_rows(), load_hardware("h200", "datasheet"), doc["launch_gap_median_us"]["measured"]
    out = []
    for k in doc["kernels"]:
        row = rows[meta["points"][k["plan"]]]
        model, iso, slot = price_row(row, hw)["model_us"], float(row["median_us"]), k["measured_us"] + gap
        out.append({"plan": k["plan"], "isolated_us": iso, "slot_us": slot,
                    "points": 100 * abs(model / slot - model / iso)})
    return out


@pytest.mark.parametrize("path", SUITE, ids=[p.name for p in SUITE])
def test_suite_layer_kernels_agree_with_validate(path: Path) -> None:
    """Long kernels (>= 15 µs) agree within 6 points; the median kernel within 5. Short kernels (< 3 µs
    isolated) differ by at most 0.4 µs, less than two isolated runs of the same kernels on two lent H200s
    differ (calibration/h200/hot_inputs.csv's cold column against small.csv: up to 0.65 µs)."""
    import csv
    import statistics
    rows = suite_agreement(path)
    assert len(rows) == 19
    long = [r for r in rows if r["isolated_us"] >= 15.0]
    assert len(long) >= 4 and max(r["points"] for r in long) <= 6.0, long
    assert statistics.median(r["points"] for r in rows) <= 5.0
    short = [r for r in rows if r["isolated_us"] < 3.0]
    in_layer = max(abs(r["slot_us"] - r["isolated_us"]) for r in short)
    iso = _isolated_rows()
    with (CALIBRATION / "hot_inputs.csv").open() as fh:
        rerun = [abs(float(r["cold_us"]) - float(iso[r["id"]]["median_us"])) for r in csv.DictReader(fh)]
    assert len(short) >= 4 and in_layer <= 0.4 < max(rerun), (in_layer, max(rerun))


@pytest.mark.parametrize("columns", ["80", "120"])
def test_table_fits_the_terminal_without_cutting_a_number_or_a_name(columns: str) -> None:
    """Issue 31: at 80 columns the measured names wrap inside their column; nothing is cut with an ellipsis."""
    trace = Path(__file__).resolve().parent / "data" / "traces" / "suite-graph-b64t1.json.gz"
    r = runner.invoke(app, ["compare-trace", str(trace), "--hardware", "h200", "--tp", "8", "--batch", "64",
                            "--tokens-per-seq", "1"], env={"COLUMNS": columns})
    assert r.exit_code == 0, r.output[-600:]
    lines = r.output.splitlines()
    assert max(len(line) for line in lines) <= int(columns) and "…" not in r.output
    assert sum(1 for line in lines if line.startswith("│ ") and line.split("│")[1].strip()) == 19  # one row each


def test_an_engine_prices_with_its_own_kernel_set_unless_told_otherwise() -> None:
    """The suite's trace, named as the gpu-suite engine, is priced with the suite's measured laws (its kernel set
    in the pattern table): its layer makespan lands within 10 %; --kernels still overrides, and the production
    set's faster Marlin and FlashMLA laws then miss the suite's Triton kernels by far more."""
    path = SUITE[0]
    meta = json.loads(gzip.decompress(path.read_bytes()))["moeSimSuite"]
    args = ("--hardware", "h200", "--tp", str(meta["tp"]), "--batch", str(meta["batch"]),
            "--tokens-per-seq", str(meta["tokens_per_seq"]), "--engine", "gpu-suite")
    own, other = _compare(path, *args), _compare(path, *args, "--kernels", "vllm")
    assert own["kernel_set"] == "gpu-suite" and other["kernel_set"] == "vllm"

    def error(doc: dict) -> float:
        ms = doc["makespan_us"]
        return abs(ms["model"] / ms["measured"] - 1)
    assert error(own) < 0.10 < error(other)


def test_intervals_of_an_unmeasured_profile_say_whose_spread_they_are() -> None:
    """Priced with the datasheet law (no measured set), the interval line says its spread is the H200 laws',
    not this profile's; priced with a measured set it does not."""
    path = SUITE[0]
    meta = json.loads(gzip.decompress(path.read_bytes()))["moeSimSuite"]
    args = ["compare-trace", str(path), "--hardware", "h200", "--tp", str(meta["tp"]), "--batch", str(meta["batch"]),
            "--tokens-per-seq", str(meta["tokens_per_seq"]), "--engine", "gpu-suite"]
    caveat = "these intervals are the spread of the laws' form"
    datasheet = runner.invoke(app, args + ["--kernels", "datasheet"], env={"COLUMNS": "200"})
    measured = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert datasheet.exit_code == measured.exit_code == 0
    assert caveat in datasheet.output and caveat not in measured.output
