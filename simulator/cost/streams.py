"""The timeline's event loop over many (plan, draw) rows, one row at a time, on a state per stream.

The rules are the timeline module docstring's and the event loop events' (the one description of them, shared with
`events` and `lockstep`), in the formulation `lockstep` vectorises: a stream runs its kernels in order, so it has
one *current* kernel (the first not ended: waiting or running) and at most one more of interest, the kernel after it
loading early while the current one runs. A row's state is therefore a record per stream (S = 1-3), not per kernel,
and an event costs O(S) work instead of events' O(n) scans. Settling at one `now` takes the passes A, B, C, repeated
while a start leaves something with nothing to do (it ends in the next pass, as in events). A and B touch one stream
at a time, and so does C: a start depends on other streams only through ends, which only A records.

`simulate_rows` is plain Python; `fastsim.simulate_rows` is it compiled with Numba (its `.py_func`, STYLE
item 14), what sweeps schedule their interval draws with. The state lives in structured arrays (`KERNEL`,
`ROW`, `STREAM`), not in a tuple of arrays each: a compiled call takes a reference on every array it is
passed (an atomic add and subtract) and the helpers here run several times an event, so four arrays
instead of some thirty took a row from ~65 to ~4 µs (`fastsim` compiles what runs at every event into
`_run`: ~2.2 µs).
Napkin (2-core Zen 4, one core, compiled): a 27-kernel layer has ~80 events x ~3 streams, a few hundred
scalar steps, ~2-3 µs a row, against ~20 µs a row for lockstep's NumPy (all call overhead: ~80 iterations
of a few dozen array operations over the rows). Plain Python (~2 ms a row) is for tests: a single command
keeps lockstep, which loads no compiler (~0.7 s).

Floating point: as events' docstring says, every time and byte count is events' expression in events'
order (the shared demand summed in kernel order), so the schedule is the same to the bit.

Dimension legend: N draws, n kernels (all plans side by side), w cross-stream waits per kernel (padded),
S streams of a plan.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import numpy.typing as npt

from simulator.cost.lockstep import EPS, chains_side_by_side, check_chains

Array = npt.NDArray[np.float64]

# a kernel's layout, the same in every draw: its predecessor and successor on its stream (-1: none), the bytes
# it may load early behind its predecessor, and whether it may
KERNEL = np.dtype([("pred", np.int64), ("succ", np.int64), ("can_pf", np.float64), ("may_pf", np.bool_)], align=True)
TERMS = ("gap_pred", "fixed", "math", "comm", "nbytes", "bw")  # events.simulate's per-kernel arrays
RESULTS = ("start", "end", "pf_start", "pf_end", "pf_bytes")  # and what it returns; -1: not yet, or never
ROW = np.dtype([(name, np.float64) for name in TERMS + RESULTS], align=True)  # a kernel in one draw
# a stream: its current kernel (-1: done) and whether it runs; when it may start (inf while an input runs); its
# phase (0 fixed, 1 work, 2 comm, 3 none) and their lengths (the last: inf); what is left of the phase; the B/µs
# its work phase asks for alone, and asks now; whether the kernel after it may still prefetch, and when; that
# prefetch running, what is left of it (µs at full speed), and its B/µs
STREAM = np.dtype([("cur", np.int64), ("started", np.bool_), ("ready", np.float64), ("phase", np.int64),
                   ("lengths", np.float64, (4,)), ("rem", np.float64), ("dem", np.float64), ("ask", np.float64),
                   ("pending", np.bool_), ("t_pf", np.float64), ("pf_on", np.bool_), ("pf_rem", np.float64),
                   ("pf_ask", np.float64)], align=True)


def simulate_plans(plans: list[tuple], gap_dep: Array, gap_pdl: Array, capacity: Array,
                   loop: Callable | None = None) -> list[tuple]:
    """`lockstep.simulate_plans`'s arguments and result, each (plan, draw) row run alone by `loop`
    (`simulate_rows`, or `fastsim.simulate_rows`, the same compiled)."""
    pred, deps, can_pf, firsts = chains_side_by_side(plans)
    check_chains(pred)
    rows = np.empty((np.shape(plans[0][2])[0], len(pred)), dtype=ROW)  # [N, n]
    for plan, a, b in zip(plans, firsts[:-1], firsts[1:]):  # each plan's draws straight into its columns
        block = rows[:, a:b]
        for name, x in zip(TERMS, plan[2:8]):
            block[name] = x
    for name in RESULTS:
        rows[name] = 0.0 if name == "pf_bytes" else -1.0
    scalars = (np.ascontiguousarray(x, dtype=np.float64) for x in (gap_dep, gap_pdl, capacity))
    kernels = kernel_table(pred, can_pf)
    heads, st = np.empty(len(kernels), dtype=np.int64), np.zeros(len(kernels), dtype=STREAM)  # room for every
    # stream a plan may have; made here, so the compiled loop allocates nothing (fastsim: it runs without NRT)
    (loop or simulate_rows)(kernels, deps, firsts, rows, *scalars, heads, st)
    return [tuple(rows[name][:, a:b] for name in RESULTS) for a, b in zip(firsts[:-1], firsts[1:])]


def kernel_table(pred, can_pf) -> np.ndarray:
    """[n] KERNEL records: the plans' same-stream chains both ways, and who may prefetch."""
    kernels = np.zeros(len(pred), dtype=KERNEL)
    kernels["pred"], kernels["succ"], kernels["can_pf"] = pred, -1, can_pf
    kernels["succ"][pred[pred >= 0]] = np.nonzero(pred >= 0)[0]
    kernels["may_pf"] = (pred >= 0) & (can_pf > 0.0)
    return kernels


