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
