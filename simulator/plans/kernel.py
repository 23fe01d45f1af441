"""The kernel record: one GPU launch on one TP rank, read by the executor and by the cost model.

A plan (`Plan`) is the ordered tuple of kernels one rank launches for one decoder layer. A kernel is
bound to its op: it names a function in `simulator/ops` and the tensors it hands that function, in
order: `reads` (activations and state), then `weights` (from the one weight specification,
`weights.weight_table`, sharded as declared), then the static `consts`. The op returns the `writes`
in order (plus any declared `diagnostics`). The executor passes exactly these tensors, checks their
shape and dtype, and fails on anything undeclared, so the bytes the cost model charges are, by
construction, the tensors the numbers used. Kernel count (`len(plan)`), numbers and microseconds
come from one object. A collective (`scope="ranks"`) is bound the same way, over the lists of every rank's
tensors; padding and packing are properties of a declared tensor (`Tensor`), not tensors of their own.

Dimension legend: M decode tokens in the step (= batch x tokens per sequence), D hidden, P TP degree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Literal

import numpy as np

from simulator.config import ATTENTION_KINDS
from simulator.state import DecodeShape  # noqa: F401  (re-exported: plans are built for a shape)

# bytes per element of each storage format; MXFP4 adds one E8M0 scale byte per 32 elements.
DTYPE_BYTES: dict[str, float] = {"fp64": 8, "fp32": 4, "bf16": 2, "fp8": 1, "int32": 4, "mxfp4": 0.5}
KernelKind = Literal["gemm", "moe", "attention", "pointwise", "router", "collective", "gemm_collective"]
# The kernel family: which law of the cost model prices the kernel's work, and under which family the GPU
# measurements (calibration/h200/<family>.csv) hold it. Declared by each kernel factory, never guessed:
# a kind does not say it (an "attention" kernel is a KDA recurrence or an MLA decode; a "router" kernel
# without weights is a top-k, a small kernel). A kernel with a collective phase also pays the
# "collective" law for that phase. Each attention kind's own attention kernel is a family of its name.
Family = str
FAMILIES: tuple[str, ...] = ("gemm", "moe", "small") + ATTENTION_KINDS + ("collective",)
TENSOR_CORE_FAMILIES = frozenset({"gemm", "moe"})  # pay the tensor-core GEMM fixed cost (pricing)
CollectiveOp = Literal["all_reduce", "reduce_scatter", "all_gather"]

# where vLLM 0.33.0 keeps the code that launches each kernel (Kernel.source; docs/vllm-k3-source.md)
K3 = "vllm/models/kimi_k3/nvidia/"  # the stock Kimi K3 path
SD = K3 + "specialized_decode/"  # the specialized decode path
LLG = K3 + "low_latency_gemm.py:KimiK3LowLatencyLinearMethod.apply"  # every stock dense projection

ALL_WEIGHTS = -1  # prefetch_bytes meaning "every weight byte this kernel declares" (resolved on build)
EXPERT = "expert.*."  # weight-part prefix of a routed expert's weight, bound per touched expert
Shard = str  # "full" replicated, "col" columns r/P, "col/n" one of n column pieces per P/n ranks, "row" rows r/P,
#               "rank0" rank 0 only (weights.shard_piece)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A buffer, weight or state slice as one rank sees it: `shape` is what it occupies in HBM.

    unpadded  the shape the op receives when `shape` is padded (an expert shard padded to 256 rows,
              a fused projection padded to a multiple of 16): bytes are counted on `shape`, the
              padding is zeros and changes no number
    window    (axis, lo, hi): the kernel touches only this slice of buffer `name`
    parts     weights only: (spec name, shard) of each weight packed, in order, along `pack_axis` into
              this one buffer; `expert.*.w_gate` names a routed expert's weight, one per touched expert
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    unpadded: tuple[int, ...] | None = None
    window: tuple[int, int, int] | None = None
    parts: tuple[tuple[str, Shard], ...] = ()
    pack_axis: int = -1

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


def take_window(value: Any, window: tuple[int, int, int] | None) -> Any:
    """The slice of `value` a tensor's `window` (axis, lo, hi) names (a copy), or all of it without one."""
    if window is None:
        return value
    axis, lo, hi = window
    return np.take(value, np.arange(lo, hi), axis=axis)


@dataclass(frozen=True, slots=True)
class Collective:
    """A cross-rank exchange: `nbytes` is each rank's input payload (e.g. M x D x 2 for a bf16 all-reduce)."""

    op: CollectiveOp
    nbytes: int
    ranks: int
    in_kernel: bool = False  # done inside a computing kernel via symmetric-memory flags: no collective launch
    algorithms: tuple[str, ...] = ()  # a standalone all-reduce: the algorithms its library picks among (() any)


