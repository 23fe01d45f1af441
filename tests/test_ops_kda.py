"""KDA decode: reference (per-token loops) == fused (NumPy, its compiled replacement and that one's .py_func)
== four-kernel chain.

Also: T tokens in one call == T one-token calls, decay bounds, the delta rule's write property, the conv
against np.convolve, and purity (inputs untouched).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.ops import kda
from numerics import assert_close

# One tolerance table (rtol, atol) per working dtype.
LOWER_BOUND, EPS = -5.0, 1e-5
SHAPES = [  # (B, T, N, H, W)
    (1, 1, 1, 4, 4),
    (1, 4, 2, 8, 4),
    (3, 4, 3, 5, 3),
    (2, 1, 2, 7, 2),
]
CASES = [
    pytest.param(seed, dtype, shape, id="s{}-B{}-T{}-N{}-H{}-W{}-{}".format(seed, *shape, dtype.__name__))
    for seed in (0, 1)
    for dtype in (np.float64, np.float32)
    for shape in SHAPES
]
Form = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]
FORMS: dict[str, Form] = {
    "reference": kda.kda_decode_reference,
    "fused": kda.kda_decode_fused,
    "chain": kda.kda_chain,
}


def make_inputs(seed: int, shape: tuple[int, ...], dtype: type) -> tuple[np.ndarray, ...]:
    """Inputs in signature order, O(1) by construction (conv taps ~ 1/sqrt(W), state ~ 1/sqrt(H))."""
    rng = np.random.default_rng(seed)
    B, T, N, H, W = shape
    C = 3 * N * H
    arrays = (
        rng.standard_normal((B, T, C)),  # x
        rng.standard_normal((C, W)) / np.sqrt(W),  # conv_w
        rng.standard_normal((B, C, W - 1)),  # hist
        rng.standard_normal((B, T, N * H)),  # z
        0.1 * rng.standard_normal(N * H),  # dt_bias
        np.log(rng.uniform(1, 16, N)),  # a_log
        rng.standard_normal((B, T, N)),  # beta_logits
        rng.standard_normal((B, T, N * H)),  # gate
        1 + 0.1 * rng.standard_normal(H),  # o_norm_w
        rng.standard_normal((B, N, H, H)) / np.sqrt(H),  # state
    )
    return tuple(a.astype(dtype) for a in arrays)


def assert_step_close(got: tuple, want: tuple, dtype: type, what: str) -> None:
    for name, a, d in zip(("out", "state", "hist"), got, want, strict=True):
        assert_close(a, d, dtype, f"{what} {name}")


def run(form: Form, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    return form(*inputs, lower_bound=LOWER_BOUND, eps=EPS)


def test_kda_shapes_and_dtypes() -> None:
    B, T, N, H, W = 2, 3, 2, 5, 4
    for dtype in (np.float64, np.float32):
        inputs = make_inputs(0, (B, T, N, H, W), dtype)
        x, conv_w, hist, z, dt_bias, a_log, beta_logits, gate, o_norm_w, state = inputs
        y, new_hist = kda.kda_conv_update(x, conv_w, hist)
        g = kda.kda_gate(z, dt_bias, a_log, LOWER_BOUND)
        q, k, v = y.reshape(B, T, 3, N, H).transpose(2, 0, 1, 3, 4)
        o, new_state = kda.kda_recurrent(q, k, v, g, beta_logits, state)
        out = kda.kda_gated_norm(o, gate, o_norm_w, EPS)
        for arr, shape in ((y, (B, T, 3 * N * H)), (new_hist, (B, 3 * N * H, W - 1)), (g, (B, T, N, H)),
                           (o, (B, T, N, H)), (new_state, (B, N, H, H)), (out, (B, T, N * H))):
            assert arr.shape == shape and arr.dtype == dtype
        for name, form in FORMS.items():
            got = [(a.shape, a.dtype) for a in run(form, inputs)]
            assert got == [(out.shape, dtype), (new_state.shape, dtype), (new_hist.shape, dtype)], name


@pytest.mark.parametrize("seed, dtype, shape", CASES)
def test_kda_fused_matches_reference(seed: int, dtype: type, shape: tuple[int, ...]) -> None:
    inputs = make_inputs(seed, shape, dtype)
    want = run(kda.kda_decode_reference, inputs)
    assert_step_close(run(kda.kda_decode_fused, inputs), want, dtype, "fused")
    assert_step_close(run(kda.kda_chain, inputs), want, dtype, "chain")


@pytest.mark.parametrize("seed, dtype, shape", CASES)
def test_kda_numba_matches_py_func(seed: int, dtype: type, shape: tuple[int, ...]) -> None:
    from simulator.fast import kda as fast_kda
    inputs = make_inputs(seed, shape, dtype)
    jitted = fast_kda._launch_fused(fast_kda._kda_fused_kernel, *inputs, lower_bound=LOWER_BOUND, eps=EPS)
    python = fast_kda._launch_fused(fast_kda._kda_fused_kernel.py_func, *inputs, lower_bound=LOWER_BOUND, eps=EPS)
    assert_step_close(jitted, python, dtype, "numba vs .py_func")


@pytest.mark.parametrize("seed, dtype, shape", [c for c in CASES if c.values[1] == np.float64])
def test_kda_fused_numpy_and_compiled_agree_to_the_bit_in_float64(seed: int, dtype: type,
                                                                   shape: tuple[int, ...]) -> None:
    """The NumPy form sums in the compiled programs' order (fast/kda.py's docstring): in float64, where both
    call the same exp, not one bit differs."""
    from simulator.fast import kda as fast_kda
    inputs = make_inputs(seed, shape, dtype)
    for got, want in zip(fast_kda.kda_decode_fused(*inputs, lower_bound=LOWER_BOUND, eps=EPS),
                         kda.kda_decode_fused(*inputs, lower_bound=LOWER_BOUND, eps=EPS)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
@pytest.mark.parametrize("seed, dtype, shape", [c for c in CASES if c.values[2][1] > 1])
def test_kda_tokens_one_call_equals_sequential(
    form: Form, seed: int, dtype: type, shape: tuple[int, ...]
) -> None:
    x, conv_w, hist, z, dt_bias, a_log, beta_logits, gate, o_norm_w, state = make_inputs(seed, shape, dtype)
    want = run(form, (x, conv_w, hist, z, dt_bias, a_log, beta_logits, gate, o_norm_w, state))
    outs = []
    for t in range(x.shape[1]):
        one = slice(t, t + 1)
        out, state, hist = run(form, (x[:, one], conv_w, hist, z[:, one], dt_bias, a_log,
                                      beta_logits[:, one], gate[:, one], o_norm_w, state))
        outs.append(out)
    assert_step_close((np.concatenate(outs, axis=1), state, hist), want, dtype, "token by token")


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_kda_inputs_not_mutated(form: Form) -> None:
    inputs = make_inputs(3, (2, 4, 2, 6, 4), np.float64)
    before = [a.copy() for a in inputs]
    run(form, inputs)
    for a, b in zip(inputs, before, strict=True):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=60, deadline=None)
@given(
    z=st.lists(st.floats(-1e4, 1e4), min_size=4, max_size=4),
    a_log=st.floats(-3, 3),
    lower_bound=st.floats(-10, -0.1),
)
def test_kda_decay_within_bounds(z: list[float], a_log: float, lower_bound: float) -> None:
    """alpha = exp(g) lies in (e^lb, 1]; the bound is reached only when the sigmoid rounds to 1."""
    g = kda.kda_gate(np.array(z).reshape(1, 1, 4), np.zeros(4), np.array([a_log]), lower_bound)
    alpha = np.exp(g)
    assert alpha.shape == (1, 1, 1, 4)
    assert np.all(alpha <= 1.0) and np.all(alpha >= np.exp(lower_bound) * (1 - 1e-12))
    moderate = np.abs(np.exp(a_log) * np.array(z)) < 20
    assert np.all(alpha[0, 0, 0][moderate] > np.exp(lower_bound))


def test_kda_gate_extremes() -> None:
    g = kda.kda_gate(np.array([[[-1e6, 0.0, 1e6]]]), np.zeros(3), np.array([0.0]), LOWER_BOUND)
    np.testing.assert_allclose(np.exp(g).ravel(), [1.0, np.exp(LOWER_BOUND / 2), np.exp(LOWER_BOUND)])


def test_kda_delta_rule_writes_value_at_key() -> None:
    """With alpha = 1 and beta = 1 the update makes S^T k_hat = v (up to |k_hat|^2 = 1 - O(1e-6))."""
    rng = np.random.default_rng(7)
    B, N, H = 2, 3, 16
    q, k, v = (rng.standard_normal((B, 1, N, H)) for _ in range(3))
    state = rng.standard_normal((B, N, H, H))
    o, new_state = kda.kda_recurrent(q, k, v, np.zeros((B, 1, N, H)), np.ones((B, 1, N)), state)
    k_hat = k[:, 0] / np.linalg.norm(k[:, 0], axis=-1, keepdims=True)
    np.testing.assert_allclose(np.einsum("bnij,bni->bnj", new_state, k_hat), v[:, 0], rtol=1e-5, atol=1e-5)
    q_hat = q[:, 0] / np.linalg.norm(q[:, 0], axis=-1, keepdims=True) / np.sqrt(H)
    np.testing.assert_allclose(o[:, 0], np.einsum("bnij,bni->bnj", new_state, q_hat), rtol=1e-5, atol=1e-5)


def test_kda_conv_matches_np_convolve() -> None:
    """From zero history, channel c is the causal 1-D convolution of x[:, c] with the reversed taps."""
    rng = np.random.default_rng(5)
    B, T, C, W = 1, 9, 6, 4
    x, conv_w = rng.standard_normal((B, T, C)), rng.standard_normal((C, W))
    y, new_hist = kda.kda_conv_update(x, conv_w, np.zeros((B, C, W - 1)))
    pre = np.stack([np.convolve(x[0, :, c], conv_w[c, ::-1])[:T] for c in range(C)], axis=1)  # [T, C]
    np.testing.assert_allclose(y[0], pre / (1 + np.exp(-pre)), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(new_hist[0], x[0, T - (W - 1) :].T)
