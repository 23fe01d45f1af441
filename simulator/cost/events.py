"""The timeline's event loop, one draw, in plain Python, on the arrays cost/layout.py lays a plan out as.

The event loop: how the rules of the timeline module docstring run, the one description of the four schedulers.
`events.run` is it in plain Python (one draw; what `layer` and `step` price with), `fastsim` compiles that same
function (sweeps), `lockstep.simulate_plans` runs it in NumPy over many (plan, draw) rows at once,
`streams.simulate_rows` one row at a time on a record per stream (compiled by `fastsim` for a sweep's draws).
tests/test_lockstep.py holds all of them equal on random plans and draws, to the bit.
- State per kernel: its ready time (known once its predecessor and its waits have ended), start, end, phase
  (fixed -> work -> comm) and the time left in it; its prefetch (on or off, the bytes loaded, start and end).
- Settle at `now`, kernels in index order, passes repeated until one changes nothing (a kernel waits only on
  earlier kernels, so index order reaches the fixed point): (A) a started kernel whose phase has no time left
  (<= EPS) moves on to the next, and after comm it ends at `now`; (B) a prefetch stops when its bytes are
  loaded or its predecessor has ended, and keeps what it loaded; (C) a kernel whose same-stream predecessor
  has started starts once its ready time is <= now + EPS, its work phase max(bytes not prefetched / bw, math)
  long; otherwise it starts prefetching once its waits have ended and start_pred + gap_pdl <= now + EPS.
- Advance: the bandwidth demand of every work phase and prefetch in flight, summed in kernel order, sets the
  scale min(1, C / demand) they all progress at (fixed and comm phases progress at rate 1); `now` moves to the
  earliest of a phase or prefetch running out, a ready time, or a prefetch start later than now + EPS.
- Times within EPS = 1e-9 µs are one event; "not yet" is a negative time (NaN in lockstep's arrays). Each time
  and byte count is the same expression, summed in the same order, in every form: that is why they agree.

`timeline.schedule` and `makespan_us` run it for a central value (a layer's ~70 events in ~2 ms), so
`step` and `layer` run no compiled code (loading Numba's cached code cost ~0.75 s of a cold command).
`fastsim.simulate` is this loop compiled with Numba for sweeps (`fastsim.run.py_func` is `run` here, STYLE
item 14).

Arrays, one entry per kernel (n kernels, µs and bytes):
    pred[n]        same-stream predecessor (-1: none)        deps[n, d]  cross-stream waits (-1 padded)
    gap_pred[n]    launch gap after the predecessor (PDL-dependent)
    fixed, math, comm[n]   phase lengths alone (µs)          nbytes, bw[n]  bytes and solo bandwidth (B/µs)
    can_pf[n]      bytes it may load early behind its predecessor (0: none)
Scalars: gap_dep (gap after a cross-stream event), gap_pdl, capacity (shared HBM B/µs).
"""

from __future__ import annotations

import numpy as np

EPS = 1e-9


def simulate(pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf, gap_dep, gap_pdl, capacity, loop=None):
    """The schedule: (start, end, pf_start, pf_end, pf_bytes) [n] each. The state is made here and the events
    run in `loop` (`run`, or `fastsim.run`: the same compiled, which then allocates nothing and runs without
    Numba's reference counts)."""
    n = pred.shape[0]
    start = np.full(n, -1.0)
    end = np.full(n, -1.0)
    ready = np.full(n, -1.0)
    phase = np.zeros(n, dtype=np.int64)  # 0 fixed, 1 work, 2 comm, 3 done (valid once started)
    rem = np.zeros((n, 3))
    dem = np.zeros((n, 3))
    pf_on = np.zeros(n, dtype=np.bool_)
    pf_rem = np.zeros(n)
    pf_rate = np.zeros(n)
    pf_bytes = np.zeros(n)
    pf_start = np.full(n, -1.0)
    pf_end = np.full(n, -1.0)
    (loop or run)(pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf, gap_dep, gap_pdl, capacity,
                  start, end, ready, phase, rem, dem, pf_on, pf_rem, pf_rate, pf_bytes, pf_start, pf_end)
    return start, end, pf_start, pf_end, pf_bytes