def simulate_rows(kernels, deps, firsts, rows, gap_dep, gap_pdl, capacity, heads, st) -> None:
    """Every (plan, draw) row to its end, results written into `rows` [N, n] (ROW records). Plans lie side
    by side (`lockstep.chains_side_by_side`): plan p's kernels are firsts[p] .. firsts[p + 1] - 1, indices
    global; deps [n, w] (-1 padded); gap_dep, gap_pdl, capacity [N], each draw's; heads [n] and st [n]
    (STREAM records) scratch, room for every stream a plan may have."""
    for p in range(len(firsts) - 1):
        streams = 0
        for k in range(firsts[p], firsts[p + 1]):
            if kernels[k]["pred"] < 0:
                heads[streams] = k
                streams += 1
        for d in range(rows.shape[0]):
            _run(kernels, deps, rows[d], heads[:streams], st[:streams], gap_dep[d], gap_pdl[d], capacity[d],
                 firsts[p + 1] - firsts[p])


def _run(kernels, deps, row, heads, st, gap_dep: float, gap_pdl: float, capacity: float, n: int) -> None:
    """One row from its streams' first kernels to its last end: settle what happens at `now`, jump to the
    next event; at most 20 n + 20 events, as events allows."""
    for s in range(len(st)):
        _reset(st[s], heads[s])
    now = 0.0
    for _ in range(20 * n + 20):
        _settle(kernels, deps, row, st, gap_dep, gap_pdl, now)
        if _done(st):
            return
        now += _advance(kernels, st, capacity, now)
    raise RuntimeError("timeline did not converge")


def _reset(x, head: int) -> None:
    """A stream before the row: its first kernel waiting, nothing running or prefetching."""
    x["cur"], x["started"], x["ready"], x["phase"], x["lengths"][3] = head, False, np.inf, 3, np.inf
    x["rem"], x["dem"], x["ask"], x["pending"], x["t_pf"] = np.inf, 0.0, 0.0, False, np.inf
    x["pf_on"], x["pf_rem"], x["pf_ask"] = False, np.inf, 0.0


def _done(st) -> bool:
    for s in range(len(st)):
        if st[s]["cur"] >= 0:
            return False
    return True


# -- settling what happens at `now` -------------------------------------------------------------------

def _settle(kernels, deps, row, st, gap_dep: float, gap_pdl: float, now: float) -> None:
    """events._settle: passes of (A) finish phases, (B) stop prefetches, (C) start, until C leaves nothing
    that ends at once."""
    again = True
    while again:
        _finish(kernels, row, st, now)
        _stop_prefetches(kernels, row, st, now)
        again = _start_streams(kernels, deps, row, st, gap_dep, gap_pdl, now)


def _finish(kernels, row, st, now: float) -> None:
    """Phases that ran out give way to the next with something left; a kernel with none left ends, and the
    next on its stream becomes current (a prefetch of it not begun by now never will)."""
    for s in range(len(st)):
        x = st[s]
        while x["rem"] <= EPS:
            x["phase"] += 1
            x["rem"] = x["lengths"][x["phase"]]
            x["ask"] = x["dem"] if x["phase"] == 1 else 0.0
        if x["started"] and x["phase"] == 3:
            row[x["cur"]]["end"] = now
            x["cur"], x["started"], x["pending"], x["t_pf"] = kernels[x["cur"]]["succ"], False, False, np.inf


def _stop_prefetches(kernels, row, st, now: float) -> None:
    """A prefetch stops when its bytes are in or its predecessor ended (it is then the current kernel); what
    it did not load is taken off its bytes."""
    for s in range(len(st)):
        x = st[s]
        if x["pf_on"] and (x["pf_rem"] <= EPS or not x["started"]):
            r = row[kernels[x["cur"]]["succ"] if x["started"] else x["cur"]]
            r["pf_bytes"] -= max(0.0, x["pf_rem"]) * r["bw"]
            r["pf_end"] = now
            x["pf_on"], x["pf_rem"], x["pf_ask"] = False, np.inf, 0.0


