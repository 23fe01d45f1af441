"""Re-quote the docs' numbers after a change: every `<span title="ARGS | PATH | FORMAT">` marker of the
walkthrough, cost-model.md and the README gets the value the tool prints now (the convention
tests/test_walkthrough.py checks), and docs/architecture.md's sizes block the sizes of the tree now
(tests/test_architecture.py).

    python docs/update_numbers.py            # rewrite those files in place
    python docs/update_numbers.py --check    # list what would change, exit 1 if anything would

Only the numbers inside markers change: read the listed lines afterwards, since the prose around a number
(a ranking, "about twice", a crossover) may no longer hold. `py:` markers and bounds are left alone.
"""

from __future__ import annotations

import argparse
import html
import json
import shlex
import sys
from pathlib import Path

from typer.testing import CliRunner

from simulator.cli import app

DOC = Path(__file__).resolve().parent / "walkthrough.md"
DOCS = (DOC, DOC.parent / "cost-model.md",  # cost-model.md quotes through markers in section 8 (intervals)
        DOC.parent.parent / "README.md")  # the README's modelled figures, checked by tests/test_readme.py
sys.path.insert(0, str(DOC.parent.parent / "tests"))
from test_architecture import requote as requote_sizes  # noqa: E402  (one definition of the sizes block)
from test_walkthrough import MARKER, _walk  # noqa: E402  (one definition of the marker convention)


def requote(text: str) -> tuple[str, list[str]]:
    cache: dict[str, dict] = {}
    changes: list[str] = []

    def value_of(args: str):
        if args not in cache:
            r = CliRunner().invoke(app, shlex.split(args))
            if r.exit_code != 0:
                raise SystemExit(f"moe-sim {args} failed: {r.output[-300:]}")
            cache[args] = json.loads(r.output)
        return cache[args]

    def replace(m):
        spec = [part.strip() for part in html.unescape(m.group(1)).split("|")]
        if spec[0].startswith("py:") or spec[2].startswith("<"):
            return m.group(0)
        shown = format(_walk(value_of(spec[0]), spec[1]), spec[2])
        if shown != m.group(2):
            line = text.count("\n", 0, m.start()) + 1
            changes.append(f"line {line}: {m.group(2)} -> {shown}   ({spec[0]} | {spec[1]})")
        return f'<span title="{m.group(1)}">{shown}</span>'

    return MARKER.sub(replace, text), changes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    changed = False
    for doc in DOCS:
        new, changes = requote(doc.read_text(encoding="utf-8"))
        print(f"{doc.name}: " + ("\n".join(changes) or "every quoted number is current"))
        if not args.check and changes:
            doc.write_text(new, encoding="utf-8")
        changed |= bool(changes)
    arch = DOC.parent / "architecture.md"
    text = arch.read_text(encoding="utf-8")
    new = requote_sizes(text)
    print(f"{arch.name}: " + ("the sizes block is stale" if new != text else "the sizes block is current"))
    if not args.check and new != text:
        arch.write_text(new, encoding="utf-8")
    changed |= new != text
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
