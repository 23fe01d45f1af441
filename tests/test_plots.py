"""Plots: each function writes a PNG and an SVG, atomically, and refuses bad input without leaving a file.

The pictures themselves are judged by eye (README); these tests pin down the contract: both formats,
valid signatures, both variants in the timeline, waterfall arithmetic, speedup pairing, no leftovers.
"""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.hardware import load_hardware
from simulator.plans.kernel import DecodeShape
from simulator.report import plots
from simulator.report.summary import layer_report, layer_timelines

pytest.importorskip("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TRACE_SHAPE = DecodeShape(1, 8, 512)  # the published trace: batch 1 verifying 7 draft tokens


@pytest.fixture(scope="module")
def gb300():
    return load_hardware("gb300")


@pytest.fixture(scope="module")
def layer_doc(k3, gb300):
    return layer_report(k3, gb300, 16, TRACE_SHAPE, "kda")


@pytest.fixture(scope="module")
def timelines(k3, gb300):
    return layer_timelines(k3, gb300, 16, TRACE_SHAPE, "kda", "both")


def sweep_rows() -> list[dict]:
    """A synthetic step sweep: two TP degrees, five batches, both variants; speedup 2.0 at TP16."""
    rows = []
    for tp in (8, 16):
        for batch in (1, 4, 16, 64, 256):
            standard = 7.0 + 0.05 * batch * (16 / tp)
            for variant, ms in (("standard", standard), ("specialized", standard / (2.0 if tp == 16 else 1.5))):
                rows.append({"model": "kimi-k3", "hardware": "gb300", "tp": tp, "batch": batch, "context": 512,
                             "variant": variant, "step_ms": ms, "tokens_per_s": batch / ms * 1e3})
    return rows


def assert_png_and_svg(paths: list[Path], out_dir: Path, stem: str) -> str:
    """Both files exist under their names, are well-formed, and nothing else is in out_dir; returns the SVG."""
    assert sorted(paths) == [out_dir / f"{stem}.png", out_dir / f"{stem}.svg"]
    png, svg = (out_dir / f"{stem}.png").read_bytes(), (out_dir / f"{stem}.svg").read_text(encoding="utf-8")
    assert png.startswith(PNG_SIGNATURE) and len(png) > 1000
    assert svg.startswith("<?xml") or "<svg" in svg
    assert sorted(p.name for p in out_dir.iterdir()) == [f"{stem}.png", f"{stem}.svg"], "temporary file left behind"
    return svg


def test_importing_plots_does_not_import_matplotlib():
    code = "import sys, simulator.report.plots; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_timeline_has_both_variants_standard_first(layer_doc, timelines, tmp_path):
    svg = assert_png_and_svg(plots.plot_timeline(layer_doc, tmp_path, "timeline", timelines=timelines),
                             tmp_path, "timeline")
    titles = [f"{v}: {layer_doc['variants'][v]['kernel_count']} kernels" for v in ("standard", "specialized")]
    assert all(t in svg for t in titles), "one panel per variant, titled with its kernel count"
    assert svg.index(titles[0]) < svg.index(titles[1]), "standard panel above specialized"
    assert "weight prefetch window" in svg


def test_prefetch_windows_end_before_their_kernel_starts(timelines):
    windows = plots.prefetch_windows(timelines)
    assert windows["specialized"], "the specialized plan prefetches weights (pdl_prefetch)"
    for variant, found in windows.items():
        for key, _, start, end in found:
            assert start <= end <= timelines[variant].span(key).start_us + 1e-9


def test_kernel_bars(layer_doc, tmp_path):
    assert_png_and_svg(plots.plot_kernel_bars(layer_doc, tmp_path, "kernels"), tmp_path, "kernels")


def test_roofline_skips_kernels_without_flops(layer_doc, gb300, tmp_path):
    points = plots.roofline_points(layer_doc)
    for variant, run in layer_doc["variants"].items():
        assert [p[0] for p in points[variant]] == [k["key"] for k in run["kernels"] if k["flops"] > 0]
    assert_png_and_svg(plots.plot_roofline(layer_doc, tmp_path, "roofline", gb300), tmp_path, "roofline")


def test_roofline_refuses_other_hardware(layer_doc, tmp_path):
    with pytest.raises(ValueError, match="priced on GB300"):
        plots.plot_roofline(layer_doc, tmp_path / "out", "roofline", load_hardware("h200"))
    assert not (tmp_path / "out").exists()


def test_step_vs_batch_and_speedup_pairs(tmp_path):
    rows = sweep_rows()
    pairs = plots.speedup_pairs(rows, "batch", "tp")
    assert [b for b, _ in pairs[16]] == [1, 4, 16, 64, 256]
    assert all(math.isclose(s, 2.0) for _, s in pairs[16]) and all(math.isclose(s, 1.5) for _, s in pairs[8])
    assert_png_and_svg(plots.plot_step_vs_batch(rows, tmp_path, "step", group="tp"), tmp_path, "step")


def test_step_vs_batch_without_group_needs_one_row_per_batch_and_variant(tmp_path):
    with pytest.raises(ValueError, match=r"vary in \['tp'\]"):
        plots.plot_step_vs_batch(sweep_rows(), tmp_path, "step")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("call", [
    lambda out: plots.plot_step_vs_batch([], out, "step"),
    lambda out: plots.plot_metric([], out, "metric", "context", "step_ms"),
], ids=["step_vs_batch", "metric"])
def test_empty_rows_raise_and_write_nothing(call, tmp_path):
    with pytest.raises(ValueError, match="rows is empty"):
        call(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_missing_column_is_named(tmp_path):
    with pytest.raises(ValueError, match="lacks 'step_ms'"):
        plots.plot_step_vs_batch([{"batch": 1, "variant": "standard"}], tmp_path, "step")


def test_metric_lines_per_group_and_variant(tmp_path):
    rows = sweep_rows()
    paths = plots.plot_metric(rows, tmp_path, "tps", "batch", "tokens_per_s", group="tp", logx=True)
    svg = assert_png_and_svg(paths, tmp_path, "tps")
    assert "specialized, TP16" in svg and "standard, TP8" in svg


def test_waterfall_bars_end_at_start_plus_changes():
    steps = [("standard", 128.4), ("latent_tail", -9.3), ("split_router", -6.1), ("pdl_prefetch", 1.2)]
    bars = plots.waterfall_bars(steps)
    assert [b[0] for b in bars] == ["standard", "latent_tail", "split_router", "pdl_prefetch", "specialized"]
    assert [b[3] for b in bars] == ["total", "saving", "saving", "cost", "total"]
    assert bars[-1][1] == 0.0 and math.isclose(bars[-1][2], 128.4 - 9.3 - 6.1 + 1.2)
    assert bars[1][1:3] == pytest.approx((128.4 - 9.3, 9.3)), "a saving hangs from the running level"
    assert bars[3][1:3] == pytest.approx((128.4 - 9.3 - 6.1, 1.2)), "a cost rises from it"
    assert all(b[2] >= 0 for b in bars)


def test_waterfall_writes_identical_files_twice(tmp_path):
    steps = [("standard", 7.69), ("oproj_allreduce_norm", -1.2), ("latent_tail", -0.8)]
    first = assert_png_and_svg(plots.plot_waterfall(steps, tmp_path, "wf", "step time", "ms"), tmp_path, "wf")
    second = assert_png_and_svg(plots.plot_waterfall(steps, tmp_path, "wf", "step time", "ms"), tmp_path, "wf")
    assert first == second, "SVG output is deterministic (no date, fixed id salt)"


@pytest.mark.parametrize("steps, match", [([], "steps is empty"), ([("standard", float("nan"))], "non-finite")])
def test_waterfall_refuses_bad_steps(steps, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        plots.plot_waterfall(steps, tmp_path, "wf", "title")
    assert list(tmp_path.iterdir()) == []


def test_failed_save_leaves_no_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    (tmp_path / "wf.png").write_bytes(b"old")
    real_savefig = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        if kwargs.get("format") == "svg":
            raise OSError("disk full")
        return real_savefig(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    with pytest.raises(OSError, match="disk full"):
        plots.plot_waterfall([("standard", 1.0), ("x", -0.5)], tmp_path, "wf", "title")
    assert [p.name for p in tmp_path.iterdir()] == ["wf.png"]
    assert (tmp_path / "wf.png").read_bytes() == b"old"


def test_stem_must_be_a_bare_name(tmp_path):
    with pytest.raises(ValueError, match="bare file name"):
        plots.plot_waterfall([("standard", 1.0)], tmp_path, "sub/wf", "title")
    assert list(tmp_path.iterdir()) == []


def test_axis_labels_carry_units():
    assert plots.axis_label("step_ms") == "decode step time (ms)"
    assert plots.axis_label("kda_layers_ms") == "kda layers (ms)"
    assert plots.axis_label("weights_per_gpu_gb") == "weights per gpu (GB)"
