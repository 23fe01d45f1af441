"""The package's layers: config -> weights -> ops -> plans -> executor | cost -> report -> cli.

Every `import simulator.x` (at module level or inside a function: a lazy import is still a dependency)
must point to the same or a lower layer, and no chain of imports may lead back to where it started.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "simulator"
LAYERS = [  # lowest first; a module belongs to the first prefix that matches it
    ("simulator.errors", "simulator.jit", "simulator.memo", "simulator.paths", "simulator.limits", "simulator.dtypes",
     "simulator.config", "simulator.fast", "simulator.rng", "simulator.numba_ext"),
    ("simulator.weights", "simulator.hardware"),
    ("simulator.ops",),
    ("simulator.state",),
    ("simulator.plans", "simulator.attention"),
    ("simulator.reference",),
    ("simulator.execute", "simulator.check", "simulator.cost"),
    ("simulator.scenario", "simulator.report"),
    ("simulator.sweep",),
    ("simulator.cli", "simulator.__main__"),
]


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("simulator"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # `from simulator.ops import norm`
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("simulator"))
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {i for i in _imports(p) if i in files and i != m} for m, p in files.items()}


def _layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"module {module} belongs to no layer; add it to LAYERS")


def test_no_import_points_to_a_higher_layer():
    graph = _graph()
    back = [f"{m} -> {i}" for m, deps in graph.items() if m != "simulator" for i in deps
            if i != "simulator" and _layer(i) > _layer(m)]
    assert not back, "back-edges: " + "; ".join(sorted(back))


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for i in sorted(graph[m]):
            if state.get(i) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(i):] + [i]))
            if i not in state:
                visit(i, path + [i])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
