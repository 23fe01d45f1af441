"""The loops over many (plan, draw) rows agree with `events.simulate` (plain Python, the reference;
test_timeline holds `fastsim.simulate`, the same loop compiled by Numba, to it): `lockstep.simulate_plans`
(NumPy, every row in one vectorised loop: `step` and `layer` intervals) and `streams.simulate_plans` (one
row at a time on a state per stream: plain Python, and compiled by `fastsim` for sweeps). Random plans from
test_timeline, random per-draw phase lengths and GPU scalars, including the edge cases the rules spell out:
zero gaps (a prefetch that may begin the instant its predecessor starts), kernels with nothing to do (they
end in the pass after they start), prefetches of nothing, and a capacity that several streams and
prefetches overrun at once (the shared bandwidth, summed in kernel order, to the bit)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_timeline import random_plans

from simulator.cost import events, lockstep, streams
from simulator.cost.layout import plan_arrays, plan_layout, plan_scalars
from simulator.hardware import load_hardware

OUTPUTS = ("start", "end", "pf_start", "pf_end", "pf_bytes")


def assert_same(actual: tuple, desired: tuple, label: str = "") -> None:
    for name, a, d in zip(OUTPUTS, actual, desired):
        assert a.shape == d.shape, f"{label} {name}: shape {a.shape} != {d.shape}"
        np.testing.assert_allclose(a, d, rtol=1e-9, atol=1e-9, err_msg=f"{label} {name}")


@settings(max_examples=150, deadline=None)
@given(random_plans())
def test_lockstep_one_draw_matches_the_python_loop(case) -> None:
    plan, hw_name = case
    arrays = plan_arrays(plan, load_hardware(hw_name))
    assert_same(lockstep.simulate(*arrays), events.simulate(*arrays))


@st.composite
def plan_draws(draw: st.DrawFn) -> tuple[list[tuple], tuple]:
    """1-3 random plans under the same N draws: each draw scales every phase of every kernel (a factor of
    0 makes phases, or whole kernels, empty) and draws its own gaps, zero included."""
    n_draws = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    plans = []
    for _ in range(draw(st.integers(1, 3))):
        plan, hw_name = draw(random_plans())
        a = plan_arrays(plan, load_hardware(hw_name))
        n = len(plan)

        def scaled(x):
            return x * rng.choice([0.0, 0.5, 1.0, 1.0, 3.0], size=(n_draws, n))
        plans.append((a[0], a[1], scaled(a[2]), scaled(a[3]), scaled(a[4]), scaled(a[5]), a[6],
                       a[7] * rng.choice([0.25, 1.0, 4.0], size=(n_draws, n)), a[8]))
    scalars = (rng.choice([0.0, 0.4, 2.0], n_draws), rng.choice([0.0, 1e-10, 0.3, 1.5], n_draws),
               rng.choice([1e5, 4.5e6, 8e6], n_draws))
    return plans, scalars


def _compiled_rows(plans, gap_dep, gap_pdl, capacity):
    from simulator.cost import fastsim
    return fastsim.simulate_plans(plans, gap_dep, gap_pdl, capacity)


ROW_LOOPS = {"lockstep": lockstep.simulate_plans, "streams-python": streams.simulate_plans,
             "streams-compiled": _compiled_rows}


@pytest.mark.parametrize("loop", list(ROW_LOOPS))
@settings(max_examples=150, deadline=None)
@given(case=plan_draws())
def test_row_loops_match_the_python_loop_one_draw_at_a_time(loop, case) -> None:
    """Every (plan, draw) row of one call equals the plain loop on that draw alone; the rows loop (one row at a
    time, every expression as events writes it) to the bit."""
    plans, (gap_dep, gap_pdl, capacity) = case
    together = ROW_LOOPS[loop](plans, gap_dep, gap_pdl, capacity)
    for p, (plan, got) in enumerate(zip(plans, together)):
        pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf = plan
        for d in range(len(gap_dep)):
            want = events.simulate(pred, deps, gap_pred[d], fixed[d], math[d], comm[d], nbytes, bw[d], can_pf,
                                   gap_dep[d], gap_pdl[d], capacity[d])
            if loop == "lockstep":
                assert_same(tuple(x[d] for x in got), want, f"plan {p} draw {d}")
            else:
                for name, a, w in zip(OUTPUTS, got, want):
                    np.testing.assert_array_equal(a[d], w, err_msg=f"{loop} plan {p} draw {d} {name}")


def test_compiled_rows_loop_is_the_python_one() -> None:
    """STYLE item 14: what sweeps run is `streams.simulate_rows` compiled, nothing else."""
    from simulator.cost import fastsim
    assert fastsim.simulate_rows.py_func is streams.simulate_rows


def test_shared_bandwidth_of_three_asks_is_summed_in_kernel_order() -> None:
    """Two streams, each running a work phase while the kernel after it prefetches, under a capacity all four
    overrun: the demand has four terms whose float sum depends on its order, and the kernel order (main's
    pair interleaved with aux's) is not the order of the streams. Bytes and bandwidths found by a search
    (one in ~100 random choices) so that the two orders differ in the last bit and the schedule shows it: a
    sum in stream order gives other ends."""
    pred, deps = np.array([-1, -1, 0, 1]), np.full((4, 1), -1)
    nbytes = np.array([2.33e7, 4.2e6, 2.84e7, 2.06e7])
    bw = np.array([[2.2e6, 4.5e6, 4.9e6, 4.5e6]]) / 3.0
    row = np.array([[0.1, 0.3, 0.2, 0.5]])
    zero, can_pf = np.zeros((1, 4)), np.array([0.0, 0.0, 0.8 * nbytes[2], 0.8 * nbytes[3]])
    plan = (pred, deps, row, zero, row, zero, nbytes, bw, can_pf)
    scalars = np.array([0.7]), np.array([0.0]), np.array([5.3e6])
    want = events.simulate(pred, deps, row[0], zero[0], row[0], zero[0], nbytes, bw[0], can_pf,
                           *(x[0] for x in scalars))
    for name, loop in ROW_LOOPS.items():
        for a, w, out in zip(loop([plan], *scalars)[0], want, OUTPUTS):
            np.testing.assert_array_equal(a[0], w, err_msg=f"{name} {out}")


def test_kimi_layers_schedule_to_the_bit(k3) -> None:
    """On the shipped plans the lockstep loop sums shared bandwidth in the plain loop's order: same bits."""
    from simulator.cost.step import build_plan
    from simulator.plans.kernel import DecodeShape
    for hw_name, tp in (("gb300", 16), ("h200", 8)):
        hw = load_hardware(hw_name)
        for variant in ("standard", "specialized"):
            for layer in ("kda", "mla", "dense"):
                arrays = plan_arrays(build_plan(k3, variant, tp, DecodeShape(4, 8, 2048), layer), hw)
                for a, d in zip(lockstep.simulate(*arrays), events.simulate(*arrays)):
                    np.testing.assert_array_equal(a, d, err_msg=f"{hw_name} {variant} {layer}")


@pytest.mark.parametrize("hw_name", ["gb300", "h200"])
def test_rows_loop_schedules_a_steps_plans_under_the_draws_as_lockstep_does(k3, hw_name) -> None:
    """What a sweep's interval reads: a step's plans (6-27 kernels, 1-3 streams, prefetch, cross-stream waits)
    side by side in one call under the sample's draws; the compiled rows loop gives lockstep's bits."""
    from simulator.cost import fastsim
    from simulator.cost.step import build_plan, drafter_plans, load_drafter
    from simulator.cost.uncertainty import IntervalSpec, _draw_arrays, uncertainty
    from simulator.cost.head import head_plan
    from simulator.plans.kernel import DecodeShape
    hw = load_hardware(hw_name)
    sample = uncertainty(hw, IntervalSpec(draws=50, seed=5)).sample
    shape, tp = DecodeShape(4, 4, 4096), 16 if hw_name == "gb300" else 8
    drafter, drafting, taps = load_drafter("dspark-k3")
    plans = [build_plan(k3, v, tp, shape, t) for v in ("standard", "specialized") for t in ("kda", "mla", "dense")]
    plans += [head_plan(k3, tp, shape, "specialized", True), *drafter_plans(drafter, tp, 4, 3, 4096, drafting, taps)[0]]
    assert len({len(p) for p in plans}) >= 4 and any(k.prefetch_bytes for p in plans for k in p)
    arrays = [_draw_arrays(p, sample) for p in plans]
    assert any(a[1].max() >= 0 for a in arrays)  # cross-stream waits
    scalars = [np.broadcast_to(np.asarray(x, dtype=np.float64), (sample.n,)) for x in plan_scalars(sample.stacked)]
    for p, (got, want) in enumerate(zip(fastsim.simulate_plans(arrays, *scalars),
                                        lockstep.simulate_plans(arrays, *scalars))):
        for name, a, w in zip(OUTPUTS, got, want):
            np.testing.assert_array_equal(a, w, err_msg=f"{hw_name} plan {p} ({plans[p].layer}) {name}")


@pytest.mark.parametrize("loop", list(ROW_LOOPS))
def test_a_plan_whose_streams_do_not_chain_is_refused(loop) -> None:
    """The row loops follow each stream's kernels in order; `pred` must say which came before."""
    pred, deps = np.array([-1, 0, 0]), np.full((3, 1), -1)
    row = np.ones((1, 3))
    with pytest.raises(ValueError, match="chain"):
        ROW_LOOPS[loop]([(pred, deps, row, row, row, row, np.ones(3), row, np.zeros(3))],
                        np.ones(1), np.ones(1), np.ones(1))


def test_layout_is_what_the_arrays_carry(k3) -> None:
    """plan_layout (used for the draws) and plan_arrays (one profile) agree on structure, bytes and targets."""
    from simulator.cost.step import build_plan
    from simulator.plans.kernel import DecodeShape
    plan = build_plan(k3, "specialized", 8, DecodeShape(1, 1, 512), "mla")
    arrays = plan_arrays(plan, load_hardware("h200", "datasheet"))
    for got, want in zip(plan_layout(plan), (arrays[0], arrays[1], arrays[6], arrays[8])):
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------------
# what `moe-sim step` loads: no compiled code (a fresh interpreter each, since this session has loaded Numba)
# ---------------------------------------------------------------------------------------------------

def _fresh(script: str) -> dict:
    """Run `script` in a new interpreter; it prints one JSON document, returned parsed."""
    import json
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


COMMAND_THEN_REPORT = """
import json, sys
from simulator.cli import app
try:
    app({args!r} + ["--json"])
except SystemExit as exit:
    assert not exit.code, exit.code
dispatchers = [f"{{m.__name__}}.{{k}}" for m in list(sys.modules.values()) for k, v in list(vars(m).items())
               if type(v).__name__ == "CPUDispatcher" and v.overloads]
print(json.dumps({{"numba": "numba" in sys.modules, "fastsim": "simulator.cost.fastsim" in sys.modules,
                  "compiled": dispatchers}}))
"""


@pytest.mark.parametrize("args", [["step"], ["step", "--no-interval"], ["step", "--hardware", "h200", "--tp", "8"],
                                  ["layer"]], ids=["step-gb300", "step-gb300-no-interval", "step-h200", "layer"])
def test_step_and_layer_run_no_compiled_code(args) -> None:
    """`moe-sim step` and `layer` schedule their central values with the plain loop and their draws with the
    lockstep one: no Numba function is compiled or loaded from its cache (that load alone cost ~0.75 s of a
    cold command)."""
    seen = _fresh(COMMAND_THEN_REPORT.format(args=args))
    assert not seen["fastsim"] and seen["compiled"] == [], seen


def test_the_cost_layer_imports_no_numba() -> None:
    """Timeline, lockstep draws, the rows loop (plain), uncertainty and calibration figures: none imports Numba."""
    seen = _fresh("""
import json, sys
import numpy as np
from simulator.cost import calibrate, events, lockstep, streams, timeline, uncertainty
print(json.dumps({"numba": "numba" in sys.modules}))
""")
    assert not seen["numba"]


def test_step_imports_no_numba() -> None:
    """The plans bind their ops (attention/kda.py imports ops/kda.py, and cost/ the weight table in
    weights.py -> fast/rng.py), whose kernels compile on first call (simulator/jit.py): pricing a step imports
    no Numba."""
    assert not _fresh(COMMAND_THEN_REPORT.format(args=["step"]))["numba"]
