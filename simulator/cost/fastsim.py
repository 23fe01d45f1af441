"""The timeline's event loops compiled with Numba, for sweeps: `events.simulate` (one plan, one draw) and
`streams.simulate_rows` (every (plan, draw) row of a sweep chunk's interval draws).

A sweep schedules thousands of plans one draw each, where the compiled loop (~50 µs a layer) beats the
plain one (~2 ms), and some hundred thousand (plan, draw) rows for its intervals, where the compiled rows
loop (~2.5 µs a row) beats lockstep's NumPy (~20 µs); a single command does not, since importing Numba and
loading its cached code cost ~0.7 s, so `step` and `layer` never import this module. `run.py_func` is
`events.run` and `simulate_rows.py_func` is `streams.simulate_rows`, the pure-Python originals (STYLE
item 14); their helpers are registered as jitable so the compiled loops call compiled helpers while
Python callers keep the plain functions.
"""

from __future__ import annotations

from numba import njit
from numba.extending import register_jitable

from simulator.cost import events, streams
from simulator.cost.timeline import Makespan

for _helper in (events._all_ended, events._prefetch_time, events._settle, events._try_start, streams._run,
                streams._reset, streams._inputs_end, streams._waits_end, streams._start, streams._start_prefetch):
    register_jitable(_helper)
# what a row runs at every event is compiled into `_run`: a compiled call takes a reference on each array it
# is passed (an atomic add and subtract), ~40 % of the rows loop when these were calls (a 27-kernel layer
# ~2.2 µs a row inlined, ~3 with only the passes inlined, ~4.3 with none); the helpers above run when a
# kernel starts and stay calls (inlining them too doubles the compile, ~5 -> ~12 s once, for nothing)
for _helper in (streams._done, streams._settle, streams._finish, streams._stop_prefetches, streams._start_streams,
                streams._advance, streams._demand):
    register_jitable(inline="always")(_helper)

run = njit(cache=True, _nrt=False)(events.run)  # without NRT, as `simulate_rows` below: the loop passes ~24
# arrays to its helpers at every kernel it looks at, and each costs an atomic pair (~2x the loop on a Xeon VM)


def simulate(*arrays):
    """`events.simulate`, its events run by the compiled loop (sweeps price thousands of plans one at a time)."""
    return events.simulate(*arrays, loop=run)


# without Numba's reference counts (NRT): every array a helper is passed, or a record view is taken of, costs
# an atomic increment and decrement, and on a 2-vCPU Xeon VM those `lock inc/dec` were ~70 % of the
# rows loop under `perf` (a 27-kernel layer ~11 µs a row with them, ~4 without). The loop allocates nothing
# (`streams.simulate_plans` passes its scratch), which is what running without NRT requires.
simulate_rows = njit(cache=True, _nrt=False)(streams.simulate_rows)


def simulate_plans(plans: list[tuple], gap_dep, gap_pdl, capacity) -> list[tuple]:
    """`lockstep.simulate_plans`, every row run by the compiled rows loop (`uncertainty.schedule_plans`)."""
    return streams.simulate_plans(plans, gap_dep, gap_pdl, capacity, simulate_rows)


makespan_us = Makespan(simulate, simulate_plans)  # what sweeps and the calibration fit price with, draws included
