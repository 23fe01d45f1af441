"""Bad-input sweep: every malformed number in a config.json, a hardware TOML, a scenario or a CLI flag
ends in exit 2 with one line on stderr that names the problem, no traceback and no output file.

Each case is (command template, file to write or None, needle). The command's `{file}` is the bad input
written to a temp folder and `{out}` an output path that must not exist afterwards. Output-path
problems themselves (read-only folders, FIFOs, ...) are tested with the output-file code, not here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


# ---------------------------------------------------------------------------------------
# bad files, each built from a shipped one with one change
# ---------------------------------------------------------------------------------------

def deepseek(**changes) -> str:
    """tiny-deepseek's config.json with keys replaced; values are JSON text (so NaN stays NaN)."""
    text = (ROOT / "models" / "tiny-deepseek.json").read_text()
    for key, value in changes.items():
        text, n = re.subn(rf'"{key}": [^,\n]+', f'"{key}": {value}', text)
        if not n:  # a key the file does not have yet
            text = text.replace("{", f'{{\n  "{key}": {value},', 1)
    return text


def kimi(**changes) -> str:
    """kimi-k3's config.json (the nested text_config) with keys replaced."""
    text = (ROOT / "models" / "kimi-k3.json").read_text()
    for key, value in changes.items():
        text, n = re.subn(rf'"{key}": [^,\n]+', f'"{key}": {value}', text, count=1)
        assert n, key
    return text


def h200(key: str, value: str) -> str:
    """The H200 profile with one constant's value replaced (TOML literals: nan, inf, -1, ...)."""
    text = (ROOT / "simulator" / "hardware" / "h200.toml").read_text()
    inline = re.subn(rf"^{key} = \{{ value = [^,]+,", f"{key} = {{ value = {value},", text, flags=re.M)
    if inline[1]:
        return inline[0]
    table = re.subn(rf"(\[{key}\]\nvalue = )[^\n]+", rf"\g<1>{value}", text)
    assert table[1], key
    return table[0]


def scenario(base: str = "", sweep: str = "", top: str = "") -> str:
    return f'question = "a bad scenario"\n{top}\n[base]\ntp = 8\n{base}\n[sweep]\n{sweep}\n'


GOOD_JSON = (ROOT / "models" / "tiny-deepseek.json").read_text()
DS = "trace --out {out} --model {file} --layer mla --tp 4"  # a command that would write a file
K3 = "check --model {file} --tp 16 --batch 1"
HW = "trace --out {out} --hardware {file} --tp 8"
RUN = "run {file} --out {out}"

