"""The routed experts' FC1 as Hopper's Triton fused_moe and Marlin MoE run it (moe/fused.py's sm90 kernels):
the gate+up grouped GEMM alone, its product written for the activation launch that follows (vLLM 0.33.0
fused_moe.py fused_experts_impl -> activation.py apply_moe_activation; the activation's op is experts.glu_product).

    gate_up   [M, Din] -> [M, k, 2F/P] = [gate | up] per (token, slot), each row by its expert's shard
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from simulator.dtypes import Array
from simulator.ops.experts import ExpertFn, _groups, _scatter, bias_rows


def expert_gate_up(z: Array, topk_idx: npt.NDArray[np.int64], expert: ExpertFn, *bias: Array) -> Array:
    """expert_fc1 without its activation: expert(e) = (w_gate, w_up); `bias` [E, 2F/P] as in expert_fc1."""
    groups = list(_groups(topk_idx))
    gu = np.concatenate([np.concatenate([z[rows] @ w for w in expert(e)], axis=1) for e, rows, _ in groups])
    if bias:
        gu += bias_rows(bias[0], groups, gu.dtype)
    return _scatter(gu, groups, topk_idx.shape, z.dtype)
