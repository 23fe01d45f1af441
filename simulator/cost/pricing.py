"""Price one kernel on one GPU: a latency floor, bytes over achievable bandwidth, math where it dominates.

Dimension legend: S bytes the kernel moves through HBM on one rank (weights + activations/state read and
written, `Kernel.hbm_bytes`), F its FLOPs, BW peak HBM bandwidth, eta the achievable fraction of BW
(streaming kernels vs grouped MoE GEMMs), R the dense peak FLOP/s of the kernel's math format.

    t_launch = gap                                 idle time at the kernel boundary (the timeline adds it);
               under PDL gap - what the kernel can overlap: all of it for a kernel with its weights (or
               its cache) to load first, pdl_dependent_hidden for one that must wait (launch_gap_us())
    t_fixed  = the kernel family's floor: kernel_fixed for a streaming kernel, floor_reduction / _topk /
               _finalize / _attention for the others (+ gemm_fixed for the gemm and moe families)
               (+ U x moe_expert for a grouped GEMM over U experts: one group of tiles to schedule each)
    t_mem    = S / (eta BW)                         a grouped MoE GEMM streams like a dense one
    t_math   = F / (eta_c R)                        eta_c: no GEMM runs at the datasheet peak (H200: 0.73)
               grouped GEMM: F counts whole BLOCK_M-row tiles per expert (moe_align_block_size pads
               each expert's rows to 16, or 64 once experts average more than 16 rows), plus, where the
               GPU has no FP4 tensor cores, the dequantisation of every FP4 weight in registers on the
               CUDA cores (DEQUANT_OPS per element at the FP32 rate): W4A16 on Hopper
    t_comm   = alpha + transfer                    collective and gemm_collective only (collectives.py)
    t_serial = steps x serial_step x waves          a recurrence: each work item runs its steps in order
                                                    (KDA: T - 1 tokens after the first); waves =
                                                    ceil(ctas / (SMs x ctas_per_sm))
    duration = t_fixed + t_serial + max(t_mem, t_math) + t_comm

So the bandwidth a kernel achieves depends on its size,

    BW_achieved(S) = S / (t_fixed + S / (eta BW)),

~0 for tiny kernels, half of eta BW at S = t_fixed eta BW, and eta BW for large S. Napkin (H200): a
streaming kernel reaches half speed at 0.44 us x 4.56 TB/s = 2 MB; a cuBLAS-like GEMM (2.44 us fixed) only
at 11 MB. A 30 MB bf16 GEMM at M = 1 takes 2.44 + 30e6 / 4.56e12 = 9.0 us (+1.6 us gap), measured 10-13 us
(sources.md §3.2). Its intensity is ~M FLOP/B (2 M K N flops over 2 K N bytes), far below H200's 206
FLOP/B critical intensity, so the time stays flat from M = 1 to M = 64.

`bound` names the largest term: latency (t_fixed + alpha), memory, compute or communication (transfer).
A GPU without FP4 tensor cores prices FP4 math at its `fp4_runs_as` format's rate (Hopper: BF16).
"""

from __future__ import annotations


import numpy as np
from dataclasses import dataclass
from typing import Any, Literal

from simulator.cost.collectives import collective_cost, collective_time_us
from simulator.cost.laws import expected_tiles, gqa_chain_us, law_us
from simulator.hardware import HardwareProfile
from simulator.plans.kernel import TENSOR_CORE_FAMILIES, Kernel

Bound = Literal["memory", "compute", "latency", "communication"]
COLLECTIVE_KINDS = frozenset({"collective", "gemm_collective"})


@dataclass(frozen=True, slots=True)
class KernelCost:
    """One kernel alone on one rank. Times in µs; `bytes` through HBM, `comm_bytes` over NVLink."""

    key: str
    name: str
    kind: str
    launch_us: float
    fixed_us: float
    serial_us: float
    mem_us: float
    math_us: float
    comm_us: float
    comm_alpha_us: float
    algorithm: str  # collective algorithm, "" for none
    bytes: int
    flops: int
    comm_bytes: int
    peak_bandwidth: float  # B/s, datasheet HBM
    stream_bandwidth: float  # B/s, eta BW: what this kernel's byte phase reaches alone
    measured: bool = False  # priced by a measured law of the profile's kernel set (cost/laws.py)

    @property
    def duration_us(self) -> float:
        return self.fixed_us + self.serial_us + max(self.mem_us, self.math_us) + self.comm_us

    @property
    def total_us(self) -> float:
        """Duration plus the launch gap before it (serial, no overlap)."""
        return self.launch_us + self.duration_us

    @property
    def achieved_gbps(self) -> float:
        """HBM GB/s over the kernel's duration, as a profiler would report it (B/µs = 1e-3 GB/s x 1e6)."""
        return self.bytes / self.duration_us * 1e-3 if self.duration_us > 0 else 0.0

    @property
    def fraction_of_peak(self) -> float:
        return self.achieved_gbps * 1e9 / self.peak_bandwidth

    @property
    def intensity(self) -> float:
        """FLOP per HBM byte (~M for a bf16 GEMM at M decode tokens)."""
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def bound(self) -> Bound:
        terms: dict[Bound, float] = {
            "latency": self.fixed_us + self.serial_us + self.comm_alpha_us,
            "memory": self.mem_us,
            "compute": self.math_us,
            "communication": self.comm_us - self.comm_alpha_us,
        }
        return max(terms, key=terms.__getitem__)


