"""The fast backend's replacements (simulator/fast/replacements.py) against the ops they replace, and the fence
around the annex: nothing in ops/, plans/ or cost/ imports simulator.fast.

Tolerance: the shared table (tests/numerics.py: 1e-12 in float64, 1e-5 in float32). A replacement computes
its op's function in the op's dtype and differs only in the order of its sums (and, compiled, fused
multiply-adds): for the sums of at most a few hundred O(1) terms drawn here that moves a result by at most
~n eps relative (256 x 1.1e-16 = 3e-14 in float64, 256 x 6e-8 = 1.5e-5 worst case in float32, ~sqrt(n) eps
typically), and a packed MXFP4 weight is exact (E2M1 values times power-of-two scales), so the table holds
with margin in float64 while a wrong formula (a constant, an index, a missing term) misses it by orders of
magnitude. Indices (the top-k order) must be equal.
"""

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numerics import assert_close
from simulator.config import load_model
from simulator.fast import kernels
from simulator.fast.experts import PackedExperts
from simulator.fast.packed import MXFP4Weight
from simulator.fast.replacements import REPLACEMENTS
from simulator.ops import experts, kda, norm, router
from simulator.ops.replaceable import replaceable, replacing

ROOT = Path(__file__).resolve().parent.parent
CFG = load_model("tiny-k3")


def _experts(rng, dtype, packed):  # type: ignore[no-untyped-def]
    """(gate+up fn, down fn, routing idx, weights, z, h) for 6 tokens, 8 experts, k = 3, Din 64, F 96; packed:
    the replacement gets `PackedExperts` over MXFP4 parts and the op the same weights dequantized."""
    din, f, m, k, n_exp = 64, 96, 6, 3, 8
    parts = {(e, p): kernels.mxfp4_quantize_t(rng.standard_normal(shape, dtype=np.float32) * np.float32(0.2))
             for e in range(n_exp) for p, shape in (("w_gate", (din, f)), ("w_up", (din, f)), ("w_down", (f, din)))}
    dense = lambda names: lambda e: tuple(np.asarray(MXFP4Weight(*parts[(e, p)]), dtype) for p in names)  # noqa: E731
    fast = (lambda names: PackedExperts(lambda e, p: parts[(e, p)], names, ("full",) * len(names))) if packed else dense
    idx = np.stack([rng.choice(n_exp, k, replace=False) for _ in range(m)])
    return {"gate_up": (dense(("w_gate", "w_up")), fast(("w_gate", "w_up"))),
            "down": (dense(("w_down",)), fast(("w_down",))), "idx": idx, "weight": rng.random((m, k)).astype(dtype),
            "z": rng.standard_normal((m, din)).astype(dtype), "h": rng.standard_normal((m, k, f)).astype(dtype)}


def _rms_norm(rng, dtype):  # type: ignore[no-untyped-def]
    x = rng.standard_normal((5, 256)).astype(dtype)
    args = (x, 1 + 0.1 * rng.standard_normal(256), 1e-6)
    return args, args


def _attn_res_mix(rng, dtype):  # type: ignore[no-untyped-def]
    args = ([rng.standard_normal((4, 128)).astype(dtype) for _ in range(5)], 1 + 0.1 * rng.standard_normal(128),
            rng.standard_normal(128) / 11, 1e-6)
    return args, args


def _top_order(rng, dtype):  # type: ignore[no-untyped-def]
    scores = np.round(rng.standard_normal((7, 96)), 1).astype(dtype)  # rounded: many ties, lower index first
    scores[0, 10:20] = -np.inf  # ineligible experts (grouped top-k masks them so)
    return (scores, 9), (scores, 9)