CASES = {
    # config.json -----------------------------------------------------------------------
    "cfg-scaling-nan": (DS, deepseek(routed_scaling_factor="NaN"), "'routed_scaling_factor' = nan must be a finite"),
    "cfg-situ-beta-inf": (K3, kimi(activation_situ_beta="Infinity"), "'activation_situ_beta' = inf must be a finite"),
    "cfg-eps-minus-inf": (DS, deepseek(rms_norm_eps="-Infinity"), "'rms_norm_eps' = -inf must be a finite"),
    "cfg-eps-zero": (DS, deepseek(rms_norm_eps="0"), "'rms_norm_eps' = 0.0 must be positive"),
    "cfg-scaling-negative": (DS, deepseek(routed_scaling_factor="-2.5"),
                             "'routed_scaling_factor' = -2.5 must be positive"),
    "cfg-rope-theta-zero": (DS, deepseek(rope_theta="0"), "'rope_theta' = 0.0 must be positive"),
    "cfg-rope-theta-one": (DS, deepseek(rope_theta="1"), "'rope_theta' = 1.0 must exceed 1"),
    "cfg-hidden-negative": (DS, deepseek(hidden_size="-64"), "'hidden_size' = -64 must be a positive integer"),
    "cfg-hidden-zero": (DS, deepseek(hidden_size="0"), "'hidden_size' = 0 must be a positive integer"),
    "cfg-hidden-float": (DS, deepseek(hidden_size="64.5"), "'hidden_size' = 64.5 should be of type int"),
    "cfg-experts-string": (DS, deepseek(n_routed_experts='"32"'), "'n_routed_experts' = '32' should be of type int"),
    "cfg-layers-zero": (DS, deepseek(num_hidden_layers="0"),
                        "'num_hidden_layers' = 0 must be an integer in [1, 10000]"),
    "cfg-layers-huge": (DS, deepseek(num_hidden_layers="1000000000"), "must be an integer in [1, 10000]"),
    "cfg-topk-zero": (DS, deepseek(num_experts_per_tok="0"), "'top_k' = 0 must be a positive integer"),
    "cfg-gate-bound-nan": (K3, kimi(gate_lower_bound="NaN"), "'gate_lower_bound' = nan must be a finite"),
    "cfg-rope-scaling-unknown-key": (DS, deepseek(rope_scaling='{"type": "yarn", "factor": 4, '
                                                               '"original_max_position_embeddings": 64, '
                                                               '"mscale_all_dim": 1, "attention_factor": 2}'),
                                     "unknown key 'attention_factor'"),
    "cfg-hidden-2-20": (K3, kimi(hidden_size=str(2**20)), "this check needs about"),
    "cfg-rope-scaling-linear": (DS, deepseek(rope_scaling='{"type": "linear", "factor": 4.0}'),
                                "only 'yarn' is modelled"),
    "cfg-rope-scaling-nan": (DS, deepseek(rope_scaling='{"type": "yarn", "factor": NaN, '
                                          '"original_max_position_embeddings": 64}'),
                             "rope_scaling: field 'factor' = nan must be a finite"),
    "cfg-quant-int4": (DS, deepseek(quantization_config='{"quant_method": "int4"}'), "names format 'int4'"),
    "cfg-not-json": (DS, GOOD_JSON[:-20], "not valid JSON"),
    "cfg-top-level-list": (DS, "[1, 2]", "must be a JSON object"),
    # hardware TOML ---------------------------------------------------------------------
    "hw-bandwidth-nan": (HW, h200("hbm_bandwidth", "nan"), "'hbm_bandwidth' value = nan must be a finite"),
    "hw-bandwidth-inf": (HW, h200("hbm_bandwidth", "inf"), "'hbm_bandwidth' value = inf must be a finite"),
    "hw-bandwidth-negative": (HW, h200("hbm_bandwidth", "-4.8e12"),
                              "'hbm_bandwidth' value = -4800000000000.0 must be positive"),
    "hw-bandwidth-zero": (HW, h200("hbm_bandwidth", "0"), "'hbm_bandwidth' value = 0 must be positive"),
    "hw-capacity-negative": (HW, h200("hbm_capacity", "-141e9"),
                             "'hbm_capacity' value = -141000000000.0 must be positive"),
    "hw-flops-nan": (HW, h200("bf16_flops", "nan"), "'bf16_flops' value = nan must be a finite"),
    "hw-nvlink-inf": (HW, h200("nvlink_bandwidth", "inf"), "'nvlink_bandwidth' value = inf must be a finite"),
    "hw-sm-count-float": (HW, h200("sm_count", "132.5"), "'sm_count' value must be an integer"),
    "hw-efficiency-above-1": (HW, h200("hbm_efficiency", "1.5"), "'hbm_efficiency'"),
    "hw-fitted-nan": (HW, h200("launch_gap_us", "nan"), "'launch_gap_us' value = nan must be a finite"),
    "hw-not-toml": (HW, "hbm_capacity = {", "not valid TOML"),
    # scenario TOML ---------------------------------------------------------------------
    "sc-acceptance-nan": (RUN, scenario(base="acceptance_length = nan"),
                          "'acceptance_length' = nan must be a finite number"),
    "sc-acceptance-inf-axis": (RUN, scenario(sweep="acceptance_length = [2.0, inf]"), "'acceptance_length' = inf"),
    "sc-batch-zero": (RUN, scenario(base="batch = 0"), "'batch' = 0 must be an integer in [1,"),
    "sc-batch-float": (RUN, scenario(base="batch = 1.5"), "'batch' = 1.5 should be int"),
    "sc-batch-huge": (RUN, scenario(sweep="batch = [1, 3000000000]"), "'batch' = 3000000000 must be an integer"),
    "sc-context-negative": (RUN, scenario(base="context = -5"), "'context' = -5 must be an integer in [0,"),
    "sc-tp-zero": (RUN, scenario(sweep="tp = [0, 8]"), "'tp' = 0 must be an integer in [1,"),
    "sc-draft-negative": (RUN, scenario(base="draft_tokens = -1"), "'draft_tokens' = -1 must be an integer in [0,"),
    "sc-unknown-hardware": (RUN, scenario(base='hardware = "nope"'), "'hardware' = 'nope' cannot be used"),
    "sc-unknown-key": (RUN, scenario(base="batchsize = 4"), "'batchsize' is unknown"),
    "sc-bad-kind": (RUN, scenario(top='kind = "nonsense"'), "'kind' = 'nonsense' is not one of"),
    # CLI flags -------------------------------------------------------------------------
    "flag-seed-negative": ("check --seed -1", None, "--seed = -1 must be an integer in [0,"),
    "flag-batch-zero": ("step --batch 0", None, "--batch = 0 must be an integer in [1,"),
    "flag-batch-negative": ("step --batch -1", None, "--batch = -1 must be an integer in [1,"),
    "flag-tp-zero": ("layer --tp 0", None, "--tp = 0 must be an integer in [1,"),
    "flag-tp-not-dividing": ("check --tp 3", None, "--tp 3 does not divide"),
    "flag-tp-huge-check": ("check --tp 2147483647", None, "--tp 2147483647 does not divide"),
    "flag-draft-negative": ("step --draft-tokens -1", None, "--draft-tokens = -1 must be an integer in [0,"),
    "flag-context-negative": ("layer --context -5", None, "--context = -5 must be an integer in [0,"),
    "flag-tokens-zero": ("ablation --tokens-per-seq 0", None, "--tokens-per-seq = 0 must be an integer in [1,"),
    "flag-acceptance-nan": ("step --draft-tokens 3 --acceptance-length nan", None,
                            "--acceptance-length = nan must be a finite"),
    "flag-acceptance-inf": ("ablation --acceptance-length inf", None, "--acceptance-length = inf must be a finite"),
    "flag-acceptance-above-draft": ("step --draft-tokens 3 --acceptance-length 5", None,
                                    "must lie in [1, draft tokens + 1 = 4]"),
    "flag-batch-above-int32": ("layer --batch 3000000000", None,
                               "--batch = 3000000000 must be an integer in [1, 2147483647]"),
    "flag-rows-above-int32": ("trace --out {out} --batch 2147483647 --tokens-per-seq 2", None,
                              "token rows exceeds 2147483647"),
    "flag-cache-above-int32": ("step --context 2147483647", None, "cache positions exceeds 2147483647"),
    "check-batch-1e9": ("check --batch 1000000000", None, "this check needs about"),
    "check-context-1e12": ("check --context 1000000000000", None, "--context = 1000000000000 must be an integer"),
    "check-tokens-1e6": ("check --tokens-per-seq 1000000", None, "this check needs about"),
    "flag-unknown-hardware": ("step --hardware nope", None, "Unknown hardware 'nope'"),
    "flag-unknown-model-capitals": ("layer --model Kimi-K9", None, "unknown model 'Kimi-K9'"),
    "flag-layer-the-model-lacks": ("layer --model deepseek-v3 --layer kda", None, "has no layer of type 'kda'"),
    "flag-measurements-not-a-folder": ("validate --measurements {file}", None,
                                       "not a folder of measurement CSVs, nor a shipped set (h200)"),
    # output paths that permission bits allow but no file can be made in (root in a container) ------------------
    "out-proc-trace": ("trace --out /proc/nope", None, "/proc"),
    "out-proc-run": ("run batch-sweep --quick --out /proc/nope", None, "/proc"),
    "out-proc-layer-plot": ("layer --plot /proc/nope", None, "/proc"),
    "out-proc-ablation-plot": ("ablation --plot /proc/nope/deeper", None, "/proc"),
    "out-sys-trace": ("trace --out /sys/nope.json", None, "/sys"),
}


