"""Alpha-beta cost of tensor-parallel collectives inside one NVLink domain.

Dimension legend: P ranks (TP degree), n bytes of each rank's input payload (an all-reduce of M decode
tokens of hidden D in bf16 has n = M x D x 2: 1 x 7168 x 2 = 14 KiB; 64 tokens = 0.88 MiB).
alpha is the fixed latency of one collective kernel (launch, flag setup, one exchange, barrier);
beta is the effective bus bandwidth per GPU (nccl-tests busbw convention).

    one-shot all-reduce   T = a1 + (P - 1) * n / b1          every rank pulls all P-1 peers' inputs
    two-shot all-reduce   T = a2 + 2 (P - 1) / P * n / b2    reduce-scatter, then all-gather
    ring all-reduce       T = a_r + 2 (P - 1) * a_step + 2 (P - 1) / P * n / b_r
    reduce-scatter        T = a1 + (P - 1) / P * n / b2      n = full input, output n / P
    all-gather            T = a1 + (P - 1) * n / b2          n = this rank's shard, output P * n

Choice (`choose_algorithm`): one-shot while n x P <= `one_shot_threshold_bytes`, else two-shot. That is
the rule FlashInfer / TRT-LLM's fused all-reduce uses (tokens x hidden x P x elem <= 1 MiB) and, with a
2 MiB bound, vLLM's custom all-reduce for P <= 8 (one-shot below 256 KB per rank at P = 8, below 512 KB
at P = 4; csrc/custom_all_reduce.cuh). Ring is NCCL's fallback, priced only when asked for by name.

Napkin (GB300, TP16, 1 token): one-shot 10.7 + 15 x 14 KiB / 690 GB/s = 10.7 + 0.3 us: latency-bound.
At 64 tokens (0.88 MiB): one-shot 10.7 + 19.9 = 30.6 us; two-shot 11.5 + 2.5 = 14.0 us (measured on
GB200 MNNVL: 32.7 and 15.0 us, tokenspeed PR #1234).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simulator.errors import UserError
from simulator.hardware import HardwareProfile
from simulator.plans.kernel import Collective, CollectiveOp

Algorithm = Literal["one_shot", "two_shot", "ring", "reduce_scatter", "all_gather", "none"]
ALL_REDUCE_ALGORITHMS = ("one_shot", "two_shot", "ring")


@dataclass(frozen=True, slots=True)
class CollectiveCost:
    """Time of one collective: `alpha_us` latency plus `transfer_us` of bytes over NVLink."""

    op: CollectiveOp
    algorithm: Algorithm
    nbytes: int
    ranks: int
    alpha_us: float
    transfer_us: float

    @property
    def time_us(self) -> float:
        return self.alpha_us + self.transfer_us

    @property
    def latency_bound(self) -> bool:
        return self.alpha_us >= self.transfer_us


def check_ranks(ranks: int, hw: HardwareProfile) -> None:
    """A TP group must fit inside one NVLink domain; beyond it the traffic would cross InfiniBand."""
    if ranks < 1:
        raise UserError(f"TP {ranks} is not a positive number of GPUs.")
    if ranks > hw.nvlink_domain:
        raise UserError(f"--tp {ranks} exceeds the {hw.nvlink_domain}-GPU NVLink domain of {hw.name}.")


def _us(nbytes: float, bandwidth: float) -> float:
    return nbytes / bandwidth * 1e6


def one_shot(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a1 + (P - 1) n / b1: one exchange, but each rank moves (P - 1) n bytes."""
    check_ranks(ranks, hw)
    return _cost("all_reduce", "one_shot", nbytes, ranks, hw.alpha_one_shot_us,
                 _us((ranks - 1) * nbytes, hw.beta_one_shot))


def two_shot(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a2 + 2 (P - 1) / P n / b2: bandwidth-optimal, nearly independent of P at large n."""
    check_ranks(ranks, hw)
    return _cost("all_reduce", "two_shot", nbytes, ranks, hw.alpha_two_shot_us,
                 _us(2 * (ranks - 1) / ranks * nbytes, hw.beta_two_shot))


def ring(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a_r + 2 (P - 1) a_step + 2 (P - 1) / P n / b_r (NCCL's latency model, src/graph/tuning.cc)."""
    check_ranks(ranks, hw)
    alpha = hw.alpha_ring_us + 2 * (ranks - 1) * hw.alpha_ring_step_us
    return _cost("all_reduce", "ring", nbytes, ranks, alpha,
                 _us(2 * (ranks - 1) / ranks * nbytes, hw.beta_ring))


def reduce_scatter(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a1 + (P - 1) / P n / b2: half a two-shot, one exchange."""
    check_ranks(ranks, hw)
    return _cost("reduce_scatter", "reduce_scatter", nbytes, ranks, hw.alpha_one_shot_us,
                 _us((ranks - 1) / ranks * nbytes, hw.beta_two_shot))


def all_gather(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a1 + (P - 1) n / b2 with n this rank's shard: the other half of a two-shot."""
    check_ranks(ranks, hw)
    return _cost("all_gather", "all_gather", nbytes, ranks, hw.alpha_one_shot_us,
                 _us((ranks - 1) * nbytes, hw.beta_two_shot))


def _cost(op: CollectiveOp, algorithm: Algorithm, nbytes: int, ranks: int, alpha: float,
          transfer: float) -> CollectiveCost:
    if ranks == 1:  # nothing to exchange: engines skip the kernel's work entirely
        return CollectiveCost(op, "none", nbytes, 1, 0.0, 0.0)
    return CollectiveCost(op, algorithm, nbytes, ranks, alpha, transfer)


def choose_algorithm(op: CollectiveOp, nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """The engine's choice: one-shot all-reduce while n x P <= threshold, else two-shot (see module doc)."""
    if op == "reduce_scatter":
        return reduce_scatter(nbytes, ranks, hw)
    if op == "all_gather":
        return all_gather(nbytes, ranks, hw)
    if op != "all_reduce":
        raise ValueError(f"unknown collective op {op!r}")
    if nbytes * ranks <= hw.one_shot_threshold_bytes:
        return one_shot(nbytes, ranks, hw)
    return two_shot(nbytes, ranks, hw)


def collective_cost(collective: Collective, hw: HardwareProfile,
                    algorithm: Algorithm | None = None) -> CollectiveCost:
    """Price a kernel's `Collective`: the engine's choice, or a named all-reduce algorithm."""
    if algorithm is None:
        cost = choose_algorithm(collective.op, collective.nbytes, collective.ranks, hw)
        if collective.in_kernel and cost.ranks > 1:  # rides inside a computing kernel: only the flag round trip
            return CollectiveCost(cost.op, cost.algorithm, cost.nbytes, cost.ranks, hw.alpha_in_kernel_us,
                                  cost.transfer_us)
        return cost
    if collective.op != "all_reduce" or algorithm not in ALL_REDUCE_ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} does not apply to {collective.op}")
    pick = {"one_shot": one_shot, "two_shot": two_shot, "ring": ring}[algorithm]
    return pick(collective.nbytes, collective.ranks, hw)


def min_alpha_us(op: CollectiveOp, ranks: int, hw: HardwareProfile) -> float:
    """The least latency any algorithm pays for one exchange: the speed-of-light floor's collective term."""
    if ranks <= 1:
        return 0.0
    ring_alpha = hw.alpha_ring_us + 2 * (ranks - 1) * hw.alpha_ring_step_us
    return min(hw.alpha_one_shot_us, hw.alpha_two_shot_us, ring_alpha, hw.alpha_in_kernel_us)
