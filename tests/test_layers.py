"""The package's layers: config -> weights -> ops -> plans -> executor | cost -> report -> cli, and no import cycle
anywhere in the repository.

Every `import simulator.x` (at module level or inside a function: a lazy import is still a dependency)
must point to the same or a lower layer. No chain of imports may lead back to where it started, in the
package or among the scripts beside it (benchmarks/, benchmarks/gpu/, tests/, docs/), which import each other by
bare name (`from fullsize import copy_gbps`, `from harness import time_graph`): the graph is read from the
source (ast), nothing is imported.
"""

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "simulator"
LAYERS = [  # lowest first; a module belongs to the longest prefix that matches it
    ("simulator.errors", "simulator.jit", "simulator.memo", "simulator.paths", "simulator.limits", "simulator.dtypes",
     "simulator.config", "simulator.routing", "simulator.fast"),
    ("simulator.weights", "simulator.hardware", "simulator.fast.packed"),
    ("simulator.ops",),
    ("simulator.state",),
    ("simulator.plans", "simulator.attention", "simulator.moe"),
    ("simulator.reference",),
    ("simulator.execute", "simulator.check", "simulator.cost", "simulator.fast.experts", "simulator.fast.kda",
     "simulator.fast.replacements",
     "simulator.fast.backend"),
    ("simulator.scenario", "simulator.report"),
    ("simulator.sweep",),
    ("simulator.cli", "simulator.__main__"),
]


def _sources(root: Path) -> list[Path]:
    """Every .py file of the repository, skipping hidden folders (.venv, .git) and build output."""
    return sorted(p for p in root.rglob("*.py") if not any(
        part.startswith(".") or part == "build" or part.endswith(".egg-info") for part in p.relative_to(root).parts))


def _module(path: Path, root: Path) -> str:
    """`simulator.ops.norm` for the package's files, the path (`benchmarks/gpu/harness.py`) for a script."""
    rel = path.relative_to(root)
    if rel.parts[0] != "simulator":
        return rel.as_posix()
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The dotted names a file imports, at any depth of its code (`from a import b` gives a and a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # `from simulator.ops import norm`
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the repository's modules it imports. A bare name that is not the package's resolves to the
    script of that name in the importer's folder, else to the one script of that name elsewhere (a folder
    put on sys.path: tests/ by docs/update_numbers.py, benchmarks/gpu/ by the GPU tests)."""
    files = {_module(p, root): p for p in _sources(root)}
    scripts: dict[str, list[Path]] = {}
    for p in files.values():
        if p.relative_to(root).parts[0] != "simulator":
            scripts.setdefault(p.stem, []).append(p)

    def resolve(name: str, importer: Path) -> str | None:
        if name in files and name.startswith("simulator"):
            return name
        if "." in name or name.startswith("simulator"):
            return None  # a dotted name outside the package is a third-party module (or `simulator.x.func`)
        near = [p for p in scripts.get(name, ()) if p.parent == importer.parent]
        found = near or scripts.get(name, [])
        return _module(found[0], root) if len(found) == 1 else None

    graph = {}
    for m, p in files.items():
        targets = (resolve(i, p) for i in _imports(p))
        graph[m] = {t for t in targets if t is not None and t != m}
    return graph


def _package_graph() -> dict[str, set[str]]:
    return {m: {i for i in deps if i.startswith("simulator")} for m, deps in _graph().items()
            if m.startswith("simulator")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph as [a, b, ..., a], or None (depth-first search, in sorted order)."""
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for i in sorted(graph[m]):
            if state.get(i) == 1:
                return path[path.index(i):] + [i]
            if i not in state and (found := visit(i, path + [i])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [m])):
            return found
    return None


def _layer(module: str) -> int:
    found = [(len(p), rank) for rank, prefixes in enumerate(LAYERS) for p in prefixes
             if module == p or module.startswith(p + ".")]
    if not found:
        raise AssertionError(f"module {module} belongs to no layer; add it to LAYERS")
    return max(found)[1]


def test_no_import_points_to_a_higher_layer():
    graph = _package_graph()
    back = [f"{m} -> {i}" for m, deps in graph.items() if m != "simulator" for i in deps
            if i != "simulator" and _layer(i) > _layer(m)]
    assert not back, "back-edges: " + "; ".join(sorted(back))


def test_no_import_cycle_in_the_repository():
    graph = _graph()
    assert {"benchmarks/fullsize.py", "benchmarks/gpu/harness.py", "simulator.cost.step"} <= set(graph)
    assert "benchmarks/fullsize.py" in graph["benchmarks/bench_draw.py"]  # bare names resolve to the scripts
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle_through_a_lazy_import(tmp_path):
    (tmp_path / "simulator").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "simulator" / "__init__.py").write_text("")
    (tmp_path / "simulator" / "a.py").write_text("import numpy\nfrom simulator import b\n")
    (tmp_path / "simulator" / "b.py").write_text("def f():\n    from simulator.a import g\n")
    (tmp_path / "benchmarks" / "one.py").write_text("from two import x\nimport simulator.a\n")
    (tmp_path / "benchmarks" / "two.py").write_text("def f():\n    import one\n")
    graph = _graph(tmp_path)
    assert graph["benchmarks/one.py"] == {"benchmarks/two.py", "simulator.a"}
    assert _cycle(graph) in (["benchmarks/one.py", "benchmarks/two.py", "benchmarks/one.py"],
                             ["simulator.a", "simulator.b", "simulator.a"])
    (tmp_path / "benchmarks" / "two.py").write_text("x = 1\n")
    (tmp_path / "simulator" / "b.py").write_text("")
    assert _cycle(_graph(tmp_path)) is None
