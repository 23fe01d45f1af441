"""The numerical interpreter: run a plan over P simulated TP ranks, each kernel through its bound op.

Each rank has its own named buffers. Kernels run in launch order (a valid serial order of the
streams, since every cross-stream dependency points backwards). For each kernel the executor

1. fetches exactly the declared tensors: `reads` from the rank's buffers (a `window` reads a slice),
   `weights` from the layer's weight specification, each part sharded as declared (only the shard is
   converted from its held bf16 to the compute dtype) and packed in order; routed experts come as a
   function e -> the declared parts of expert e's shard;
2. checks every fetched tensor against its declared per-rank shape (and integer vs float dtype);
3. calls the op, once per rank or once over all ranks for a collective, with the declared consts;
4. checks the outputs' number and shapes against the declared `writes`, rounds each to its storage
   format (that is where the standard plan's extra intermediate roundings happen and the specialized
   plan's fused kernels skip them) and stores it.

The backend says how the ops run: "numpy" calls each op's NumPy form on float weights, once per rank;
"fast" (simulator/fast/backend.py, the `runner` below) runs the ops' registered compiled replacements, hands
packed weights (MXFP4 codes, bf16 bits) to the ops that only multiply by them, and streams the routed experts
a chunk at a time. Both compute the same functions; the NumPy forms are the definitions.

Anything undeclared fails: a read of a buffer that does not exist, a weight part missing from the
specification, an output the kernel did not declare. Inputs are replicated on every rank; the state is
sharded as its attention kind says (simulator/attention: KDA's by head, MLA's cache replicated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from simulator.attention import shard_state, unshard_state
from simulator.dtypes import Array, Precision
from simulator.errors import UserError
from simulator.ops.experts import ExpertFn
from simulator.ops.replaceable import replacing
from simulator.plans.common import Dims
from simulator.plans.kernel import EXPERT, Kernel, Plan, RunOption, Tensor, take_window
from simulator.state import LayerIO, LayerState
from simulator.weights import LayerWeights, shard_array, shard_shape, weight_spec, widen


@dataclass
class Rank:
    """One simulated GPU: its index and its buffers."""

    r: int
    tp: int
    buf: dict[str, Any] = field(default_factory=dict)


BACKENDS = ("numpy", "fast")
DEFAULT_BACKEND = "fast"  # the NumPy forms define the ops; the fast backend runs a full-size layer in seconds


def make_backend(name: str) -> Any:
    """The runner of backend `name` (BACKENDS): None for "numpy" (each op's NumPy form, once per rank); for "fast"
    the fast backend, whose members the executor calls: its `replacements` (op -> what runs in its place),
    `matmul_weight` (packed weights), `experts` (packed experts) and `run_ranks` (a kernel on every rank)."""
    if name == "fast":
        from simulator.fast.backend import FastBackend  # the annex: imported only when asked for
        return FastBackend()
    if name != "numpy":
        raise UserError(f"unknown backend '{name}': choose one of {', '.join(BACKENDS)}.")
    return None


class BindingError(AssertionError):
    """A kernel's declaration and what its op receives or returns disagree."""


def run_plan(plan: Plan, dims: Dims, weights: LayerWeights, io: LayerIO, state: LayerState,
             prec: Precision, all_reduce: str = "one_shot", backend: str = DEFAULT_BACKEND,
             ) -> tuple[LayerIO, LayerState, dict[str, Any]]:
    """Execute `plan` on `backend` (BACKENDS); return the outgoing stream, the new state and rank 0's diagnostics."""
    runner = make_backend(backend)
    ranks = [Rank(r, plan.tp) for r in range(plan.tp)]
    for rank, st in zip(ranks, shard_state(state, plan.tp)):
        rank.buf.update(_initial_buffers(io, dims.boundary, prec))
        rank.buf.update({k: np.asarray(v, dtype=prec.dtype) if v.dtype.kind == "f" else v for k, v in st.items()})
    options = {"all_reduce": all_reduce, "store_bf16": lambda x: prec.store(x, "bf16")}
    with replacing(runner.replacements if runner else {}):
        for kernel in plan.kernels:
            run_kernel(kernel, ranks, weights, prec, options, runner)
    _check_replicated(ranks, ("prefix", "moe_out"))
    buf = ranks[0].buf
    out = LayerIO(prefix=buf["prefix"], delta=buf["moe_out"], blocks=list(buf["blocks"]))
    new_state = unshard_state([r.buf for r in ranks], state, dims.shape.tokens_per_seq)
    diag = {k[5:]: v for k, v in buf.items() if k.startswith("diag.")}
    if "topk.idx" in buf:
        diag["topk_idx"] = buf["topk.idx"]
    return out, new_state, diag


def run_kernel(kernel: Kernel, ranks: list[Rank], weights: LayerWeights, prec: Precision,
               options: dict[str, Any], runner: Any = None) -> None:
    """Fetch, check, call, check, store: one kernel on every rank (`runner`: make_backend's)."""
    if kernel.op is None:
        raise BindingError(f"kernel '{kernel.key}' names no op")
    consts = {k: options[v.name] if isinstance(v, RunOption) else v for k, v in kernel.consts}
    args = [[_read(kernel, rank, t) for t in kernel.reads] + [_weight(kernel, rank, weights, prec, t, runner)
                                                                for t in kernel.weights] for rank in ranks]
    if kernel.scope == "rank":
        results = runner.run_ranks(kernel, ranks, weights, args, consts) if runner else [
            kernel.op(*a, **consts) for a in args]
        outs = [_outputs(kernel, out) for out in results]
    else:
        per_output = _outputs(kernel, kernel.op(*[list(col) for col in zip(*args)], **consts))
        if any(len(o) != len(ranks) for o in per_output):
            raise BindingError(f"collective '{kernel.key}' did not return one value per rank")
        outs = [tuple(o[i] for o in per_output) for i in range(len(ranks))]
    for rank, out in zip(ranks, outs):
        for t, value in zip(kernel.writes, out):
            _store(kernel, rank, t, prec.store(value, t.dtype))
        for name, value in zip(kernel.diagnostics, out[len(kernel.writes):]):
            rank.buf[f"diag.{name}"] = value


def _outputs(kernel: Kernel, result: Any) -> tuple[Any, ...]:
    out = result if isinstance(result, tuple) else (result,)
    if len(out) != len(kernel.writes) + len(kernel.diagnostics):
        raise BindingError(f"kernel '{kernel.key}': op '{kernel.op.__name__}' returned {len(out)} outputs, "
                           f"declared {len(kernel.writes)} writes + {len(kernel.diagnostics)} diagnostics")
    return out


def _check(kernel: Kernel, t: Tensor, value: Any, what: str) -> None:
    if tuple(np.shape(value)) != (t.unpadded or t.shape):
        raise BindingError(f"kernel '{kernel.key}' {what} '{t.name}' with shape {np.shape(value)}, "
                           f"declared {t.unpadded or t.shape}")
    is_int = (value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype).kind in "iu"
    if is_int != (t.dtype == "int32"):
        raise BindingError(f"kernel '{kernel.key}' {what} '{t.name}' as {np.asarray(value).dtype}, declared {t.dtype}")


def _read(kernel: Kernel, rank: Rank, t: Tensor) -> Any:
    if t.name not in rank.buf:
        raise BindingError(f"kernel '{kernel.key}' reads '{t.name}', which no earlier kernel wrote")
    value = take_window(rank.buf[t.name], t.window)
    _check(kernel, t, value, "reads")
    return value


def _store(kernel: Kernel, rank: Rank, t: Tensor, value: Any) -> None:
    _check(kernel, t, value, "wrote")
    if t.window:
        axis, lo, hi = t.window
        whole = rank.buf[t.name].copy()
        index = [slice(None)] * whole.ndim
        index[axis] = slice(lo, hi)
        whole[tuple(index)] = value
        value = whole
    rank.buf[t.name] = value


def _weight(kernel: Kernel, rank: Rank, weights: LayerWeights, prec: Precision, t: Tensor, runner: Any) -> Any:
    """The declared weight: its spec parts, sharded, packed; for routed experts a function of e."""
    parts = t.parts or ((t.name, "full"),)
    if parts[0][0].startswith(EXPERT):
        return _expert_weights(kernel, rank, weights, prec, t, parts, runner)
    for name, _ in parts:
        weight_spec(weights.cfg, name)  # KeyError for a name the specification does not hold
    held = [weights.shard(name, None, shard, rank.r, rank.tp) for name, shard in parts]
    value = runner.matmul_weight(kernel.kind, held, t.pack_axis, prec.dtype) if runner else None
    if value is None and (len(held) > 1 or parts[0][1] != "full"):
        value = widen(held[0] if len(held) == 1 else _pack(held, t.pack_axis), prec.dtype)
    elif value is None:
        value = weights.get(parts[0][0], prec.dtype)  # a replicated weight: one copy the ranks share
    _check(kernel, t, value, "is handed weight")
    return value


def _pack(held: list[np.ndarray], axis: int) -> np.ndarray:
    """Concatenate weights in their held format; bf16 as its uint16 bits (NumPy copies a custom dtype
    element by element, its own integers with memcpy: 20x faster)."""
    if all(h.dtype == ml_dtypes.bfloat16 for h in held):
        return np.concatenate([h.view(np.uint16) for h in held], axis=axis).view(ml_dtypes.bfloat16)
    return np.concatenate(held, axis=axis)


def _expert_weights(kernel: Kernel, rank: Rank, weights: LayerWeights, prec: Precision, t: Tensor,
                    parts: tuple[tuple[str, str], ...], runner: Any) -> ExpertFn:
    """e -> the declared parts of expert e's shard: the backend's (packed views on "fast"), else float arrays.
    Every expert's parts have the specification's shapes, so the shard is checked against the declared
    per-expert shape once, not per expert."""
    names, shards = tuple(name[len(EXPERT):] for name, _ in parts), tuple(shard for _, shard in parts)
    got = [shard_shape(weight_spec(weights.cfg, f"expert.0.{name}")[0], shard, rank.tp)
           for name, shard in zip(names, shards)]
    shape = list(got[0])
    shape[t.pack_axis] = sum(g[t.pack_axis] for g in got)
    if tuple(shape) != (t.unpadded or t.shape)[1:]:
        raise BindingError(f"kernel '{kernel.key}' is handed experts as {tuple(shape)}, declared "
                           f"{(t.unpadded or t.shape)[1:]}")
    fn = runner.experts(weights, names, shards, rank) if runner else None
    return fn if fn is not None else lambda e: tuple(
        shard_array(weights.get(f"expert.{e}.{name}", prec.dtype), shard, rank.r, rank.tp)
        for name, shard in zip(names, shards))


def _initial_buffers(io: LayerIO, boundary: bool, prec: Precision) -> dict[str, Array]:
    """prefix, delta and the block snapshots [n (+ 1 slot this layer fills at a boundary), M, D]."""
    snapshots = list(io.blocks) + ([np.zeros_like(io.prefix)] if boundary else [])
    blocks = np.stack(snapshots) if snapshots else np.zeros((0,) + io.prefix.shape)
    return {"prefix": prec.store(io.prefix, "bf16"), "delta": prec.store(io.delta, "bf16"),
            "blocks": prec.store(blocks, "bf16")}


def _check_replicated(ranks: list[Rank], names: tuple[str, ...]) -> None:
    """Replicated outputs must be bitwise identical on every rank (collectives guarantee it)."""
    for name in names:
        first = ranks[0].buf[name]
        for rank in ranks[1:]:
            if not np.array_equal(rank.buf[name], first):
                raise AssertionError(f"buffer '{name}' differs between rank 0 and rank {rank.r}")
