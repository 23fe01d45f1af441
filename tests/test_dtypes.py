import ml_dtypes
import numpy as np
import pytest

from simulator.dtypes import Precision, mxfp4_dequantize, mxfp4_quantize, round_bf16, round_fp8, round_mxfp4
from simulator.errors import UserError


def test_bf16_matches_ml_dtypes():
    x = np.random.default_rng(0).standard_normal(1000)
    np.testing.assert_array_equal(round_bf16(x), x.astype(ml_dtypes.bfloat16).astype(np.float64))
    assert np.max(np.abs(round_bf16(x) - x) / np.abs(x)) <= 2.0 ** -8


def test_fp8_saturates_instead_of_nan():
    y = round_fp8(np.array([1e4, -1e4, 0.3]))
    assert y[0] == 448 and y[1] == -448 and abs(y[2] - 0.3) < 0.02


def test_mxfp4_exact_values_roundtrip_and_nibble_order():
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6] * 4, dtype=np.float32)  # block max 6 -> scale 1
    q = mxfp4_quantize(grid[None])
    np.testing.assert_array_equal(mxfp4_dequantize(q)[0], grid)
    assert q.packed.shape == (1, 16) and q.scales.shape == (1, 1) and q.nbytes == 17
    assert q.packed[0, 0] == (0x1 << 4) | 0x0  # low nibble = element 0 (0.0), high = element 1 (0.5 = code 1)
    assert float(q.scales.astype(np.float32)[0, 0]) == 1.0


def test_mxfp4_scale_is_power_of_two_and_error_bounded():
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32) * 37.0
    q = mxfp4_quantize(x)
    s = q.scales.astype(np.float32)
    np.testing.assert_array_equal(np.log2(s), np.round(np.log2(s)))
    err = np.abs(round_mxfp4(x) - x).reshape(8, 2, 32).max(-1)
    amax = np.abs(x).reshape(8, 2, 32).max(-1)
    assert np.all(err <= 0.25 * amax + 1e-6)  # half the top E2M1 step (1 of 4..6), relative to the block max


def test_mxfp4_rejects_ragged_blocks():
    with pytest.raises(ValueError):
        mxfp4_quantize(np.ones((2, 33)))


def test_precision_store():
    x = np.array([1 / 3])
    assert Precision("fp64").store(x, "bf16")[0] == 1 / 3
    assert Precision("bf16").store(x, "bf16")[0] == round_bf16(x)[0]
    assert Precision("bf16").store(x, "fp32").dtype == np.float32
    with pytest.raises(UserError):
        Precision("fp16")
