"""The timeline's event loop in NumPy, vectorised over draws: every draw of a plan advances in lockstep.

The rules are the timeline module docstring's and the event loop events' (the one description of them, shared
with `events` and `streams`). What differs is the axis. A plan's structure (`pred`, `deps`, bytes, prefetch
targets) is the same in every draw of the uncertainty sample; only phase lengths and scalars vary. So one loop
runs all N draws at once, and several plans side by side (`simulate_plans`: a row per (plan, draw)): each
iteration every row settles what happens at its own `now`, then jumps to its own next event; a finished row
stands still, and finished rows are dropped.

A stream runs its kernels in order (`pred` is the previous kernel on the same stream), so at any moment
a stream has one kernel of interest, its *current* one (the first not ended: waiting or running), and at
most one more, the kernel after it loading early while the current one runs. The state is therefore
[S, R] (S streams, 1-3; R rows), not [R, n]: an iteration is a few dozen array operations, and the loop
runs as many iterations as the longest plan has events (~3 per kernel, ~80 for a 27-kernel layer), however
many rows. Napkin (2 cores, shared, CPU): a 23-kernel layer under 400 draws ~20 ms, against ~60 ms for the
compiled loop one draw at a time (~0.14 ms a draw) and ~2 s for the plain one; a step's ten plans under 400
draws ~0.1 s in one loop. One draw takes ~13 ms, all overhead: a central value runs `events.simulate`
(~2-5 ms) instead, and `fastsim.simulate` stays for sweeps, which schedule thousands of plans one draw
each. Sweeps schedule their draws with `fastsim.simulate_plans` too: the same formulation one row at a time
(`streams`), compiled, ~3 µs a row against ~20 here, once Numba is loaded (~0.7 s), which a single command
does not pay for. tests/test_lockstep.py holds this loop to `events.simulate` on random plans and draws.

Settling at one `now` takes the event loop's passes A, B, C (events' docstring) over the [S, R] state, C repeated so
that a kernel sees what an earlier one started in the same pass, as index order does. "Not yet" is NaN (comparisons
with it are false, and max propagates it: "not all inputs ended").

Dimension legend: N draws, n kernels, S streams, w cross-stream waits per kernel (padded).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
EPS = 1e-9  # events.EPS: events closer than this are one event


def simulate(pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf, gap_dep, gap_pdl, capacity):
    """One draw, `events.simulate`'s signature and result: (start, end, pf_start, pf_end, pf_bytes) [n]."""
    scalars = (np.array([x], dtype=np.float64) for x in (gap_dep, gap_pdl, capacity))
    out = simulate_draws(pred, deps, gap_pred[None], fixed[None], math[None], comm[None], nbytes, bw[None], can_pf,
                         *scalars)
    return tuple(x[0] for x in out)


def simulate_draws(pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf, gap_dep, gap_pdl, capacity
                   ) -> tuple[Array, Array, Array, Array, Array]:
    """N draws of one plan: per-kernel arrays [N, n] (`nbytes`, `can_pf`: [n], the same in every draw),
    scalars [N]. Returns (start, end, pf_start, pf_end, pf_bytes) [N, n]; -1 for a prefetch that never ran."""
    return simulate_plans([(pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf)], gap_dep, gap_pdl,
                          capacity)[0]


def simulate_plans(plans: list[tuple], gap_dep: Array, gap_pdl: Array, capacity: Array) -> list[tuple]:
    """`simulate_draws` for several plans under the same N draws of the GPU's scalars, in one loop: each
    (plan, draw) pair is a row, so the loop runs as many iterations as the longest plan has events, not
    their sum (a step's four plans, or the published figures' ten, cost about one)."""
    s = _Streams(side_by_side(plans), gap_dep, gap_pdl, capacity)
    with np.errstate(divide="ignore", invalid="ignore"):  # inf and NaN stand for "not applicable"
        for _ in range(20 * max(len(p[0]) for p in plans) + 20):
            s.settle()
            if not s.open.any():
                return s.result([len(p[0]) for p in plans])
            s.advance()
    raise RuntimeError("timeline did not converge")


