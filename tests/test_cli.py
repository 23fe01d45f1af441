"""CLI contract: exit codes, key output, JSON shape, one-sentence errors without traceback."""

import json

import pytest
from typer.testing import CliRunner

from simulator.cli import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_check_default_passes():
    r = run("check")
    assert r.exit_code == 0, r.output
    assert "PASSED" in r.output and "kda" in r.output and "rel RMS" in r.output


def test_check_json_contract():
    r = run("check", "--layer", "kda", "--tp", "16", "--batch", "1", "--tokens-per-seq", "8", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert doc["passed"] is True and doc["precision"] == "fp64"
    layer = doc["layers"][0]
    assert layer["layer"] == "kda" and layer["kernel_counts"] == {"standard": 23, "specialized": 13}
    assert isinstance(layer["max_abs_error"], float) and isinstance(layer["rel_rms_error"], float)
    assert layer["routing_flips"] == 0


def test_check_bf16_json():
    r = run("check", "--precision", "bf16", "--json", "--layer", "mla", "--batch", "2")
    doc = json.loads(r.output)
    assert r.exit_code == 0 and doc["precision"] == "bf16" and doc["layers"][0]["rel_rms_error"] > 1e-5


def test_check_exit_1_when_out_of_tolerance(monkeypatch):
    import simulator.check as chk
    monkeypatch.setitem(chk.REL_RMS_TOL, "bf16", 1e-9)
    r = run("check", "--precision", "bf16", "--layer", "dense")
    assert r.exit_code == 1 and "FAILED" in r.output


@pytest.mark.parametrize("args, needle", [
    (("check", "--tp", "3"), "does not divide"),
    (("check", "--batch", "-2"), "batch"),
    (("check", "--model", "no-such-model"), "unknown model"),
    (("check", "--tokens-per-seq", "0"), "--tokens-per-seq = 0"),
    (("check", "--all-reduce", "tree"), "all-reduce"),
    (("list", "gpus"), "cannot list"),
])
def test_bad_input_exit_2_one_sentence(args, needle):
    r = run(*args)
    assert r.exit_code == 2
    assert needle in r.output
    assert "Traceback" not in r.output


def test_bad_files(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("[1, 2")
    r = run("check", "--model", str(bad))
    assert r.exit_code == 2 and "not valid JSON" in r.output
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"model_type": "llama"}))
    r = run("check", "--model", str(odd))
    assert r.exit_code == 2 and "model_type" in r.output


def test_list_models():
    r = run("list", "models")
    assert r.exit_code == 0 and "kimi-k3" in r.output.split()
