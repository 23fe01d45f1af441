"""Expert-major execution on the fast backend (fast.experts.run_streamed, weights.stream_experts): the
touched experts stream a chunk at a time and every rank runs its groups of a chunk before the next is
drawn. It must compute what one call per rank computes, bit for bit, and draw each touched expert part
once per pass however small the expert cache is (a rank-major pass drew what did not fit once per rank)."""

import numpy as np
import pytest

from simulator.check import make_inputs
from simulator.dtypes import Precision
from simulator.execute import run_plan
from simulator.fast import experts as fx
from simulator.ops import experts as ex
from simulator.ops.router import route_reference
from simulator.plans import specialized, standard
from simulator.plans.common import make_dims
from simulator.plans.kernel import DecodeShape
from simulator.reference import reference_layer
from simulator.weights import PARTS, LayerWeights

from numerics import assert_close


def _chunks(experts: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """The touched experts cut at random places, single-expert chunks included."""
    cuts = np.sort(rng.choice(np.arange(1, len(experts)), size=min(4, len(experts) - 1), replace=False))
    return np.split(experts, cuts)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("m", [1, 5])
def test_chunked_grouped_ops_equal_one_call(tiny, m, dtype):
    w = LayerWeights(tiny, 1, 0)
    rng = np.random.default_rng(m)
    z = rng.standard_normal((m, tiny.expert_in_dim)).astype(dtype)
    r = route_reference(rng.standard_normal((m, tiny.num_experts)), np.zeros(tiny.num_experts), tiny)
    weight = r.topk_weight.astype(dtype)
    expert = lambda e: tuple(t.astype(dtype) for t in w.expert(e))  # noqa: E731
    gate_up, down = (lambda e: expert(e)[:2]), (lambda e: expert(e)[2:])
    h = fx.expert_fc1(z, r.topk_idx, gate_up, cfg=tiny)
    whole = {"fc1": h, "fc2": fx.expert_fc2(h, r.topk_idx, down),
             "fc2_finalize": fx.expert_fc2_finalize(h, r.topk_idx, weight, down),
             "outputs_reference": ex.expert_outputs_reference(z, r.topk_idx, expert, tiny)}
    numpy_forms = {"fc1": ex.expert_fc1(z, r.topk_idx, gate_up, cfg=tiny), "fc2": ex.expert_fc2(h, r.topk_idx, down),
                   "fc2_finalize": ex.expert_fc2_finalize(h, r.topk_idx, weight, down)}
    for name, value in numpy_forms.items():  # on float experts the replacement is the op, bit for bit
        np.testing.assert_array_equal(whole[name], value, err_msg=name)
    calls = {"fc1": lambda c, o: fx.expert_fc1(z, r.topk_idx, gate_up, cfg=tiny, only=c, out=o),
             "fc2": lambda c, o: fx.expert_fc2(h, r.topk_idx, down, only=c, out=o),
             "fc2_finalize": lambda c, o: fx.expert_fc2_finalize(h, r.topk_idx, weight, down, only=c, out=o),
             "outputs_reference": lambda c, o: ex.expert_outputs_reference(z, r.topk_idx, expert, tiny, only=c, out=o)}
    for name, call in calls.items():
        out = None
        for chunk in _chunks(np.unique(r.topk_idx), rng):
            out = call(chunk, out)
        assert out.shape == whole[name].shape and out.dtype == whole[name].dtype
        np.testing.assert_array_equal(out, whole[name], err_msg=name)


@pytest.mark.parametrize("layer", ["kda", "mla"])
@pytest.mark.parametrize("precision", ["fp64", "bf16"])
@pytest.mark.parametrize("backend", ["fast", "numpy"])
def test_streamed_layer_equals_one_chunk_bit_for_bit(tiny, layer, precision, backend):
    """One expert per chunk and a cache of one part against one chunk holding every expert: the same
    bits out of all three paths, and on the fast backend each touched part drawn once per pass in the
    streamed run (the NumPy backend calls each op once per rank and asks the weight store for float copies)."""
    shape = DecodeShape(5, 1, 6)
    d = make_dims(tiny, 4, shape, None, layer)
    io, state = make_inputs(tiny, d, np.random.default_rng(7))
    part = tiny.expert_in_dim * tiny.moe_intermediate * 17 // 32
    results = []
    for chunk_bytes, cache_bytes in ((1, part), (1 << 40, 1 << 40)):
        w = LayerWeights(tiny, d.layer, 7, expert_cache_bytes=cache_bytes, stream_chunk_bytes=chunk_bytes)
        ref_io, _, diag = reference_layer(tiny, d.layer, shape, w, io, state)
        touched = len(np.unique(diag["topk_idx"]))
        assert w.expert_generations <= touched * len(PARTS)  # the reference pass: each part at most once
        outs = [ref_io]
        for build in (standard.build, specialized.build):
            made = w.expert_generations
            out, _, _ = run_plan(build(tiny, 4, shape, layer, d.layer), d, w, io, state, Precision(precision),
                                 backend=backend)
            assert backend == "numpy" or w.expert_generations - made <= touched * len(PARTS)  # not once per rank
            outs.append(out)
        results.append(outs)
    for streamed, whole in zip(*results):
        np.testing.assert_array_equal(streamed.delta, whole.delta)
        np.testing.assert_array_equal(streamed.prefix, whole.prefix)


def test_executor_runs_a_chunk_of_a_grouped_op_on_all_ranks_in_one_compiled_call(tiny, monkeypatch):
    """The executor hands packed experts as `PackedExperts`, so an all-ranks op builds every rank's weight
    table at once: one `fast.mxfp4_grouped` per chunk of FC1 and of FC2 + finalize, not one per rank (experts
    widened so that each rank's shard holds whole 32-blocks: L = 64, F/P = 128/4)."""
    from dataclasses import replace

    from simulator.fast import kernels as fast
    if not fast.has_avx512():
        pytest.skip("the grouped kernel runs on AVX-512 hosts")
    calls, grouped = [], fast.mxfp4_grouped
    monkeypatch.setattr(fast, "mxfp4_grouped", lambda *a: calls.append(len(a[1])) or grouped(*a))
    cfg, shape = replace(tiny, latent_dim=64, moe_intermediate=128), DecodeShape(5, 1, 6)
    d = make_dims(cfg, 4, shape, None, "kda")
    io, state = make_inputs(cfg, d, np.random.default_rng(7))
    _, _, diag = run_plan(specialized.build(cfg, 4, shape, "kda", d.layer), d, LayerWeights(cfg, d.layer, 7), io,
                          state, Precision("bf16"), backend="fast")
    assert calls == [4 * diag["topk_idx"].size] * 2  # every rank's (token, slot) rows, in one call per op


def test_reference_rows_together_equal_rows_alone(tiny):
    """The reference runs the rows that chose an expert together; on packed experts each row is still its
    own product with each dequantized chunk, so every row has the bits of the token-by-token form."""
    from simulator.fast.packed import MXFP4Weight
    w = LayerWeights(tiny, 1, 3)
    rng = np.random.default_rng(3)
    z = rng.standard_normal((6, tiny.expert_in_dim))
    r = route_reference(rng.standard_normal((6, tiny.num_experts)), np.zeros(tiny.num_experts), tiny)
    expert = lambda e: tuple(MXFP4Weight(*q, form="reference") for q in w.expert_packed(e))  # noqa: E731
    slots = ex.expert_outputs_reference(z, r.topk_idx, expert, tiny)
    for t in range(6):
        for j, e in enumerate(r.topk_idx[t]):
            np.testing.assert_array_equal(slots[t, j], ex.mlp_reference(z[t:t + 1], *expert(int(e)), tiny)[0])


@pytest.mark.parametrize("avx512", [True, False], ids=["grouped-kernel", "shard-by-shard"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, "bfloat16"], ids=["float64", "float32", "bfloat16"])
def test_grouped_ops_over_all_ranks_equal_each_rank_alone(tiny, dtype, avx512, monkeypatch):
    """The executor runs a grouped op over every rank in one call (`over_ranks`); each rank's output is
    what the op computes on that rank alone, bit for bit, and the packed product is the float one: with
    the grouped kernel, and with the shard-by-shard fallback of hosts without AVX-512. bfloat16: float32
    activations holding bfloat16 values (the W4A16 path), which the grouped kernel multiplies with the bf16
    dot where the host has one."""
    from simulator.fast import kernels as fast
    from simulator.dtypes import round_bf16
    from simulator.fast.packed import MXFP4Weight
    if avx512 and not fast.has_avx512():
        pytest.skip("no AVX-512 on this host")
    monkeypatch.setattr(fast, "has_avx512", lambda: avx512)
    bf16, dtype = dtype == "bfloat16", np.float32 if dtype == "bfloat16" else dtype
    values = round_bf16 if bf16 else (lambda a: a)
    rng = np.random.default_rng(11)
    din, f, tp, m, k, n_exp = 64, 96, 3, 5, 2, 6  # F/P = 32: whole blocks in each row shard
    packed = {(e, p): fast.mxfp4_quantize_t(rng.standard_normal(shape, dtype=np.float32) * np.float32(0.2))
              for e in range(n_exp) for p, shape in (("gate", (din, f)), ("up", (din, f)), ("down", (f, din)))}
    topk_idx = np.stack([rng.choice(n_exp, k, replace=False) for _ in range(m)])
    weight = rng.random((m, k)).astype(dtype)
    z = values(rng.standard_normal((m, din)).astype(dtype))
    zs = [z, z.copy(), values(rng.standard_normal((m, din)).astype(dtype))]  # replicated on ranks 0 and 1, not on 2

    how = {"gate": "col", "up": "col", "down": "row"}
    part = lambda e, p: packed[(e, p)]  # noqa: E731  one for every rank: the all-ranks forms see the same parts

    def shards(r, names, form=None):  # type: ignore[no-untyped-def]
        if form is None:  # as the executor hands them: the all-ranks forms build every rank's table at once
            return fx.PackedExperts(part, names, tuple(how[p] for p in names), r, tp)
        return lambda e: tuple(form(MXFP4Weight(*packed[(e, p)]).shard(how[p], r, tp)) for p in names)
    dense = lambda w: np.asarray(w, np.float64).astype(dtype)  # noqa: E731
    hs = fx.expert_fc1.over_ranks(zs, [topk_idx] * tp, [shards(r, ("gate", "up")) for r in range(tp)], cfg=tiny)
    for r in range(tp):
        np.testing.assert_array_equal(hs[r], fx.expert_fc1(zs[r], topk_idx, shards(r, ("gate", "up")), cfg=tiny))
        assert_close(hs[r], fx.expert_fc1(zs[r], topk_idx, shards(r, ("gate", "up"), dense), cfg=tiny), dtype)
    hs = [values(h) for h in hs]  # bfloat16: FC1 writes its output as bfloat16
    downs = [shards(r, ("down",)) for r in range(tp)]
    for name, ranks_form, one in (
            ("fc2", lambda: fx.expert_fc2.over_ranks(hs, [topk_idx] * tp, downs),
             lambda r, d: fx.expert_fc2(hs[r], topk_idx, d)),
            ("fc2_finalize", lambda: fx.expert_fc2_finalize.over_ranks(hs, [topk_idx] * tp, [weight] * tp, downs),
             lambda r, d: fx.expert_fc2_finalize(hs[r], topk_idx, weight, d))):
        together = ranks_form()
        for r in range(tp):
            np.testing.assert_array_equal(together[r], one(r, downs[r]), err_msg=name)
            assert_close(together[r], one(r, shards(r, ("down",), dense)), dtype, name)


def test_reference_experts_on_threads_are_the_one_thread_bits(tiny, monkeypatch):
    """The reference deals a chunk's experts to threads (reference.REFERENCE_THREADS); each expert's slot
    outputs are computed whole on one thread, so the layer's bits do not depend on the thread count."""
    from simulator import reference
    shape = DecodeShape(6, 1, 6)
    d = make_dims(tiny, 4, shape, None, "kda")
    io, state = make_inputs(tiny, d, np.random.default_rng(3))
    runs = []
    for threads in (1, 3):
        monkeypatch.setattr(reference, "REFERENCE_THREADS", threads)
        w = LayerWeights(tiny, d.layer, 3, stream_chunk_bytes=1 << 40)  # one chunk: every expert on the pool
        out, _, diag = reference_layer(tiny, d.layer, shape, w, io, state)
        assert len(np.unique(diag["topk_idx"])) > threads  # every thread had experts to run
        runs.append(out)
    np.testing.assert_array_equal(runs[0].delta, runs[1].delta)
    np.testing.assert_array_equal(runs[0].prefix, runs[1].prefix)
