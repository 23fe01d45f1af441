"""Output files are written the way users expect: symlinks followed, special files refused, the location
checked before any work, normal permissions, no temporary file left behind (simulator/report/files.py)."""

import json
import os
import socket
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator import sweep
from simulator.cli import app
from simulator.errors import UserError
from simulator.report.files import atomic_write, replacing

runner = CliRunner()
SMALL = ["--tp", "8", "--batch", "1", "--tokens-per-seq", "1"]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _no_temporaries(folder: Path) -> bool:
    return not list(folder.glob(".*.tmp"))


def test_new_files_get_umask_permissions(tmp_path, umask_022):
    r = runner.invoke(app, ["trace", "--out", str(tmp_path / "t.json"), *SMALL])
    assert r.exit_code == 0 and _mode(tmp_path / "t.json") == 0o644
    r = runner.invoke(app, ["run", "batch-sweep", "--quick", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0
    for name in ("points.csv", "summary.json", "batch-sweep-step.png", "batch-sweep-step.svg"):
        assert _mode(tmp_path / "run" / name) == 0o644, name


def test_replaced_file_keeps_its_mode(tmp_path, umask_022):
    target = tmp_path / "t.json"
    target.write_text("old")
    target.chmod(0o640)
    assert runner.invoke(app, ["trace", "--out", str(target), *SMALL]).exit_code == 0
    assert _mode(target) == 0o640 and json.loads(target.read_text())["traceEvents"]


def test_symlink_is_followed(tmp_path):
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target.name)
    assert runner.invoke(app, ["trace", "--out", str(link), *SMALL]).exit_code == 0
    assert link.is_symlink() and json.loads(target.read_text())["traceEvents"]
    assert _no_temporaries(tmp_path)


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    return tmp_path / "fifo"


def _socket(tmp_path):
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "sock"))
    return tmp_path / "sock"


@pytest.mark.parametrize("make, needle", [
    (_fifo, "is a FIFO"), (_socket, "is a socket"), (lambda p: Path("/dev/null"), "is a character device"),
    (lambda p: p, "is a folder"),
], ids=["fifo", "socket", "device", "folder"])
def test_special_files_are_refused(tmp_path, make, needle, monkeypatch):
    path = make(tmp_path)
    kind = stat.S_IFMT(os.lstat(path).st_mode)
    monkeypatch.setattr("simulator.report.summary.layer_timelines", lambda *a: pytest.fail("work before the check"))
    r = runner.invoke(app, ["trace", "--out", str(path)])
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output
    assert stat.S_IFMT(os.lstat(path).st_mode) == kind, "left as it was"
    link = tmp_path.parent / f"{tmp_path.name}-link"
    link.symlink_to(path)
    r = runner.invoke(app, ["trace", "--out", str(link)])
    assert r.exit_code == 2 and needle in r.output and link.is_symlink()
    link.unlink()


@pytest.mark.parametrize("args, needle", [
    (["trace", "--out", ""], "empty name"),
    (["trace", "--out", "x" * 300 + ".json"], "longer than"),
    (["trace", "--out", "{file}/t.json"], "is a file, not a folder"),
    (["run", "batch-sweep", "--out", "{file}"], "is a file, not a folder"),
    (["run", "batch-sweep", "--out", ""], "empty name"),
    (["run", "batch-sweep", "--out", "{tmp}/" + "d" * 300], "longer than"),
    (["run", "batch-sweep", "--out", "{tmp}/{pcsv}"], "points.csv is a folder"),
    (["layer", "--plot", "{file}"], "is a file, not a folder"),
    (["layer", "--plot", ""], "empty name"),
    (["ablation", "--plot", "{file}"], "is a file, not a folder"),
    (["run", "{scenarios}"], "is a folder"),
], ids=["trace-empty", "trace-long", "trace-under-file", "run-file", "run-empty", "run-long", "run-csv-dir",
        "layer-file", "layer-empty", "ablation-file", "run-folder-as-scenario"])
def test_bad_locations_refused_before_any_work(tmp_path, monkeypatch, args, needle):
    (tmp_path / "file").write_text("mine")
    (tmp_path / "pcsv" / "points.csv").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for name in ("layer_timelines", "layer_report"):
        monkeypatch.setattr(f"simulator.report.summary.{name}", lambda *a, **k: pytest.fail("work before the check"))
    monkeypatch.setattr(sweep, "evaluate", lambda *a: pytest.fail("work before the check"))
    root = Path(__file__).resolve().parent.parent
    args = [a.format(file=tmp_path / "file", tmp=tmp_path, pcsv="pcsv", scenarios=root / "scenarios") for a in args]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    assert (tmp_path / "file").read_text() == "mine" and _no_temporaries(tmp_path)


def test_read_only_folder_refused_before_any_work(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):  # root writes anyway: stand in for a read-only mount
        monkeypatch.setattr("simulator.report.files.os.access", lambda path, mode: False)
    monkeypatch.setattr(sweep, "evaluate", lambda *a: pytest.fail("work before the check"))
    for args in (["run", "batch-sweep", "--out", str(folder / "out")], ["trace", "--out", str(folder / "t.json")],
                 ["layer", "--plot", str(folder)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "is not writable" in r.output and "Traceback" not in r.output, r.output
    folder.chmod(0o755)


def test_no_temporary_file_survives_ctrl_c_or_an_error(tmp_path):
    target = tmp_path / "a.csv"
    target.write_text("before")
    for error in (KeyboardInterrupt, OSError):
        with pytest.raises(error):
            with replacing(target) as tmp:
                tmp.write_text("half")
                raise error()
        assert target.read_text() == "before" and _no_temporaries(tmp_path)


def test_plots_all_or_nothing(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from simulator.report import plot_kit
    real = Figure.savefig

    def svg_fails(self, fname, format=None, **kw):
        if format == "svg":
            raise KeyboardInterrupt
        return real(self, fname, format=format, **kw)
    monkeypatch.setattr(Figure, "savefig", svg_fails)
    with pytest.raises(KeyboardInterrupt):
        plot_kit._save(plot_kit._figure(2, 2), tmp_path, "p")
    assert not list(tmp_path.iterdir())


def test_atomic_write_refuses_a_fifo_without_blocking(tmp_path):
    with pytest.raises(UserError, match="FIFO"):
        atomic_write(_fifo(tmp_path), "x")
