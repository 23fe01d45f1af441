"""The model head's kernels: embedding, final AttnRes mix (or residual add) + norm, LM head, sampling; and the drafter's
tap projection. Part of the cost model, not of the plans the executor runs: the executor simulates one decoder
layer, so these kernels name no op (`op=None`) and only the step's pricing reads them; their tensors are declared
as the plans' are (plans/common.py).

    embedding (vocab-parallel, one all-reduce) -> final mix + RMSNorm -> LM head (vocab shard)
    -> local argmax -> all-gather of the P candidates

Dimension legend: M tokens per forward, D hidden, V vocab, P TP degree.
"""

from __future__ import annotations

from functools import lru_cache

from simulator.config import ModelConfig
from simulator.ops.linear import gemm_flops
from simulator.plans.common import act, weight
from simulator.plans.kernel import Collective, DecodeShape, Kernel, Plan


@lru_cache(maxsize=1024)
def head_plan(cfg: ModelConfig, tp: int, shape: DecodeShape, variant: str, pdl: bool | None = None) -> Plan:
    """The head's kernels; the fused path launches every one with PDL (`pdl` overrides)."""
    M, D, P, V = shape.tokens, cfg.hidden_size, tp, cfg.vocab_size
    n_src = (-(-cfg.num_layers // cfg.attn_res_block) if cfg.attn_res_block else 0) + 1
    pdl = variant == "specialized" if pdl is None else pdl
    x, logits, best = act("hidden", M, D), act("logits", M, V // P, dtype="fp32"), act("best", M, 2, dtype="fp32")
    kernels = (
        Kernel(key="embed", name="vocab_parallel_embedding", kind="pointwise", family="small", writes=(x,), pdl=pdl,
               weights=(weight("embed.rows", M, D),), note="each rank gathers the rows it owns (V/P of them)"),
        Kernel(key="embed_all_reduce", name="allreduce", kind="collective", family="collective",
               reads=(x,), writes=(x,), pdl=pdl,
               collective=Collective("all_reduce", x.nbytes, P),
               note="vocab-parallel embedding: rows from their owner"),
        Kernel(key="final_mix_norm", name="attn_res_final_mix_rmsnorm", kind="pointwise", family="small",
               floor="reduction", pdl=pdl,
               reads=(act("sources", n_src, M, D),), writes=(x,), weights=(weight("final_norm", D),
                                                                           weight("final_res", 2, D)),
               note="output AttnRes mix over every snapshot + prefix, then model.norm")
        if cfg.residual == "attn_res" else
        Kernel(key="final_norm", name="fused_add_rms_norm", kind="pointwise", family="small", floor="reduction",
               pdl=pdl,
               reads=(act("residual", M, D), act("delta", M, D)), writes=(x,), weights=(weight("final_norm", D),),
               note="residual += last MLP output, then model.norm (a plain residual: vLLM fused_add_rms_norm)"),
        Kernel(key="lm_head", name="gemm_lm_head", kind="gemm", family="gemm", reads=(x,), writes=(logits,), pdl=pdl,
               weights=(weight("lm_head", D, V // P),), flops=gemm_flops(M, D, V // P),
               note="vocab-sharded LM head (10240 x 7168 per rank at TP16; V-LLG)"),
        Kernel(key="argmax", name="argmax_local", kind="pointwise", family="small",
               reads=(logits,), writes=(best,), pdl=pdl,
               note="greedy: each rank's best logit and its id"),
        Kernel(key="sample_gather", name="allgather_argmax", kind="collective", family="collective",
               reads=(best,), pdl=pdl,
               writes=(act("tokens", M, dtype="int32"),), collective=Collective("all_gather", M * 8, P),
               note="gather the P candidates per token and pick the winner (and accept / reject drafts)"),
    )
    return Plan(variant, "head", tp, shape, kernels)


def draft_head_plan(drafter: ModelConfig, tp: int, shape: DecodeShape, taps: int) -> Plan:
    """The drafter's head: the tap projection into the drafter, then the target's head without the embedding
    all-reduce (the drafter reads the target's LM head for its own logits)."""
    D, M = drafter.hidden_size, shape.tokens
    fc = Kernel(key="draft_fc", name="gemm_draft_tap_projection", kind="gemm", family="gemm",
                reads=(act("taps", M, taps * D),),
                writes=(act("x", M, D),), weights=(weight("draft.fc", taps * D, D // tp),),
                flops=gemm_flops(M, taps * D, D // tp),
                note="projects the target hidden states tapped at several layers into the drafter")
    head = head_plan(drafter, tp, shape, "standard")
    kept = tuple(k for k in head.kernels if k.key != "embed_all_reduce")
    return Plan("standard", "draft_head", tp, shape, (fc,) + kept)
