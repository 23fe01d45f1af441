"""The plain pre-norm residual stream (DeepSeek-V3, Llama, ...): add the sublayer's output, then RMSNorm.

    residual = residual + delta;   x = RMSNorm(residual)            before attention (delta: the last MLP's output)
    residual = residual + attn;    x2 = RMSNorm(residual)           before the MLP

vLLM runs each pair as one `fused_add_rms_norm` kernel. A model with Block Attention Residuals (Kimi K3)
mixes over block snapshots instead (ops/norm.py); the model's config says which (`ModelConfig.residual`).
The residual is the `prefix` buffer of the layer's stream, so both structures share the executor's buffers.

Dimension legend: M tokens, D hidden.
"""

from __future__ import annotations

from typing import Callable

from simulator.dtypes import Array
from simulator.ops.collectives import all_reduce_one_shot
from simulator.ops.norm import rms_norm


def add_rms_norm(residual: Array, delta: Array, norm_w: Array, *, eps: float) -> tuple[Array, Array]:
    """residual += delta; x = RMSNorm(residual).   [M, D], [M, D] -> residual [M, D], x [M, D]"""
    residual = residual + delta
    return residual, rms_norm(residual, norm_w, eps)


def add_rms_norm_post(residual: Array, attn_out: Array, norm_w: Array, *, eps: float,
                      store: Callable[[Array], Array]) -> tuple[Array, Array]:
    """residual += attention output (stored in bf16, and the norm reads the stored value); x2 = RMSNorm."""
    residual = store(residual + attn_out)
    return residual, rms_norm(residual, norm_w, eps)


def oproj_allreduce_add_norm(cores: list[Array], residuals: list[Array], w_o: list[Array], norm_w: list[Array],
                             *bias: list[Array], eps: float, store: Callable[[Array], Array],
                             ) -> tuple[list[Array], list[Array]]:
    """All ranks: partial_r = core_r @ W_o shard (+ o_proj's bias: rank 0's, zeros elsewhere); one-shot FP32
    all-reduce; then `add_rms_norm_post` on the sum."""
    partials = [c @ w for c, w in zip(cores, w_o)]  # P x [M, D]
    if bias:
        partials = [p + b.astype(p.dtype) for p, b in zip(partials, bias[0])]
    outs = [add_rms_norm_post(r, total, n, eps=eps, store=store)
            for r, total, n in zip(residuals, all_reduce_one_shot(partials), norm_w)]
    return [o[0] for o in outs], [o[1] for o in outs]
