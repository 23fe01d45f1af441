"""Does one decode step fit? Bytes per GPU under TP: weights + each attention kind's cache or state + activations.

    weights     = (sharded weights) / P + replicated weights       as each layer type's plan declares them
    mla_cache   = B x (context + T) x (Lkv + R) x 1 B x n_mla      FP8 latent, replicated on every rank
    kda_state   = B x n_kda x [(Nh/P) H H x 4 B + 3 (Nh/P) H (W-1) x 2 B]   FP32 state + BF16 conv history
    activations = M x [2 B x D x (blocks + 3) + widest per-rank intermediate]

Each cache or state term is its attention kind's registry entry's `memory` (simulator/attention/<kind>.py),
per layer, times the model's layers of that kind; its key names the part in every answer.

Replicated on every rank in the stock layout (docs/sources.md §K1h): the router, the latent down /
up projections and the MLA q_a / kv_a projection. Kimi K3 comes to 1.56 TB in all, 205 GB per GPU at
TP8 (1.56 TB / 8 plus the replicated weights): more than an H200 (141 GB), B200 (180 GB) or GB200 (186 GB) holds, so
TP8 on those needs pipeline
parallelism; the CLI still prices the TP8 layer (with a warning), a sweep skips the point.

The cache and the state grow with the batch and the context and soon dominate: absorbed MLA keeps one
576-element latent per token per MLA layer (512 c_kv + 64 k_pe, FP8 in vLLM's `--kv-cache-dtype fp8`,
docs/sources.md §K1b), and every rank holds all of it because every rank's heads attend to the same
latent. Kimi K3 at TP8, batch 64, context 131,072: 64 x 131,073 x 576 B x 24 layers = 116 GB per GPU.
KDA's state is fixed-size per sequence: 96/8 heads x 128 x 128 x 4 B = 0.75 MiB per layer (docs/sources.md §K1c).

Activations are modest: per token the residual stream and its AttnRes block snapshots in BF16, plus the
widest intermediate one rank holds at once (the gathered expert rows and their gate/up output, the dense
FFN's gate/up, or FP32 logits over V/P); about 0.3 MB per token for K3 at TP8. Not counted: the
framework's workspace (CUDA graphs, NCCL buffers, allocator slack; vLLM reserves 10 % by default with
gpu_memory_utilization = 0.9) and the drafter's weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from simulator import attention
from simulator.config import ModelConfig
from simulator.cost.step import build_plan
from simulator.plans.kernel import EXPERT, DecodeShape, Tensor
from simulator.weights import model_weight_table, shard_shape, weight_spec


@lru_cache(maxsize=256)
def weight_bytes_per_gpu(cfg: ModelConfig, tp: int) -> int:
    """Every weight one GPU holds, from the weight specification (`weights.weight_table`: full shapes)
    sharded the way the standard plan declares it (column, row or replicated; norms and FP32 biases
    included), x each layer type's count; all E routed experts resident, each sharded F/P in its
    checkpoint format; the vocab-sharded embedding and LM head (`weights.model_weight_table`).
    So the capacity check and the bytes every kernel loads come from one truth.
    """
    total = 0
    for layer_type, count in cfg.layer_counts().items():
        if count:
            total += count * _layer_weight_bytes(cfg, tp, layer_type)
    for shape, shard in model_weight_table(cfg).values():
        total += Tensor("w", shard_shape(shape, shard, tp), "bf16").nbytes
    return total


def _layer_weight_bytes(cfg: ModelConfig, tp: int, layer_type: str) -> int:
    """One layer's resident weights: each spec weight the standard plan declares, once, as sharded there."""
    # the layout the stock loader stores: the tier-0 tail (arch sm100) reads a row shard of the replicated
    # latent up-projection, which the stock path also keeps whole for its larger-batch tiers (arch sm90's plan)
    plan = build_plan(cfg, "standard", tp, DecodeShape(1, 1, 0), layer_type, arch="sm90")
    layout = {name: (shard, t.dtype) for k in plan for t in k.weights for name, shard in t.parts}
    total = 0
    for name, (shard, dtype) in layout.items():
        if name.startswith(EXPERT):  # every expert is resident, not only those a step touches
            shape, _ = weight_spec(cfg, f"expert.0.{name[len(EXPERT):]}")
            total += cfg.num_experts * Tensor(name, shard_shape(shape, shard, tp), dtype).nbytes
        else:
            total += Tensor(name, shard_shape(weight_spec(cfg, name)[0], shard, tp), dtype).nbytes
    return total


