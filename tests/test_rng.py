"""simulator/rng.py draws NumPy's numbers bit for bit: the PCG64 stream through four interleaved lanes, the
ziggurat's accepted samples and its rare wedge and tail branches (each seed below draws enough samples to
reach both), buffer refills anywhere (inside a rejection's wedge or tail reads too) and draws split across
calls. NumPy's own Generator is the reference here: the kernels have no `.py_func` twin (the 128-bit
multiply is an LLVM intrinsic, which only compiled code can call)."""

import numpy as np
import pytest

from simulator.fast import kernels as fast, rng
from simulator.dtypes import mxfp4_quantize


def numpys(seed, shape, std):
    return (np.random.default_rng(np.random.SeedSequence(seed)).standard_normal(shape, dtype=np.float32)
            * np.float32(std))


def first_try_rejections(seed, n_u32):
    """Positions of NumPy's raw uint32 stream whose first ziggurat try would fail its box test, by layer."""
    u32 = np.random.PCG64(np.random.SeedSequence(seed)).random_raw(n_u32 // 2).view(np.uint32)
    _, ki, _ = rng.tables()
    rejected = (u32 >> 9).astype(np.int64) >= ki[u32 & 0x1FF]
    return np.flatnonzero(rejected), u32 & 0xFF


@pytest.mark.parametrize("seed", [[0, 1, 5], [3, 4, 99], [7]], ids=["s0-1-5", "s3-4-99", "s7"])
def test_normal_draws_are_numpys(seed):
    n = 2_000_000  # ~1.5 % of first tries go to the wedge test; |x| > 3.654 (the tail) ~500 times
    want = numpys(seed, n, 0.3)
    got = rng.standard_normal_f32(np.random.SeedSequence(seed), (n,), 0.3)
    assert got.dtype == np.float32 and got.shape == (n,)
    assert np.sum(np.abs(want) > 0.3 * rng.NOR_R) > 0, "the tail branch was not reached"
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("raw_words", [4, 8, 1024], ids=["buf4", "buf8", "buf1024"])
def test_refills_inside_rejections_keep_numpys_stream(raw_words):
    """A 4-word buffer (8 uint32) refills every few samples: wedge and tail reads cross refills thousands
    of times (checked on NumPy's raw stream), and the draw still equals NumPy's."""
    seed, n = [11, 12], 1_000_000
    pos, layer = first_try_rejections(seed, 2 * n)
    last = pos[pos % (2 * raw_words) == 2 * raw_words - 1]  # a try rejected at a buffer's last uint32
    assert np.sum(layer[last] != 0) > 10 and np.sum(layer[pos] == 0) > 10, "no wedge / tail read crossed a refill"
    stream, got = rng.NormalStream(np.random.SeedSequence(seed), raw_words), np.empty(n, np.float32)
    stream.fill(got, 0.5)
    np.testing.assert_array_equal(got, numpys(seed, n, 0.5))


@pytest.mark.parametrize("cuts", [(1, 2, 3, 5), (2047, 2048, 2049, 4096), (333, 100_000, 100_001)],
                         ids=["tiny", "buffer-edges", "mixed"])
def test_fills_split_anywhere_continue_the_stream(cuts):
    """Successive fills continue NumPy's stream: cut after one sample (the first output's high half is still
    buffered), at the buffer's edges (2048 uint32 = RAW_WORDS outputs), and anywhere else; each piece's
    first value comes from a different one of the four lanes."""
    seed, n = [5, 6, 7], 300_000
    stream, got = rng.NormalStream(np.random.SeedSequence(seed)), np.empty(n, np.float32)
    for a, b in zip((0,) + cuts, cuts + (n,)):
        stream.fill(got[a:b], 0.25)
    np.testing.assert_array_equal(got, numpys(seed, n, 0.25))


def test_lane_state_is_pcg64_four_steps_apart():
    """The lanes hold the states NumPy's next four outputs come from, and (A, C) moves each four steps."""
    bitgen = np.random.PCG64(np.random.SeedSequence([9]))
    s = rng.lane_state(rng.pcg64_words(np.random.SeedSequence([9])))
    states = []
    for _ in range(8):
        bitgen.random_raw()
        states.append(bitgen.state["state"]["state"])
    lanes = [(int(s[2 * i]) << 64) | int(s[2 * i + 1]) for i in range(rng.LANES)]
    assert lanes == states[:4]
    a, c = (int(s[8]) << 64) | int(s[9]), (int(s[10]) << 64) | int(s[11])
    assert [(a * x + c) % (1 << 128) for x in lanes] == states[4:]


@pytest.mark.parametrize("k, n", [(64, 5), (256, 33), (96, 3072)], ids=["K64-N5", "K256-N33", "K96-N3072"])
def test_drawn_block_maxima_pack_like_the_reference(k, n):
    ss = np.random.SeedSequence([k, n])
    w, amax_t = np.empty((k, n), np.float32), np.empty((k // 32, n), np.float32)
    rng.normal_block_amax(rng.pcg64_words(ss), np.float32(k ** -0.5), w, amax_t)
    np.testing.assert_array_equal(w, numpys([k, n], (k, n), k ** -0.5))
    np.testing.assert_array_equal(amax_t, np.abs(w).reshape(k // 32, 32, n).max(axis=1))
    codes, bits = fast.mxfp4_quantize_t(w, amax_t)
    ref = mxfp4_quantize(np.ascontiguousarray(w.T))
    np.testing.assert_array_equal(codes, ref.packed)
    np.testing.assert_array_equal(bits, ref.scales.view(np.uint8))


def test_buffer_must_hold_whole_lane_rounds():
    with pytest.raises(ValueError, match="multiple of 4"):
        rng.NormalStream(np.random.SeedSequence([1]), 6)


@pytest.mark.parametrize("k, n", [(64, 5), (256, 33), (3584, 96)], ids=["K64-N5", "K256-N33", "K3584-N96"])
def test_parts_drawn_strip_by_strip_pack_like_the_packer(k, n):
    """rng.draw_mxfp4_t (a 32-row strip at a time, never the float32 part whole) == the packer run on
    NumPy's draws, codes and scales, and without falling back to the plain path."""
    ss, std = np.random.SeedSequence([k, n, 2]), k ** -0.5
    fallbacks = rng.FUSED_FALLBACKS[0]
    codes, bits = rng.draw_mxfp4_t(ss, (k, n), std)
    w = numpys([k, n, 2], (k, n), std)
    want_codes, want_bits = fast.mxfp4_quantize_t(w, np.abs(w).reshape(k // 32, 32, n).max(axis=1))
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(bits, want_bits)
    assert rng.FUSED_FALLBACKS[0] == fallbacks


def test_kernel_exponents_are_numpys_near_every_power_of_two():
    """The exponent read off a maximum's bits (`_exponent`, with thresholds taken from NumPy's log2) equals
    NumPy's floor(log2) rule for every float32 within 40 ulps of each power of two, where log2 rounds
    up to the power for some, and for zero and subnormals."""
    thresholds, _ = rng._log2_thresholds()
    exponent = getattr(rng._exponent, "py_func", rng._exponent)
    powers = (np.arange(1, 255, dtype=np.uint32) << np.uint32(23))
    bits = (powers[:, None] + np.arange(-40, 41, dtype=np.int64)[None, :]).astype(np.uint32).ravel()
    bits = np.concatenate([bits, np.array([0, 1, 2 ** 22, 2 ** 23 - 1], np.uint32)])
    got = np.array([exponent(b, thresholds) for b in bits])
    np.testing.assert_array_equal(got, fast.mxfp4_exponents(bits.view(np.float32)))
    assert np.sum(thresholds[1:255] != powers) > 100, "NumPy's log2 never rounded up: the thresholds are untested"


def test_a_part_whose_exponents_differ_is_drawn_again_the_plain_way(monkeypatch):
    """Thresholds that round every maximum up make the kernel's exponents differ from NumPy's: the part
    is drawn again through the plain path and still packs like the packer."""
    monkeypatch.setattr(rng, "_MXFP4_TABLES", (np.zeros(256, np.uint32), rng._log2_thresholds()[1]))
    fallbacks = rng.FUSED_FALLBACKS[0]
    codes, bits = rng.draw_mxfp4_t(np.random.SeedSequence([3]), (64, 7), 0.125)
    w = numpys([3], (64, 7), 0.125)
    want_codes, want_bits = fast.mxfp4_quantize_t(w)
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(bits, want_bits)
    assert rng.FUSED_FALLBACKS[0] == fallbacks + 1
