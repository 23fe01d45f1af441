import ml_dtypes
import numpy as np

from simulator.weights import LayerWeights, column_shard, row_shard


def test_deterministic_and_order_independent(tiny):
    a, b = LayerWeights(tiny, 1, 7), LayerWeights(tiny, 1, 7)
    e3 = a.expert(3)[0].copy()
    b.expert(5), b["router.w"]  # generate other tensors first
    np.testing.assert_array_equal(b.expert(3)[0], e3)
    assert not np.array_equal(LayerWeights(tiny, 1, 8).expert(3)[0], e3)
    assert not np.array_equal(LayerWeights(tiny, 2, 7).expert(3)[0], e3)


def test_lazy_experts_only_touched(tiny):
    w = LayerWeights(tiny, 1, 0)
    w.expert(4)
    assert w.cached_experts() == [4]
    assert not any(k.startswith("expert.") for k in w._held)  # packed in the expert cache, not as floats


def test_scaling_keeps_activations_order_one(k3):
    w = LayerWeights(k3, 1, 0)
    x = np.random.default_rng(0).standard_normal((4, k3.hidden_size)).astype(np.float32)
    y = x @ w["latent.w_down"]
    assert 0.5 < y.std() < 2.0


def test_weights_are_in_checkpoint_formats(tiny):
    w = LayerWeights(tiny, 1, 0)
    import ml_dtypes
    r = w["router.w"]
    np.testing.assert_array_equal(r, r.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert len(np.unique(np.abs(w.expert(0)[0][:32, 0]))) <= 8  # E2M1 grid x one scale per block


def test_shards_tile_the_weight():
    w = np.arange(24.0).reshape(4, 6)
    np.testing.assert_array_equal(np.concatenate([column_shard(w, r, 3) for r in range(3)], axis=1), w)
    np.testing.assert_array_equal(np.concatenate([row_shard(w, r, 2) for r in range(2)], axis=0), w)


def test_dense_weights_drawn_in_chunks_are_numpys_drawn_whole(tiny, monkeypatch):
    """A dense weight is drawn a few rows at a time (rng.NormalStream; here chunks of at most 96 values, the
    last one short): bf16(offset + std * NumPy's float32 normals), as drawing it whole in NumPy gives."""
    from simulator import weights
    monkeypatch.setattr(weights, "DRAW_CHUNK", 96)
    w = LayerWeights(tiny, 1, 4)
    for name, offset in (("router.w", 0.0), ("input_norm", 1.0)):
        shape, _ = weights.weight_spec(tiny, name)
        std = 0.1 if offset else shape[0] ** -0.5
        want = weights._normal(4, 1, name, shape, std)
        np.testing.assert_array_equal(w.held(name), (want + offset if offset else want).astype(ml_dtypes.bfloat16))


def test_packed_experts_are_the_packer_on_numpys_draws(tiny):
    from simulator import weights
    from simulator.fast import kernels as fast
    w = LayerWeights(tiny, 1, 4)
    for part in ("w_gate", "w_down"):
        shape, _ = weights.weight_spec(tiny, f"expert.2.{part}")
        codes, bits = w.expert_part(2, part)
        want_codes, want_bits = fast.mxfp4_quantize_t(
            weights._normal(4, 1, f"expert.2.{part}", shape, shape[0] ** -0.5))
        np.testing.assert_array_equal(codes, want_codes)
        np.testing.assert_array_equal(bits, want_bits)


def test_spilled_parts_are_read_back_not_drawn_again(tiny, tmp_path):
    """With a cache too small for one expert, a second pass over the experts draws again without a spill
    folder and reads every part back with one: the same codes and scales as parts drawn fresh."""
    from simulator.weights import PARTS
    experts = [1, 4, 6]
    plain = LayerWeights(tiny, 1, 3, expert_cache_bytes=1, stream_chunk_bytes=1)
    spill = LayerWeights(tiny, 1, 3, expert_cache_bytes=1, stream_chunk_bytes=1, spill_dir=str(tmp_path))
    for w in (plain, spill):
        for _ in range(2):
            for chunk in w.stream_experts(experts):
                for e in chunk:
                    w.expert_packed(e)
    assert plain.expert_generations == 2 * 3 * len(PARTS)
    assert spill.expert_generations == 3 * len(PARTS) and spill.spill_reads == 3 * len(PARTS)
    fresh = LayerWeights(tiny, 1, 3)
    for chunk in spill.stream_experts(experts):
        for e in chunk:
            for got, want in zip(spill.expert_packed(e), fresh.expert_packed(e)):
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])
    assert spill.spill_reads == 2 * 3 * len(PARTS)
    assert len(list(tmp_path.iterdir())) == 3 * len(PARTS)
