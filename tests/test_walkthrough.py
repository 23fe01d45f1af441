"""docs/walkthrough.md stays true: its commands run, its code runs, and its quoted numbers are what the tool prints.

Conventions the walkthrough follows (so this test can check it):
- ```bash blocks: every line starting with `moe-sim ` runs through the CLI and must exit 0, or the
  code named by a trailing `# exit N` comment.
- ```python blocks run in order in one shared namespace and must not raise.
- A number quoted in the text is wrapped in a span whose title says where it comes from
      <span title="ARGS | PATH | FORMAT">NUMBER</span>
  (a reader sees the number, and its source on hover). ARGS are `moe-sim` arguments that print JSON
  (they include --json), PATH walks the JSON (dot-separated keys, integers index lists) and FORMAT
  is a Python format spec; NUMBER must equal the formatted value. `py: EXPR | FORMAT` evaluates EXPR
  in the python blocks' namespace instead. A FORMAT of `< BOUND` quotes a bound, for rounding noise
  whose digits depend on the CPU: NUMBER reads `&lt; BOUND` and the value must lie below BOUND.
"""

import html
import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app

DOC = Path(__file__).resolve().parent.parent / "docs" / "walkthrough.md"
runner = CliRunner()
MARKER = re.compile(r'<span title="([^"]*)">([^<]*)</span>')
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _invoke(args: str):
    return runner.invoke(app, shlex.split(args))


_cache: dict[str, dict] = {}


def _json(args: str) -> dict:
    if args not in _cache:
        r = _invoke(args)
        assert r.exit_code == 0, f"moe-sim {args} failed: {r.output[-500:]}"
        _cache[args] = json.loads(r.output)
    return _cache[args]


def _walk(doc, path: str):
    for part in path.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


@pytest.fixture(scope="module")
def namespace() -> dict:
    ns: dict = {}
    for lang, body in FENCE.findall(_text()):
        if lang == "python":
            exec(compile(body, str(DOC), "exec"), ns)  # the project's own documentation, not user input
    return ns


def test_walkthrough_exists_and_is_substantial():
    text = _text()
    assert len(text) > 8000 and "Takeaway" in text and "Problems" in text


def test_every_command_runs():
    commands = [line for lang, body in FENCE.findall(_text()) if lang in ("bash", "console")
                for line in body.splitlines() if line.startswith("moe-sim ")]
    assert len(commands) >= 8
    for line in commands:
        code = 0
        if "# exit" in line:
            line, _, tail = line.partition("# exit")
            code = int(tail.strip())
        r = _invoke(line[len("moe-sim "):].strip())
        assert r.exit_code == code, f"{line}: exit {r.exit_code}\n{r.output[-800:]}"


def test_python_blocks_run(namespace):
    assert any(lang == "python" for lang, _ in FENCE.findall(_text()))


def test_quoted_numbers_match_the_tool(namespace):
    text = _text()
    markers = list(MARKER.finditer(text))
    assert len(markers) >= 15, "the walkthrough quotes its numbers through markers"
    for m in markers:
        spec = [part.strip() for part in html.unescape(m.group(1)).split("|")]
        if spec[0].startswith("py:"):
            value, fmt = eval(spec[0][3:], namespace), spec[1]  # noqa: S307 (the project's own doc)
        else:
            args, path, fmt = spec
            value = _walk(_json(args), path)
        if fmt.startswith("<"):
            bound = float(fmt[1:])
            assert html.unescape(m.group(2)) == f"< {fmt[1:].strip()}", f"marker '{m.group(1)}' quotes {m.group(2)!r}"
            assert abs(value) < bound, f"marker '{m.group(1)}': the tool gives {value:.2e}, above the quoted bound"
            continue
        shown = format(value, fmt)
        assert m.group(2) == shown, f"marker '{m.group(1)}': the tool gives {shown}, the text says {m.group(2)!r}"
