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
