"""GQA attention (simulator/attention/gqa.py, ops/gqa.py): standard == specialized == float64 reference over
full and sliding-window layers, sinks, QK-norm, biases, YaRN and TP; and the paged decode against an
independent dense formulation with explicit masks (no pages, no grouped einsum, no shared code)."""

from dataclasses import replace

import numpy as np
import pytest

from simulator.attention import gqa as gqa_entry
from simulator.check import check_layer
from simulator.ops import gqa
from simulator.plans import specialized, standard
from simulator.plans.kernel import DecodeShape

WINDOW = 5  # tiny_gqa (conftest.py): layer 1 slides over its last 5 positions; layer 2 attends to everything


CASES = [(tp, b, t, ctx, layer) for tp in (1, 2) for b, t, ctx in ((1, 1, 3), (3, 2, 20), (2, 4, 33))
         for layer in (1, 2)] + [(4, 3, 2, 20, 1), (8, 2, 4, 33, 2)]  # 2 key/value heads: TP 4 and 8 replicate


@pytest.mark.parametrize("tp, batch, tokens, context, layer", CASES,
                         ids=[f"P{p}-B{b}-T{t}-C{c}-L{L}" for p, b, t, c, L in CASES])
def test_fp64_three_way(tiny_gqa, tp, batch, tokens, context, layer):
    """Both plans agree with the reference to fp64 rounding, over contexts that cross cache blocks (16 positions)
    and windows shorter than the context; the new cache rows, block tables and lengths included."""
    result = check_layer(tiny_gqa, "gqa", tp, DecodeShape(batch, tokens, context), "fp64", seed=tp + batch + layer,
                         layer=layer)
    names = {t.name for v in result.variants.values() for t in v.tensors}
    assert {"gqa.k_cache[new]", "gqa.v_cache[new]", "moe_out", "prefix"} <= names
    for v in result.variants.values():
        for t in v.tensors:
            assert t.rel_rms_error < 1e-12, f"{v.variant} {t.name}: rel RMS {t.rel_rms_error:.2e}"


def test_dense_layer_and_bf16_stay_bounded(tiny_gqa):
    assert check_layer(tiny_gqa, "dense", 2, DecodeShape(2, 2, 9), "fp64").passed
    result = check_layer(tiny_gqa, "gqa", 2, DecodeShape(3, 2, 20), "bf16", layer=1)
    assert result.passed, [(v.variant, t.name, t.rel_rms_error) for v in result.variants.values() for t in v.tensors]


def test_plans_declare_the_attention_they_run(tiny_gqa):
    shape = DecodeShape(2, 2, 30)
    for build in (standard.build, specialized.build):
        keys = [k.key for k in build(tiny_gqa, 2, shape, "gqa", 1)]
        assert keys[:6] == ["input_norm", "gqa_qkv_proj", "gqa_qk_norm", "gqa_rope", "gqa_cache_insert", "gqa_decode"]
    sliding, full = (standard.build(tiny_gqa, 2, shape, "gqa", layer).kernel("gqa_decode") for layer in (1, 2))
    assert dict(sliding.consts)["window"] == WINDOW and dict(full.consts)["window"] == 0
    assert sliding.flops * 32 == full.flops * WINDOW  # 32 cached positions after the step, 5 of them seen
    no_norm = replace(tiny_gqa, gqa_qk_norm=False, gqa_sinks=False, gqa_qkv_bias=False)
    plan = standard.build(no_norm, 2, shape, "gqa", 2)
    assert "gqa_qk_norm" not in [k.key for k in plan] and not plan.kernel("gqa_decode").weights


# ----------------------------------------------------------------------------- the independent formulation
def dense_masked_attention(q, keys, values, lengths, sinks, window, scale):
    """Written apart from ops/gqa.py: key/value heads repeated to every query head, one [T, S] mask per
    sequence built from explicit position comparisons, the sink appended as an extra logit column whose
    probability is dropped.   q [B, T, Nq, H], keys/values [B, S, Nkv, H] -> [B, T, Nq, H]"""
    B, T, Nq, H = q.shape
    rep = Nq // keys.shape[2]
    out = np.zeros_like(q)
    for b in range(B):
        k_all = np.repeat(keys[b], rep, axis=1)  # [S, Nq, H]
        v_all = np.repeat(values[b], rep, axis=1)
        S = lengths[b] + T
        query_pos = lengths[b] + np.arange(T)[:, None]  # [T, 1]
        key_pos = np.arange(S)[None, :]  # [1, S]
        mask = key_pos <= query_pos
        if window:
            mask &= key_pos >= query_pos - (window - 1)
        for h in range(Nq):
            logits = q[b, :, h] @ k_all[:S, h].T * scale  # [T, S]
            logits = np.where(mask, logits, -np.inf)
            col = np.full((T, 1), sinks[h]) if sinks is not None else np.full((T, 1), -np.inf)
            full = np.concatenate([logits, col], axis=1)
            prob = np.exp(full - full.max(axis=1, keepdims=True))
            prob /= prob.sum(axis=1, keepdims=True)
            out[b, :, h] = prob[:, :S] @ v_all[:S, h]
    return out


