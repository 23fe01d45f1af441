"""A sweep's interval rows are priced a chunk at a time (every plan of the chunk scheduled under the draws in
one call of the compiled rows loop, each kernel's drawn terms remembered across plans, the step times' draws
shared by points that differ only in acceptance length); they must equal each point priced alone (its plans
scheduled by lockstep's NumPy loop)."""

from __future__ import annotations

from simulator import sweep
from simulator.cost.uncertainty import uncertainty_for
from simulator.report.summary import step_time_draws
from simulator.scenario import DEFAULTS, Scenario

GRID = {"tp": [16], "batch": [1, 4], "context": [512, 2048], "draft_tokens": [3], "expert_skew": [0.0, 1.2],
        "acceptance_length": [1.0, 2.0], "hardware": ["gb300", "gb200"]}


def test_a_chunk_priced_together_equals_each_point_priced_alone():
    sc = Scenario("chunk", "tests/test_sweep.py", "Same rows?", "step", DEFAULTS | {"model": "kimi-k3"}, GRID)
    points = list(sc.points())
    together = list(sweep.evaluate_points(iter(points), sc.kind, len(points), workers=1))
    alone = []
    for point in points:
        for hw in ("gb300", "gb200"):  # forget every scheduled plan, remembered kernel and step: this point's own loop
            sample = uncertainty_for(sweep._hardware(hw), sweep._interval_spec(True)).sample
            sample.timelines.clear()
            sample.terms.clear()
        step_time_draws.cache_clear()
        alone.append(sweep.evaluate(point, sc.kind))
    assert all(r["status"] == "ok" and "step_ms_low" in r for rows in together for r in rows)
    assert together == alone


def test_a_layer_sweeps_compiled_draws_equal_the_layer_command():
    """A layer sweep schedules each point's draws with the compiled rows loop (`fastsim.makespan_us.draws`);
    its rows' bounds must equal `layer_report`'s with the defaults `moe-sim layer` runs (lockstep's NumPy
    loop), every scheduled plan forgotten in between."""
    from simulator.report.summary import layer_report
    grid = {"layer": ["kda", "mla", "dense"], "batch": [1, 8], "tokens_per_seq": [1, 4], "hardware": ["gb300", "gb200"]}
    sc = Scenario("layers", "tests/test_sweep.py", "Same bounds?", "layer", DEFAULTS | {"model": "kimi-k3"}, grid)
    spec = sweep._interval_spec(True)
    for point in sc.points():
        hw = sweep._hardware(point["hardware"])
        uncertainty_for(hw, spec).sample.timelines.clear()
        rows = {r["variant"]: r for r in sweep.evaluate(point, "layer")}
        uncertainty_for(hw, spec).sample.timelines.clear()
        doc = layer_report(sweep._model(point["model"], point["precision"]), hw, point["tp"], sweep._shape(point),
                           point["layer"], point["variant"], sweep._fusions(point), spec)
        for variant, row in rows.items():
            assert row["status"] == "ok", row["status"]
            assert [row["layer_us_low"], row["layer_us_high"]] == doc["variants"][variant]["layer_us_interval"]
            assert [row["speedup_low"], row["speedup_high"]] == doc["speedup_interval"]


def _chunk_in_a_worker(points: list[dict]) -> tuple[int, int, list]:
    import gc
    before = gc.get_freeze_count()
    rows = sweep._evaluate_chunk(points, "step", True)
    return before, gc.get_freeze_count(), rows


def test_a_worker_chunk_hides_its_caches_from_the_collector():
    """A worker freezes what is alive before each chunk (`sweep._evaluate_chunk`: the growing caches stay out
    of every full collection); its rows are the same as the calling process's, which freezes nothing."""
    import gc
    import multiprocessing
    sc = Scenario("chunk", "tests/test_sweep.py", "Same rows?", "step", DEFAULTS | {"model": "kimi-k3"}, GRID)
    points = list(sc.points())[:4]
    before_here = gc.get_freeze_count()
    with multiprocessing.get_context("fork").Pool(1) as pool:
        before, after, rows = pool.apply(_chunk_in_a_worker, (points,))
    assert after > before
    assert gc.get_freeze_count() == before_here
    assert rows == [sweep.evaluate(p, "step") for p in points]
