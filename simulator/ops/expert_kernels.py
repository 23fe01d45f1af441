"""Compiled pieces around the routed experts' grouped products (ops/experts.py, ops/linear.grouped_matmul).

Apart from ops/experts.py so that editing the ops does not change the kernel sources' digest (jit.py),
which recompiles every kernel.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from simulator import fast
from simulator.dtypes import Array
from simulator.jit import lazy_njit as njit


def scale_add_rows(out: Array, rows: npt.NDArray[np.int64], weight: Array, values: Array) -> None:
    """out[rows[i]] += weight[i] values[i] for i in order, each product rounded to out's dtype before its add:
    FC2's finalize epilogue, one pass over values. NumPy's form (scale, then np.add.at) writes and re-reads
    the scaled [rows, Din] and pays ~15 us of Python a rank: 16 ranks at batch 1, 0.38 -> 0.11 ms."""
    weight = weight.astype(out.dtype)
    if fast.numba_enabled():
        _scale_add_rows(out, rows, weight, values)
    else:
        np.add.at(out, rows, weight[:, None] * values)


@njit(cache=True)
def _scale_add_rows(out, rows, weight, values):  # type: ignore[no-untyped-def]
    for i in range(rows.shape[0]):
        o, w, v = out[rows[i]], weight[i], values[i]
        for d in range(v.shape[0]):
            o[d] += w * v[d]


@njit(cache=True)
def tiles(lengths, widths, ranks, tile):  # type: ignore[no-untyped-def]
    """Work items (weight, n0, n1, col0, r0, r1) of `tile` output columns for groups of `lengths` rows times
    parts of `widths` columns on every rank: weight (group, part, rank) of the table, output rows (rank,
    group); ordered by group, part, tile, then rank (`ops.linear.grouped_matmul`). One pass writing each
    item once: NumPy's strided column stores took ~130 us for FC2's 28,672 items at batch 1, TP16 (~50 us)."""
    total, parts = lengths.sum(), widths.shape[0]
    count = 0
    for n in widths:
        count += (n + tile - 1) // tile
    items = np.empty((lengths.shape[0] * count * ranks, 6), np.int64)
    i = row = 0
    for g in range(lengths.shape[0]):
        col = 0
        for p in range(parts):
            for n0 in range(0, widths[p], tile):
                for r in range(ranks):
                    items[i, 0] = (g * parts + p) * ranks + r
                    items[i, 1] = n0
                    items[i, 2] = min(n0 + tile, widths[p])
                    items[i, 3] = col + n0
                    items[i, 4] = r * total + row
                    items[i, 5] = r * total + row + lengths[g]
                    i += 1
            col += widths[p]
        row += lengths[g]
    return items
