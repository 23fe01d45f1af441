"""Collectives over P simulated ranks, with an explicit reduction order.

    all-reduce:     out_r = sum_q x_q                 every rank gets the same sum
    reduce-scatter: out_r = (sum_q x_q)[chunk r]      chunk r = columns r*n/P .. (r+1)*n/P
    all-gather:     out_r = concat_q x_q

Floating-point addition is not associative, so each algorithm fixes its order:
- one-shot  : every rank reads all P inputs and adds them in rank order 0, 1, ..., P-1
              (Lamport / vLLM custom 1-stage); the result is bitwise identical on all ranks.
- two-shot  : reduce-scatter (rank r adds chunk r in rank order) then all-gather (vLLM 2-stage,
              FlashInfer two-shot); same order as one-shot per element, so also the same result.
- ring      : chunk c is accumulated around the ring starting at rank c+1 (NCCL ring); the order
              differs per chunk, so results differ from one-shot by rounding only.
All sums run in the inputs' dtype (FP32 registers on the GPU); the caller rounds the output.

Dimension legend: P ranks, n elements along the split axis (the last axis).
"""

from __future__ import annotations

import numpy as np

from simulator.dtypes import Array


def _chunks(x: Array, p: int) -> list[Array]:
    n = x.shape[-1]
    if n % p:
        raise ValueError(f"cannot split {n} columns over {p} ranks")
    return np.split(x, p, axis=-1)


def _ordered_sum(parts: list[Array]) -> Array:
    acc = parts[0].copy()
    for part in parts[1:]:
        acc = acc + part
    return acc


def all_reduce_one_shot(partials: list[Array]) -> list[Array]:
    """Each rank sums all P inputs in rank order.   P x [..., n] -> P x [..., n]"""
    total = _ordered_sum(partials)
    return [total.copy() for _ in partials]


def reduce_scatter(partials: list[Array]) -> list[Array]:
    """Rank r sums chunk r of every input in rank order.   P x [..., n] -> P x [..., n/P]"""
    p = len(partials)
    chunked = [_chunks(x, p) for x in partials]
    return [_ordered_sum([chunked[q][r] for q in range(p)]) for r in range(p)]


def all_gather(chunks: list[Array]) -> list[Array]:
    """Every rank gets all chunks in rank order.   P x [..., n/P] -> P x [..., n]"""
    full = np.concatenate(chunks, axis=-1)
    return [full.copy() for _ in chunks]


def all_reduce_two_shot(partials: list[Array]) -> list[Array]:
    """Reduce-scatter then all-gather (moves 2 (P-1)/P n per rank instead of (P-1) n)."""
    return all_gather(reduce_scatter(partials))


def all_reduce_ring(partials: list[Array]) -> list[Array]:
    """Ring order: chunk c starts at rank c+1 and travels P-1 hops, adding each rank's piece."""
    p = len(partials)
    chunked = [_chunks(x, p) for x in partials]
    reduced = [_ordered_sum([chunked[(c + 1 + h) % p][c] for h in range(p)]) for c in range(p)]
    return all_gather(reduced)


ALL_REDUCE = {"one_shot": all_reduce_one_shot, "two_shot": all_reduce_two_shot, "ring": all_reduce_ring}


def all_reduce(partials: list[Array], *, algorithm: str = "one_shot") -> list[Array]:
    """The TP all-reduce with the run's reduction order; chunked orders need the payload to split
    evenly over the ranks, otherwise one-shot (what a library falls back to)."""
    algo = ALL_REDUCE[algorithm]
    if partials[0].shape[-1] % len(partials):
        algo = all_reduce_one_shot
    return algo(partials)
