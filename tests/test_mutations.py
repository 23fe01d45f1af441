"""benchmarks/mutations.py: its catalogue stays in step with the code, and bad input gets one sentence.

(Running the catalogue takes minutes, so the suite does not; `python benchmarks/mutations.py` does.)"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import mutations  # noqa: E402


def test_catalogue_covers_the_kinds_of_bug_and_applies_once_each():
    assert len(mutations.MUTATIONS) >= 15
    assert len({m.name for m in mutations.MUTATIONS}) == len(mutations.MUTATIONS)
    for m in mutations.MUTATIONS:
        mutations.check_applies(m)  # raises unless the text to replace occurs exactly once
        assert m.old != m.new and m.new.count("\n") == m.old.count("\n") + (m.name == "layer_back_edge")


@pytest.mark.parametrize("args", [["--bogus"], ["--only", "no_such_mutation"], ["--only"]])
def test_bad_input_is_one_sentence_and_exit_2(args):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mutations.py"), *args],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1 and run.stderr.strip().endswith(".")
