"""The README's promises: exactly two set-up commands, pictures that exist, usage lines that run."""

import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from simulator.cli import app

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _block_after(heading: str) -> list[str]:
    section = README.split(heading, 1)[1]
    body = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in body.splitlines() if line.strip()]


def test_exactly_two_set_up_commands():
    install, tests = _block_after("## Set up")
    assert install.strip() == 'python -m pip install -e ".[test]" && moe-sim layer', "no extra beyond the tests'"
    assert tests.strip() == "python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest" in ci and 'pip install --quiet -e ".[test]"' in ci


def test_ci_builds_installs_and_runs_the_wheel_outside_the_clone():
    ci = (ROOT / ".ci" / "run").read_text()
    for step in ("pip wheel", 'python3 -m venv "$scratch/venv"', 'cd "$scratch"', "moe-sim\" list models",
                 "moe-sim\" run batch-sweep"):
        assert step in ci, step


def test_pictures_exist():
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert images
    for image in images:
        assert (ROOT / image).stat().st_size > 10_000


def test_usage_lines_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # commands that write files write them here
    lines = [line.split("#")[0].strip() for line in _block_after("## What it answers")]
    runner = CliRunner()
    for line in lines:
        if "kimi-k3 --tp 16 --batch 1" in line:  # minutes of full-size numerics: run by hand, timed in the notes
            continue
        args = shlex.split(line)[1:]
        args = [str(ROOT / a) if a.startswith(("scenarios/", "calibration/", "tests/")) else a for a in args]
        r = runner.invoke(app, args)
        assert r.exit_code == 0, f"{line}: {r.output[-400:]}"


def test_intro_labels_published_and_modelled_numbers():
    import json
    intro = README.split("## Set up", 1)[0]
    published, modelled = intro.split("**Modelled**", 1)
    assert "**Published**" in published and "69 µs" in published and "3.90 ms against 7.38 ms" in published
    runner = CliRunner()
    layer = json.loads(runner.invoke(app, ["layer", "--json"]).output)["variants"]
    step = json.loads(runner.invoke(app, ["step", "--json"]).output)["variants"]
    assert (f"{layer['specialized']['kernel_count']} kernels / {layer['specialized']['layer_us']:.0f} µs against "
            f"{layer['standard']['kernel_count']} / {layer['standard']['layer_us']:.0f} µs") in modelled
    assert f"{step['specialized']['step_ms']:.2f} ms against {step['standard']['step_ms']:.2f} ms" in modelled
