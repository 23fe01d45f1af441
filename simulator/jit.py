"""Numba on first call: a module that defines compiled kernels costs no Numba import until one of them runs.

Importing Numba and loading its cached machine code takes ~0.3-0.7 s, more than the cost model needs to
price a step. The fast backend imports its kernels (`fast/kda.py`, `fast/kernels.py`) when a plan runs on
it, and the executor the weight store (`weights.py` -> `fast/rng.py`), so a kernel module that imported
Numba at the top would charge that to `moe-sim step`, which runs none of them. Used by the
fast backend (simulator/fast).

    @lazy_njit(cache=True)      a kernel: a proxy whose first call imports Numba and compiles it; `.py_func`
    def kernel(...): ...        is the plain Python function (STYLE item 14), runnable without Numba
    @jitable                    a helper the kernels call: stays a plain Python function, registered with
    def helper(...): ...        Numba (register_jitable) when the kernels compile
    prange = range              a module's parallel loops; the compile binds it to numba.prange
    on_compile("pkg.module")    Numba extensions (overloads, intrinsics) imported at the first compile,
    on_compile(setup)           or a function run then (one that binds constants the kernels read)

Kernels call helpers and each other by their module-level names, which Numba resolves when it types a
kernel. So the first call compiles every registered module at once: each module's proxies are replaced in
its namespace by their Numba dispatchers (which compile per signature on their own first call), its
helpers are registered, and its `prange` is bound. Code that imported a proxy by name keeps working: the
proxy forwards to its dispatcher.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import sys
import threading
from typing import Any, Callable

_MODULES: list[str] = []  # modules holding lazy kernels or helpers, in import order
_HELPERS: list[Callable[..., Any]] = []
_EXTENSIONS: list[str | Callable[[], Any]] = []  # extension modules (overloads, intrinsics) or setup to run at compile
_compiled = False
_LOCK = threading.RLock()  # weights.py draws experts on a thread pool: the first calls may race


class LazyJit:
    """A function Numba compiles on its first call (module docstring)."""

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self.py_func = fn
        self.options = options
        self.dispatcher: Any = None
        functools.update_wrapper(self, fn)
        _register(fn.__module__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.dispatcher is None:
            compile_all()
        return self.dispatcher(*args, **kwargs)


def lazy_njit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """`numba.njit(**options)`, compiled on the first call instead of at import."""
    if fn is None:
        return lambda f: LazyJit(f, options)
    return LazyJit(fn, options)


def jitable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`numba.extending.register_jitable`, registered when the kernels compile; until then a plain function."""
    _HELPERS.append(fn)
    _register(fn.__module__)
    return fn


def on_compile(what: str | Callable[[], Any]) -> None:
    """When the kernels compile, not before: import a module of Numba extensions (overloads, intrinsics), or
    call a setup function (one that binds constants the kernels read)."""
    if what not in _EXTENSIONS:
        _EXTENSIONS.append(what)
    if _compiled:
        _run(what)


def _run(what: str | Callable[[], Any]) -> None:
    if callable(what):
        what()
    else:
        importlib.import_module(what)


def threads() -> int:
    """Numba's thread count, for sizing parallel kernels' chunks (imports Numba: call it on the kernel path)."""
    import numba
    return numba.get_num_threads()


def compile_all() -> None:
    """Import Numba, register the helpers, put a dispatcher in place of every lazy kernel, bind `prange`."""
    import numba
    from numba.extending import register_jitable
    with _LOCK:
        _compile_locked(numba, register_jitable)


def _compile_locked(numba: Any, register_jitable: Callable[..., Any]) -> None:
    global _compiled
    for fn in _HELPERS:
        register_jitable(fn)
    _HELPERS.clear()
    for what in _EXTENSIONS:
        _run(what)
    _stamp_caches()
    for name in _MODULES:
        namespace = vars(sys.modules[name])
        if "prange" in namespace:
            namespace["prange"] = numba.prange
        for key, obj in list(namespace.items()):
            if isinstance(obj, LazyJit):
                if obj.dispatcher is None:
                    obj.dispatcher = numba.njit(**obj.options)(obj.py_func)
                namespace[key] = obj.dispatcher
    _compiled = True


def kernel_sources() -> tuple[str, ...]:
    """The package's files that define kernels or helpers (they import this module) and the extension
    module, sorted: a fixed list, whatever has been imported so far."""
    root = os.path.dirname(os.path.abspath(__file__))
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(".py") and (name == "numba_ext.py" or "from simulator.jit import" in _text(path)):
                found.append(path)
    return tuple(sorted(found))


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def kernel_digest(files: tuple[str, ...]) -> str:
    """One hash of the files' contents."""
    h = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _stamp_caches() -> None:
    """Numba keys a function's on-disk cache on its own source file only, so an edit to `numba_ext.py` (or to a
    kernel module another calls) would load stale machine code. Our kernels' cache stamps also carry one
    digest of every kernel and extension source: an edit to any of them recompiles them all (~25 s, once)."""
    from numba.core import caching
    if any(getattr(c, "moe_sim", False) for c in caching.CacheImpl._locator_classes):
        return
    ours = kernel_sources()
    digest = kernel_digest(ours)

    def stamped(base: Any) -> Any:
        class Locator(base):  # type: ignore[misc, valid-type]
            moe_sim = True

            def get_source_stamp(self) -> Any:
                return (super().get_source_stamp(), digest)

            @classmethod
            def from_function(cls, py_func: Any, py_file: str) -> Any:
                return super().from_function(py_func, py_file) if os.path.abspath(py_file) in ours else None
        return Locator
    bases = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator)
    caching.CacheImpl._locator_classes[:0] = [stamped(b) for b in bases]


def _register(module: str) -> None:
    if module not in _MODULES:
        _MODULES.append(module)
    if _compiled:  # a module imported after the first compile: bring it up to date now
        compile_all()
