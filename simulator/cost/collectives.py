"""Alpha-beta cost of tensor-parallel collectives inside one NVLink domain.

Dimension legend: P ranks (TP degree), n bytes of each rank's input payload (an all-reduce of M decode
tokens of hidden D in bf16 has n = M x D x 2: 1 x 7168 x 2 = 14 KiB; 64 tokens = 0.88 MiB).
alpha is the fixed latency of one collective kernel (launch, flag setup, one exchange, barrier);
beta is the effective bus bandwidth per GPU (nccl-tests busbw convention).

    one-shot all-reduce   T = a1(P) + (P - 1) * n / b1       every rank pulls all P-1 peers' inputs
    two-shot all-reduce   T = a2(P) + 2 (P - 1) / P * n / b2 reduce-scatter, then all-gather
    NVLS all-reduce       T = a_nvls(P) + n / b_nvls         NVLink SHARP (multimem): the switch reduces
    ring all-reduce       T = a_r + 2 (P - 1) * a_step + 2 (P - 1) / P * n / b_r
    reduce-scatter        T = a1(P) + (P - 1) / P * n / b2   n = full input, output n / P
    all-gather            T = a1(P) + (P - 1) * n / b2       n = this rank's shard, output P * n

    a(P) = a x (1 + g log2(P / 8))   alphas are quoted at P = 8; g = `alpha_growth_per_doubling`

The alpha of a flag-based collective grows with the ranks it waits on: sglang PR #2904's custom all-reduce
on H100 takes 3.7 / 4.8 / 5.9 µs at P = 2 / 4 / 8 (512 B), 1.1 µs or 19 % of the P = 8 value per doubling
(a run without CUDA graphs: the level is off, the slope is what is used). NVLS: each rank sends its n
bytes once into the NVSwitch, which reduces them, and receives the reduced n once (multimem.ld_reduce +
multimem.st; vLLM on GB300 all-reduces this way through torch symmetric memory, PR #37756), half the
bytes of a two-shot.

Choice (`choose_algorithm`): the cheaper of the modelled one-shot and two-shot. Engines switch by a size
rule instead (FlashInfer / TRT-LLM: one-shot while tokens x hidden x P x elem <= 1 MiB; vLLM's custom
all-reduce: below 256 KB per rank at P = 8), but those rules were tuned for those engines' own kernels,
while the alphas and betas here come from several implementations: a rule applied to constants it was not
tuned with picks, for some sizes, the algorithm the model itself prices slower (the audit found 11 batch
sizes on GB300 TP16 and 13 on H200 TP8). The cheaper of the two never contradicts the model's own prices,
and where the constants match an engine's kernels it is what a tuned rule picks. Ring is NCCL's fallback,
priced only when asked for by name.

An exchange done inside a computing kernel (`Collective.in_kernel`: the specialized plan's fused o_proj +
all-reduce + norm, router gather, latent tail) is a push through symmetric memory from the kernel's
epilogue, whatever its size, so it is priced as that push, not as whichever standalone algorithm would be
cheaper: the flag round trip `alpha_in_kernel` plus, for an all-reduce, a multimem reduction store (each
rank sends its n bytes once into the NVSwitch, which adds them into every rank's copy: the NVLS transfer
n / b_nvls; vLLM's GB300 path all-reduces through multimem, PR #37756), and for an all-gather its own
transfer. (The audit found the old rule pricing these as a two-shot above 1 MiB; a one-shot Lamport push
would move (P - 1) n: 19.9 µs at GB300 TP16 and 64 tokens.)

Napkin (GB200 MNNVL constants, TP16 so a(16) = 1.19 a): one token, one-shot 12.7 + 15 x 14 KiB /
690 GB/s = 12.7 + 0.3 us: latency-bound. At 64 tokens (0.88 MiB): one-shot 12.7 + 19.9 = 32.6 us;
two-shot 13.7 + 2.5 = 16.2 us (measured on GB200 MNNVL: 32.7 and 15.0 us, tokenspeed PR #1234).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from simulator.errors import UserError
from simulator.hardware import HardwareProfile
from simulator.plans.kernel import Collective, CollectiveOp

Algorithm = Literal["one_shot", "two_shot", "nvls", "ring", "reduce_scatter", "all_gather", "none"]
ALL_REDUCE_ALGORITHMS = ("one_shot", "two_shot", "nvls", "ring")
REFERENCE_RANKS = 8  # the P at which the profiles quote their alphas


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


def alpha_at(alpha_us: float, ranks: int, hw: HardwareProfile) -> float:
    """a(P) = a (1 + g log2(P / 8)): a profile's alpha, quoted at P = 8, at P ranks (module doc)."""
    return alpha_us * (1.0 + hw.alpha_growth_per_doubling * math.log2(max(ranks, 1) / REFERENCE_RANKS))


