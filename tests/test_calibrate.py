"""`moe-sim calibrate`: the GB300 constants fitted to the published figures are the bounded optimum."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.config import load_model
from simulator.cost import calibrate as cal
from simulator.hardware import load_hardware

runner = CliRunner()


@pytest.fixture(scope="module")
def gb300_fit():
    cfg, hw = load_model("kimi-k3"), load_hardware("gb300")
    return cfg, hw, cal.fit(cfg, hw)


def test_fitted_constants_are_the_ones_the_toml_says(gb300_fit):
    _, hw, _ = gb300_fit
    # alpha_nvls_us left the fit: vLLM 0.33.0 runs no standalone NVLS all-reduce (docs/vllm-k3-source.md)
    assert cal.fitted_names(hw) == ("alpha_in_kernel_us", "launch_gap_us", "pdl_dependent_hidden_us")
    assert cal.fitted_names(load_hardware("h200")) == ()  # its fits name H200 measurements, not published.md


def test_committed_constants_are_the_refit_optimum(gb300_fit):
    """A physics change that moves the published figures must come with a refit: refitting may not improve
    the loss by more than rounding the constants costs."""
    _, _, result = gb300_fit
    assert result.loss_fitted <= result.loss_start + 1e-12
    assert result.loss_start - result.loss_fitted < 5e-5, (result.start, result.fitted)


# With the plans as vLLM 0.33.0 launches them (docs/vllm-k3-source.md) the stock layer at the assumed 1 x 8
# configuration launches 22 kernels, not the published 23, and prices 6.7 % under 130 us while the stock step
# is 4 % over 7.38 ms: no constant inside its range closes both. Issue 9's 5 % target is missed there, and
# this test says so instead of hiding it in a constant.
KNOWN_MISS = {"per-layer trace, standard": 0.07}


def test_published_figures_within_five_percent(gb300_fit):
    cfg, hw, _ = gb300_fit
    for fig in cal.FITTED:
        assert abs(cal.model_value(fig, cfg, hw) / fig.published - 1) < KNOWN_MISS.get(fig.name, 0.05), fig.name


def test_fused_gather_topk_kernel_matches_its_measurement():
    """The fused all-gather + top-k kernel priced as exchange + top-k floor, against b12x's measured 6.2-7.0 us
    for a top-16 kernel with its exchange: the refit to the source-true plans puts the in-kernel exchange at
    4.35 us (5.2 at TP16) and the kernel ~19 % above that measurement, a known miss kept visible (the source
    also moves this exchange into the front GEMM's epilogue, difference P7, which the plan does not mirror)."""
    from simulator.cost.pricing import price_kernel
    from simulator.plans import specialized
    from simulator.plans.kernel import DecodeShape
    cfg, hw = load_model("kimi-k3"), load_hardware("gb300")
    k = specialized.build(cfg, 16, DecodeShape(1, 8), "kda").kernel("router_gather_topk")
    assert 6.2 - 0.5 <= price_kernel(k, hw).duration_us <= 7.0 * 1.2


def test_fit_pulls_a_displaced_constant_back_inside_its_range():
    cfg, hw = load_model("kimi-k3"), load_hardware("gb300")
    displaced = replace(hw, launch_gap_us=2.1)
    result = cal.fit(cfg, displaced, names=("launch_gap_us",))
    lo, hi = result.ranges["launch_gap_us"]
    assert lo <= result.fitted["launch_gap_us"] <= hi and result.loss_fitted < result.loss_start / 2
    assert result.fitted["launch_gap_us"] == pytest.approx(hw.launch_gap_us, abs=0.05)  # back to the committed fit


def test_calibrate_cli_json_and_bad_hardware():
    r = runner.invoke(app, ["calibrate", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert {c["name"] for c in doc["constants"]} == set(cal.fitted_names(load_hardware("gb300")))
    assert len(doc["fitted_figures"]) == 4 and len(doc["unfitted_figures"]) == 3 and doc["degrees_of_freedom"] == 1
    assert all(c["range"][0] <= c["fitted"] <= c["range"][1] for c in doc["constants"])
    bad = runner.invoke(app, ["calibrate", "--hardware", "h200"])
    assert bad.exit_code == 2 and "no constant fitted to the published figures" in bad.output
    assert "Traceback" not in bad.output


def test_published_figures_want_pdl_to_hide_what_it_does_not_on_h200():
    """The H200's measured PDL saving for kernels that wait first (0.34 us) would put the GB300 fit further
    from the published figures than the fitted 1.0 us (of a 1.62 us boundary): the fitted value is a claim
    about Blackwell that a GB300 PDL chain can test (docs/cost-model.md 1.4)."""
    cfg, hw = load_model("kimi-k3"), load_hardware("gb300")
    measured_h200 = load_hardware("h200").pdl_dependent_hidden_us
    assert hw.launch_gap_us > hw.pdl_dependent_hidden_us > measured_h200
    assert cal.loss(cfg, replace(hw, pdl_dependent_hidden_us=measured_h200)) > cal.loss(cfg, hw)


def test_the_trace_can_be_read_as_requests_of_one_token():
    """The published trace's configuration is not published: with one token per sequence, 3 to 8 sequences give
    both its kernel counts (23 standard, 13 specialized), which 1 x 8 does not (22 and 13). calibrate prices the
    trace figures at the configuration asked for and says which; an impossible one is one sentence, exit 2."""
    from simulator.cost.step import build_plan
    from simulator.plans.kernel import DecodeShape
    cfg = load_model("kimi-k3")
    counts = {(b, t): tuple(len(build_plan(cfg, v, 16, DecodeShape(b, t, 512), "kda")) for v in
                            ("standard", "specialized")) for b, t in ((1, 8), (3, 1), (8, 1), (2, 1), (9, 1))}
    assert counts[(3, 1)] == counts[(8, 1)] == (23, 13) != counts[(1, 8)]
    assert counts[(2, 1)] != (23, 13) != counts[(9, 1)]
    r = runner.invoke(app, ["calibrate", "--trace-batch", "8", "--trace-tokens", "1", "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    trace = [f for f in doc["fitted_figures"] if f["metric"] == "layer_us"]
    steps = [f for f in doc["fitted_figures"] if f["metric"] == "step_ms"]
    assert all((f["batch"], f["tokens_per_seq"]) == (8, 1) for f in trace)
    assert all((f["batch"], f["tokens_per_seq"]) == (1, 1) for f in steps)  # the steps keep their own
    default = json.loads(runner.invoke(app, ["calibrate", "--json"]).stdout)
    assert trace[0]["model_now"] != default["fitted_figures"][0]["model_now"]
    bad = runner.invoke(app, ["calibrate", "--trace-batch", "0"])
    assert bad.exit_code == 2 and "at least one sequence" in bad.output and "Traceback" not in bad.output


def test_the_stock_path_got_faster_and_the_model_prices_the_newest():
    """The unfitted standard-path figures at TP8, batch 1 are dated: July's 111 tok/s (9.0 ms), vLLM main of
    2026-08-24 at 8.469 ms (vLLM PRs #53525 / #53526). The model prices 0.33.0's October path: faster than both,
    within 10 % of August, the newer figure closer than the older."""
    doc = json.loads(runner.invoke(app, ["calibrate", "--json"]).output)
    figs = {f["figure"]: f for f in doc["unfitted_figures"]}
    july, august = figs["July standard vLLM, TP8, batch 1"], figs["August standard vLLM main, TP8, batch 1"]
    assert 1000.0 / july["published"] > august["published"] > august["model_now"]  # 9.0 ms > 8.47 ms > the model
    assert -10 < august["error_now_pct"] < 0 < july["error_now_pct"]
    assert abs(august["error_now_pct"]) < abs(july["error_now_pct"])
