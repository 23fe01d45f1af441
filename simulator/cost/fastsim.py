"""The timeline's event loop (`events.simulate`) compiled with Numba, for sweeps.

A sweep schedules thousands of plans one draw each, where the compiled loop (~50 µs a layer) beats the
plain one (~2 ms); a single command does not, since importing Numba and loading its cached code cost
~0.7 s, so `step` and `layer` never import this module. `simulate.py_func` is `events.simulate`, the
pure-Python original (STYLE item 14); its helpers are registered as jitable so the compiled loop calls
compiled helpers while Python callers keep the plain functions.
"""

from __future__ import annotations

from numba import njit
from numba.extending import register_jitable

from simulator.cost import events
from simulator.cost.timeline import Makespan

for _helper in (events._prefetch_time, events._settle, events._try_start):
    register_jitable(_helper)

simulate = njit(cache=True)(events.simulate)
makespan_us = Makespan(simulate)  # what sweeps and the calibration fit price with (estimate_step caches it)
