"""benchmarks/core_lines.py: the core's line count, split by kind, held to a limit."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import core_lines  # noqa: E402

SAMPLE = '''"""Module docstring,

over three lines."""
import os  # a trailing comment is code


# a comment line
def f(x):
    """One line."""
    return x  # code
'''


def test_lines_are_split_by_kind():
    assert core_lines.classify(SAMPLE) == {"code": 3, "docstring": 4, "comment": 1, "blank": 2}


def test_the_core_is_the_ops_plans_executor_pricing_and_timeline_without_the_fast_path():
    files = {str(p.relative_to(ROOT)) for p in core_lines.core_files()}
    assert {"simulator/execute.py", "simulator/cost/pricing.py", "simulator/cost/timeline.py",
            "simulator/ops/norm.py", "simulator/plans/common.py"} <= files
    assert not any(f.startswith("simulator/fast") or f == "simulator/cost/step.py" for f in files)


def test_exit_1_over_the_limit_and_0_within(capsys):
    total = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in core_lines.core_files())
    assert core_lines.main(["--limit", str(total)]) == 0
    assert core_lines.main(["--limit", str(total - 1)]) == 1
    assert f"{total:,} against a limit of {total - 1:,}: OVER" in capsys.readouterr().out
    assert core_lines.main(["--bogus"]) == 2