DEQUANT_OPS = 2  # CUDA-core instructions per FP4 weight element dequantised in registers (unpack + scale)
FP4_DTYPES = frozenset({"mxfp4", "nvfp4", "fp4"})


def fixed_us(kernel: Kernel, hw: HardwareProfile) -> float:
    """Per-kernel latency PDL cannot hide: the floor of the kernel's family (a streaming kernel's
    kernel_fixed_us, a norm's, a top-k's, a finalize's, a split-KV decode's), plus the tensor-core GEMM
    fixed cost. A collective carries its latency in alpha; one that also computes (an all-gather + top-k
    kernel) pays its compute floor after the exchange."""
    if kernel.family == "collective":
        return hw.floor_us(kernel.floor) if kernel.floor else 0.0
    return hw.floor_us(kernel.floor) + (hw.gemm_fixed_us if kernel.family in TENSOR_CORE_FAMILIES else 0.0)


def grouped_gemm_terms(kernel: Kernel, hw: HardwareProfile) -> tuple[float, float]:
    """(per-expert µs, math µs) of a grouped GEMM: U groups to schedule, whole tiles of math, FP4 dequant."""
    if kernel.kind != "moe" or not kernel.group_rows or not kernel.weights:
        return 0.0, kernel.flops / (hw.peak_flops(kernel.math) * hw.compute_efficiency) * 1e6
    w = kernel.weights[0]
    experts, k_dim, n_dim = w.shape[0], w.shape[-2], w.shape[-1]
    tiles, block = expected_tiles(kernel.group_tokens or kernel.group_rows, kernel.group_rows, experts)
    padded = 2.0 * tiles * block * k_dim * n_dim  # 2 x K x N over the whole BLOCK_M-row tiles the grid runs
    extra = max(0, kernel.flops - 2 * kernel.group_rows * k_dim * n_dim)  # epilogue work beyond the GEMM
    math_us = (padded + extra) / (hw.peak_flops(kernel.math) * hw.compute_efficiency) * 1e6
    if w.dtype in FP4_DTYPES and hw.fp4_runs_as != "fp4":  # each tile's programs dequantise their slab
        math_us += DEQUANT_OPS * tiles * k_dim * n_dim / (hw.fp32_flops * hw.compute_efficiency) * 1e6
    return experts * hw.moe_expert_us, math_us


def launch_gap_us(kernel: Kernel, hw: HardwareProfile) -> float:
    """Idle time before the kernel in CUDA-graph replay. Without PDL: the launch gap. With PDL the kernel is
    launched early and hides the boundary only as far as it has independent work to start before its wait:
    the weights the plan prefetches, and an attention kernel's cache or state (H200: a kernel that streams
    8 MiB before its wait hides the whole boundary, one that waits first only `pdl_dependent_hidden_us`,
    0.34 µs; calibration/h200/pdl):

        gap_pdl = max(launch_gap_pdl, gap - pdl_dependent_hidden - W_prefetch / (eta BW))"""
    if not kernel.pdl or (hw.kernel_set is not None and not hw.kernel_set.pdl):
        return hw.launch_gap_us
    independent = prefetch_target(kernel)
    if kernel.kind == "attention" and kernel.prefetch_bytes:  # its KV cache / recurrent state is no input either
        independent = kernel.hbm_bytes
    independent_us = independent / (hw.hbm_efficiency * hw.hbm_bandwidth) * 1e6
    gap = np.maximum(hw.launch_gap_pdl_us, hw.launch_gap_us - hw.pdl_dependent_hidden_us - independent_us)
    return float(gap) if np.ndim(gap) == 0 else gap  # arrays when the constants are drawn (uncertainty.py)


def prefetch_target(kernel: Kernel) -> int:
    """The weight bytes the kernel may load before its inputs are ready: its declared prefetch, at most its weights."""
    return min(kernel.prefetch_bytes, kernel.weight_bytes)


def stream_bandwidth(kernel: Kernel, hw: HardwareProfile) -> float:
    """eta BW, or less when the kernel has only `ctas` independent work items: each CTA streams at most
    `cta_bandwidth` on its own (latency-bound), so 6 CTAs (one per KDA head at TP16, batch 1) reach
    6 x 35 GB/s = 0.21 TB/s, not 6.08 TB/s (GB300)."""
    full = hw.hbm_efficiency * hw.hbm_bandwidth
    return full if kernel.ctas is None else min(full, kernel.ctas * hw.cta_bandwidth)