def one_shot(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a1(P) + (P - 1) n / b1: one exchange, but each rank moves (P - 1) n bytes."""
    check_ranks(ranks, hw)
    return _cost("all_reduce", "one_shot", nbytes, ranks, alpha_at(hw.alpha_one_shot_us, ranks, hw),
                 _us((ranks - 1) * nbytes, hw.beta_one_shot))


def two_shot(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a2(P) + 2 (P - 1) / P n / b2: bandwidth-optimal, nearly independent of P at large n."""
    check_ranks(ranks, hw)
    return _cost("all_reduce", "two_shot", nbytes, ranks, alpha_at(hw.alpha_two_shot_us, ranks, hw),
                 _us(2 * (ranks - 1) / ranks * nbytes, hw.beta_two_shot))


def nvls(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a_nvls(P) + n / b_nvls: NVLink SHARP, the switch reduces; each rank sends and receives n once."""
    check_ranks(ranks, hw)
    return _cost("all_reduce", "nvls", nbytes, ranks, alpha_at(hw.alpha_nvls_us, ranks, hw), _us(nbytes, hw.beta_nvls))


def ring(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a_r + 2 (P - 1) a_step + 2 (P - 1) / P n / b_r (NCCL's latency model, src/graph/tuning.cc)."""
    check_ranks(ranks, hw)
    alpha = hw.alpha_ring_us + 2 * (ranks - 1) * hw.alpha_ring_step_us
    return _cost("all_reduce", "ring", nbytes, ranks, alpha,
                 _us(2 * (ranks - 1) / ranks * nbytes, hw.beta_ring))


def reduce_scatter(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a1 + (P - 1) / P n / b2: half a two-shot, one exchange."""
    check_ranks(ranks, hw)
    return _cost("reduce_scatter", "reduce_scatter", nbytes, ranks, alpha_at(hw.alpha_one_shot_us, ranks, hw),
                 _us((ranks - 1) / ranks * nbytes, hw.beta_two_shot))


def all_gather(nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """T = a1 + (P - 1) n / b2 with n this rank's shard: the other half of a two-shot."""
    check_ranks(ranks, hw)
    return _cost("all_gather", "all_gather", nbytes, ranks, alpha_at(hw.alpha_one_shot_us, ranks, hw),
                 _us((ranks - 1) * nbytes, hw.beta_two_shot))


def _cost(op: CollectiveOp, algorithm: Algorithm, nbytes: int, ranks: int, alpha: float,
          transfer: float) -> CollectiveCost:
    if ranks == 1:  # nothing to exchange: engines skip the kernel's work entirely
        return CollectiveCost(op, "none", nbytes, 1, 0.0, 0.0)
    return CollectiveCost(op, algorithm, nbytes, ranks, alpha, transfer)


def choose_algorithm(op: CollectiveOp, nbytes: int, ranks: int, hw: HardwareProfile,
                     algorithms: tuple[str, ...] = ()) -> CollectiveCost:
    """The standalone collective: for an all-reduce the cheapest of one-shot, two-shot and NVLS, or of the
    `algorithms` the launching library picks among (FlashInfer's MNNVL all-reduce: one- or two-shot)."""
    if op == "reduce_scatter":
        return reduce_scatter(nbytes, ranks, hw)
    if op == "all_gather":
        return all_gather(nbytes, ranks, hw)
    if op != "all_reduce":
        raise ValueError(f"unknown collective op {op!r}")
    picks = {"one_shot": one_shot, "two_shot": two_shot, "nvls": nvls}
    return min((f(nbytes, ranks, hw) for name, f in picks.items() if name in (algorithms or picks)),
               key=lambda c: c.time_us)


def in_kernel(op: CollectiveOp, nbytes: int, ranks: int, hw: HardwareProfile) -> CollectiveCost:
    """An exchange inside a computing kernel: the flag round trip plus the transfer of the push it executes
    (a multimem reduction store for an all-reduce, its own transfer for an all-gather; module doc)."""
    executed = {"all_reduce": nvls, "all_gather": all_gather, "reduce_scatter": reduce_scatter}[op]
    cost = executed(nbytes, ranks, hw)
    if cost.ranks <= 1:
        return cost
    return CollectiveCost(cost.op, cost.algorithm, cost.nbytes, cost.ranks, alpha_at(hw.alpha_in_kernel_us, ranks, hw),
                          cost.transfer_us)


def collective_cost(collective: Collective, hw: HardwareProfile,
                    algorithm: Algorithm | None = None) -> CollectiveCost:
    """Price a kernel's `Collective`: in-kernel as executed, standalone the cheaper algorithm, or one named."""
    if algorithm is None:
        if collective.in_kernel:
            return in_kernel(collective.op, collective.nbytes, collective.ranks, hw)
        return choose_algorithm(collective.op, collective.nbytes, collective.ranks, hw, collective.algorithms)
    if collective.op != "all_reduce" or algorithm not in ALL_REDUCE_ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} does not apply to {collective.op}")
    pick = {"one_shot": one_shot, "two_shot": two_shot, "nvls": nvls, "ring": ring}[algorithm]
    return pick(collective.nbytes, collective.ranks, hw)


def collective_time_us(collective: Collective, hw: HardwareProfile) -> Any:
    """`collective_cost(collective, hw).time_us` without the record, so that it also holds when the profile's
    constants are arrays of draws (cost/uncertainty.py): the cheapest all-reduce is then a minimum per draw."""
    if collective.op == "all_reduce" and not collective.in_kernel:
        n, p, allowed = collective.nbytes, collective.ranks, collective.algorithms or ("one_shot", "two_shot", "nvls")
        times = [f(n, p, hw).time_us for name, f in (("one_shot", one_shot), ("two_shot", two_shot), ("nvls", nvls))
                 if name in allowed]
        best = times[0]
        for t in times[1:]:
            best = np.minimum(best, t)
        return best
    return collective_cost(collective, hw).time_us


def min_alpha_us(op: CollectiveOp, ranks: int, hw: HardwareProfile) -> float:
    """The least latency any algorithm pays for one exchange: the speed-of-light floor's collective term."""
    if ranks <= 1:
        return 0.0
    ring_alpha = hw.alpha_ring_us + 2 * (ranks - 1) * hw.alpha_ring_step_us
    alphas = (hw.alpha_one_shot_us, hw.alpha_two_shot_us, hw.alpha_nvls_us, hw.alpha_in_kernel_us)
    return min(ring_alpha, *(alpha_at(a, ranks, hw) for a in alphas))
