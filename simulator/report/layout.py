"""Tables that fit the terminal without cutting a number or a name.

`show(con, headers, rows)` prints a table in the first layout that fits the console's width:

1. the boxed table: headers on one line, else wrapped at their spaces;
2. the same without borders;
3. transposed, one column per row (tables of a few rows, such as the two variants);
4. each row on two lines: its `key` cells (a kernel's number and name), then the rest under their headers;
5. each row as a block of `header value` pairs.

A cell is never folded or cut: every layout keeps each cell whole on one line, or gives way to the next
layout. A console as wide as the table (`--wide`) always gets layout 1.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

NUMERIC = re.compile(r"^[-+\[(]?[\d.]")
WIDE = 10_000  # the console width of --wide: any table fits whole


def console(wide: bool = False) -> Console:
    """The console tables print on: the terminal's width, COLUMNS when set, else 80 (rich's default for
    a pipe); `wide` makes it wide enough for every table in its full layout."""
    if wide:
        return Console(highlight=False, width=WIDE)
    return Console(highlight=False)


def _words(text: str) -> int:
    return max(map(len, text.split()), default=0)


def _widths(headers: Sequence[str], rows: Sequence[Sequence[str]], wrap: bool) -> list[int]:
    return [max([_words(h) if wrap else len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]


def _boxed_width(widths: list[int], boxed: bool) -> int:
    return sum(widths) + (3 * len(widths) + 1 if boxed else 2 * len(widths) - 1)


def _rich_table(headers: Sequence[str], rows: Sequence[Sequence[str]], widths: list[int], boxed: bool) -> Table:
    table = Table(box=box.HEAVY_HEAD if boxed else box.SIMPLE_HEAD, show_edge=boxed,
                  padding=(0, 1) if boxed else (0, 1, 0, 0))
    for i, (h, w) in enumerate(zip(headers, widths)):
        numeric = i > 0 and all(NUMERIC.match(r[i]) or not r[i] for r in rows)
        table.add_column(h, width=w, justify="right" if numeric else "left", overflow="fold")
    for r in rows:
        table.add_row(*r)
    return table


def _as_table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> Table | None:
    """Layouts 1 and 2, or None when neither fits `width`."""
    for boxed in (True, False):
        for wrap in (False, True):
            widths = _widths(headers, rows, wrap)
            if _boxed_width(widths, boxed) <= width:
                return _rich_table(headers, rows, widths, boxed)
    return None


def _transposed(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> tuple[list[str], list[list[str]]]:
    return [headers[0], *(r[0] for r in rows)], [[h, *(r[i] for r in rows)] for i, h in enumerate(headers) if i]


def _line(cells: Sequence[str], widths: Sequence[int], numeric: Sequence[bool]) -> str:
    return "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric)).rstrip()


def _two_line(headers: Sequence[str], rows: Sequence[Sequence[str]], key: int, width: int) -> list[str] | None:
    """Layout 4: the first `key` cells on a line of their own, the others on the next, indented under the
    second key cell; None when the other cells do not fit `width`."""
    kw = [max([len(headers[i])] + [len(r[i]) for r in rows]) for i in range(key)]
    knum = [all(NUMERIC.match(r[i]) or not r[i] for r in rows) for i in range(key)]
    indent = kw[0] + 2
    rest_h, rest = headers[key:], [r[key:] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rest]) for i, h in enumerate(rest_h)]
    numeric = [all(NUMERIC.match(r[i]) or not r[i] for r in rest) for i in range(len(rest_h))]
    span = indent + sum(widths) + 2 * (len(widths) - 1)
    if span > width or sum(kw) + 2 * (key - 1) > width:
        return None
    pad = " " * indent
    lines = [_line(headers[:key], kw, knum), pad + _line(rest_h, widths, numeric), "─" * span]
    for r in rows:
        lines += [_line(r[:key], kw, knum), pad + _line(r[key:], widths, numeric)]
    return lines


def _records(headers: Sequence[str], rows: Sequence[Sequence[str]], key: int, width: int) -> list[str]:
    """Layout 5: each row's key cells, then `header value` pairs filled greedily, never split."""
    lines: list[str] = []
    for r in rows:
        pairs = [f"{h} {c}" for h, c in zip(headers, r) if c]
        lines += _fill(pairs[:key], width, "") + _fill(pairs[key:], width, "  ")
    return lines


def _fill(pairs: Sequence[str], width: int, indent: str) -> list[str]:
    """`pairs` joined by three spaces into lines of at most `width`, a pair never split."""
    lines: list[str] = []
    line = ""
    for pair in pairs:
        if line and len(line) + 3 + len(pair) > width:
            lines.append(line)
            line = ""
        line = f"{line}   {pair}" if line else indent + pair
    return lines + ([line] if line else [])


def show(con: Console, headers: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None,
         key: int = 1) -> None:
    """Print `title` (wrapped at spaces) then the table in the first layout that fits (module docstring);
    `key` is how many leading cells name a row (layouts 4 and 5)."""
    rows = [[str(c) for c in r] for r in rows]
    if title:
        con.print(title, markup=False)
    width = con.width
    table = _as_table(headers, rows, width)
    if table is None and 0 < len(rows) <= 4:
        table = _as_table(*_transposed(headers, rows), width)
    if table is not None:
        con.print(table)
        return
    lines = _two_line(headers, rows, key, width) if key > 1 else None
    for line in lines or _records(headers, rows, key, width):
        con.print(line, markup=False, highlight=False, soft_wrap=True)