def side_by_side(plans: list[tuple]) -> tuple:
    """The plans side by side as one plan of disjoint streams: kernel indices offset, waits padded to one
    width; (pred [n], deps [n, w], per-draw arrays [N, n] x 6, can_pf [n], first kernel of each plan)."""
    pred, deps, can_pf, firsts = chains_side_by_side(plans)
    n_draws = np.shape(plans[0][2])[0]
    cols = [np.concatenate([np.broadcast_to(np.asarray(p[j], dtype=np.float64), (n_draws, len(p[0]))) for p in plans],
                           axis=1) for j in (2, 3, 4, 5, 6, 7)]
    return pred, deps, *cols, can_pf, firsts


def chains_side_by_side(plans: list[tuple]) -> tuple:
    """What of `side_by_side` no draw changes: (pred [n], deps [n, w], can_pf [n], first kernel of each plan
    and n after the last [P + 1])."""
    width = max(np.asarray(p[1]).reshape(len(p[0]), -1).shape[1] for p in plans)
    preds, deps, offset, firsts = [], [], 0, []
    for p in plans:
        n = len(p[0])
        pred, dep = np.asarray(p[0]), np.asarray(p[1]).reshape(n, -1)
        preds.append(np.where(pred >= 0, pred + offset, -1))
        dep = np.where(dep >= 0, dep + offset, -1)
        deps.append(np.hstack([dep, np.full((n, width - dep.shape[1]), -1)]))
        firsts.append(offset)
        offset += n
    can_pf = np.concatenate([np.asarray(p[8], dtype=np.float64) for p in plans])
    return np.concatenate(preds), np.vstack(deps), can_pf, np.array(firsts + [offset])


def check_chains(pred) -> None:
    """A stream's kernels come in order, each after the one before it (`pred`), so a stream has one current
    kernel at a time; refuse a plan laid out otherwise."""
    n = len(pred)
    if np.any(pred >= np.arange(n)) or np.any(np.bincount(pred[pred >= 0], minlength=n) > 1):
        raise ValueError("pred must chain each stream's kernels in order (layout.plan_arrays lays plans out so)")


def _pad(x, width: int, fill: float = 0.0) -> Array:
    """Per-kernel values [N, n] with sentinel columns (n: no kernel, n + 1: no predecessor, n + 2: no wait)."""
    return np.pad(x, [(0, 0), (0, width - x.shape[-1])], constant_values=fill)


