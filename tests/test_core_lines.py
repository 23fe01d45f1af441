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


def test_the_shared_core_is_the_ops_plans_executor_pricing_and_timeline_without_fast_path_or_entries():
    files = {str(p.relative_to(ROOT)) for p in core_lines.core_files()}
    assert {"simulator/execute.py", "simulator/cost/pricing.py", "simulator/cost/timeline.py",
            "simulator/ops/norm.py", "simulator/plans/common.py", "simulator/plans/moe_kernels.py"} <= files
    assert not any(f.startswith(("simulator/fast", "simulator/moe")) or f == "simulator/cost/step.py" for f in files)
    assert "simulator/ops/kda.py" not in files and "simulator/ops/mla.py" not in files


def test_a_kind_is_its_registry_entry_its_ops_and_its_kernels():
    assert {"kda", "mla"} <= set(core_lines.attention_kinds())
    files = {str(p.relative_to(ROOT)) for p in core_lines.kind_files("kda")}
    assert {"simulator/attention/kda.py", "simulator/ops/kda.py"} <= files
    assert not any("mla" in f for f in files)


def test_a_moe_path_is_its_registry_entry():
    assert set(core_lines.entries("MoE path")) == {"fused", "latent", "ogs"}
    files = {str(p.relative_to(ROOT)) for p in core_lines.entry_files("MoE path", "latent")}
    assert files == {"simulator/moe/latent.py"}


def _lines(files):
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files)


def test_exit_1_over_the_limit_and_0_within(capsys):
    """The limit holds the shared core + the registries + the largest entry of each, not the sum of the entries."""
    total = _lines(core_lines.core_files())
    for registry, (_, own) in core_lines.REGISTRIES.items():
        largest = max(_lines(core_lines.entry_files(registry, e)) for e in core_lines.entries(registry))
        total += _lines(ROOT / f for f in own) + largest
    assert core_lines.main(["--limit", str(total)]) == 0
    assert core_lines.main(["--limit", str(total - 1)]) == 1
    assert f"{total:,} against a limit of {total - 1:,}: OVER" in capsys.readouterr().out
    assert core_lines.main(["--bogus"]) == 2


def test_the_readers_path_is_within_the_limit(capsys):
    """Issue 32's target: the shared core + the registries + the largest attention kind and MoE path a
    newcomer reads stay within core_lines.LIMIT physical lines (the script exits 1 past it)."""
    assert core_lines.main([]) == 0, capsys.readouterr().out[-300:]
