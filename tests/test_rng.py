"""simulator/rng.py draws NumPy's numbers bit for bit: the PCG64 stream, the ziggurat's accepted
samples and its rare wedge and tail branches (each seed below draws enough samples to reach both).
NumPy's own Generator is the reference here: the kernels have no `.py_func` twin (the 128-bit multiply
is an LLVM intrinsic, which only compiled code can call)."""

import numpy as np
import pytest

from simulator import fast, rng
from simulator.dtypes import mxfp4_quantize


@pytest.mark.parametrize("seed", [[0, 1, 5], [3, 4, 99], [7]], ids=["s0-1-5", "s3-4-99", "s7"])
def test_normal_draws_are_numpys(seed):
    ss = np.random.SeedSequence(seed)
    n = 2_000_000  # ~0.7 % go to the wedge test; |x| > 3.654 (the tail) ~500 times
    want = np.random.default_rng(ss).standard_normal(n, dtype=np.float32) * np.float32(0.3)
    got = rng.standard_normal_f32(ss, (n,), 0.3)
    assert got.dtype == np.float32 and got.shape == (n,)
    assert np.sum(np.abs(want) > 0.3 * rng.NOR_R) > 0, "the tail branch was not reached"
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("k, n", [(64, 5), (256, 33)], ids=["K64-N5", "K256-N33"])
def test_drawn_block_maxima_pack_like_the_reference(k, n):
    ss = np.random.SeedSequence([k, n])
    w, amax_t = np.empty((k, n), np.float32), np.empty((k // 32, n), np.float32)
    rng.normal_block_amax(rng.pcg64_words(ss), np.float32(k ** -0.5), w, amax_t)
    np.testing.assert_array_equal(w, np.random.default_rng(ss).standard_normal((k, n), dtype=np.float32) * np.float32(k ** -0.5))
    np.testing.assert_array_equal(amax_t, np.abs(w).reshape(k // 32, 32, n).max(axis=1))
    codes, bits = fast.mxfp4_quantize_t(w, amax_t)
    ref = mxfp4_quantize(np.ascontiguousarray(w.T))
    np.testing.assert_array_equal(codes, ref.packed)
    np.testing.assert_array_equal(bits, ref.scales.view(np.uint8))
