"""CLI contract: exit codes, key output, JSON shape, one-sentence errors without traceback."""

import inspect
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
    assert layer["layer"] == "kda" and layer["kernel_counts"] == {"standard": 22, "specialized": 13}
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
    (("check", "--tp", "3"), "--tp 3 does not divide"),
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


# ------------------------------------------------------------------ flags as typed, one fact each, no no-ops


@pytest.mark.parametrize("args, needle, absent", [
    (("step", "--batch", "-1"), "--batch = -1", "context"),
    (("layer", "--batch", "0"), "--batch = 0", "tokens"),
    (("layer", "--tokens-per-seq", "0"), "--tokens-per-seq = 0", "batch"),
    (("step", "--context", "-5"), "--context = -5", "batch"),
    (("step", "--tp", "0"), "--tp = 0", "batch"),
    (("ablation", "--tp", "-2"), "--tp = -2", "batch"),
])
def test_range_errors_name_the_flag_as_typed_one_fact(args, needle, absent):
    r = run(*args)
    assert r.exit_code == 2 and r.output.startswith(f"error: {needle}") and r.output.count("\n") == 1
    assert absent not in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args, needle", [
    (("layer", "--enable-fusion", "fused_kda"), "--enable-fusion fused_kda changes nothing"),
    (("step", "--enable-fusion", "latent_tail"), "on by default"),
    (("layer", "--enable-fusion", "unpadded_experts", "--disable-fusion", "unpadded_experts"),
     "both name unpadded_experts"),
    (("layer", "--enable-fusion", "unpadded_experts"), "--enable-fusion unpadded_experts changes nothing"),
    (("layer", "--variant", "standard", "--disable-fusion", "fused_kda"), "--variant standard prices only"),
    (("step", "--variant", "standard", "--enable-fusion", "unpadded_experts"),
     "--enable-fusion changes the specialized"),
    (("ablation", "--tokens-per-seq", "1", "--acceptance-length", "3"),
     "--acceptance-length 3 must lie in [1, --tokens-per-seq = 1]"),
    (("ablation", "--tokens-per-seq", "8", "--acceptance-length", "9"), "must lie in [1, --tokens-per-seq = 8]"),
])
def test_options_that_change_nothing_are_refused(args, needle):
    r = run(*args)
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_useful_fusion_flags_still_work():
    assert run("layer", "--disable-fusion", "unpadded_experts", "--json").exit_code == 0
    assert run("layer", "--variant", "specialized", "--disable-fusion", "fused_kda", "--json").exit_code == 0
    assert run("ablation", "--tokens-per-seq", "8", "--acceptance-length", "6", "--json").exit_code == 0


# ------------------------------------------------------------------ names never cut, help paragraphs apart


def test_ablation_prints_whole_fusion_names_at_80_columns(monkeypatch):
    from simulator.plans.specialized import FUSIONS
    monkeypatch.setenv("COLUMNS", "80")
    r = run("ablation")
    assert r.exit_code == 0 and "…" not in r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    for name in FUSIONS:
        assert sum(f"│ {name} " in line for line in r.output.splitlines()) == 2, name  # layer and step tables


@pytest.mark.parametrize("command", ["check", "layer", "step", "trace", "ablation", "run"])
def test_help_keeps_example_a_paragraph_of_its_own(command):
    lines = run(command, "--help").output.splitlines()
    example = next(i for i, line in enumerate(lines) if line.strip().startswith("Example:"))
    assert not lines[example - 1].strip() and not lines[example + 1].strip(), "blank lines around Example:"


def test_check_help_example_is_a_small_run():
    text = run("check", "--help").output
    assert "Exit 0 when" in text and "Example: moe-sim check --tp 2" in text
    assert "kimi-k3" not in text.split("Options:")[0]
    example = next(line for line in text.splitlines() if "Example:" in line)
    assert "Exit 0" not in example


# ------------------------------------------------------------------ one set of defaults, names in any case


def test_every_command_defaults_to_one_token_per_sequence():
    from simulator.cli import ablation, compare_trace, layer, trace
    for command in (layer, ablation, trace, compare_trace):
        assert inspect.signature(command).parameters["tokens_per_seq"].default == 1, command.__name__
    assert json.loads(run("layer", "--json", "--no-interval").output)["tokens_per_seq"] == 1
    assert json.loads(run("step", "--json", "--no-interval").output)["speculation"]["draft_tokens"] == 0


def test_layer_type_defaults_to_the_model_s_own():
    assert json.loads(run("layer", "--model", "deepseek-v3", "--json", "--no-interval").output)["layer"] == "mla"
    assert json.loads(run("layer", "--json", "--no-interval").output)["layer"] == "kda"
    assert json.loads(run("ablation", "--model", "deepseek-v3", "--json").output)["layer"] == "mla"


