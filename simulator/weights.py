"""Deterministic seeded weights for one decoder layer, generated lazily, and TP sharding helpers.

Every tensor is drawn from its own stream, `SeedSequence([seed, layer, crc32(name)])`, so a tensor's
values do not depend on which other tensors were generated first. That is what lets the routed
experts be lazy: a full-size Kimi K3 layer at batch 1 generates only the k selected experts
(16 x 17.5 MB in MXFP4 instead of 896 of them).

Scaling keeps activations O(1) (STYLE item 13): a linear `[in, out]` is N(0, 1/in); norm weights
are 1 + N(0, 0.1^2); AttnRes projections are N(0, 1/D). Weights are rounded to their checkpoint
format (bf16 everywhere, MXFP4 or FP8 routed experts) and held in float32 containers.

Layout: activations are rows, weights are `[in, out]`, so y = x @ w. Column-parallel shards split
`out` (w[:, r*out/P:(r+1)*out/P]); row-parallel shards split `in`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from simulator.config import ModelConfig
from simulator.dtypes import Array, round_bf16, round_fp8, round_mxfp4


def _rng(seed: int, layer: int, name: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, layer, zlib.crc32(name.encode())]))


def _normal(seed: int, layer: int, name: str, shape: tuple[int, ...], std: float) -> Array:
    return _rng(seed, layer, name).standard_normal(shape, dtype=np.float32) * np.float32(std)


def _quantize(w: Array, fmt: str) -> Array:
    if fmt == "mxfp4":  # blocks of 32 run along the reduction (input) dimension: quantize w^T
        return np.ascontiguousarray(round_mxfp4(np.ascontiguousarray(w.T)).T)
    if fmt == "fp8":
        return round_fp8(w)
    return round_bf16(w)


@dataclass
class LayerWeights:
    """All weights of one layer, full (unsharded) size, created on first access and then cached."""

    cfg: ModelConfig
    layer: int
    seed: int
    _cache: dict[str, Array] = field(default_factory=dict, repr=False)

    def __getitem__(self, name: str) -> Array:
        if name not in self._cache:
            self._cache[name] = self._make(name)
        return self._cache[name]

    def get(self, name: str, dtype: type) -> Array:
        """The weight converted to a compute dtype, converted once and cached: P simulated ranks and the
        reference then share one float64 copy instead of making one each."""
        base = self[name]
        if base.dtype == dtype:
            return base
        key = f"{name}@{np.dtype(dtype).name}"
        if key not in self._cache:
            self._cache[key] = base.astype(dtype)
        return self._cache[key]

    def expert(self, e: int, dtype: type = np.float32) -> tuple[Array, Array, Array]:
        """Routed expert e: (w_gate [Din, F], w_up [Din, F], w_down [F, Din]) in its checkpoint format."""
        return tuple(self.get(f"expert.{e}.{part}", dtype) for part in ("w_gate", "w_up", "w_down"))

    def _make(self, name: str) -> Array:
        shape, kind = weight_spec(self.cfg, name)
        d = self.cfg.hidden_size
        if kind == "norm":
            w = 1.0 + _normal(self.seed, self.layer, name, shape, 0.1)
        elif kind == "res_proj":
            w = _normal(self.seed, self.layer, name, shape, d ** -0.5)
        elif kind == "conv":
            w = _normal(self.seed, self.layer, name, shape, shape[-1] ** -0.5)
        elif kind == "dt_bias":
            w = _normal(self.seed, self.layer, name, shape, 0.5)
        elif kind == "a_log":  # exp(A_log) in [1, 16]: gates neither saturated nor flat
            w = np.log(_rng(self.seed, self.layer, name).uniform(1.0, 16.0, shape)).astype(np.float32)
            return w  # FP32 in the checkpoint
        elif kind == "bias":
            w = _normal(self.seed, self.layer, name, shape, 0.05)
            return w  # FP32 correction bias
        else:
            w = _normal(self.seed, self.layer, name, shape, shape[0] ** -0.5)
        return _quantize(w, self.cfg.expert_dtype if kind == "expert" else "bf16")


def weight_spec(cfg: ModelConfig, name: str) -> tuple[tuple[int, ...], str]:
    """Full shape and init kind of a named weight (the single table of weight names)."""
    f_in = cfg.expert_in_dim
    if name.startswith("expert."):
        _, _, part = name.split(".")
        shape = (cfg.moe_intermediate, f_in) if part == "w_down" else (f_in, cfg.moe_intermediate)
        return shape, "expert"
    table = weight_table(cfg)
    if name not in table:
        raise KeyError(f"unknown weight '{name}'")
    return table[name]


def weight_table(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (full shape, init kind) of every non-expert weight a layer may hold."""
    d = cfg.hidden_size
    n, h = cfg.mla_heads, cfg.v_head_dim
    kn, kh, w = cfg.kda_heads, cfg.kda_head_dim, cfg.conv_size
    return {
        # residual stream
        "attn_res_norm": ((d,), "norm"), "attn_res_proj": ((d,), "res_proj"),
        "mlp_res_norm": ((d,), "norm"), "mlp_res_proj": ((d,), "res_proj"),
        "input_norm": ((d,), "norm"), "post_attn_norm": ((d,), "norm"),
        # MLA
        "mla.w_qa": ((d, cfg.q_lora_rank), "linear"),
        "mla.w_kva": ((d, cfg.kv_lora_rank + cfg.qk_rope_dim), "linear"),
        "mla.q_a_norm": ((cfg.q_lora_rank,), "norm"), "mla.kv_a_norm": ((cfg.kv_lora_rank,), "norm"),
        "mla.w_qb": ((cfg.q_lora_rank, n * cfg.mla_qk_head_dim), "linear"),
        "mla.w_uk": ((cfg.kv_lora_rank, n * cfg.qk_nope_dim), "linear"),
        "mla.w_uv": ((cfg.kv_lora_rank, n * h), "linear"),
        "mla.w_g": ((d, n * h), "linear"), "mla.w_o": ((n * h, d), "linear"),
        # KDA
        "kda.w_q": ((d, kn * kh), "linear"), "kda.w_k": ((d, kn * kh), "linear"),
        "kda.w_v": ((d, kn * kh), "linear"), "kda.w_g": ((d, kn * kh), "linear"),
        "kda.w_fa": ((d, kh), "linear"), "kda.w_fb": ((kh, kn * kh), "linear"),
        "kda.w_b": ((d, kn), "linear"),
        "kda.conv_q": ((kn * kh, w), "conv"), "kda.conv_k": ((kn * kh, w), "conv"),
        "kda.conv_v": ((kn * kh, w), "conv"),
        "kda.dt_bias": ((kn * kh,), "dt_bias"), "kda.a_log": ((kn,), "a_log"),
        "kda.o_norm": ((kh,), "norm"), "kda.w_o": ((kn * kh, d), "linear"),
        # MoE
        "router.w": ((d, cfg.num_experts), "linear"), "router.bias": ((cfg.num_experts,), "bias"),
        "latent.w_down": ((d, cfg.latent_dim), "linear"), "latent.norm": ((cfg.latent_dim,), "norm"),
        "latent.w_up": ((cfg.latent_dim, d), "linear"),
        "shared.w_gate": ((d, cfg.shared_intermediate), "linear"),
        "shared.w_up": ((d, cfg.shared_intermediate), "linear"),
        "shared.w_down": ((cfg.shared_intermediate, d), "linear"),
        # dense FFN
        "dense.w_gate": ((d, cfg.dense_intermediate), "linear"),
        "dense.w_up": ((d, cfg.dense_intermediate), "linear"),
        "dense.w_down": ((cfg.dense_intermediate, d), "linear"),
    }