def serial_us(kernel: Kernel, hw: HardwareProfile) -> float:
    """steps x serial_step x waves: a recurrence's dependent steps (module docstring)."""
    if not kernel.serial_steps:
        return 0.0
    waves = -(-(kernel.ctas or hw.sm_count) // (hw.sm_count * kernel.ctas_per_sm))
    return kernel.serial_steps * hw.serial_step_us * waves


def measured_terms(kernel: Kernel, hw: HardwareProfile) -> tuple[Any, Any, Any, Any] | None:
    """(fixed µs, mem µs, comm µs, stream B/s) of a kernel the profile's kernel set has a measured law for
    (cost/laws.py), None otherwise. The law gives the time per launch in back-to-back graph replay, the launch
    gap included; the kernel's own duration is that less the gap, its bytes stream at eta BW (or as fast as
    that duration needs) and the rest is latency, or the exchange of a collective:

        duration = law - gap;  mem = min(duration, S / (eta BW));  fixed (or comm) = duration - mem"""
    if hw.kernel_set is None:
        return None
    law = law_us(kernel, hw.kernel_set, hw.sm_count, hw.l2_bytes)
    if law is None:
        return None
    duration = np.maximum(law - hw.launch_gap_us, hw.kernel_fixed_us)
    stream = hw.hbm_efficiency * hw.hbm_bandwidth
    mem = np.minimum(duration, kernel.hbm_bytes / stream * 1e6)
    stream = np.where(mem > 0, kernel.hbm_bytes / np.maximum(mem, 1e-12) * 1e6, stream)
    rest = duration - mem
    if kernel.family == "collective":
        return 0.0, mem, rest, stream
    return rest, mem, 0.0, stream


def kernel_terms(kernel: Kernel, hw: HardwareProfile) -> tuple[float, float, float, float, float]:
    """(launch µs, fixed + serial µs, math µs, comm µs, stream B/s): what the timeline needs, without a record."""
    _check_collective(kernel)
    measured = measured_terms(kernel, hw)
    if measured is not None:
        fixed, _, comm, stream = measured
        return launch_gap_us(kernel, hw), fixed, 0.0, comm, stream
    comm = collective_time_us(kernel.collective, hw) if kernel.collective else 0.0
    experts_us, math_us = grouped_gemm_terms(kernel, hw)
    if kernel.family == "gqa":  # its grid's tile chain, against its bytes as math is (cost/laws.py gqa)
        math_us = gqa_chain_us(kernel, hw.sm_count, hw.cta_bandwidth)
    return (launch_gap_us(kernel, hw), fixed_us(kernel, hw) + experts_us + serial_us(kernel, hw),
            math_us, comm, stream_bandwidth(kernel, hw))


def price_kernel(kernel: Kernel, hw: HardwareProfile) -> KernelCost:
    """The cost of `kernel` alone on `hw` (formulas in the module docstring; a kernel the profile's kernel set
    measured: its law, measured_terms)."""
    _check_collective(kernel)
    same = dict(key=kernel.key, name=kernel.name, kind=kernel.kind, launch_us=launch_gap_us(kernel, hw),
                bytes=kernel.hbm_bytes, flops=kernel.flops, comm_bytes=kernel.comm_bytes,
                peak_bandwidth=hw.hbm_bandwidth)
    measured = measured_terms(kernel, hw)
    if measured is not None:
        fixed, mem, comm, stream = (float(v) for v in measured)
        return KernelCost(**same, fixed_us=fixed, serial_us=0.0, mem_us=mem, math_us=0.0, comm_us=comm,
                          comm_alpha_us=comm if mem == 0 else 0.0, algorithm="measured" if comm else "",
                          stream_bandwidth=stream, measured=True)
    _, fixed, math_us, _, stream = kernel_terms(kernel, hw)
    serial = serial_us(kernel, hw)
    comm = collective_cost(kernel.collective, hw) if kernel.collective else None
    return KernelCost(**same, fixed_us=fixed - serial, serial_us=serial, mem_us=kernel.hbm_bytes / stream * 1e6,
                      math_us=math_us, comm_us=comm.time_us if comm else 0.0,
                      comm_alpha_us=comm.alpha_us if comm else 0.0, algorithm=comm.algorithm if comm else "",
                      stream_bandwidth=stream)


def _check_collective(kernel: Kernel) -> None:
    """A collective kind needs a `Collective`; other kinds must not carry one (a plan bug, not user input)."""
    if (kernel.kind in COLLECTIVE_KINDS) != (kernel.collective is not None):
        raise ValueError(f"kernel {kernel.key!r} of kind {kernel.kind!r} "
                         f"{'lacks' if kernel.collective is None else 'must not carry'} a collective")
