"""Scenarios: every shipped one runs and writes what it promises; malformed ones fail cleanly."""

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator import sweep
from simulator.cli import app
from simulator.scenario import DEFAULTS, load_scenario
from simulator.plans.specialized import FUSIONS

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))
runner = CliRunner()
METRICS = {"step": {"step_ms", "tokens_per_s", "tokens_per_s_per_user", "speedup", "memory_total_gb"},
           "layer": {"layer_us", "floor_us", "kernel_count", "speedup"},
           "ablation": {"fusion", "add_one_layer_us", "remove_one_layer_us", "waterfall_layer_us", "waterfall_step_ms"}}


def expected_rows(sc) -> int:
    per_point = len(FUSIONS) if sc.kind == "ablation" else None
    total = 0
    for point in sc.points():
        rows = sweep.evaluate(point, sc.kind)
        if rows[0]["status"] != "ok":
            total += 1
        else:
            total += per_point or (2 if point["variant"] == "both" else 1)
    return total


def test_nine_scenarios_ship():
    assert {p.stem for p in SHIPPED} == {"published-trace", "batch-sweep", "hardware", "speculative",
                                        "fusion-ablation", "tp8-vs-tp16", "context-length", "routing", "gqa-models"}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_scenario_runs(path, tmp_path):
    sc = load_scenario(path)
    assert len(sc.question) > 80, "one paragraph stating the question"
    r = runner.invoke(app, ["run", str(path), "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    with open(tmp_path / "points.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == expected_rows(sc)
    assert set(DEFAULTS) | {"variant", "status"} | METRICS[sc.kind] <= set(rows[0])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["question"] == sc.question and summary["rows"] == len(rows) and not summary["interrupted"]
    for plot in summary["files"]:
        assert Path(plot).stat().st_size > 0
    pngs = list(tmp_path.glob("*.png"))
    assert len(pngs) >= len(sc.outputs.get("plots", [])), "every requested plot written"
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"


def test_skipped_points_carry_their_reason():
    sc = load_scenario(ROOT / "scenarios" / "speculative.toml")
    rows = sweep.run(sc)["rows"]
    skipped = [r for r in rows if r["status"] != "ok"]
    assert skipped and all(r["acceptance_length"] > r["draft_tokens"] + 1 for r in skipped)
    assert all("acceptance" in r["status"] for r in skipped)


def test_published_trace_scenario_finds_eight_tokens():
    rows = sweep.run(load_scenario(ROOT / "scenarios" / "published-trace.toml"))["rows"]
    best = min({r["tokens_per_seq"] for r in rows},
               key=lambda t: sum(abs(r["layer_us"] / {"standard": 130, "specialized": 69}[r["variant"]] - 1)
                                 for r in rows if r["tokens_per_seq"] == t))
    assert best == 8


def _scenario(tmp_path, text):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    return p


GOOD = 'question = "A question long enough to be a question about decode steps on GPUs?"\nkind = "step"\n'


@pytest.mark.parametrize("text, needles", [
    (GOOD + "[base]\nbatchh = 3\n", ["line 4", "batchh"]),
    (GOOD + "[sweep]\nbatch = []\n", ["line 4", "batch", "non-empty"]),
    (GOOD + "[sweep]\nbatch = [1, \"two\"]\n", ["line 4", "batch", "int"]),
    (GOOD + "[base]\nmodel = \"gpt-9\"\n", ["line 4", "model", "unknown model"]),
    (GOOD + "[sweep]\nhardware = [\"gb300\", \"tpu\"]\n", ["line 4", "hardware"]),
    (GOOD + "[base]\nfusion_off = \"magic\"\n", ["fusion_off"]),
    (GOOD + "colour = \"red\"\n", ["line 3", "colour"]),
    (GOOD.replace('"step"', '"dance"'), ["line 2", "kind"]),
    (GOOD + "[outputs]\nplots = [\"pie\"]\n", ["line 4", "plots", "pie"]),
    (GOOD + "[outputs]\ny = \"nonsense\"\n", ["line 4", "'y'", "nonsense", "step_ms"]),
    ("kind = \"step\"\n", ["question"]),
    ("question = [unclosed\n", ["not valid TOML"]),
    (GOOD + "[sweep]\nhardware = [\"h200\", \"gb300\"]\nkernels = [\"vllm\", \"triton-magic\"]\n",
     ["line 5", "kernels", "triton-magic", "kernel set"]),
], ids=["unknown-key", "empty-axis", "wrong-type", "unknown-model", "unknown-hardware", "unknown-fusion",
        "unknown-top-key", "unknown-kind", "unknown-plot", "unknown-y", "no-question", "not-toml",
        "unknown-kernel-set"])
def test_malformed_scenario(tmp_path, text, needles):
    out = tmp_path / "out"
    r = runner.invoke(app, ["run", str(_scenario(tmp_path, text)), "--out", str(out)])
    assert r.exit_code == 2
    for needle in needles:
        assert needle in r.output, (needle, r.output)
    assert "Traceback" not in r.output and not out.exists()


def test_interrupted_sweep_keeps_finished_points(tmp_path, monkeypatch):
    sc = load_scenario(ROOT / "scenarios" / "batch-sweep.toml")
    real = sweep.evaluate
    calls = {"n": 0}

    def flaky(point, kind, interval=True):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(point, kind, interval)

    monkeypatch.setattr(sweep, "evaluate", flaky)
    r = runner.invoke(app, ["run", str(sc.path), "--out", str(tmp_path)])
    assert r.exit_code == 130
    with open(tmp_path / "points.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 2  # three finished points x two variants, a complete file
    assert json.loads((tmp_path / "summary.json").read_text())["interrupted"] is True


def test_quick_cuts_axes():
    sc = load_scenario(ROOT / "scenarios" / "batch-sweep.toml")
    assert sc.reduced().count == len(list(sc.reduced().points())) == 4
    assert sc.count == len(list(sc.points())) == 14


# ------------------------------------------------------------------ sizes, resume, interruptions


def _counting(monkeypatch, stop_at: int | None = None) -> dict:
    """Patch sweep.evaluate to count calls, and to raise Ctrl-C at call `stop_at`."""
    real, calls = sweep.evaluate, {"n": 0}

    def counted(point, kind, interval=True):
        calls["n"] += 1
        if calls["n"] == stop_at:
            raise KeyboardInterrupt
        return real(point, kind, interval)

    monkeypatch.setattr(sweep, "evaluate", counted)
    return calls


def _csv_rows(path: Path) -> int:
    with open(path / "points.csv") as f:
        return len(list(csv.DictReader(f)))


def test_points_are_generated_lazily(tmp_path):
    axes = ("batch = [" + ", ".join(map(str, range(1, 1001))) + "]\n"
            "context = [" + ", ".join(map(str, range(1000))) + "]\n")
    sc = load_scenario(_scenario(tmp_path, GOOD + "[sweep]\n" + axes))
    points = sc.points()
    assert sc.count == 10**6 and iter(points) is points  # an iterator, never a million-entry list
    assert next(points)["batch"] == 1


def test_grid_over_the_limit_needs_yes(tmp_path, monkeypatch):
    axes = "batch = [" + ", ".join(map(str, range(1, 501))) + "]\ncontext = [" + ", ".join(map(str, range(100))) + "]\n"
    path = _scenario(tmp_path, GOOD + "[sweep]\n" + axes)
    calls = _counting(monkeypatch)
    r = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "50,000 grid points" in r.output and "--yes" in r.output
    assert f"about {50_000 / sweep.POINTS_PER_S['step', True] / 60:,.0f} min on one core at" in r.output
    assert "--no-interval" in r.output
    r = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "out"), "--no-interval"])
    assert r.exit_code == 2 and f"about {50_000 / sweep.POINTS_PER_S['step', False] / 60:,.0f} min" in r.output
    assert calls["n"] == 0 and not (tmp_path / "out").exists()
    monkeypatch.setattr(sweep, "LIMIT", 3)
    r = runner.invoke(app, ["run", "batch-sweep", "--quick", "--yes"])
    assert r.exit_code == 0, r.output


