"""Every table fits the terminal without cutting a number or a name: at 80 and 120 columns, piped (rich's
80 without COLUMNS), and whole with --wide. The cells checked are formatted from the command's own JSON,
so a number folded across two lines or shortened with an ellipsis fails."""

import json
import os
import re
import subprocess
import sys
from functools import lru_cache

import pytest
from rich.console import Console
from typer.testing import CliRunner

from simulator.cli import app
from simulator.report.layout import show

runner = CliRunner()
QUESTIONS = {  # issue 31's three questions, as a new user types them
    "k3-h200-b32-d3": ["step", "--model", "Kimi-K3", "--hardware", "H200", "--tp", "8", "--batch", "32",
                       "--draft-tokens", "3"],
    "gb300-tp16-b1": ["step", "--hardware", "gb300", "--tp", "16", "--batch", "1"],
    "dsv3-h200-b16": ["step", "--model", "deepseek-v3", "--hardware", "h200", "--tp", "8", "--batch", "16"],
}


def _run(args: list[str], columns: int | None):
    env = {"COLUMNS": str(columns)} if columns else {}
    r = runner.invoke(app, args, env=env)
    assert r.exit_code == 0, r.output[-500:]
    return r.output


def _json(args: list[str]) -> dict:
    return _json_of(tuple(args))


@lru_cache(maxsize=None)  # each width's test asks for the same document
def _json_of(args: tuple[str, ...]) -> dict:
    return json.loads(_run([*args, "--json"], None))


def _whole(output: str, cell: str) -> bool:
    """`cell` appears on one line, not as part of a longer number or name."""
    pattern = re.compile(r"(?<![\w.])" + re.escape(cell) + r"(?![\w.])")
    return any(pattern.search(line) for line in output.splitlines())


def _fits(output: str, width: int) -> None:
    assert "…" not in output
    longest = max(output.splitlines(), key=len)
    assert len(longest) <= width, longest


def _step_cells(doc: dict) -> list[str]:
    cells = [f"{doc['acceptance_length']:.2f}"]
    for name, v in doc["variants"].items():
        cells += [name, f"{v['step_ms']:.3f}", f"{v['ms_per_token']:.3f}", f"{v['tokens_per_s']:.1f}",
                  f"{v['tokens_per_s_per_user']:.1f}", *(f"{x:.3f}" for x in v["breakdown_ms"].values())]
        lo, hi = v["step_ms_interval"]
        cells.append(f"[{lo:.3f}, {hi:.3f}]")
    return cells


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("question", sorted(QUESTIONS))
def test_the_three_questions_read_whole_with_their_assumptions(question, width):
    args = QUESTIONS[question]
    out, doc = _run(args, width), _json(args)
    _fits(out, width)
    for cell in _step_cells(doc):
        assert _whole(out, cell), cell
    assert "speculation: " in out and "acceptance length" in out
    if doc["draft_tokens"]:
        assert "assumed: each draft accepted with probability 0.85" in " ".join(out.split())
    assert ("DOES NOT FIT IN HBM" in out) == (not doc["fits_in_hbm"])


def test_a_layout_that_does_not_fit_says_so_at_the_top():
    doc = _json(QUESTIONS["k3-h200-b32-d3"])
    assert doc["fits_in_hbm"] is False and "207.1 GB per GPU" in doc["does_not_fit"]
    out = _run(QUESTIONS["k3-h200-b32-d3"], 80)
    assert out.startswith("DOES NOT FIT IN HBM") and "[DOES NOT FIT IN HBM] per variant" in out
    assert _json(QUESTIONS["dsv3-h200-b16"])["fits_in_hbm"] is True


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("args", [["layer", "--tokens-per-seq", "8"], ["layer", "--model", "deepseek-v3"]])
def test_layer_keeps_every_kernel_name_and_duration_whole(args, width):
    out, doc = _run(args, width), _json(args)
    _fits(out, width)
    for v in doc["variants"].values():
        for k in v["kernels"]:
            assert _whole(out, k["name"]) and _whole(out, f"{k['duration_us']:.2f}"), k["name"]
            assert _whole(out, f"{100 * k['fraction_of_hbm_peak']:.0f}")


def test_percent_of_peak_is_the_gbps_beside_it_over_the_datasheet():
    from simulator.hardware import load_hardware
    peak = load_hardware("gb300").hbm_bandwidth
    for k in _json(["layer", "--tokens-per-seq", "8", "--no-interval"])["variants"]["standard"]["kernels"]:
        assert k["fraction_of_hbm_peak"] == pytest.approx(k["achieved_gbps"] * 1e9 / peak, abs=2e-3), k["name"]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("args, cells", [
    (["ablation"], lambda d: [r["fusion"] for r in d["fusions"]]
     + [f"{r['waterfall_step_ms']:.3f}" for r in d["fusions"]]),
    (["run", "batch-sweep", "--quick"], lambda d: [f"{r['step_ms']:.4g}" for r in d["rows"]]),
    (["check", "--tp", "2", "--batch", "2"], lambda d: [f"{t['max_abs_error']:.2e}" for layer in d["layers"]
                                                         for v in layer["variants"].values() for t in v["tensors"]]),
    (["validate"], lambda d: [f"{d['by_family'][f]['median_abs_pct_error']:.1f}" for f in d["by_family"]]),
    (["step", "--batch", "8", "--draft-tokens", "7", "--routing-bracket", "--no-interval"],
     lambda d: [f"{row['step_ms']:.3f}" for end in d["routing_bracket"].values() for row in end["variants"].values()]),
])
def test_every_command_s_table_fits_and_keeps_its_cells(args, cells, width):
    out, doc = _run(args, width), _json(args)
    _fits(out, width)
    for cell in cells(doc):
        assert _whole(out, cell), cell


def test_list_fits_80_columns():
    _fits(_run(["list", "hardware"], 80), 80)


def test_piped_output_is_80_columns_and_wide_is_the_full_table(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run([sys.executable, "-m", "simulator", "step", "--no-interval"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, check=True).stdout
    _fits(piped, 80)
    wide = _run(["step", "--no-interval", "--wide"], 80)
    header = next(line for line in wide.splitlines() if "tok/s (aggregate)" in line)
    assert "step ms" in header and "kernels" in header and len(header) > 80, "one row per variant, full width"


def test_show_moves_to_narrower_layouts_and_never_cuts():
    headers = ["#", "kernel", "stream", "start us", "dur us", "MB", "bound", "GB/s", "% of HBM peak"]
    rows = [[str(i), "latent_tail_allreduce_rmsnorm_reducescatter" if i == 3 else f"k{i}", "main", "1.25",
             "123.45", "0.96", "communication", "1094", "14"] for i in range(1, 9)]
    for width in (60, 80, 120):  # 60: the two-line rows; 80 and 120 as the CLI
        con = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        show(con, headers, rows, key=2)
        text = con.export_text()
        _fits(text, width)
        for r in rows:
            for cell in r:
                assert _whole(text, cell), (width, cell)