@dataclass(frozen=True, slots=True)
class RunOption:
    """A const the executor fills in per run (the all-reduce order, the bf16 store), not the plan."""

    name: str


@dataclass(frozen=True)
class Kernel:
    """One launch: `op(*reads, *weights, **consts)` returns `writes` (+ `diagnostics`), once per rank
    (`scope="rank"`) or once over the lists of every rank's tensors (`scope="ranks"`)."""

    key: str  # unique within the plan; dependencies name it
    name: str  # as a profiler would show it
    kind: KernelKind
    family: Family | Literal[""] = ""  # required: one of FAMILIES (checked on build)
    impl: str = ""  # the algorithm, where the family has several (KDA: "split_v" grid or "per_head"); cost/laws.py
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
    floor: Literal["", "reduction", "topk", "finalize", "attention"] = ""  # latency-floor family ("" streams)
    group_tokens: int = 0  # the tokens those rows come from (how rows spread over experts; 0: one row each)
    group_experts: int = 0  # the E experts those rows choose among (the engine's tile tables are keyed by it)
    fusions: tuple[str, ...] = ()  # named fusions of the specialized plan this kernel embodies
    replaces: tuple[str, ...] = ()  # keys of the standard-plan kernels this fused kernel replaces
    note: str = ""  # source or reasoning (docs/kernels.md is generated from these)
    # the vLLM 0.33.0 function that launches it, "vllm/<package path>.py:<qualified name>" (docs/vllm_k3_map.toml)
    source: str = ""
    op: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
    consts: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)
    scope: Literal["rank", "ranks"] = "rank"
    diagnostics: tuple[str, ...] = ()  # extra op outputs the check keeps (no GPU tensor, no bytes)
    # HBM bytes the launch moves where its tensors do not say them (0: the declared tensors' bytes): a
    # sliding-window decode reads its window's pages of the whole pool it declares, a split-KV decode writes
    # fp32 partials its op never materialises, a cast reads a table moe-sim does not hold
    traffic_bytes: int = 0

    # byte totals, derived once from the declared tensors (the cost model reads them many times)
    weight_bytes: int = field(init=False, compare=False, repr=False)
    read_bytes: int = field(init=False, compare=False, repr=False)
    write_bytes: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"kernel {self.key!r} declares family {self.family!r}; expected one of {FAMILIES}")
        object.__setattr__(self, "weight_bytes", sum(t.nbytes for t in self.weights))
        object.__setattr__(self, "read_bytes", sum(t.nbytes for t in self.reads))
        object.__setattr__(self, "write_bytes", sum(t.nbytes for t in self.writes))
        if self.prefetch_bytes == ALL_WEIGHTS:
            object.__setattr__(self, "prefetch_bytes", self.weight_bytes)

    def __hash__(self) -> int:
        """A hash of what equality compares, the tensors by their bytes and windows (a KV-cache insert differs
        from context to context in its window alone), kept after the first call: kernels key the pricing's
        caches. Kernels that differ only in what it leaves out share a hash; equality tells them apart."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.key, self.name, self.kind, self.family, self.impl, self.flops, self.math, self.stream,
                           self.deps, self.collective, self.prefetch_bytes, self.pdl, self.ctas, self.ctas_per_sm,
                           self.serial_steps, self.group_rows, self.floor, self.group_tokens, self.fusions,
                           self.replaces, self.scope, self.weight_bytes, self.read_bytes, self.write_bytes,
                           self.traffic_bytes, self.group_experts,
                           tuple(t.window for t in self.reads), tuple(t.window for t in self.writes)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}  # str hashes differ between processes

    @property
    def hbm_bytes(self) -> int:
        """Bytes this kernel moves through HBM on one rank: weights + activations/state in and out, or its
        `traffic_bytes` where the declared tensors do not say them."""
        return self.traffic_bytes or self.weight_bytes + self.read_bytes + self.write_bytes

    @property
    def comm_bytes(self) -> int:
        return self.collective.nbytes if self.collective else 0


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

    def __hash__(self) -> int:
        """The dataclass hash, kept after the first call: plans key the cost model's caches (`plan_layout`)."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.variant, self.layer, self.tp, self.shape, self.kernels, self.fusions))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}  # str hashes differ between processes

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
        return tuple(dict.fromkeys(k.stream for k in self.kernels))