def run(pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf, gap_dep, gap_pdl, capacity,  # noqa: C901
        start, end, ready, phase, rem, dem, pf_on, pf_rem, pf_rate, pf_bytes, pf_start, pf_end):
    """The events from time 0 until every kernel ended, on the state `simulate` made."""
    n = pred.shape[0]
    now = 0.0
    for _ in range(20 * n + 20):
        _settle(now, pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf, gap_dep, gap_pdl,
                start, end, ready, phase, rem, dem, pf_on, pf_rem, pf_rate, pf_bytes, pf_start, pf_end)
        if _all_ended(end):
            return
        demand = 0.0
        for i in range(n):
            if start[i] >= 0.0 and end[i] < 0.0 and phase[i] < 3:
                demand += dem[i, phase[i]]
            if pf_on[i]:
                demand += pf_rate[i]
        scale = min(1.0, capacity / demand) if demand > 0.0 else 1.0
        dt = -1.0
        for i in range(n):
            if start[i] >= 0.0 and end[i] < 0.0 and phase[i] < 3:
                s = scale if dem[i, phase[i]] > 0.0 else 1.0
                t = rem[i, phase[i]] / s
                dt = t if dt < 0.0 or t < dt else dt
            if pf_on[i]:
                t = pf_rem[i] / scale
                dt = t if dt < 0.0 or t < dt else dt
            if start[i] < 0.0 and (pred[i] < 0 or start[pred[i]] >= 0.0):
                for t_abs in (ready[i], _prefetch_time(i, pred, deps, can_pf, gap_dep, gap_pdl, start, end, pf_start)):
                    if t_abs >= 0.0 and t_abs > now + EPS:
                        dt = t_abs - now if dt < 0.0 or t_abs - now < dt else dt
        if dt < 0.0:
            break
        for i in range(n):
            if start[i] >= 0.0 and end[i] < 0.0 and phase[i] < 3:
                rem[i, phase[i]] -= dt * (scale if dem[i, phase[i]] > 0.0 else 1.0)
            if pf_on[i]:
                pf_rem[i] -= dt * scale
        now += dt
    raise RuntimeError("timeline did not converge")


def _all_ended(end):
    for i in range(end.shape[0]):
        if end[i] < 0.0:
            return False
    return True


def _prefetch_time(i, pred, deps, can_pf, gap_dep, gap_pdl, start, end, pf_start):
    """When kernel i may begin loading early, or -1 when it may not (now or ever)."""
    p = pred[i]
    if pf_start[i] >= 0.0 or can_pf[i] <= 0.0 or p < 0 or start[p] < 0.0 or end[p] >= 0.0:
        return -1.0
    t = start[p] + gap_pdl
    for j in range(deps.shape[1]):
        d = deps[i, j]
        if d >= 0:
            if end[d] < 0.0:
                return -1.0
            t = max(t, end[d] + gap_dep)
    return t


def _settle(now, pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf, gap_dep, gap_pdl,
            start, end, ready, phase, rem, dem, pf_on, pf_rem, pf_rate, pf_bytes, pf_start, pf_end):
    n = pred.shape[0]
    changed = True
    while changed:
        changed = False
        for i in range(n):
            if end[i] >= 0.0 or (pred[i] >= 0 and start[pred[i]] < 0.0):
                continue
            if start[i] >= 0.0:  # finish phases that ran out
                while phase[i] < 3 and rem[i, phase[i]] <= EPS:
                    phase[i] += 1
                if phase[i] == 3:
                    end[i] = now
                    changed = True
            if pf_on[i] and (pf_rem[i] <= EPS or end[pred[i]] >= 0.0):  # stop prefetch
                pf_bytes[i] -= max(0.0, pf_rem[i]) * pf_rate[i]
                pf_on[i] = False
                pf_end[i] = now
                changed = True
            if start[i] < 0.0:
                changed |= _try_start(i, now, pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf, gap_dep,
                                      gap_pdl, start, end, ready, phase, rem, dem, pf_on, pf_rem, pf_rate, pf_bytes,
                                      pf_start)


def _try_start(i, now, pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf, gap_dep, gap_pdl,
               start, end, ready, phase, rem, dem, pf_on, pf_rem, pf_rate, pf_bytes, pf_start):
    if ready[i] < 0.0:
        t = 0.0
        ok = True
        p = pred[i]
        if p >= 0:
            ok = end[p] >= 0.0
            t = end[p] + gap_pred[i]
        else:
            t = gap_pred[i]
        for j in range(deps.shape[1]):
            d = deps[i, j]
            if d >= 0:
                ok = ok and end[d] >= 0.0
                t = max(t, end[d] + gap_dep)
        if ok:
            ready[i] = t
    if ready[i] >= 0.0 and ready[i] <= now + EPS:
        start[i] = ready[i]
        left = max(0.0, nbytes[i] - (pf_bytes[i] if pf_start[i] >= 0.0 else 0.0))
        work = max(left / bw[i], math[i])
        rem[i, 0], rem[i, 1], rem[i, 2] = fixed[i], work, comm[i]
        dem[i, 1] = left / work if work > 0.0 else 0.0
        phase[i] = 0
        while phase[i] < 3 and rem[i, phase[i]] <= EPS:
            phase[i] += 1
        return True
    t_pf = _prefetch_time(i, pred, deps, can_pf, gap_dep, gap_pdl, start, end, pf_start)
    if t_pf < 0.0 or t_pf > now + EPS:
        return False
    pf_on[i] = True
    pf_rate[i] = bw[i]
    pf_bytes[i] = can_pf[i]
    pf_rem[i] = can_pf[i] / bw[i]
    pf_start[i] = now
    return True