def _fc(name):  # type: ignore[no-untyped-def]
    """Half the draws carry expert biases (gpt-oss: [E, 2F] before FC1's activation, [E, Din] after FC2)."""
    def make(rng, dtype, packed=False):  # type: ignore[no-untyped-def]
        t = _experts(rng, dtype, packed)
        n_exp, f2, din = 8, 2 * t["h"].shape[2], t["z"].shape[1]
        with_bias = rng.random() < 0.5
        if name == "fc1":
            bias = (rng.standard_normal((n_exp, f2)).astype(dtype),) if with_bias else ()
            return ((t["z"], t["idx"], t["gate_up"][0], *bias, {"cfg": CFG}),
                    (t["z"], t["idx"], t["gate_up"][1], *bias, {"cfg": CFG}))
        bias = (rng.standard_normal((n_exp, din)).astype(dtype),) if with_bias else ()
        if name == "fc2":
            return ((t["h"], t["idx"], t["down"][0], *bias), (t["h"], t["idx"], t["down"][1], *bias))
        return ((t["h"], t["idx"], t["weight"], t["down"][0], *bias),
                (t["h"], t["idx"], t["weight"], t["down"][1], *bias))
    return make


def _kda_fused(rng, dtype):  # type: ignore[no-untyped-def]
    B, T, N, H, W = 2, 3, 3, 16, 4  # 2 sequences verifying 2 draft tokens, 3 heads of 16
    C = 3 * N * H
    args = tuple(a.astype(dtype) for a in (
        rng.standard_normal((B, T, C)), rng.standard_normal((C, W)) / 2, rng.standard_normal((B, C, W - 1)),
        rng.standard_normal((B, T, N * H)), 0.1 * rng.standard_normal(N * H), np.log(rng.uniform(1, 16, N)),
        rng.standard_normal((B, T, N)), rng.standard_normal((B, T, N * H)), 1 + 0.1 * rng.standard_normal(H),
        rng.standard_normal((B, N, H, H)) / 4))
    return args, args


def _kw(op):  # type: ignore[no-untyped-def]
    """The keyword arguments an op takes besides its tensors."""
    return {"lower_bound": -5.0, "eps": 1e-5} if op is kda.kda_decode_fused else {}


# op -> (op's arguments, replacement's arguments) for random small inputs of a dtype: one per registered op
EXAMPLES = {norm.rms_norm: _rms_norm, norm.attn_res_mix: _attn_res_mix, router.top_order: _top_order,
            experts.expert_fc1: _fc("fc1"), experts.expert_fc2: _fc("fc2"),
            experts.expert_fc2_finalize: _fc("fc2_finalize"), kda.kda_decode_fused: _kda_fused}


def _compare(op, replacement, op_args, fast_args, dtype):  # type: ignore[no-untyped-def]
    """The replacement's result against the op's NumPy form (`__wrapped__`): equal indices, close floats."""
    split = lambda args: (args[:-1], args[-1]) if isinstance(args[-1], dict) else (args, {})  # noqa: E731
    (op_pos, op_kw), (fast_pos, fast_kw) = split(op_args), split(fast_args)
    want, got = op.__wrapped__(*op_pos, **op_kw, **_kw(op)), replacement(*fast_pos, **fast_kw, **_kw(op))
    for w, g in zip(want, got) if isinstance(want, tuple) else [(want, got)]:
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w)
        else:
            assert_close(g, w, dtype, op.__name__)


def _name(op):  # type: ignore[no-untyped-def]
    return f"{op.__module__.rsplit('.', 1)[-1]}.{op.__name__}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("op", list(REPLACEMENTS), ids=_name)
