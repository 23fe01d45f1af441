"""benchmarks/fullsize.py refuses bad arguments before it draws anything: one sentence, exit 2, no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fullsize.py"


@pytest.mark.parametrize("args, names", [(["--batch", "0"], "--batch"), (["--spill-dir", "FILE/sub"], "--spill-dir")])
def test_fullsize_refuses_bad_arguments_in_one_sentence(tmp_path, args, names):
    file = tmp_path / "a-file"
    file.write_text("")
    args = [a.replace("FILE", str(file)) for a in args]  # a folder cannot be made under a file
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and names in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and run.stdout == ""
