"""One tolerance table for op-level tests, and the one closeness check they all use (STYLE items 16-18)."""

import numpy as np

TOL = {np.float64: (1e-12, 1e-12), np.float32: (1e-5, 1e-5)}  # (rtol, atol), tuned on the ops' worst cases


def assert_close(actual: np.ndarray, desired: np.ndarray, dtype: type, what: str = "") -> None:
    """Shape and dtype first, then elementwise closeness with max-abs and RMS-ratio in the message."""
    assert actual.shape == desired.shape, f"{what}: shape {actual.shape} != {desired.shape}"
    assert actual.dtype == desired.dtype == dtype, f"{what}: dtype {actual.dtype} / {desired.dtype}"
    rtol, atol = TOL[dtype]
    err = np.abs(actual - desired)
    ratio = np.sqrt(np.mean(err**2) / max(np.mean(desired.astype(np.float64) ** 2), 1e-300))
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol,
                               err_msg=f"{what}: max|err|={err.max():.3e} rms ratio={ratio:.3e}")
