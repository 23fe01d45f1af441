"""Count the lines of the core a newcomer reads: the ops, the plans, the executor and the cost model's pricing
and timeline (simulator/ops, simulator/plans, simulator/execute.py, simulator/cost/pricing.py and timeline.py;
the fast path, simulator/fast, is outside them).

    python benchmarks/core_lines.py              # per-file table and total; exit 1 when the total is over 3,500
    python benchmarks/core_lines.py --limit N    # another limit

What it counts: every physical line of those files (what a reader scrolls through) is the figure held to the
limit; the table splits it into code, docstring (module, class and function docstrings, their blank lines
included), comment-only and blank lines, so that a change in the total can be told apart from a change in
the code.
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
LIMIT = 3500
KINDS = ("code", "docstring", "comment", "blank")


def core_files(root: Path = ROOT) -> list[Path]:
    """The core's files, sorted."""
    return sorted({p for pattern in CORE for p in root.glob(pattern)})


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


def main(argv: list[str]) -> int:
    limit = LIMIT
    if argv[:1] == ["--limit"] and len(argv) == 2 and argv[1].isdigit():
        limit = int(argv[1])
    elif argv:
        print("usage: python benchmarks/core_lines.py [--limit N]", file=sys.stderr)
        return 2
    total = dict.fromkeys(KINDS, 0)
    print(f"{'file':40} {'lines':>6} " + " ".join(f"{k:>9}" for k in KINDS))
    for path in core_files():
        counts = classify(path.read_text(encoding="utf-8"))
        for k in KINDS:
            total[k] += counts[k]
        row = " ".join(f"{counts[k]:9d}" for k in KINDS)
        print(f"{str(path.relative_to(ROOT)):40} {sum(counts.values()):6d} {row}")
    lines = sum(total.values())
    print(f"{'total':40} {lines:6d} " + " ".join(f"{total[k]:9d}" for k in KINDS))
    print(f"metric: physical lines (code + docstrings + comments + blank lines) of the core, {lines:,} against a "
          f"limit of {limit:,}: {'within' if lines <= limit else 'OVER'}")
    return 0 if lines <= limit else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
