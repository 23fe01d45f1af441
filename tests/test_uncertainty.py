"""Intervals (issue 12, simulator/cost/uncertainty.py): the cached residuals equal their source, coverage is
counted on held-back points, shared parameters move every kernel together, the speedup interval is taken
draw by draw, seeds reproduce, and the outputs carry the bounds."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.cost import uncertainty as u
from simulator.cost.calibrate import FITTED
from simulator.cost.step import build_plan, estimate_step
from simulator.errors import UserError
from simulator.hardware import load_hardware
from simulator.plans.kernel import DecodeShape

runner = CliRunner()
SMALL = u.IntervalSpec(draws=100)


@pytest.fixture(scope="module")
def gb300():
    return load_hardware("gb300")


def test_cached_residuals_equal_their_source():
    """residuals_h200.json is what `moe-sim validate`'s split and refit give today; regenerate with
    `python -m simulator.cost.uncertainty` after a change to the measurements or the family laws."""
    derived = u.residuals_document("calibration/h200", load_hardware("h200"))
    cached = json.loads(u.RESIDUALS_FILE.read_text(encoding="utf-8"))
    assert cached == json.loads(json.dumps(derived)), "stale residuals: run python -m simulator.cost.uncertainty"


def test_coverage_counts_held_back_points_only():
    """Synthetic residuals: fitted spread [-0.1, 0.1], held-back points placed inside and outside it. The count
    must follow the held-back list (a coverage computed on the fitted points would be ~90 % here)."""
    fitted = tuple(np.linspace(-0.1, 0.1, 201))
    res = u.Residuals("synthetic", {"gemm": fitted}, {"gemm": (0.0, 0.05, -0.05, 0.5, -0.5)})
    c = u.coverage(res, 0.9)
    assert c["by_family"]["gemm"]["covered"] == 3 and c["coverage"] == pytest.approx(0.6)


def test_h200_held_back_coverage_is_calibrated():
    """The 90 % interval built from the fitted half covers 80-97 % of the held-back H200 points."""
    c = u.coverage(u.load_residuals(), 0.9)
    assert c["n"] >= 250
    assert 0.80 <= c["coverage"] <= 0.97, c


def test_shared_constant_moves_every_kernel_together(k3, gb300):
    """Only the launch gap varies, drawn at random: one gap per draw moves every boundary of the layer at
    once, so the layer's spread is ~(boundaries) x the gap's spread. Gaps drawn per kernel would add up to
    only ~sqrt(boundaries) x (under 5 for the 23 kernels here)."""
    res = u.load_residuals()
    params = u.parameters(gb300, res)
    k = [p.name for p in params].index("launch_gap_us")
    z = np.zeros((100, len(params)))
    z[:, k] = np.random.default_rng(0).uniform(-0.1, 2.0, 100)  # inside the range [1.3, 2.1]
    sample = u.realise(gb300, params, z, res)
    plan = build_plan(k3, "standard", 16, DecodeShape(1, 1, 512), "kda")
    times = u.plan_draws(plan, sample)
    gaps = np.array([p.launch_gap_us for p in sample.profiles])
    assert np.std(times) / np.std(gaps) > 10
    assert np.corrcoef(times, gaps)[0, 1] > 0.999


def test_family_factor_scales_every_kernel_of_the_family(k3, gb300):
    """The gemm factor alone: every GEMM's work grows by the same factor in a draw, so the layer time is
    linear in it (on one stream with no HBM sharing) and grows by more than any single GEMM could."""
    res = u.load_residuals()
    params = u.parameters(gb300, res)
    k = [p.name for p in params].index("gemm")
    z = np.zeros((2, len(params)))
    z[1, k] = 1.5
    sample = u.realise(gb300, params, z, res)
    plan = build_plan(k3, "standard", 16, DecodeShape(1, 1, 512), "kda")
    times = u.plan_draws(plan, sample)
    from simulator.cost.timeline import schedule
    gemms = [s.duration_us for s in schedule(plan, gb300).spans if s.kind == "gemm"]
    factor = sample.factors[1, u.FAMILIES.index("gemm")]
    assert factor > 1.05
    assert times[1] - times[0] > (factor - 1) * max(gemms) * 1.5


def test_seed_reproduces_and_changes_the_draws(k3, gb300):
    shape = DecodeShape(1, 8, 512)
    plan = build_plan(k3, "specialized", 16, shape, "kda")
    a, b = (u.uncertainty(gb300, SMALL) for _ in range(2))
    c = u.uncertainty(gb300, u.IntervalSpec(draws=100, seed=7))
    np.testing.assert_array_equal(u.plan_draws(plan, a.sample), u.plan_draws(plan, b.sample))
    assert not np.array_equal(a.sample.z, c.sample.z)


def test_speedup_interval_is_taken_draw_by_draw(k3, gb300):
    """The ratio's interval from per-draw ratios: equal to the quantiles of standard / specialized under the
    same draws, and narrower than the ratio of the two intervals' ends (their errors are shared)."""
    from simulator.report.summary import layer_report
    shape = DecodeShape(1, 8, 512)
    doc = layer_report(k3, gb300, 16, shape, "kda", "both", None, SMALL)
    unc = u.uncertainty_for(gb300, SMALL)
    std, spec = (u.plan_draws(build_plan(k3, v, 16, shape, "kda"), unc.sample) for v in ("standard", "specialized"))
    assert doc["speedup_interval"] == unc.interval(std / spec, 4)
    (s_lo, s_hi), (f_lo, f_hi) = (doc["variants"][v]["layer_us_interval"] for v in ("standard", "specialized"))
    lo, hi = doc["speedup_interval"]
    assert hi - lo < s_hi / f_lo - s_lo / f_hi


