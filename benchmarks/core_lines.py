"""Count the lines of the core a newcomer reads: the shared core plus one attention kind, held to 3,500.

    python benchmarks/core_lines.py              # per-file tables, the totals; exit 1 when the reader's path is over
    python benchmarks/core_lines.py --limit N    # another limit

What it counts (the fast path, simulator/fast, is outside all of it):
- the shared core: simulator/ops, simulator/plans, simulator/execute.py and the cost model's pricing and
  timeline (simulator/cost/pricing.py, timeline.py), less each attention kind's own files;
- an attention kind's files: for kind K (a module simulator/attention/K.py, its registry entry), every file of
  simulator/attention, simulator/ops and simulator/plans named K.py or K_*.py (its ops, its kernels);
- the registry: simulator/attention/kind.py and __init__.py, which every kind is read through.

The figure held to the limit is the reader's path: the shared core + the registry + the largest kind. A
newcomer reads the layer once with one attention kind (DeepSeek-V3's ~800-line model, the comparison the
limit comes from, has one); counting every kind instead would charge each new kind (GQA, ...) to every
reader, and a registry that lets kinds be added would make the core grow with each. The whole tree (the
shared core, the registry and every kind) is printed beside it, so the growth stays in sight.

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
REGISTRY = ("simulator/attention/__init__.py", "simulator/attention/kind.py")
KIND_FOLDERS = ("simulator/attention", "simulator/ops", "simulator/plans")
LIMIT = 3500
KINDS = ("code", "docstring", "comment", "blank")


def attention_kinds(root: Path = ROOT) -> list[str]:
    """The attention kinds: the registry's entry modules, simulator/attention/<kind>.py."""
    return sorted(p.stem for p in (root / "simulator/attention").glob("*.py")
                  if str(p.relative_to(root)) not in REGISTRY)


def kind_files(kind: str, root: Path = ROOT) -> list[Path]:
    """Attention kind `kind`'s own files: <kind>.py and <kind>_*.py in simulator/attention, ops and plans."""
    return sorted({p for folder in KIND_FOLDERS for pattern in (f"{kind}.py", f"{kind}_*.py")
                   for p in (root / folder).glob(pattern)})


def core_files(root: Path = ROOT) -> list[Path]:
    """The shared core's files, sorted: the CORE patterns less every attention kind's files."""
    kinds = {p for k in attention_kinds(root) for p in kind_files(k, root)}
    return sorted({p for pattern in CORE for p in root.glob(pattern)} - kinds)


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
    registry = table("attention registry", [ROOT / f for f in REGISTRY])
    kinds = {k: table(f"attention kind {k}", kind_files(k)) for k in attention_kinds()}
    largest = max(kinds, key=kinds.__getitem__)
    path = shared + registry + kinds[largest]
    print(f"whole tree: shared core {shared:,} + registry {registry:,} + every kind "
          f"({', '.join(f'{k} {n:,}' for k, n in kinds.items())}) = {shared + registry + sum(kinds.values()):,}")
    print(f"metric: physical lines (code + docstrings + comments + blank lines) of the reader's path, the shared "
          f"core + the registry + the largest attention kind ({largest}): {path:,} against a limit of {limit:,}: "
          f"{'within' if path <= limit else 'OVER'}")
    return 0 if path <= limit else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
