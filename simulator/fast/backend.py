"""The fast backend: what the executor does differently for `run_plan(..., backend="fast")`.

- the ops' compiled replacements run in their place (`REPLACEMENTS`, fast/replacements.py);
- a kernel that only multiplies by its bf16 weight gets the held bits (`packed.BF16Weight`: 2 B a weight
  read once) instead of a float copy, and the routed experts come as packed MXFP4 views
  (`experts.PackedExperts`: 0.53 B a weight, no float copy);
- a routed-expert kernel runs expert-major: the touched experts stream a chunk at a time, every rank runs its
  groups of a chunk before the next is drawn (`experts.run_streamed`).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from simulator.fast.experts import PackedExperts, run_streamed
from simulator.plans.fuse import Chain
from simulator.fast.packed import BF16Weight
from simulator.fast.replacements import REPLACEMENTS
from simulator.plans.kernel import EXPERT, Kernel
from simulator.weights import LayerWeights

MATMUL_ONLY_KINDS = ("gemm", "gemm_collective", "router")  # kinds whose 2-D weights their op only multiplies by


class FastBackend:
    """Compiled replacements, packed weights, streamed experts (module docstring): the members the executor calls
    (`execute.make_backend`), which imports this module only when asked for it."""

    name = "fast"
    replacements = REPLACEMENTS

    def matmul_weight(self, kind: str, held: list[np.ndarray], axis: int, dtype: type) -> Any | None:
        """bf16 matrices side by side (or one) for a kernel that only multiplies by them: `x @ W` reads the bits."""
        if kind in MATMUL_ONLY_KINDS and all(h.ndim == 2 and h.dtype == ml_dtypes.bfloat16 for h in held) \
                and (len(held) == 1 or axis in (1, -1)):
            return BF16Weight(tuple(h.view(np.uint16) for h in held), np.dtype(dtype))
        return None

    def experts(self, weights: LayerWeights, names: tuple[str, ...], shards: tuple[str, ...], rank: Any) -> Any:
        return PackedExperts(weights.expert_part, names, shards, rank.r, rank.tp) if weights.packs_experts else None

    def run_ranks(self, kernel: Kernel, ranks: list[Any], weights: LayerWeights, args: list[list[Any]],
                  consts: dict[str, Any]) -> list[Any]:
        """A routed-expert op streamed over the touched experts' chunks on all ranks; any other op once a rank."""
        parts, op = routed_parts(kernel), self.replacements.get(kernel.op, kernel.op)
        if not parts or not streams(op):  # streams: the routed-expert ops of fast/experts.py, and fused chains of them
            return [kernel.op(*a, **consts) for a in args]
        idx = [ranks[0].buf[t.name] for t in kernel.reads if t.dtype == "int32"]  # topk.idx, the same on every rank
        touched = np.unique(idx[0]) if idx else np.empty(0, np.int64)
        return run_streamed(op, args, consts, weights.stream_experts(touched, parts))


def streams(op: Any) -> bool:
    """Whether `op` continues its output over chunks of experts (`only` / `out`): a routed-expert op of
    fast/experts.py, or a fused kernel (plans/fuse.py) whose every part is one, so re-running it on each chunk
    redoes no other work (the persistent FC1 + FC2 experts kernel)."""
    return hasattr(op, "over_ranks") or (isinstance(op, Chain) and all(p.routed for p in op.parts))


def routed_parts(kernel: Kernel) -> list[str]:
    """The routed-expert parts ("w_gate", ...) a kernel's weights declare; none for other kernels."""
    return [name[len(EXPERT):] for t in kernel.weights for name, _ in (t.parts or ((t.name, "full"),))
            if name.startswith(EXPERT)]
