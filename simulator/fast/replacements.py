"""The fast backend's table: each op of simulator/ops that has a compiled form, and that form.

    ops.norm.rms_norm                  kernels.rms_norm: one pass per row (float32 / float64 x)
    ops.norm.attn_res_mix              kernels.attn_res_mix: each source row read once for its rms, score and sum
    ops.router.top_order               kernels.topk_order: insertion into the first n, no [M, E] sort
    ops.kda.kda_decode_fused           fast/kda.py: one compiled program per (sequence, head), as the GPU grid
    ops.experts.expert_fc1             fast/experts.py: packed experts streamed a chunk at a time, every rank's
    ops.experts.expert_fc2             groups in one compiled call (`packed.grouped_matmul`) where the experts
    ops.experts.expert_fc2_finalize    are packed; the adds of the finalize in one compiled pass

The executor runs a plan with `REPLACEMENTS` in force on `backend="fast"` (ops/replaceable.py). Each
replacement computes its op's function to rounding (top_order exactly): tests/test_replacements.py runs
every entry against its op.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from simulator.dtypes import Array
from simulator.fast import experts, kda, kernels
from simulator.ops import experts as expert_ops
from simulator.ops import kda as kda_ops
from simulator.ops import norm, router


def rms_norm(x: Array, w: Array, eps: float) -> Array:
    """`kernels.rms_norm` for float32 / float64 x; the op's NumPy form for other dtypes."""
    if x.dtype in (np.float32, np.float64):
        return kernels.rms_norm(x, w, eps)
    return norm.rms_norm.__wrapped__(x, w, eps)


def attn_res_mix(sources: list[Array], norm_w: Array, proj_w: Array, eps: float) -> Array:
    """`kernels.attn_res_mix` for float32 / float64 sources; the op's NumPy form for other dtypes."""
    if sources[0].dtype in (np.float32, np.float64):
        return kernels.attn_res_mix(sources, norm_w, proj_w, eps)
    return norm.attn_res_mix.__wrapped__(sources, norm_w, proj_w, eps)


REPLACEMENTS: dict[Callable[..., Any], Callable[..., Any]] = {
    norm.rms_norm: rms_norm,
    norm.attn_res_mix: attn_res_mix,
    router.top_order: kernels.topk_order,
    kda_ops.kda_decode_fused: kda.kda_decode_fused,
    expert_ops.expert_fc1: experts.expert_fc1,
    expert_ops.expert_fc2: experts.expert_fc2,
    expert_ops.expert_fc2_finalize: experts.expert_fc2_finalize,
}