def test_gb300_published_figures_inside_and_step_width_within_15_percent(k3, gb300):
    """The four published figures inside their 90 % intervals (in-sample: the draws are conditioned on them),
    and the batch-1 step intervals within +-15 % of their central values (issue 12's target)."""
    unc = u.uncertainty_for(gb300, u.IntervalSpec())
    assert unc.weights.sum() == pytest.approx(1.0) and unc.describe()["effective_draws"] >= 0.05 * unc.sample.n
    values = u.figure_values(k3, unc.sample, FITTED)
    for j, fig in enumerate(FITTED):
        lo, hi = unc.interval(values[:, j])
        assert lo <= fig.published <= hi, (fig.name, lo, hi)
        if fig.metric == "step_ms":
            central = estimate_step(k3, gb300, fig.variant, 16, 1, 512).step_us / 1000
            assert 0.85 * central <= lo <= central <= hi <= 1.15 * central, (fig.name, lo, central, hi)


def test_step_json_carries_the_intervals():
    r = runner.invoke(app, ["step", "--json", "--draws", "100"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    for v in doc["variants"].values():
        for key, central in (("step_ms_interval", v["step_ms"]), ("tokens_per_s_interval", v["tokens_per_s"])):
            lo, hi = v[key]
            assert lo < hi and math.isfinite(lo)
            assert lo <= central * 1.2 and hi >= central * 0.8
    lo, hi = doc["speedup_interval"]
    assert lo < doc["speedup"] < hi
    assert doc["interval"]["draws"] == 100 and doc["interval"]["conditioned_on_published"]
    off = json.loads(runner.invoke(app, ["step", "--json", "--no-interval"]).output)
    assert "speedup_interval" not in off and "step_ms_interval" not in off["variants"]["standard"]


def test_layer_json_and_table_carry_the_intervals():
    args = ["layer", "--json", "--draws", "100", "--hardware", "h200", "--tp", "8"]
    doc = json.loads(runner.invoke(app, args).output)
    for v in doc["variants"].values():
        lo, hi = v["layer_us_interval"]
        assert lo < v["layer_us"] < hi
        for k in v["kernels"]:  # each kernel's own span under the draws
            assert 0 < k["duration_us_interval"][0] <= k["duration_us_interval"][1]
        assert sum(k["duration_us_interval"][1] for k in v["kernels"]) > hi * 0.5
    assert doc["interval"]["conditioned_on_published"] is None  # H200 was not fitted to the published figures
    table = runner.invoke(app, ["layer", "--draws", "100"])
    assert table.exit_code == 0 and "90% interval" in table.output


def test_sensitivity_ranks_and_plots(tmp_path):
    r = runner.invoke(app, ["step", "--json", "--sensitivity", "--plot", str(tmp_path), "--hardware", "h200",
                            "--tp", "8"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    for panel in doc["sensitivity"]["variants"].values():
        shares = [row["share"] for row in panel["ranking"]]
        assert shares == sorted(shares, reverse=True) and all(0 <= s <= 1 for s in shares)
        # independent parameters on H200: about all of the variance at most (+ sampling noise ~K / N)
        assert 0.3 < panel["sum_of_shares"] <= 1.15
    assert (tmp_path / "step-sensitivity.png").stat().st_size > 0


def test_scenario_csv_carries_the_bounds(tmp_path):
    from simulator import sweep
    from simulator.scenario import load_scenario
    sc = load_scenario("batch-sweep").reduced()
    sweep.run(sc, tmp_path)
    rows = [r for r in sweep.read_csv(tmp_path / "points.csv") if r["status"] == "ok"]
    assert rows
    for r in rows:
        assert r["step_ms_low"] < r["step_ms_high"] and r["speedup_low"] < r["speedup_high"]
        assert r["tokens_per_s_low"] < r["tokens_per_s_high"]


@pytest.mark.parametrize("args", [["--seed", "-1"], ["--interval", "1.5"], ["--interval", "0"], ["--draws", "3"],
                                  ["--plot", "out"], ["--sensitivity", "--no-interval"]])
def test_bad_interval_options_are_one_sentence(args):
    r = runner.invoke(app, ["step", *args])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.output.strip().count("\n") == 0, r.output


def test_cost_model_doc_quotes_the_tool():
    """docs/cost-model.md section 8 quotes its numbers through the walkthrough's markers; each must be what
    the tool prints now (`python docs/update_numbers.py` rewrites them)."""
    from pathlib import Path

    from test_walkthrough import MARKER, _json, _walk
    text = (Path(__file__).resolve().parent.parent / "docs" / "cost-model.md").read_text(encoding="utf-8")
    markers = list(MARKER.finditer(text))
    assert len(markers) >= 15
    for m in markers:
        args, path, fmt = (part.strip() for part in m.group(1).split("|"))
        shown = format(_walk(_json(args), path), fmt)
        assert m.group(2) == shown, f"marker '{m.group(1)}': the tool gives {shown}, the text says {m.group(2)!r}"


def _quantile_alone(values, weights, probs):
    """weighted_quantile as it was written for one array of draws: the reference for the batched form."""
    order = np.argsort(values)
    v, w = values[order], weights[order]
    return np.interp(probs, (np.cumsum(w) - w / 2) / w.sum(), v)


@pytest.mark.parametrize("n", [50, 100, 400, 1000])
def test_quantiles_taken_together_equal_each_taken_alone(n):
    """A report takes the quantiles of all its intervals in one batch ([K, N]): the same bits as one array
    at a time, with skewed importance weights and with ties (rounded draws)."""
    rng = np.random.default_rng(n)
    probs = [0.05, 0.95]
    for rounded in (False, True):
        values = rng.lognormal(size=(9, n)) * 10.0 ** rng.uniform(-3, 3, size=(9, 1))
        values = np.round(values, 1) if rounded else values
        weights = rng.random(n) ** 6
        weights /= weights.sum()
        together = u.weighted_quantile(values, weights, probs)
        for k in range(len(values)):
            np.testing.assert_array_equal(together[k], _quantile_alone(values[k], weights, probs))
            np.testing.assert_array_equal(u.weighted_quantile(values[k], weights, probs), together[k])


@pytest.mark.parametrize("hardware", ["gb300", "h200"])
def test_vectorised_pricing_equals_one_draw_at_a_time(k3, hardware):
    """plan_draws prices all draws at once (drawn constants as arrays, a per-draw loop where the pricing
    branches on one); it must equal pricing and scheduling each draw's own profile with the timeline's code."""
    from simulator.cost.fastsim import simulate
    from simulator.cost.layout import plan_arrays
    from simulator.cost.head import head_plan
    hw = load_hardware(hardware)
    unc = u.uncertainty(hw, u.IntervalSpec(draws=50, seed=3))
    s = unc.sample
    shape = DecodeShape(4, 2, 512)
    plans = [build_plan(k3, v, 8, shape, t) for v in ("standard", "specialized") for t in ("kda", "mla", "dense")]
    for plan in plans + [head_plan(k3, 8, shape, "specialized", True)]:
        fams = [u.kernel_families(k) for k in plan]
        want = []
        for d, prof in enumerate(s.profiles):
            a = list(plan_arrays(plan, prof))
            fw = np.array([s.factors[d, u.FAMILIES.index(w)] if w else 1.0 for w, _ in fams])
            fc = np.array([s.factors[d, u.FAMILIES.index(c)] if c else 1.0 for _, c in fams])
            a[3], a[4], a[5], a[7] = a[3] * fw, a[4] * fw, a[5] * fc, a[7] / fw
            want.append(simulate(*a)[1].max() * s.structure[d, u.VARIANTS.index(plan.variant)])
        np.testing.assert_allclose(u.plan_draws(plan, s), want, rtol=1e-12, err_msg=f"{plan.variant} {plan.layer}")


def test_no_kernel_falls_back_to_one_draw_at_a_time(k3, gb300):
    """Pricing under drawn constants stays vectorised, collectives included (the cheaper all-reduce is a
    minimum per draw). A pricing change that branches on a drawn constant (Python max/min, `if` on an array)
    silently falls back to one call per draw and costs `step` a good part of a second."""
    from simulator.cost.pricing import kernel_terms
    from simulator.cost.head import head_plan
    s = u.uncertainty(gb300, u.IntervalSpec(draws=50, seed=1)).sample
    plans = [build_plan(k3, v, 16, DecodeShape(1, 8, 512), t) for v in ("standard", "specialized")
             for t in ("kda", "mla", "dense")] + [head_plan(k3, 16, DecodeShape(1, 1, 512), "specialized", True)]
    for plan in plans:
        for k in plan:
            kernel_terms(k, s.stacked)  # raises on an array branch


def test_machine_spread_widens_a_short_kernel_s_interval_only(monkeypatch):
    """compare-trace's family interval moves each bound out by the machine spread, in µs: a 2 µs launch 20 %
    faster than its law is inside a [-10, +10] % interval once 0.5 µs of spread is added, a 60 µs one is not."""
    from simulator.hardware import load_hardware
    from simulator.plans import standard
    from simulator.config import load_model
    from simulator.plans.kernel import DecodeShape
    from simulator.report import trace_compare as tc
    plan = standard.build(load_model("kimi-k3"), 8, DecodeShape(1, 1, 512), "kda", 46, arch="sm90")
    fitted = tuple(np.linspace(math.log(0.9), math.log(1.1), 401))
    rows = lambda: [{"plan": "fc1", "model_us": m, "model_gap_us": 0.0, "launch_error_pct": -20.0,  # noqa: E731
                     "error_pct": -20.0} for m in (2.0, 60.0)]
    for spread, inside in ((0.0, [False, False]), (0.5, [True, False])):
        res = u.Residuals("synthetic", {"moe": fitted}, {"moe": ()}, spread)
        monkeypatch.setattr(tc, "residuals_of", lambda hw, res=res: res)
        got = rows()
        tc.family_intervals(got, plan, load_hardware("h200"))
        assert [r["inside_interval"] for r in got] == inside, (spread, got)


def test_machine_spread_is_measured_from_the_repeat():
    """Every shipped repeat kernel under 10 µs moved by less than a microsecond between the two H200s, and the
    quantile taken is inside that range; folders that share no kernel are one sentence."""
    doc = u.machine_spread(*u.REPEAT)
    assert doc["kernels"] >= 30 and 0.05 < doc["us"] < 1.0
    assert u.machine_spread(*u.REPEAT, level=0.5)["us"] < doc["us"]
    with pytest.raises(UserError, match="no short kernel is measured in both"):
        u.machine_spread("h200/production", "h200/production/layers")
