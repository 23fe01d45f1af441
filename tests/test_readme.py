"""The README's promises: exactly two set-up commands, pictures that exist, usage lines that run."""

import html
import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from simulator.cli import app
from test_walkthrough import MARKER, _json, _walk  # one definition of the marker convention

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _block_after(heading: str) -> list[str]:
    section = README.split(heading, 1)[1]
    body = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in body.splitlines() if line.strip()]


def test_exactly_two_set_up_commands():
    install, tests = _block_after("## Set up")
    assert install.strip() == 'python -m pip install -e ".[test]" && moe-sim layer --tokens-per-seq 8', "no extra"
    assert tests.strip() == "python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest" in ci and 'pip install --quiet -e ".[test]"' in ci


def test_ci_runs_the_linter_it_installs():
    """CI installs ruff from the dev extra on a fresh machine and runs it over the whole tree before the tests."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install --quiet -e ".[dev]"' in ci and "\nruff check .\n" in ci.replace("  #", "\n#")
    assert ci.index("ruff check .") < ci.index("python -m pytest")
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dev = \["moe-sim\[test\]", "ruff[^"]*"\]', pyproject, re.M)
    assert re.search(r"^\[tool\.ruff\]\nline-length = 120", pyproject, re.M)


def test_ci_builds_installs_and_runs_the_wheel_outside_the_clone():
    ci = (ROOT / ".ci" / "run").read_text()
    for step in ("pip wheel", 'python3 -m venv "$scratch/venv"', 'cd "$scratch"', "moe-sim\" list models",
                 "moe-sim\" run batch-sweep", "moe-sim\" validate", "COLUMNS=80 \"$scratch/venv/bin/moe-sim\" step"):
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
    intro = README.split("## Set up", 1)[0]
    published, modelled = intro.split("**Modelled**", 1)
    assert "**Published**" in published and "69 µs" in published and "3.90 ms against 7.38 ms" in published
    assert "<span" not in published, "published figures are quoted from docs/published.md, not computed"
    assert len(MARKER.findall(modelled)) >= 6, "every modelled figure is a marker the tool re-quotes"


def test_every_quoted_number_is_what_the_tool_prints():
    """The walkthrough's convention (tests/test_walkthrough.py): <span title="ARGS | PATH | FORMAT">N</span>."""
    markers = list(MARKER.finditer(README))
    assert len(markers) >= 20
    for m in markers:
        args, path, fmt = (part.strip() for part in html.unescape(m.group(1)).split("|"))
        value = _walk(_json(args), path)
        if fmt.startswith("<"):
            assert html.unescape(m.group(2)) == f"< {fmt[1:].strip()}" and abs(value) < float(fmt[1:]), m.group(1)
            continue
        assert m.group(2) == format(value, fmt), f"marker '{m.group(1)}': the tool gives {format(value, fmt)}"


def test_constants_the_readme_names_are_the_code_s():
    from simulator.report.summary import DRAFT_ACCEPTANCE
    from simulator.sweep import LIMIT
    assert f"probability {DRAFT_ACCEPTANCE:g} given the one before" in README.replace("\n", " ")
    assert f"Grids over {LIMIT:,} points" in README


def test_prose_quotes_no_bare_modelled_figure():
    """A µs or ms figure outside a marker is a published one (the intro) or a drifting copy."""
    body = MARKER.sub("", README.split("## Set up", 1)[1])
    assert not re.findall(r"\d+(?:\.\d+)? ?(?:µs|ms)\b", body), "quote modelled times through markers"