class _Streams:
    """The loop's state. A row is one (plan, draw) pair. Per kernel [N, n + 3] (read and written at flat
    offsets draw x (n + 3) + kernel): start, end and prefetch records, and the phase lengths alone; columns
    n (no kernel), n + 1 (the predecessor of a stream's first kernel: started and ended at 0) and n + 2
    (padding of `deps`: ended at -inf, never the latest) are sentinels. Per stream [S, R] (streams first, so
    that reductions over streams run along rows: numpy's fast axis): the current kernel `cur` and its
    state, and the prefetch of the kernel after it. A time that does not apply (what is left of the phase
    of a stream with nothing running, the ready time of a kernel whose inputs still run) is +inf, so the
    next event is a plain minimum."""

    ROW_STATE = ("cur", "started", "ready", "phase", "lengths", "rem", "dem", "ask", "pending", "t_pf", "pf_on",
                 "pf_rem", "pf_ask", "now", "base", "gap_dep", "gap_pdl", "capacity")

    def __init__(self, plan: tuple, gap_dep: Array, gap_pdl: Array, capacity: Array):
        pred, deps, gap_pred, fixed, math, comm, nbytes, bw, can_pf, firsts = plan
        self.n = n = len(pred)
        N, wide = gap_pred.shape[0], n + 3
        check_chains(pred)
        self.succ = np.full(wide, n)  # the next kernel on the same stream (n: none)
        self.succ[pred[pred >= 0]] = np.nonzero(pred >= 0)[0]
        self.pred = np.append(np.where(pred >= 0, pred, n + 1), [n, n, n])
        deps = np.where(deps >= 0, deps, n + 2) if deps.shape[1] else np.full((n, 1), n + 2)
        self.deps = np.vstack([deps, np.full((3, deps.shape[1]), n + 2)]).T.copy()  # [w, n + 3]
        self.may_pf = np.append((pred >= 0) & (can_pf > 0), [False] * 3)
        self.gap_pred, self.fixed, self.math, self.comm, self.nbytes = (
            _pad(x, wide) for x in (gap_pred, fixed, math, comm, nbytes))
        self.bw = _pad(bw, wide, 1.0)
        self.can_pf = np.append(can_pf, [0.0] * 3)
        # rows: plan p's draws are rows p N .. p N + N - 1; each starts at its plan's stream heads
        heads = [np.nonzero(pred[a:b] < 0)[0] + a for a, b in zip(firsts[:-1], firsts[1:])]
        S = max(len(h) for h in heads)
        self.cur = np.repeat(np.array([np.concatenate([h, np.full(S - len(h), n)]) for h in heads]).T, N, axis=1)
        R = self.cur.shape[1]  # [S, R]
        self.draw = np.tile(np.arange(N), len(heads))  # [R]
        self.base = self.draw * wide  # flat offset of each row's draw in a per-kernel array
        self.gap_dep, self.gap_pdl, self.capacity = gap_dep[self.draw], gap_pdl[self.draw], capacity[self.draw]
        self.start, self.end = np.full((N, wide), np.nan), np.full((N, wide), np.nan)
        self.start[:, n + 1] = self.end[:, n + 1] = 0.0
        self.end[:, n + 2] = -np.inf
        self.pf_start, self.pf_end = np.full((N, wide), np.nan), np.full((N, wide), np.nan)
        self.pf_bytes = np.zeros((N, wide))
        self.started = np.zeros((S, R), dtype=bool)
        self.ready = np.full((S, R), np.inf)
        self.phase = np.full((S, R), 3)  # 0 fixed, 1 work, 2 comm, 3 none (also: nothing running)
        self.lengths = np.full((4, S, R), np.inf)  # the running kernel's phase lengths; row 3: none
        self.rem = np.full((S, R), np.inf)  # what is left of the running phase
        self.dem = np.zeros((S, R))  # B/µs the running kernel's work phase asks for alone
        self.ask = np.zeros((S, R))  # dem while in the work phase, else 0
        self.pending = np.zeros((S, R), dtype=bool)  # the kernel after the running one may still prefetch
        self.t_pf = np.full((S, R), np.inf)  # when it may begin
        self.pf_on = np.zeros((S, R), dtype=bool)
        self.pf_rem = np.full((S, R), np.inf)
        self.pf_ask = np.zeros((S, R))
        self.now = np.zeros(R)
        self.open = np.ones(R, dtype=bool)

    # -- settling what happens at `now` ---------------------------------------------------------------

    def settle(self) -> None:
        """events._settle for every row: passes of (A) finish phases, (B) stop prefetches, (C) start."""
        again = True
        while again:
            self._finish_phases()
            self._stop_prefetches()
            again = self._start_closure()
        self.open = (self.cur < self.n).any(axis=0)

    def _finish_phases(self) -> None:
        """Phases that ran out give way to the next one with something left; a kernel with none left ends and
        its successor on the stream becomes current. (i: flat [S, R] offsets of the streams concerned.)"""
        i = np.flatnonzero(self.rem <= EPS)
        while i.size:
            phase = np.take(self.phase, i) + 1
            rem = np.take(self.lengths, phase * self.rem.size + i)  # row 3: inf, nothing left
            np.put(self.phase, i, phase)
            np.put(self.rem, i, rem)
            np.put(self.ask, i, np.where(phase == 1, np.take(self.dem, i), 0.0))
            i = i[rem <= EPS]
        i = np.flatnonzero(self.started & (self.phase == 3))
        if i.size:
            k = np.take(self.cur, i)
            r = i % self.now.size
            np.put(self.end, self.base[r] + k, self.now[r])
            np.put(self.cur, i, self.succ[k])
            np.put(self.started, i, False)
            np.put(self.pending, i, False)  # a prefetch not begun by now never will: its predecessor ended
            np.put(self.t_pf, i, np.inf)

    def _stop_prefetches(self) -> None:
        """A prefetch stops when its bytes are in or its predecessor ended (the successor became current)."""
        if not self.pf_on.any():
            return
        i = np.flatnonzero(self.pf_on & ((self.pf_rem <= EPS) | ~self.started))
        if i.size:
            cur, r = np.take(self.cur, i), i % self.now.size
            flat = self.base[r] + np.where(np.take(self.started, i), self.succ[cur], cur)
            np.put(self.pf_bytes, flat, np.take(self.pf_bytes, flat)
                   - np.maximum(0.0, np.take(self.pf_rem, i)) * np.take(self.bw, flat))
            np.put(self.pf_end, flat, self.now[r])
            np.put(self.pf_on, i, False)
            np.put(self.pf_rem, i, np.inf)
            np.put(self.pf_ask, i, 0.0)

    def _start_closure(self) -> bool:
        """Start kernels and prefetches until none more starts at `now`. True when another pass is due: a
        kernel with nothing to do ends, or a prefetch with nothing to load stops, in the next (events)."""
        again, soon = False, self.now + EPS
        while True:
            waiting = ~self.started & (self.cur < self.n)
            fresh = waiting & np.isinf(self.ready)
            if fresh.any():
                self._inputs_ready(np.flatnonzero(fresh))
            go = waiting & (self.ready <= soon)
            pf = None
            if self.pending.any():
                unknown = self.pending & np.isinf(self.t_pf)  # once known, a prefetch time stays put
                if unknown.any():
                    self._prefetch_time(np.flatnonzero(unknown))
                pf = self.pending & (self.t_pf <= soon)
            any_go, any_pf = go.any(), pf is not None and pf.any()
            if not (any_go or any_pf):
                return again
            if any_pf:
                again |= self._start_prefetch(np.flatnonzero(pf))
            if not any_go:
                return again  # a prefetch that began enables nothing else at this instant
            again |= self._start(np.flatnonzero(go))
            if not self.pending[go].any():
                return again  # only a kernel after one just started could now begin (prefetch at once)

    def _waits_end(self, r, k) -> Array:
        """Latest end + event gap over kernel k's cross-stream waits, per (row, kernel); NaN while one runs."""
        return (np.take(self.end, self.base[r] + self.deps[:, k]) + self.gap_dep[r]).max(axis=0)

    def _inputs_ready(self, i) -> None:
        """When each waiting current kernel may start: its predecessor's end + its gap, each wait's end +
        the event gap; left at inf while an input runs."""
        k, r = np.take(self.cur, i), i % self.now.size
        t = np.maximum(np.take(self.end, self.base[r] + self.pred[k]) + np.take(self.gap_pred, self.base[r] + k),
                       self._waits_end(r, k))
        np.put(self.ready, i, np.where(np.isnan(t), np.inf, t))

    def _start(self, i) -> bool:
        """events._try_start's start: phase lengths from the bytes not prefetched. True if one ends at once."""
        k, r = np.take(self.cur, i), i % self.now.size
        flat = self.base[r] + k
        np.put(self.start, flat, np.take(self.ready, i))
        np.put(self.started, i, True)
        np.put(self.ready, i, np.inf)
        prefetched = np.where(np.isnan(np.take(self.pf_start, flat)), 0.0, np.take(self.pf_bytes, flat))
        left = np.maximum(0.0, np.take(self.nbytes, flat) - prefetched)
        fixed, comm = np.take(self.fixed, flat), np.take(self.comm, flat)
        work = np.maximum(left / np.take(self.bw, flat), np.take(self.math, flat))
        dem = np.where(work > 0.0, left / work, 0.0)
        first = np.where(fixed > EPS, 0, np.where(work > EPS, 1, np.where(comm > EPS, 2, 3)))
        size = self.rem.size
        for phase, length in enumerate((fixed, work, comm)):
            np.put(self.lengths, phase * size + i, length)
        np.put(self.dem, i, dem)
        np.put(self.phase, i, first)
        np.put(self.rem, i, np.take(self.lengths, first * size + i))
        np.put(self.ask, i, np.where(first == 1, dem, 0.0))
        np.put(self.pending, i, self.may_pf[self.succ[k]])
        return bool((first == 3).any())

    def _prefetch_time(self, i) -> None:
        """events._prefetch_time for the kernel after each running one that may still prefetch: when it may
        begin loading early (inf until its waits have ended)."""
        k, r = np.take(self.cur, i), i % self.now.size
        t = np.maximum(np.take(self.start, self.base[r] + k) + self.gap_pdl[r], self._waits_end(r, self.succ[k]))
        np.put(self.t_pf, i, np.where(np.isnan(t), np.inf, t))

    def _start_prefetch(self, i) -> bool:
        """Begin loading early; True if a prefetch with nothing to load must stop in another pass."""
        k, r = self.succ[np.take(self.cur, i)], i % self.now.size
        flat = self.base[r] + k
        bw = np.take(self.bw, flat)
        rem = self.can_pf[k] / bw
        np.put(self.pf_on, i, True)
        np.put(self.pf_rem, i, rem)
        np.put(self.pf_ask, i, bw)
        np.put(self.pf_bytes, flat, self.can_pf[k])
        np.put(self.pf_start, flat, self.now[r])
        np.put(self.pending, i, False)
        np.put(self.t_pf, i, np.inf)
        return bool((rem <= EPS).any())

    # -- advancing to the next event ------------------------------------------------------------------

    def advance(self) -> None:
        """events.simulate's step: share bandwidth, find each row's next event, move every phase to it."""
        scale = np.minimum(1.0, self.capacity / self._demand())  # [R]; no demand: 1
        rate = np.where(self.ask > 0.0, scale, 1.0)
        later = np.minimum(np.minimum(self.rem / rate, self.pf_rem / scale),
                           np.minimum(self.ready - self.now, self.t_pf - self.now))
        dt = later.min(axis=0)  # [R]
        stuck = np.isinf(dt)
        if stuck.any():
            if (stuck & self.open).any():
                raise RuntimeError("timeline did not converge")
            dt = np.where(self.open, dt, 0.0)
        self.rem -= dt * rate
        self.pf_rem -= dt * scale
        self.now = self.now + dt
        if self.open.sum() < 0.7 * self.open.size:
            self._keep(self.open)

    def _demand(self) -> Array:
        """[R] bytes/µs asked of HBM: work phases and prefetches. A sum of up to two asks is exact in any
        order; more are summed in kernel order, as events sums them (so the two agree to the bit)."""
        asks = np.concatenate([self.ask, self.pf_ask])  # [2S, R]
        if len(asks) > 2 and (np.count_nonzero(asks, axis=0) > 2).any():
            index = np.concatenate([self.cur, self.succ[self.cur]])
            return np.cumsum(np.take_along_axis(asks, np.argsort(index, axis=0, kind="stable"), axis=0), axis=0)[-1]
        return asks.sum(axis=0)

    def _keep(self, rows) -> None:
        """Drop finished rows: they no longer change, and the loop runs on until the longest plan is done."""
        for name in self.ROW_STATE:
            setattr(self, name, getattr(self, name)[..., rows])
        self.open = self.open[rows]

    def result(self, sizes: list[int]) -> list[tuple[Array, Array, Array, Array, Array]]:
        """Each plan's (start, end, pf_start, pf_end, pf_bytes) [N, n_plan]."""
        out, a = [], 0
        for n in sizes:
            cut = slice(a, a + n)
            out.append((self.start[:, cut], self.end[:, cut], np.nan_to_num(self.pf_start[:, cut], nan=-1.0),
                        np.nan_to_num(self.pf_end[:, cut], nan=-1.0), self.pf_bytes[:, cut]))
            a += n
        return out
