"""Decode state of one layer for B sequences: what a step consumes and returns.

- KDA: recurrent state S [B, Nh, H, H] (FP32, S[i=key][j=value]) and the short-conv history
  [B, 3 Nh H, W-1] of the last W-1 pre-conv q, k, v inputs (channels: all q, then all k, then all v).
  Sharded by head under TP: rank r owns heads r Nh/P .. (r+1) Nh/P of S and of each q/k/v block.
- MLA: the latent cache [B, context + T, Lkv + R] (c_kv then k_pe; FP8 on the GPU), with room for
  this step's T tokens, and `lengths` [B] = tokens cached before the step. Replicated on every rank.

A state built by `initial_state` stands for `context` tokens already processed: random but O(1),
seeded, and already in its storage format (FP32 state, BF16 conv history, FP8 cache), so every
variant and the float64 reference start from exactly the same history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.config import ModelConfig
from simulator.dtypes import Array, round_bf16, round_fp8
from simulator.ops.experts import UNIFORM, RoutingStats

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


def initial_state(cfg: ModelConfig, attn_kind: str, shape: DecodeShape, rng: np.random.Generator) -> LayerState:
    b = shape.batch
    if attn_kind == "kda":
        nh, h, w = cfg.kda_heads, cfg.kda_head_dim, cfg.conv_size
        state = rng.standard_normal((b, nh, h, h)).astype(np.float32) * np.float32(0.3)  # [B, Nh, H, H]
        conv = round_bf16(rng.standard_normal((b, 3 * nh * h, w - 1)))  # [B, 3C, W-1]
        return {"kda.state": state.astype(np.float64), "kda.conv": conv}
    rows = shape.context + shape.tokens_per_seq
    cache = np.zeros((b, rows, cfg.kv_lora_rank + cfg.qk_rope_dim))  # [B, S, Lkv+R]
    cache[:, :shape.context] = round_fp8(rng.standard_normal((b, shape.context, cache.shape[-1])))
    return {"mla.cache": cache, "mla.lengths": np.full(b, shape.context, dtype=np.int64)}


def _qkv_blocks(conv: np.ndarray) -> list[np.ndarray]:
    return np.split(conv, 3, axis=1)  # q, k, v channel blocks


def shard_state(state: LayerState, tp: int) -> list[dict[str, Any]]:
    """Per-rank views of the state (copies, so ranks never alias one another)."""
    out: list[dict[str, Any]] = [{} for _ in range(tp)]
    for r in range(tp):
        if "kda.state" in state:
            s = state["kda.state"]
            n = s.shape[1] // tp
            out[r]["kda.state"] = s[:, r * n:(r + 1) * n].copy()
            blocks = _qkv_blocks(state["kda.conv"])
            c = blocks[0].shape[1] // tp
            out[r]["kda.conv"] = np.concatenate([blk[:, r * c:(r + 1) * c] for blk in blocks], axis=1)
        if "mla.cache" in state:
            out[r]["mla.cache"] = state["mla.cache"].copy()
            out[r]["mla.lengths"] = state["mla.lengths"].copy()
    return out


def unshard_state(rank_bufs: list[dict[str, Any]], like: LayerState, advance: int) -> LayerState:
    """Reassemble the full state from the ranks' buffers; the cache now holds `advance` more tokens."""
    new: LayerState = {}
    if "kda.state" in like:
        new["kda.state"] = np.concatenate([b["kda.state"] for b in rank_bufs], axis=1)
        per_rank = [_qkv_blocks(b["kda.conv"]) for b in rank_bufs]
        new["kda.conv"] = np.concatenate(
            [np.concatenate([blocks[i] for blocks in per_rank], axis=1) for i in range(3)], axis=1)
    if "mla.cache" in like:
        for b in rank_bufs[1:]:
            if not np.array_equal(b["mla.cache"], rank_bufs[0]["mla.cache"]):
                raise AssertionError("the replicated MLA cache differs between ranks")
        new["mla.cache"] = rank_bufs[0]["mla.cache"]
        new["mla.lengths"] = rank_bufs[0]["mla.lengths"] + advance
    return new
