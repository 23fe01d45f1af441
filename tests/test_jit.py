"""simulator/jit.py: kernels compiled on first call, so importing a kernel module imports no Numba."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from simulator import jit


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_importing_a_kernel_module_imports_no_numba():
    assert _fresh("import sys, simulator.fast.kda; print('numba' in sys.modules)") == "False"


def test_first_call_compiles_and_the_python_form_stays():
    """The first call of a lazy kernel puts a Numba dispatcher in its module's namespace; `.py_func` is the
    plain function, and both give the same numbers."""
    out = _fresh(
        "import sys, numpy as np\n"
        "import simulator.fast.kda as k\n"
        "proxy = k._kda_fused_kernel\n"
        "print(type(proxy).__name__, proxy.py_func.__name__)\n"
        "rng = np.random.default_rng(0)\n"
        "B, T, N, H, W = 1, 2, 2, 8, 4\n"
        "x = rng.standard_normal((B, T, 3 * N * H))\n"
        "args = (x, rng.standard_normal((3 * N * H, W)) * 0.3, rng.standard_normal((B, 3 * N * H, W - 1)),\n"
        "        rng.standard_normal((B, T, N * H)), rng.standard_normal(N * H), rng.standard_normal(N),\n"
        "        rng.standard_normal((B, T, N)), rng.standard_normal((B, T, N * H)), "
        "1 + 0.1 * rng.standard_normal(H),\n"
        "        rng.standard_normal((B, N, H, H)) * 0.1)\n"
        "a = k._launch_fused(proxy, *args, lower_bound=-5.0, eps=1e-6)\n"
        "print('numba' in sys.modules, type(k._kda_fused_kernel).__name__)\n"
        "b = k._launch_fused(proxy.py_func, *args, lower_bound=-5.0, eps=1e-6)\n"
        "print(max(float(np.max(np.abs(u - v))) for u, v in zip(a, b)) < 1e-12)\n")
    lines = out.splitlines()
    assert lines[0] == "LazyJit _kda_fused_kernel"
    assert lines[1] == "True CPUDispatcher"
    assert lines[2] == "True"


def test_helpers_stay_plain_functions_until_compiled():
    from simulator.fast import kda
    assert not isinstance(kda._sigmoid_scalar, jit.LazyJit) and callable(kda._sigmoid_scalar)
    c = kda._Consts(*(np.float64(v) for v in (1.0, -5.0, 1e-6, 1e-6, 8.0)))
    assert abs(kda._sigmoid_scalar(np.float64(0.0), c) - 0.5) < 1e-15


def test_kernel_caches_are_stamped_with_every_kernel_and_extension_source(tmp_path):
    """Numba keys a cache on the function's own file; ours also carry a digest of numba_ext.py and every
    kernel module (a fixed list, whatever was imported first), so an edit to an overload recompiles: three
    processes share one cache folder, the third with a different digest (as after an edit)."""
    sources = jit.kernel_sources()
    for name in ("numba_ext.py", "kernels.py", "rng.py", "kda.py"):
        assert any(s.endswith(name) for s in sources), name
    probe = ("import sys; from simulator import jit; from simulator.fast import kernels as fast\n"
             "if sys.argv[1] == 'edited': jit.kernel_digest = lambda files: 'edited'\n"
             "fast.rms_norm(fast.np.ones((1, 4)), fast.np.ones(4), 1e-6)\n"
             "s = fast._rms_norm.stats; assert fast._rms_norm._cache._impl.locator.get_source_stamp()[1] == "
             "jit.kernel_digest(jit.kernel_sources())\n"
             "print(sum(s.cache_hits.values()), sum(s.cache_misses.values()))")
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", probe, how], env=env, capture_output=True, text=True, check=True)
            .stdout.split() for how in ("plain", "plain", "edited")]
    assert runs == [["0", "1"], ["1", "0"], ["0", "1"]]  # compiled, loaded, recompiled after the "edit"