def model_weight_table(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (full shape, TP layout) of the weights outside the decoder layers: the vocab-parallel
    embedding (rows split by vocab) and LM head (columns split by vocab). The executor simulates one
    layer, so only the cost model reads these."""
    v, d = cfg.vocab_size, cfg.hidden_size
    return {"embed": ((v, d), "row"), "lm_head": ((d, v), "col")}


def shard_shape(shape: tuple[int, ...], shard: str, tp: int) -> tuple[int, ...]:
    """Per-rank shape of a weight under `shard`: "col" splits the last axis, "row" the first, "full" none."""
    if shard == "col":
        return shape[:-1] + (shape[-1] // tp,)
    if shard == "row":
        return (shape[0] // tp,) + shape[1:]
    return shape


# ---------------------------------------------------------------------------------------
# tensor-parallel sharding (views, no copies)
# ---------------------------------------------------------------------------------------

def column_shard(w: Array, rank: int, tp: int) -> Array:
    """Output columns of rank r: w[..., r*out/P:(r+1)*out/P]  ->  [in, out/P]."""
    n = w.shape[-1] // tp
    return w[..., rank * n:(rank + 1) * n]


def row_shard(w: Array, rank: int, tp: int) -> Array:
    """Input rows of rank r: w[r*in/P:(r+1)*in/P]  ->  [in/P, ...]."""
    n = w.shape[0] // tp
    return w[rank * n:(rank + 1) * n]
