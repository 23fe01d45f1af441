"""The GPU suite's modules form no import cycle: suite.py is a driver that nothing imports.

fam_collective.py once imported suite.py's row writer while suite.py imported fam_collective (issue 30,
item 4); the shared CSV columns and writer now live in benchmarks/gpu/rows.py.
"""

import ast
from pathlib import Path

GPU = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu"
DRIVERS = {"suite", "production"}  # command-line drivers: they import modules, modules never import them


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_suite_module_imports_a_driver():
    offenders = {p.name: sorted(imported_modules(p) & DRIVERS) for p in GPU.glob("*.py") if p.stem not in DRIVERS}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_row_writer_is_shared_not_owned_by_a_driver():
    for name in ("suite.py", "fam_collective.py", "prereg.py"):
        assert "rows" in imported_modules(GPU / name), name