def test_rerun_resumes_and_never_shrinks_the_csv(tmp_path, monkeypatch):
    calls = _counting(monkeypatch, stop_at=4)
    r = runner.invoke(app, ["run", "batch-sweep", "--out", str(tmp_path)])
    assert r.exit_code == 130 and _csv_rows(tmp_path) == 6
    assert r.output.strip().splitlines()[-1].startswith("interrupted after 3 of 14 points; 6 rows in")
    calls = _counting(monkeypatch, stop_at=2)  # interrupted again one point later: the CSV still grows
    r = runner.invoke(app, ["run", "batch-sweep", "--out", str(tmp_path)])
    assert r.exit_code == 130 and "resuming: 3 of 14 points" in r.output and _csv_rows(tmp_path) == 8
    calls = _counting(monkeypatch)
    r = runner.invoke(app, ["run", "batch-sweep", "--out", str(tmp_path)])
    assert r.exit_code == 0 and calls["n"] == 14 - 4 and _csv_rows(tmp_path) == 28
    full = runner.invoke(app, ["run", "batch-sweep", "--json"])
    resumed = json.loads(runner.invoke(app, ["run", "batch-sweep", "--out", str(tmp_path), "--json"]).stdout)
    assert resumed["rows"] == json.loads(full.stdout)["rows"], "rows read back from points.csv are the same rows"


