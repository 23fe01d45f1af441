"""Decode state of one layer for B sequences: what a step consumes and returns.

Each attention kind's registry entry (simulator/attention/<kind>.py) says what its state holds and how TP
shards it: KDA a recurrent state and a short-conv history, sharded by head; MLA a latent cache, replicated.

A state built by `simulator.attention.initial_state` stands for `context` tokens already processed: random but O(1),
seeded, and already in its storage format (FP32 state, BF16 conv history, FP8 cache), so every
variant and the float64 reference start from exactly the same history.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.config import ModelConfig
from simulator.dtypes import Array
from simulator.routing import UNIFORM, RoutingStats

LayerState = dict[str, np.ndarray]


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


@dataclass
class LayerIO:
    """The residual stream entering or leaving a layer: prefix, pending MLP output, block snapshots."""

    prefix: Array  # [M, D]
    delta: Array  # [M, D] previous layer's MLP output, added by this layer's first kernel
    blocks: list[Array]  # n x [M, D]


def blocks_before(cfg: ModelConfig, layer: int) -> int:
    """AttnRes block snapshots that exist before `layer` (taken at layers 0, b, 2b, ... < layer)."""
    b = cfg.attn_res_block
    return 0 if b == 0 else -(-layer // b)


def block_boundary(cfg: ModelConfig, layer: int) -> bool:
    """Whether `layer` pushes the prefix as a new snapshot (and resets it) before its attention."""
    b = cfg.attn_res_block
    return b > 0 and layer % b == 0
