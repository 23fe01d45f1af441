"""Count the lines of the core a newcomer reads: the shared core, one attention kind and one MoE path, held to 3,500.

    python benchmarks/core_lines.py              # per-file tables, the totals; exit 1 when the reader's path is over
    python benchmarks/core_lines.py --limit N    # another limit

What it counts (the fast path, simulator/fast, is outside all of it):
- the shared core: simulator/ops, simulator/plans, simulator/execute.py and the cost model's pricing and
  timeline (simulator/cost/pricing.py, timeline.py), less each registry entry's own files;
- two registries, each read through its own files and made of entries:
  attention kinds (simulator/attention/__init__.py and kind.py; an entry K is a module simulator/attention/K.py)
  and MoE paths (simulator/moe/__init__.py; an entry K is a module simulator/moe/K.py);
- an entry's files: every file of its registry's folder, simulator/ops and simulator/plans named K.py or K_*.py
  (its ops, its kernels).

The figure held to the limit is the reader's path: the shared core + both registries + the largest attention
kind + the largest MoE path. A newcomer reads the layer once with one attention kind and one MoE path
(DeepSeek-V3's ~800-line model, the comparison the limit comes from, has one of each; Kimi K3 on GB300 runs the
latent MoE path, the largest); counting every entry instead would charge each new kind or path (GQA, gpt-oss's
matmul_ogs MoE, ...) to every reader, and registries that let entries be added would make the core grow with
each. The whole tree (the shared core, the registries and every entry) is printed beside it, so the growth stays
in sight.

Every physical line counts (what a reader scrolls through); the tables split it into code, docstring
(module, class and function docstrings, their blank lines included), comment-only and blank lines, so that a
change in a total can be told apart from a change in the code.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ("simulator/ops/*.py", "simulator/plans/*.py", "simulator/execute.py", "simulator/cost/pricing.py",
        "simulator/cost/timeline.py")
# registry -> (its folder, the files every entry is read through)
REGISTRIES = {
    "attention kind": ("simulator/attention", ("simulator/attention/__init__.py", "simulator/attention/kind.py")),
    "MoE path": ("simulator/moe", ("simulator/moe/__init__.py",)),
}
ENTRY_FOLDERS = ("simulator/ops", "simulator/plans")  # beside the registry's own folder
LIMIT = 3500
KINDS = ("code", "docstring", "comment", "blank")


def entries(registry: str, root: Path = ROOT) -> list[str]:
    """The entries of `registry` (a key of REGISTRIES): its entry modules, <folder>/<entry>.py."""
    folder, own = REGISTRIES[registry]
    return sorted(p.stem for p in (root / folder).glob("*.py") if str(p.relative_to(root)) not in own)


def entry_files(registry: str, entry: str, root: Path = ROOT) -> list[Path]:
    """`entry`'s own files: <entry>.py and <entry>_*.py in the registry's folder, simulator/ops and plans."""
    folders = (REGISTRIES[registry][0],) + ENTRY_FOLDERS
    return sorted({p for folder in folders for pattern in (f"{entry}.py", f"{entry}_*.py")
                   for p in (root / folder).glob(pattern)})


def attention_kinds(root: Path = ROOT) -> list[str]:
    return entries("attention kind", root)


def kind_files(kind: str, root: Path = ROOT) -> list[Path]:
    return entry_files("attention kind", kind, root)


def core_files(root: Path = ROOT) -> list[Path]:
    """The shared core's files, sorted: the CORE patterns less every registry entry's files."""
    owned = {p for r in REGISTRIES for e in entries(r, root) for p in entry_files(r, e, root)}
    return sorted({p for pattern in CORE for p in root.glob(pattern)} - owned)


def classify(text: str) -> dict[str, int]:
    """Lines of Python source by kind (KINDS): docstring lines are those of a module's, class's or function's
    first statement when it is a string; comment lines hold only a comment; blank lines only whitespace."""
    lines = text.splitlines()
    docstring: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docstring.update(range(body[0].lineno, body[0].end_lineno + 1))
    comment = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
               if tok.type == tokenize.COMMENT and not tok.line[:tok.start[1]].strip()}
    counts = dict.fromkeys(KINDS, 0)
    for number, line in enumerate(lines, 1):
        kind = ("docstring" if number in docstring else "comment" if number in comment
                else "blank" if not line.strip() else "code")
        counts[kind] += 1
    return counts


def table(title: str, files: list[Path]) -> int:
    """Print one group's per-file rows and its total; return the total."""
    total = dict.fromkeys(KINDS, 0)
    print(f"{title:44} {'lines':>6} " + " ".join(f"{k:>9}" for k in KINDS))
    for path in files:
        counts = classify(path.read_text(encoding="utf-8"))
        for k in KINDS:
            total[k] += counts[k]
        row = " ".join(f"{counts[k]:9d}" for k in KINDS)
        print(f"  {str(path.relative_to(ROOT)):42} {sum(counts.values()):6d} {row}")
    lines = sum(total.values())
    print(f"  {'total':42} {lines:6d} " + " ".join(f"{total[k]:9d}" for k in KINDS) + "\n")
    return lines


def main(argv: list[str]) -> int:
    limit = LIMIT
    if argv[:1] == ["--limit"] and len(argv) == 2 and argv[1].isdigit():
        limit = int(argv[1])
    elif argv:
        print("usage: python benchmarks/core_lines.py [--limit N]", file=sys.stderr)
        return 2
    shared = table("shared core", core_files())
    path, tree, largest = shared, shared, {}
    for registry, (_, own) in REGISTRIES.items():
        read_through = table(f"{registry} registry", [ROOT / f for f in own])
        sizes = {e: table(f"{registry} {e}", entry_files(registry, e)) for e in entries(registry)}
        largest[registry] = max(sizes, key=sizes.__getitem__)
        path += read_through + sizes[largest[registry]]
        tree += read_through + sum(sizes.values())
        print(f"{registry}s: registry {read_through:,} + every entry "
              f"({', '.join(f'{e} {n:,}' for e, n in sizes.items())})\n")
    print(f"whole tree: shared core {shared:,} + the registries and every entry = {tree:,}")
    print(f"metric: physical lines (code + docstrings + comments + blank lines) of the reader's path, the shared "
          f"core + the attention-kind and MoE-path registries + the largest attention kind "
          f"({largest['attention kind']}) + the largest MoE path ({largest['MoE path']}): {path:,} against a limit "
          f"of {limit:,}: "
          f"{'within' if path <= limit else 'OVER'}")
    return 0 if path <= limit else 1

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
