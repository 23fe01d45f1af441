"""Does the model fit? Weight bytes per GPU under TP, against HBM capacity.

    per GPU = (sharded weights) / P + replicated weights            bf16 trunk, routed experts in their format

Replicated on every rank in the stock layout (docs/sources.md §K1h): the router, the latent down /
up projections and the MLA q_a / kv_a projection. Kimi K3 comes to 1.56 TB in all, 195 GB per GPU at
TP8: more than an H200 (141 GB), B200 (180 GB) or GB200 (186 GB) holds, so TP8 on those needs pipeline
parallelism; the per-layer cost is still the TP8 one, which is why a misfit is a warning, not an error.
KV cache and KDA state come on top (a few GB at batch 1).
"""

from __future__ import annotations

from simulator.config import ModelConfig
from simulator.plans.kernel import Tensor


def _attention(cfg: ModelConfig, kind: str) -> tuple[int, int]:
    """(sharded, replicated) parameter counts of one attention block."""
    d = cfg.hidden_size
    if kind == "kda":
        c, h = cfg.kda_width, cfg.kda_head_dim
        return 4 * d * c + h * c + d * cfg.kda_heads + c * d, d * h
    n = cfg.mla_heads
    sharded = cfg.q_lora_rank * n * cfg.mla_qk_head_dim + cfg.kv_lora_rank * n * (cfg.qk_nope_dim + cfg.v_head_dim)
    sharded += (d * n * cfg.v_head_dim if cfg.mla_output_gate else 0) + n * cfg.v_head_dim * d
    return sharded, d * (cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_dim)


def weight_bytes_per_gpu(cfg: ModelConfig, tp: int) -> int:
    d, total = cfg.hidden_size, 0
    expert = Tensor("e", (3 * cfg.expert_in_dim * cfg.moe_intermediate,), cfg.expert_dtype).nbytes if cfg.has_moe else 0
    for layer in range(cfg.num_layers):
        sharded, replicated = _attention(cfg, cfg.attn_kinds[layer])
        if cfg.layer_type(layer) == "dense":
            sharded += 3 * d * cfg.dense_intermediate
        else:
            sharded += 3 * d * cfg.shared_intermediate
            replicated += d * cfg.num_experts + 2 * d * cfg.latent_dim
            total += cfg.num_experts * expert // tp
        total += 2 * (sharded // tp + replicated)
    return total + 2 * (2 * cfg.vocab_size * d) // tp  # embedding + LM head, vocab-sharded