def test_every_replacement_computes_its_op(op, dtype):
    for seed in range(6):
        op_args, fast_args = EXAMPLES[op](np.random.default_rng(seed), dtype)
        _compare(op, REPLACEMENTS[op], op_args, fast_args, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("op", [experts.expert_fc1, experts.expert_fc2, experts.expert_fc2_finalize], ids=_name)
def test_expert_replacements_on_packed_experts_compute_the_op_on_the_dequantized_ones(op, dtype):
    op_args, fast_args = EXAMPLES[op](np.random.default_rng(5), dtype, packed=True)
    _compare(op, REPLACEMENTS[op], op_args, fast_args, dtype)


def test_every_registered_op_is_replaceable_and_has_an_example():
    """A key must be the op its module calls (the @replaceable wrapper), or the replacement would never run
    where the plans' kernels call it; and every entry needs an example here."""
    for op in REPLACEMENTS:
        assert hasattr(op, "__wrapped__"), f"{_name(op)} is not @replaceable"
        assert getattr(sys.modules[op.__module__], op.__name__) is op, f"{_name(op)} is not its module's function"
    assert set(EXAMPLES) == set(REPLACEMENTS)


def test_a_wrong_replacement_is_caught():
    """The comparison can fail: an RMSNorm whose eps is off by 10x, an AttnRes mix that drops the last source
    and a top-k that breaks ties the other way are all caught."""
    wrong = {norm.rms_norm: lambda x, w, eps: kernels.rms_norm(x, w, 10 * eps),
             norm.attn_res_mix: lambda s, n, p, eps: kernels.attn_res_mix(s[:-1] + [s[-2]], n, p, eps),
             router.top_order: lambda scores, n: scores.shape[1] - 1 - np.argsort(-scores[:, ::-1], axis=-1,
                                                                                  kind="stable")[:, :n]}
    for op, replacement in wrong.items():
        op_args, fast_args = EXAMPLES[op](np.random.default_rng(0), np.float64)
        with pytest.raises(AssertionError):
            _compare(op, replacement, op_args, fast_args, np.float64)


def test_a_replacement_runs_only_inside_its_block():
    @replaceable
    def op(x):  # type: ignore[no-untyped-def]
        return x + 1
    with replacing({op: lambda x: x * 10}):
        assert op(2) == 20
    assert op(2) == 3


def _fast_imports(path: Path) -> list[str]:
    """The imports of simulator.fast (or of a module in it) a file makes, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([node.module] + [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom)
                 and node.module else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        found += [f"{path.relative_to(ROOT)}: {n}" for n in names
                  if n == "simulator.fast" or n.startswith("simulator.fast.")]
    return found


def test_ops_plans_and_cost_do_not_import_the_fast_package():
    """ops/ holds the definitions, plans/ binds them, cost/ prices them: none of them names the annex."""
    found = [hit for folder in ("ops", "plans", "cost") for path in sorted((ROOT / "simulator" / folder).rglob("*.py"))
             for hit in _fast_imports(path)]
    assert not found, found
    assert _fast_imports(ROOT / "simulator" / "fast" / "backend.py")  # the scan sees an import where there is one


def test_importing_every_op_and_plan_loads_no_fast_module():
    probe = ("import importlib, pkgutil, sys, simulator.ops, simulator.plans\n"
             "for pkg in (simulator.ops, simulator.plans):\n"
             "    for m in pkgutil.iter_modules(pkg.__path__): importlib.import_module(pkg.__name__ + '.' + m.name)\n"
             "print(sorted(m for m in sys.modules if m.startswith('simulator.fast')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


@pytest.mark.parametrize("args, env, message", [
    (["--backend", "numba"], {}, "--backend 'numba' is not a backend: choose one of numpy, fast."),
    ([], {"MOE_SIM_KERNELS": "gpu"}, "MOE_SIM_KERNELS 'gpu' is not a backend: choose one of numpy, fast.")])
def test_an_unknown_backend_is_one_sentence_and_exit_2(args, env, message, monkeypatch):
    from typer.testing import CliRunner

    from simulator.cli import app
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(app, ["check", "--tp", "2", "--batch", "1"] + args)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"error: {message}"]


@pytest.mark.parametrize("args, env", [(["--backend", "numpy"], {"MOE_SIM_KERNELS": "fast"}),
                                       ([], {"MOE_SIM_KERNELS": "numpy"})], ids=["flag", "environment"])
def test_the_flag_or_else_the_environment_picks_the_backend(args, env, monkeypatch):
    """The flag wins over the environment variable; the chosen name reaches the executor."""
    from typer.testing import CliRunner

    from simulator import check
    from simulator.cli import app
    seen = []
    real = check.check_layer
    monkeypatch.setattr(check, "check_layer", lambda *a, **k: seen.append(k["backend"]) or real(*a, **k))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(app, ["check", "--tp", "2", "--batch", "1", "--layer", "kda"] + args)
    assert result.exit_code == 0, result.output
    assert seen == ["numpy"]
