"""The kernel record: one GPU launch on one TP rank, read by the executor and by the cost model.

A plan (`Plan`) is the ordered tuple of kernels one rank launches for one decoder layer. Each kernel
declares the tensors it reads, writes and loads as weights (name, per-rank shape, storage dtype);
its traffic is *derived* from those declarations, never typed in, and the executor checks that the
numerical effect writes exactly the declared shapes. So kernel count (`len(plan)`), numbers and
microseconds come from one object.

Dimension legend: M decode tokens in the step (= batch x tokens per sequence), D hidden, P TP degree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Literal

from simulator.ops.experts import UNIFORM, RoutingStats

# bytes per element of each storage format; MXFP4 adds one E8M0 scale byte per 32 elements.
DTYPE_BYTES: dict[str, float] = {"fp64": 8, "fp32": 4, "bf16": 2, "fp8": 1, "int32": 4, "mxfp4": 0.5}
KernelKind = Literal["gemm", "moe", "attention", "pointwise", "router", "collective", "gemm_collective"]
CollectiveOp = Literal["all_reduce", "reduce_scatter", "all_gather"]


@dataclass(frozen=True, slots=True)
class Tensor:
    """A buffer, weight or state slice as one rank sees it."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:  # plain loop: cheaper than math.prod for 1-4 dims, and called a lot
            n *= size
        return n

    @property
    def nbytes(self) -> int:
        if self.dtype == "mxfp4":
            return self.numel // 2 + math.ceil(self.numel / 32)
        return int(self.numel * DTYPE_BYTES[self.dtype])


@dataclass(frozen=True, slots=True)
class Collective:
    """A cross-rank exchange: `nbytes` is each rank's input payload (e.g. M x D x 2 for a bf16 all-reduce)."""

    op: CollectiveOp
    nbytes: int
    ranks: int
    in_kernel: bool = False  # done inside a computing kernel via symmetric-memory flags: no collective launch


@dataclass(frozen=True)
class Kernel:
    """One launch. `effect(ranks)` mutates every rank's buffers; per-rank kernels loop inside it."""

    key: str  # unique within the plan; dependencies name it
    name: str  # as a profiler would show it
    kind: KernelKind
    reads: tuple[Tensor, ...] = ()
    writes: tuple[Tensor, ...] = ()
    weights: tuple[Tensor, ...] = ()
    flops: int = 0
    math: str = "bf16"  # tensor-core format of the math: "bf16", "fp8", "fp4", "fp32"
    stream: str = "main"
    deps: tuple[str, ...] = ()  # keys of earlier kernels on other streams this one waits for
    collective: Collective | None = None
    prefetch_bytes: int = 0  # weight bytes this kernel may load before its inputs are ready
    pdl: bool = False  # launched with programmatic dependent launch (overlaps its launch with the predecessor's tail)
    ctas: int | None = None  # independent work items when fewer than the GPU can hold (e.g. one per sequence x head)
    ctas_per_sm: int = 1  # work items resident on one SM at once (one-warp programs: ~8)
    serial_steps: int = 0  # dependent steps each work item runs in order after its first (KDA: T - 1 tokens)
    group_rows: int = 0  # a grouped GEMM's input rows (tokens x top-k), shared by the experts in `weights[0]`
    fusions: tuple[str, ...] = ()  # named fusions of the specialized plan this kernel embodies
    replaces: tuple[str, ...] = ()  # keys of the standard-plan kernels this fused kernel replaces
    note: str = ""  # source or reasoning (docs/kernels.md is generated from these)
    effect: Callable[[list[Any]], None] | None = field(default=None, compare=False, repr=False)

    # byte totals, derived once from the declared tensors (the cost model reads them many times)
    weight_bytes: int = field(init=False, compare=False, repr=False)
    read_bytes: int = field(init=False, compare=False, repr=False)
    write_bytes: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight_bytes", sum(t.nbytes for t in self.weights))
        object.__setattr__(self, "read_bytes", sum(t.nbytes for t in self.reads))
        object.__setattr__(self, "write_bytes", sum(t.nbytes for t in self.writes))

    @property
    def hbm_bytes(self) -> int:
        """Bytes this kernel moves through HBM on one rank: weights + activations/state in and out."""
        return self.weight_bytes + self.read_bytes + self.write_bytes

    @property
    def comm_bytes(self) -> int:
        return self.collective.nbytes if self.collective else 0


@dataclass(frozen=True, slots=True)
class DecodeShape:
    """What one forward processes: `batch` sequences x `tokens_per_seq` tokens over `context` cached tokens,
    routed with `routing` statistics (uniform and independent unless stated)."""

    batch: int = 1
    tokens_per_seq: int = 1  # 1, or 1 + draft tokens being verified
    context: int = 1024  # tokens already in the KV cache / folded into the KDA state
    routing: RoutingStats = UNIFORM

    @property
    def tokens(self) -> int:  # M
        return self.batch * self.tokens_per_seq


@dataclass(frozen=True)
class Plan:
    """The kernels one rank launches for one layer, in launch order."""

    variant: str
    layer: str  # "kda" | "mla" | "dense"
    tp: int
    shape: DecodeShape
    kernels: tuple[Kernel, ...]
    fusions: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self.kernels)

    def __iter__(self):
        return iter(self.kernels)

    def kernel(self, key: str) -> Kernel:
        for k in self.kernels:
            if k.key == key:
                return k
        raise KeyError(key)

    @cached_property
    def hbm_bytes(self) -> int:
        return sum(k.hbm_bytes for k in self.kernels)

    @cached_property
    def weight_bytes(self) -> int:
        return sum(k.weight_bytes for k in self.kernels)

    @property
    def streams(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for k in self.kernels:
            seen.setdefault(k.stream, None)
        return tuple(seen)
