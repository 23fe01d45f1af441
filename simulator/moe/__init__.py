"""MoE paths as a registry: one entry per way vLLM runs a layer's routed experts, one module per entry.

    latent  Kimi K3's latent MoE up to 128 tokens on Blackwell: TRT-LLM-gen experts and the tier-0 latent tail
            (standard), PreparedMoE's launches (specialized)                                        latent.py
    ogs     gpt-oss's MXFP4 experts on Hopper and ROCm: triton_kernels' matmul_ogs (the standard plan only)  ogs.py
    fused   every other MoE layer: vLLM's FusedMoE launches and the specialized plan's fusions of them   fused.py

An entry (`MoEPath`) says which layers it takes and holds its kernels in each plan, from the MLP input `x2` to the
layer's output `moe_out`, so the plans look the path up instead of branching on the model. The kernels the paths
share (router, top-k, FC1 / FC2, the gated MLP, the split router, the fused latent tail) are plans/moe_kernels.py's.
Adding a path: its module here and its entry in PATHS, before `fused`, which takes every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from simulator.moe import fused, latent, ogs
from simulator.plans.common import Dims


@dataclass(frozen=True)
class MoEPath:
    """One MoE path: the layers it takes and its kernels in each plan."""

    name: str
    takes: Callable[[Dims, str], bool]  # (d, arch): whether the layer's MoE runs this path on arch (standard.arch_of)
    standard: Callable[..., list]  # (d, c1, arch) -> the standard plan's kernels (c1: the stock C=1 launch)
    # (d, on, go, x2_from) -> the specialized plan's (the fusions on, the launches, the key of the kernel writing x2);
    # None: the path is not Blackwell's, where the specialized plan runs
    specialized: Callable[..., list] | None = None


PATHS: dict[str, MoEPath] = {  # in the order they are tried
    "latent": MoEPath("latent", latent.takes, latent.standard, latent.specialized),
    "ogs": MoEPath("ogs", ogs.takes, ogs.standard),
    "fused": MoEPath("fused", fused.takes, fused.standard, fused.specialized),
}


def moe_path(d: Dims, arch: str) -> MoEPath:
    """The path the MoE of the layer `d` describes runs on `arch` ("sm100" for the specialized plan)."""
    return next(p for p in PATHS.values() if p.takes(d, arch))