def test_names_are_case_insensitive():
    upper = run("layer", "--model", "Kimi-K3", "--hardware", "H200", "--tp", "8", "--layer", "KDA", "--variant",
                "Standard", "--json", "--no-interval")
    lower = run("layer", "--model", "kimi-k3", "--hardware", "h200", "--tp", "8", "--layer", "kda", "--variant",
                "standard", "--json", "--no-interval")
    assert upper.exit_code == 0 and json.loads(upper.output) == json.loads(lower.output)
    assert run("list", "Models").output == run("list", "models").output
    assert run("step", "--drafter", "DSpark-K3", "--draft-tokens", "3", "--json", "--no-interval").exit_code == 0


def test_speculation_states_its_acceptance_assumption():
    assumed = json.loads(run("step", "--draft-tokens", "3", "--json", "--no-interval").output)
    assert assumed["acceptance_length"] == pytest.approx((1 - 0.85 ** 4) / 0.15, abs=1e-4)
    assert assumed["speculation"]["assumption"].startswith("assumed: each draft accepted with probability 0.85")
    given = json.loads(run("step", "--draft-tokens", "3", "--acceptance-length", "2.5", "--json",
                           "--no-interval").output)
    assert given["acceptance_length"] == 2.5 and given["speculation"]["assumption"] == "given with --acceptance-length"
    for doc in (assumed, given):
        for v in doc["variants"].values():
            assert v["ms_per_token"] == pytest.approx(v["step_ms"] / doc["acceptance_length"], rel=1e-3)
    bracket = json.loads(run("step", "--batch", "8", "--draft-tokens", "7", "--routing-bracket", "--json",
                             "--no-interval").output)
    assert bracket["acceptance_length"] < 8, "not every draft accepted unless the user says so"


@pytest.mark.parametrize("args, charts", [
    (["layer", "--no-interval"], 6), (["ablation"], 4), (["step", "--sensitivity", "--draws", "50"], 2),
    (["validate"], 2)])
def test_plot_prints_where_it_wrote(tmp_path, monkeypatch, args, charts):
    monkeypatch.setenv("COLUMNS", "200")
    r = run(*args, "--plot", str(tmp_path / "p"))
    assert r.exit_code == 0, r.output
    words = r.output.split()  # long paths wrap onto more lines, at the spaces between them
    written = sorted((tmp_path / "p").iterdir())
    assert len(written) == charts and f"wrote {charts} chart file(s): " in " ".join(words)
    assert all(str(p) in words or f"{p}," in words for p in written)


def test_step_help_quotes_the_default_acceptance_the_code_uses():
    from simulator.report.summary import DRAFT_ACCEPTANCE, acceptance
    text = " ".join(run("step", "--help").output.split())
    assert f"probability {DRAFT_ACCEPTANCE:g} given the one before" in text
    assert f"{acceptance(3, None)[0]:.2f} at 3 drafts, {acceptance(7, None)[0]:.2f} at 7" in text


def test_scenario_names_are_case_insensitive_too(tmp_path):
    toml = ('question = "q"\nkind = "Layer"\n[base]\nmodel = "Kimi-K3"\nhardware = "GB300"\nlayer = "{}"\n'
            '[sweep]\nbatch = [1, 2]\n')
    (tmp_path / "upper.toml").write_text(toml.format("MLA"))
    (tmp_path / "lower.toml").write_text(toml.format("mla").replace('"Layer"', '"layer"'))
    docs = [json.loads(run("run", str(tmp_path / f"{name}.toml"), "--no-interval", "--json").output)
            for name in ("upper", "lower")]
    assert docs[0]["rows"] == docs[1]["rows"] and docs[0]["rows"][0]["status"] == "ok"


def test_a_sweep_states_the_acceptance_it_assumed(tmp_path):
    (tmp_path / "d.toml").write_text('question = "q"\n[base]\ndraft_tokens = 3\n[sweep]\nbatch = [1, 2]\n')
    doc = json.loads(run("run", str(tmp_path / "d.toml"), "--no-interval", "--json").output)
    assert doc["summary"]["acceptance_assumption"].startswith("assumed: each draft accepted with probability 0.85")
    assert {r["acceptance_length"] for r in doc["rows"]} == {round((1 - 0.85 ** 4) / 0.15, 4)}
    table = " ".join(run("run", str(tmp_path / "d.toml"), "--no-interval").output.split())
    assert "acceptance length where drafts are verified: assumed:" in table
    given = json.loads(run("run", "speculative", "--quick", "--no-interval", "--json").output)
    assert "acceptance_assumption" not in given["summary"], "a swept acceptance length is the user's"