def test_resume_refuses_a_csv_that_disagrees_with_its_summary(tmp_path):
    runner.invoke(app, ["run", "batch-sweep", "--quick", "--out", str(tmp_path)])
    lines = (tmp_path / "points.csv").read_text().splitlines()
    (tmp_path / "points.csv").write_text("\n".join(lines[:-1]) + "\n")
    r = runner.invoke(app, ["run", "batch-sweep", "--quick", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "summary.json says 8" in r.output and _csv_rows(tmp_path) == 7


@pytest.mark.parametrize("summary", ["not json", "[1, 2]", '{"files": 3, "scenario_hash": 7}'])
def test_a_foreign_or_broken_summary_is_named_not_a_traceback(tmp_path, summary):
    (tmp_path / "summary.json").write_text(summary)
    (tmp_path / "points.csv").write_text("a,b\n1,2\n")
    r = runner.invoke(app, ["run", "batch-sweep", "--quick", "--out", str(tmp_path)])
    assert r.exit_code == 0 and "earlier, different scenario (unknown): points.csv, summary.json" in r.output
    assert _csv_rows(tmp_path) == 8


def test_ctrl_c_while_plotting_is_one_line_and_130(tmp_path, monkeypatch):
    import simulator.report.scenario_plots as sp

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(sp, "scenario_plots", interrupted)
    r = runner.invoke(app, ["run", "batch-sweep", "--quick", "--out", str(tmp_path)])
    assert r.exit_code == 130 and r.output.strip().startswith("interrupted while drawing the plots")
    assert len(r.output.strip().splitlines()) == 1
    assert json.loads((tmp_path / "summary.json").read_text())["interrupted"] is True
    assert not list(tmp_path.glob(".*.tmp"))


def test_ctrl_c_in_any_command_is_one_line_and_130(tmp_path, monkeypatch):
    import simulator.report.summary as summary

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(summary, "layer_report", interrupted)
    r = runner.invoke(app, ["layer", "--plot", str(tmp_path)])
    assert r.exit_code == 130 and r.output.strip() == "interrupted"


def test_files_of_another_scenario_are_named(tmp_path):
    assert runner.invoke(app, ["run", "batch-sweep", "--quick", "--out", str(tmp_path)]).exit_code == 0
    r = runner.invoke(app, ["run", "speculative", "--quick", "--out", str(tmp_path)])
    assert r.exit_code == 0 and "earlier, different scenario (batch-sweep)" in r.output
    assert "batch-sweep-step.png" in r.output and "resuming" not in r.output


def test_skip_reasons_printed_when_no_csv_is_written():
    r = runner.invoke(app, ["run", "speculative", "--quick"])
    assert r.exit_code == 0 and "points.csv" not in r.output
    assert "skipped: --acceptance-length = 6.0 must lie in" in r.output


@pytest.mark.parametrize("kind, name", [("step", "batch-sweep"), ("layer", "context-length"),
                                        ("ablation", "fusion-ablation")])
def test_y_columns_are_real_columns(kind, name):
    from simulator.config import ATTENTION_KINDS, load_model
    from simulator.scenario import Y_COLUMNS
    sc = load_scenario(ROOT / "scenarios" / f"{name}.toml")
    point = next(sc.points())
    absent = {f"{k}_layers_ms" for k in ATTENTION_KINDS if k not in load_model(point["model"]).attn_kinds}
    rows = sweep.evaluate(point, kind)
    assert rows[0]["status"] == "ok" and set(Y_COLUMNS[kind]) - absent <= set(rows[0])


@pytest.mark.parametrize("name", ["batch-sweep", "routing"])
def test_worker_processes_give_the_serial_rows_in_order(monkeypatch, name):
    """The sweep on two processes (chunks of one point, so results arrive out of order) == one process."""
    sc = load_scenario(name)
    serial = sweep.run(sc, workers=1)["rows"]
    monkeypatch.setattr(sweep, "PARALLEL_MIN_POINTS", 0)
    assert sweep.run(sc, workers=2)["rows"] == serial


def test_no_interval_rows_are_the_central_values_without_bounds(tmp_path):
    """`run --no-interval` drops the bounds columns and nothing else, and a rerun with the other setting
    starts over instead of mixing rows with and without bounds in one points.csv."""
    with_bounds = runner.invoke(app, ["run", "batch-sweep", "--quick", "--json"])
    central = runner.invoke(app, ["run", "batch-sweep", "--quick", "--json", "--no-interval"])
    assert with_bounds.exit_code == 0 and central.exit_code == 0, central.output
    rows_b, rows_c = json.loads(with_bounds.output)["rows"], json.loads(central.output)["rows"]
    assert any("step_ms_low" in r for r in rows_b) and not any("step_ms_low" in r for r in rows_c)
    for b, c in zip(rows_b, rows_c, strict=True):
        assert {k: v for k, v in b.items() if not k.endswith(("_low", "_high"))} == c
    out = tmp_path / "out"
    assert runner.invoke(app, ["run", "batch-sweep", "--quick", "--out", str(out), "--no-interval"]).exit_code == 0
    assert runner.invoke(app, ["run", "batch-sweep", "--quick", "--out", str(out)]).exit_code == 0
    assert "step_ms_low" in (out / "points.csv").read_text().splitlines()[0]


def test_a_scenario_sweeps_the_kernel_set_and_each_row_names_it(tmp_path):
    """Issue 29: the implementation set is an answer's stated assumption in a scenario too. On H200 each set
    prices its own laws (the rows differ); on a GPU that lacks the set the point is skipped with the reason."""
    text = GOOD + ('[base]\nmodel = "deepseek-v3"\ntp = 8\nbatch = 8\n'
                   '[sweep]\nhardware = ["h200", "gb300"]\nkernels = ["vllm", "gpu-suite", "datasheet"]\n')
    out = tmp_path / "out"
    r = runner.invoke(app, ["run", str(_scenario(tmp_path, text)), "--out", str(out), "--no-interval"])
    assert r.exit_code == 0, r.output
    with (out / "points.csv").open() as f:
        rows = list(csv.DictReader(f))
    ok = {(r["hardware"], r["kernel_set"], r["variant"]): float(r["step_ms"]) for r in rows if r["status"] == "ok"}
    assert {k[:2] for k in ok} == {("h200", "vllm"), ("h200", "gpu-suite"), ("h200", "datasheet"),
                                   ("gb300", "datasheet")}
    h200 = [ok["h200", s, "standard"] for s in ("vllm", "gpu-suite", "datasheet")]
    assert len(set(h200)) == 3, h200
    skipped = [r["status"] for r in rows if r["hardware"] == "gb300" and r["kernels"] != "datasheet"]
    assert len(skipped) == 2 and all("Unknown kernel set" in s for s in skipped)