def cache_bytes_per_gpu(cfg: ModelConfig, tp: int, shape: DecodeShape) -> dict[str, int]:
    """key -> bytes one GPU holds of each attention kind's cache or state over all the model's layers of that kind
    (its entry's `memory`; 0 for a kind the model does not have)."""
    return {kind.memory[0]: int(kind.memory[2](cfg, tp, shape)) if kind.name in cfg.attn_kinds else 0
            for kind in attention.entries()}


def activation_bytes_per_gpu(cfg: ModelConfig, tp: int, shape: DecodeShape) -> int:
    """M tokens x (BF16 stream + block snapshots + the widest per-rank intermediate held at once)."""
    blocks = math.ceil(cfg.num_layers / cfg.attn_res_block) if cfg.attn_res_block else 0
    stream = 2 * cfg.hidden_size * (blocks + 3)  # snapshots + prefix + pending delta + normed input
    moe = 2 * cfg.top_k * (cfg.expert_in_dim + 2 * cfg.moe_intermediate // tp) if cfg.has_moe else 0
    dense = 2 * 2 * cfg.dense_intermediate // tp
    logits = 4 * cfg.vocab_size // tp
    return int(shape.tokens * (stream + max(moe, dense, logits)))


def memory_parts() -> tuple[str, ...]:
    """The parts of every memory answer, in order: weights, each attention kind's cache or state, activations."""
    return ("weights",) + tuple(kind.memory[0] for kind in attention.entries()) + ("activations",)


@dataclass(frozen=True, slots=True)
class MemoryPerGPU:
    """Bytes one GPU holds for a decode step, by part (`memory_parts`), against its HBM capacity."""

    weights: int
    caches: tuple[tuple[str, int], ...]  # (key, bytes) of each attention kind's cache or state
    activations: int
    capacity: int

    def __getitem__(self, part: str) -> int:
        if part in ("weights", "activations"):
            return getattr(self, part)
        return dict(self.caches)[part]

    @property
    def total(self) -> int:
        return self.weights + sum(b for _, b in self.caches) + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_gb(self) -> dict[str, float | bool]:
        gb = {k: round(self[k] / 1e9, 3) for k in memory_parts()}  # MB resolution
        return gb | {"total": round(self.total / 1e9, 3), "capacity": round(self.capacity / 1e9, 3), "fits": self.fits}


def shortfall(gb: dict[str, float | bool]) -> str:
    """One clause for warnings and skipped sweep rows, from `MemoryPerGPU.as_gb()`: the parts in GB."""
    caches = "".join(f" + {kind.memory[1]} {gb[kind.memory[0]]:.1f}" for kind in attention.entries()
                     if gb[kind.memory[0]])  # the model's kinds (another kind's part is 0)
    return (f"needs {gb['total']:.1f} GB per GPU (weights {gb['weights']:.1f}{caches} + activations "
            f"{gb['activations']:.2f}), more than the {gb['capacity']:.0f} GB of HBM")


def memory_per_gpu(cfg: ModelConfig, hbm_capacity: float, tp: int, shape: DecodeShape) -> MemoryPerGPU:
    """Every part of one GPU's memory for `shape` (T = tokens per sequence in this forward)."""
    return MemoryPerGPU(weight_bytes_per_gpu(cfg, tp), tuple(cache_bytes_per_gpu(cfg, tp, shape).items()),
                        activation_bytes_per_gpu(cfg, tp, shape), int(hbm_capacity))
