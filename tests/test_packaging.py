"""The package carries its data: models, scenarios and hardware profiles travel inside a wheel, and
shipped scenarios and models are usable by name from any folder. (.ci/run builds the real wheel,
installs it into a fresh venv and runs it from outside the clone.)"""

import tomllib
from pathlib import Path

from typer.testing import CliRunner

from simulator.cli import app
from simulator.paths import data_dir

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
runner = CliRunner()


def _installed_folder(package: str) -> Path:
    """Where setuptools takes `package` from: its package-dir mapping, else its dotted path."""
    mapping = PYPROJECT["tool"]["setuptools"].get("package-dir", {})
    return ROOT / mapping.get(package, package.replace(".", "/"))


def test_every_subpackage_is_listed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "simulator").rglob("__init__.py")}
    assert on_disk | {"simulator.models", "simulator.scenarios", "simulator.calibration"} == listed


def test_every_data_file_is_package_data():
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]
    for folder, pattern in (("models", "*.json"), ("scenarios", "*.toml"), ("simulator/hardware", "*.toml"),
                            ("calibration", "h200/*.csv")):
        package = "simulator." + Path(folder).name
        assert pattern in globs[package] and _installed_folder(package) == ROOT / folder
        assert list((ROOT / folder).glob(pattern))


def test_matplotlib_is_a_core_dependency():
    project = PYPROJECT["project"]
    assert any(d.startswith("matplotlib") for d in project["dependencies"])
    assert project["optional-dependencies"]["plots"] == [], "the old extra still installs"


def test_data_dirs_found_in_a_clone_and_inside_an_installed_package(tmp_path, monkeypatch):
    assert data_dir("models") == ROOT / "models" and data_dir("scenarios") == ROOT / "scenarios"
    (tmp_path / "models").mkdir()
    monkeypatch.setattr("simulator.paths.PACKAGE", tmp_path)
    assert data_dir("models") == tmp_path / "models"


def test_list_scenarios_and_run_one_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # another folder: no scenarios/ here
    r = runner.invoke(app, ["list", "scenarios"])
    assert r.exit_code == 0 and {"batch-sweep", "speculative"} <= set(r.output.split())
    for name in ("batch-sweep", "batch-sweep.toml", "scenarios/batch-sweep.toml"):
        r = runner.invoke(app, ["run", name, "--quick", "--json"])
        assert r.exit_code == 0, (name, r.output)


def test_unknown_scenario_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["run", "batch-swep"])
    assert r.exit_code == 2 and "not one of batch-sweep" in r.output and "Traceback" not in r.output


def test_validate_reads_the_shipped_measurements_from_any_folder(tmp_path, monkeypatch):
    import json
    monkeypatch.chdir(tmp_path)  # no calibration/ here: the default is the package's own
    r = runner.invoke(app, ["validate", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["measured_points"] > 500 and Path(doc["measurements"]) == data_dir("calibration") / "h200"
    named = json.loads(runner.invoke(app, ["validate", "--measurements", "h200", "--json"]).output)
    assert named["measured_points"] == doc["measured_points"]
