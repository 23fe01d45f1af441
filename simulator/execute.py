"""The numerical interpreter: run a plan over P simulated TP ranks.

Each rank has its own named buffers. Kernels run in launch order (a valid serial order of the
streams, since every cross-stream dependency points backwards). After each kernel, every tensor
it declares as written is checked against its declared per-rank shape and rounded to its storage
format by the precision mode: that is where the standard plan's extra intermediate roundings
happen and the specialized plan's fused kernels skip them.

Inputs are replicated on every rank; per-rank state (KDA recurrent state and conv history) is
sharded by head; the MLA latent cache is replicated (MLA's latent is shared by all heads).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.dtypes import Array, Precision
from simulator.plans.common import Dims
from simulator.plans.kernel import Plan
from simulator.state import LayerState, shard_state, unshard_state
from simulator.weights import LayerWeights


@dataclass
class Rank:
    """One simulated GPU: its index, its buffers, the (full) layer weights it shards on access."""

    r: int
    tp: int
    w: LayerWeights
    prec: Precision
    all_reduce: str = "one_shot"  # reduction order of the TP all-reduces (collectives.ALL_REDUCE)
    buf: dict[str, Any] = field(default_factory=dict)

    @property
    def dtype(self) -> type:
        return self.prec.dtype


@dataclass
class LayerIO:
    """The residual stream entering or leaving a layer: prefix, pending MLP output, block snapshots."""

    prefix: Array  # [M, D]
    delta: Array  # [M, D] previous layer's MLP output, added by this layer's first kernel
    blocks: list[Array]  # n x [M, D]


def run_plan(plan: Plan, dims: Dims, weights: LayerWeights, io: LayerIO, state: LayerState,
             prec: Precision, all_reduce: str = "one_shot") -> tuple[LayerIO, LayerState, dict[str, Any]]:
    """Execute `plan`; return the outgoing stream, the new state and rank 0's diagnostics."""
    ranks = [Rank(r, plan.tp, weights, prec, all_reduce) for r in range(plan.tp)]
    for rank, st in zip(ranks, shard_state(state, plan.tp)):
        rank.buf.update(_initial_buffers(io, prec))
        rank.buf.update({k: np.asarray(v, dtype=prec.dtype) if v.dtype.kind == "f" else v for k, v in st.items()})
    for kernel in plan.kernels:
        kernel.effect(ranks)
        _commit_writes(kernel, ranks, prec)
    _check_replicated(ranks, ("prefix", "moe_out"))
    out = LayerIO(prefix=ranks[0].buf["prefix"], delta=ranks[0].buf["moe_out"],
                  blocks=[ranks[0].buf[f"block.{i}"] for i in range(dims.n_blocks + dims.boundary)])
    new_state = unshard_state([r.buf for r in ranks], state, dims.shape.tokens_per_seq)
    diag = {k[5:]: v for k, v in ranks[0].buf.items() if k.startswith("diag.")}
    return out, new_state, diag


def _initial_buffers(io: LayerIO, prec: Precision) -> dict[str, Array]:
    buf = {"prefix": prec.store(io.prefix, "bf16"), "delta": prec.store(io.delta, "bf16")}
    buf.update({f"block.{i}": prec.store(b, "bf16") for i, b in enumerate(io.blocks)})
    return buf


def _commit_writes(kernel: Any, ranks: list[Rank], prec: Precision) -> None:
    for t in kernel.writes:
        base = t.name.split("[")[0]
        for rank in ranks:
            if base not in rank.buf:
                continue
            value = rank.buf[base]
            if "[" not in t.name and tuple(value.shape) != t.shape:
                raise AssertionError(f"kernel '{kernel.key}' wrote '{t.name}' with shape {value.shape}, "
                                     f"declared {t.shape}")
            rank.buf[base] = prec.store(value, t.dtype)


def _check_replicated(ranks: list[Rank], names: tuple[str, ...]) -> None:
    """Replicated outputs must be bitwise identical on every rank (collectives guarantee it)."""
    for name in names:
        first = ranks[0].buf[name]
        for rank in ranks[1:]:
            if not np.array_equal(rank.buf[name], first):
                raise AssertionError(f"buffer '{name}' differs between rank 0 and rank {rank.r}")