def invoke_case(template: str, content: str | None, tmp_path: Path):
    suffix = ".toml" if template.startswith(("run", "trace --out {out} --hardware")) else ".json"
    file = tmp_path / f"bad{suffix}"
    if content is not None:
        file.write_text(content)
    out = tmp_path / "out"
    args = [a.format(file=file, out=out) for a in template.split()]
    return runner.invoke(app, args), out


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_sentence_and_exit_2(case, tmp_path):
    template, content, needle = CASES[case]
    result, out = invoke_case(template, content, tmp_path)
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert needle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_the_sweep_has_at_least_40_cases():
    kinds = {name.split("-")[0] for name in CASES}
    assert len(CASES) >= 40 and {"cfg", "hw", "sc", "flag"} <= kinds


# ---------------------------------------------------------------------------------------
# strict JSON everywhere the tool writes JSON
# ---------------------------------------------------------------------------------------

def strict_loads(text: str):
    """json.loads that refuses NaN / Infinity, as strict parsers (JavaScript's JSON.parse, jq) do."""
    def refuse(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("args", [
    ["check", "--json"], ["layer", "--json"], ["step", "--draft-tokens", "3", "--json"],
    ["ablation", "--json"], ["run", "scenarios/speculative.toml", "--quick", "--json"],
], ids=lambda a: a[0])
def test_json_output_is_strict(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.stderr
    strict_loads(r.stdout)


def test_written_json_files_are_strict(tmp_path):
    assert runner.invoke(app, ["trace", "--out", str(tmp_path / "t.json")]).exit_code == 0
    args = ["run", "scenarios/speculative.toml", "--quick", "--out", str(tmp_path / "s")]
    assert runner.invoke(app, args).exit_code == 0
    strict_loads((tmp_path / "t.json").read_text())
    strict_loads((tmp_path / "s" / "summary.json").read_text())