def _start_streams(kernels, deps, row, st, gap_dep: float, gap_pdl: float, now: float) -> bool:
    """Start each current kernel once its inputs are in (+ gaps), then the next one's prefetch once due. True
    if one of them has nothing to do: it ends, or stops, in the next pass."""
    again, soon = False, now + EPS
    for s in range(len(st)):
        x = st[s]
        if x["cur"] >= 0 and not x["started"]:
            if x["ready"] == np.inf:
                x["ready"] = _inputs_end(kernels, deps, row, x["cur"], gap_dep)
            if x["ready"] <= soon:
                again |= _start(kernels, row, x)
        if x["pending"]:
            if x["t_pf"] == np.inf:
                after = kernels[x["cur"]]["succ"]
                x["t_pf"] = max(row[x["cur"]]["start"] + gap_pdl, _waits_end(deps, row, after, gap_dep))
            if x["t_pf"] <= soon:
                again |= _start_prefetch(kernels, row, x, now)
    return again


def _inputs_end(kernels, deps, row, k: int, gap_dep: float) -> float:
    """When kernel k may start: its predecessor's end + its own gap (the gap alone for a stream's first),
    each wait's end + the event gap; inf while an input runs."""
    p = kernels[k]["pred"]
    if p < 0:
        return max(row[k]["gap_pred"], _waits_end(deps, row, k, gap_dep))
    if row[p]["end"] < 0.0:
        return np.inf
    return max(row[p]["end"] + row[k]["gap_pred"], _waits_end(deps, row, k, gap_dep))


def _waits_end(deps, row, k: int, gap_dep: float) -> float:
    """Latest end + event gap over kernel k's cross-stream waits (-inf: none; inf while one runs)."""
    t = -np.inf
    for j in range(deps.shape[1]):
        d = deps[k, j]
        if d >= 0:
            if row[d]["end"] < 0.0:
                return np.inf
            t = max(t, row[d]["end"] + gap_dep)
    return t


def _start(kernels, row, x) -> bool:
    """events._try_start's start: phase lengths from the bytes not prefetched. True if it has nothing to do."""
    r = row[x["cur"]]
    r["start"] = x["ready"]
    x["started"], x["ready"] = True, np.inf
    left = max(0.0, r["nbytes"] - (r["pf_bytes"] if r["pf_start"] >= 0.0 else 0.0))
    work = max(left / r["bw"], r["math"])
    x["lengths"][0], x["lengths"][1], x["lengths"][2] = r["fixed"], work, r["comm"]
    x["dem"] = left / work if work > 0.0 else 0.0
    first = 0
    while first < 3 and x["lengths"][first] <= EPS:
        first += 1
    x["phase"], x["rem"], x["ask"] = first, x["lengths"][first], x["dem"] if first == 1 else 0.0
    after = kernels[x["cur"]]["succ"]
    x["pending"] = after >= 0 and kernels[after]["may_pf"]
    return first == 3


def _start_prefetch(kernels, row, x, now: float) -> bool:
    """Begin loading the next kernel's bytes at its solo bandwidth; True if there is nothing to load."""
    k = kernels[x["cur"]]["succ"]
    r = row[k]
    x["pf_on"], x["pf_rem"], x["pf_ask"] = True, kernels[k]["can_pf"] / r["bw"], r["bw"]
    x["pending"], x["t_pf"] = False, np.inf
    r["pf_bytes"], r["pf_start"] = kernels[k]["can_pf"], now
    return x["pf_rem"] <= EPS


# -- advancing to the next event ----------------------------------------------------------------------

def _advance(kernels, st, capacity: float, now: float) -> float:
    """events.simulate's step: HBM shared in proportion to what each work phase and prefetch asks (all at
    `scale` of their own rate when the sum exceeds capacity); move every phase to the next event, return dt."""
    demand = _demand(kernels, st)
    scale = min(1.0, capacity / demand) if demand > 0.0 else 1.0
    dt = np.inf
    for s in range(len(st)):
        x = st[s]
        rate = scale if x["ask"] > 0.0 else 1.0
        dt = min(dt, x["rem"] / rate, x["pf_rem"] / scale, x["ready"] - now, x["t_pf"] - now)
    if dt == np.inf:
        raise RuntimeError("timeline did not converge")
    for s in range(len(st)):
        x = st[s]
        x["rem"] -= dt * (scale if x["ask"] > 0.0 else 1.0)
        x["pf_rem"] -= dt * scale
    return dt


def _demand(kernels, st) -> float:
    """B/µs asked of HBM, summed in kernel order as events sums it (three or more terms: the order shows in
    the last bit): the asks of running kernels and of prefetches (the kernels after them), smallest index first."""
    total, after = 0.0, -1
    while True:
        k, ask = -1, 0.0
        for s in range(len(st)):
            x = st[s]
            if x["ask"] > 0.0 and after < x["cur"] and (k < 0 or x["cur"] < k):
                k, ask = x["cur"], x["ask"]
            if x["pf_ask"] > 0.0:
                nxt = kernels[x["cur"]]["succ"]
                if after < nxt and (k < 0 or nxt < k):
                    k, ask = nxt, x["pf_ask"]
        if k < 0:
            return total
        total += ask
        after = k
