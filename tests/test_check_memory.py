"""`check` estimates the RAM it will use from the shapes, before any weight exists, and refuses with one
sentence past what the machine has available."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from simulator import check
from simulator.cli import app
from simulator.plans.kernel import DecodeShape

runner = CliRunner()


def test_check_estimate_brackets_the_measured_full_size_peak(k3):
    """Measured: `moe-sim check --model kimi-k3 --tp 16 --batch 1` peaks at 2,678,712 KiB RSS (2.74 GB,
    /usr/bin/time -v on a 2-core, 23 GiB machine; the check path itself is unchanged by the estimate). It must not be
    below it, nor so far above that a machine that can run the check is refused."""
    need = max(check.estimate_layer_bytes(k3, t, 16, DecodeShape(1, 1, 64)) for t in ("kda", "mla", "dense"))
    assert 2.743e9 <= need <= 1.25 * 2.743e9


def test_check_refuses_past_available_memory(monkeypatch):
    monkeypatch.setattr(check, "available_memory", lambda: 2 * 10**9)
    r = runner.invoke(app, ["check", "--model", "kimi-k3", "--tp", "16", "--batch", "1"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "needs about 3.0 GB of memory" in r.stderr and "but 2.0 GB is available" in r.stderr


def test_available_memory_reads_the_machine():
    assert 0 < check.available_memory() < 1 << 50


def test_check_json_reports_its_estimate():
    doc = json.loads(runner.invoke(app, ["check", "--json"]).stdout)
    assert 0.2 <= doc["memory_estimate_gb"] < 1.0  # tiny-k3: mostly the interpreter baseline


def test_errors_in_blocks_are_the_whole_array_errors(monkeypatch):
    """`check._err` walks the arrays ERR_BLOCK elements at a time (no state-sized temporaries); the figures
    are the whole-array ones, for float32 against float64 and a block that does not divide the size."""
    import numpy as np
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((5, 7, 11))
    x = (ref + 1e-3 * rng.standard_normal(ref.shape)).astype(np.float32)
    monkeypatch.setattr(check, "ERR_BLOCK", 37)
    got = check._err("t", x, ref, 1e-2)
    diff = x.astype(np.float64) - ref
    assert got.max_abs_error == np.max(np.abs(diff))
    np.testing.assert_allclose(got.rel_rms_error, np.linalg.norm(diff) / np.linalg.norm(ref), rtol=1e-12)