@pytest.mark.parametrize("window", [0, 3, 40])
@pytest.mark.parametrize("with_sinks", [True, False])
def test_paged_decode_matches_the_dense_formulation(window, with_sinks):
    rng = np.random.default_rng(window + with_sinks)
    B, T, Nq, Nkv, H, ctx = 3, 2, 6, 2, 8, 37
    shape = DecodeShape(B, T, ctx)
    nblk = gqa_entry.blocks_per_seq(shape)
    table = rng.permutation(B * nblk).reshape(B, nblk)  # pages in a shuffled order
    keys, values = rng.standard_normal((2, B, ctx + T, Nkv, H))
    q = rng.standard_normal((B, T, Nq, H))
    sinks = rng.standard_normal(Nq) * 2 if with_sinks else None
    lengths = np.full(B, ctx)
    pools = [np.zeros((B * nblk * gqa_entry.BLOCK, Nkv, H)) for _ in range(2)]
    for b in range(B):
        for s in range(ctx + T):
            slot = table[b, s // gqa_entry.BLOCK] * gqa_entry.BLOCK + s % gqa_entry.BLOCK
            pools[0][slot], pools[1][slot] = keys[b, s], values[b, s]
    pools = [p.reshape(B * nblk, gqa_entry.BLOCK, Nkv, H) for p in pools]
    want = dense_masked_attention(q, keys, values, lengths, sinks, window, 0.3)
    got = gqa.paged_decode(q.reshape(B * T, Nq, H), *pools, table, lengths, *(() if sinks is None else (sinks,)),
                           batch=B, window=window, scale=0.3)
    np.testing.assert_allclose(got.reshape(B, T, Nq, H), want, rtol=1e-12, atol=1e-12)
    loops = gqa.attention_reference(q, keys, values, lengths, sinks, window=window, scale=0.3)
    np.testing.assert_allclose(loops, want, rtol=1e-12, atol=1e-12)
    if window and window < ctx:  # the window and the sinks change the answer (the case can fail)
        assert not np.allclose(want, dense_masked_attention(q, keys, values, lengths, sinks, 0, 0.3))
    if with_sinks:
        assert not np.allclose(want, dense_masked_attention(q, keys, values, lengths, None, window, 0.3))


def test_state_shards_by_key_value_head_and_memory_by_hand(tiny_gqa):
    from simulator import attention
    from simulator.cost.memory import cache_bytes_per_gpu
    shape = DecodeShape(3, 2, 20)
    state = attention.initial_state(tiny_gqa, "gqa", shape, np.random.default_rng(0))
    assert state["gqa.k_cache"].shape == (3 * 2, 16, 2, 16)  # 22 positions need 2 blocks of 16 per sequence
    ranks = attention.shard_state(state, 2)
    assert [r["gqa.k_cache"].shape for r in ranks] == [(6, 16, 1, 16)] * 2
    assert np.array_equal(ranks[1]["gqa.v_cache"][:, :, 0], state["gqa.v_cache"][:, :, 1])
    back = attention.unshard_state(ranks, state, 2)
    assert np.array_equal(back["gqa.k_cache"], state["gqa.k_cache"]) and list(back["gqa.lengths"]) == [22] * 3
    # K and V in bf16, 1 of 2 key/value heads x 16 per rank, 3 sequences: layers 0 and 2 hold all 22 positions,
    # the sliding layer 1 its window of 5: 3 x (22 + 5 + 22) x 2 x 1 x 16 x 2 B
    assert cache_bytes_per_gpu(tiny_gqa, 2, shape)["kv_cache"] == 3 * 49 * 2 * 16 * 2 == 9408


def test_key_value_heads_replicate_above_tp_nkv(tiny_gqa):
    """At TP 4 the 2 key/value heads are each held by two ranks (vLLM's QKVParallelLinear): ranks 0, 1 hold head 0
    and ranks 2, 3 head 1, in the cache and in the k / v projection; the cache per GPU stops shrinking at TP 2."""
    from simulator import attention
    from simulator.cost.memory import cache_bytes_per_gpu
    from simulator.weights import LayerWeights
    shape = DecodeShape(3, 2, 20)
    state = attention.initial_state(tiny_gqa, "gqa", shape, np.random.default_rng(0))
    ranks = attention.shard_state(state, 4)
    for r, head in enumerate((0, 0, 1, 1)):
        assert np.array_equal(ranks[r]["gqa.k_cache"][:, :, 0], state["gqa.k_cache"][:, :, head])
    assert np.array_equal(attention.unshard_state(ranks, state, 2)["gqa.v_cache"], state["gqa.v_cache"])
    assert cache_bytes_per_gpu(tiny_gqa, 4, shape) == cache_bytes_per_gpu(tiny_gqa, 2, shape)
    per_gpu = [cache_bytes_per_gpu(tiny_gqa, tp, shape)["kv_cache"] for tp in (1, 2)]
    assert per_gpu[0] == 2 * per_gpu[1]
    kernel = standard.build(tiny_gqa, 4, shape, "gqa", 1).kernel("gqa_qkv_proj")
    assert dict(kernel.consts)["kv_heads"] == 1 and kernel.weights[0].shape == (tiny_gqa.hidden_size, (2 + 2) * 16)
    w = LayerWeights(tiny_gqa, 1, 0)
    parts = dict(kernel.weights[0].parts)
    assert parts["gqa.w_k"] == "col/2"
    k2 = w.shard("gqa.w_k", None, parts["gqa.w_k"], 2, 4)
    assert np.array_equal(k2, w.held("gqa.w_k")[:, 16:32])
    assert np.array_equal(k2, w.shard("gqa.w_k", None, "col/2", 3, 4))
