"""docs/architecture.md is a map that cannot go stale: at most 150 lines, every file path it names exists,
and its sizes block is what `sizes_block` computes from the tree now, to 5 % or 20 lines a row (so an edit
elsewhere does not stale the map; `python docs/update_numbers.py` rewrites the block exactly, `--check` lists
what changed).

The block: one row per module at the top of `simulator/` and per subpackage (its modules listed), the
lines of each (`wc -l`: blank lines and comments count, a newcomer reads them), and the first line of the
module's docstring, so what a file says it does is read from the file.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
MAX_LINES = 150
BEGIN = "<!-- sizes: computed by tests/test_architecture.py's sizes_block; python docs/update_numbers.py rewrites -->"
END = "<!-- /sizes -->"
BLOCK = re.compile(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), re.S)


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.split("\n\n")[0].replace("\n", " ").replace("|", "\\|").strip()


def sizes_block(root: Path = ROOT) -> str:
    """The markdown table of the package's sizes, computed from the files under `root`."""
    pkg = root / "simulator"
    rows = []
    for path in sorted(pkg.glob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            rows.append(f"| `{path.name}` | 1 | {_lines(path):,} | {_summary(path)} |")
    for sub in sorted(p for p in pkg.iterdir() if (p / "__init__.py").exists()):
        mods = sorted(sub.rglob("*.py"))
        names = ", ".join(p.relative_to(sub).with_suffix("").as_posix() for p in mods if p.name != "__init__.py")
        what = _summary(sub / "__init__.py")
        rows.append(f"| `{sub.name}/` | {len(mods)} | {sum(map(_lines, mods)):,} | "
                    f"{what + ' ' if what else ''}Modules: {names}. |")
    package = sorted(pkg.rglob("*.py"))
    rows.append(f"| **the package** | {len(package)} | {sum(map(_lines, package)):,} | |")
    head = "| module or package | files | lines | what it says it does (its docstring's first paragraph) |\n" \
           "|---|--:|--:|---|"
    return head + "\n" + "\n".join(rows) + "\n"


def requote(text: str) -> str:
    """`text` with its sizes block replaced by the one computed now."""
    if not BLOCK.search(text):
        raise ValueError(f"no sizes block ({BEGIN} ... {END})")
    return BLOCK.sub(lambda m: BEGIN + "\n" + sizes_block() + END, text)


def test_at_most_150_lines():
    assert _lines(DOC) <= MAX_LINES, f"docs/architecture.md has {_lines(DOC)} lines: a map is at most {MAX_LINES}"


def _rows(block: str) -> dict[str, tuple[int, int, str]]:
    """{module: (files, lines, what it says)} of a sizes table."""
    cells = [[c.strip() for c in row.split("|")[1:-1]] for row in block.splitlines()[2:] if row.startswith("|")]
    return {c[0]: (int(c[1]), int(c[2].replace(",", "")), c[3]) for c in cells}


def _stale(quoted: str, now: str, slack: float = 0.05, lines: int = 20) -> list[str]:
    """Rows whose files, docstring or module set changed, or whose lines moved by more than 5 % and 20
    lines: a map stays true through small edits, and `update_numbers.py` re-quotes it exactly."""
    q, n = _rows(quoted), _rows(now)
    out = [f"{m}: {'gone' if m not in n else 'new'}" for m in sorted(set(q) ^ set(n))]
    for m in sorted(set(q) & set(n)):
        (qf, ql, qw), (nf, nl, nw) = q[m], n[m]
        if qf != nf or qw != nw or abs(ql - nl) > max(lines, slack * nl):
            out.append(f"{m}: quoted {qf} files / {ql} lines, now {nf} / {nl}")
    return out


def test_sizes_block_is_current():
    quoted = BLOCK.search(DOC.read_text(encoding="utf-8")).group(1)
    stale = _stale(quoted, sizes_block())
    assert not stale, f"docs/architecture.md's sizes are stale ({'; '.join(stale)}): run python docs/update_numbers.py"


def test_a_small_edit_keeps_the_map_true_and_a_large_one_does_not():
    now = sizes_block()
    name, (files, lines, what) = next(iter(_rows(now).items()))
    row = f"| {name} | {files} | {lines:,} | {what} |"
    assert row in now
    assert not _stale(now.replace(row, f"| {name} | {files} | {lines + 5:,} | {what} |"), now)
    assert _stale(now.replace(row, f"| {name} | {files} | {lines + max(30, lines // 4):,} | {what} |"), now)


def test_sizes_block_counts_the_files(tmp_path):
    pkg = tmp_path / "simulator"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text('"""The command line:\na | b.\n\nDetails."""\nx = 1\n')
    (pkg / "ops" / "__init__.py").write_text('"""The math."""\n')
    (pkg / "ops" / "norm.py").write_text("a = 1\nb = 2\n")
    table = sizes_block(tmp_path)
    assert "| `cli.py` | 1 | 5 | The command line: a \\| b. |" in table
    assert "| `ops/` | 2 | 3 | The math. Modules: norm. |" in table
    assert "| **the package** | 4 | 8 | |" in table
    (pkg / "ops" / "norm.py").write_text("a = 1\n")
    assert "| `ops/` | 2 | 2 |" in sizes_block(tmp_path)


def _named_paths(text: str) -> list[str]:
    """Backticked names that look like files of the repository: `plans/kernel.py`, `docs/kernels.md`."""
    names = re.findall(r"`([\w./<>-]+\.(?:py|md|toml|json|npz|c|sh))`", text)
    return [n for n in names if "<" not in n and "*" not in n]


def test_every_named_file_exists():
    text = BLOCK.sub("", DOC.read_text(encoding="utf-8"))
    named = _named_paths(text)
    assert len(named) > 20, "the map names the files it describes"
    bases = (ROOT, *(ROOT / "simulator" / d for d in ("", "cost", "plans")), ROOT / "tests", ROOT / "benchmarks")
    missing = [n for n in named if not any((b / n).exists() for b in bases)]
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"
    assert _named_paths("`plans/kernel.py` and `x.py` and `a.b` and `hardware/laws/<gpu>.toml`") == [
        "plans/kernel.py", "x.py"]


def test_benchmarks_readme_names_every_script():
    """benchmarks/README.md's tables have a row for each script (its first cell names it): a script without one is
    a new one to describe, a row without a script is stale."""
    readme = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    first_cells = [row.split("|")[1] for row in readme.splitlines() if row.startswith("| `")]
    named = {n for cell in first_cells for n in re.findall(r"`([\w./-]+\.(?:py|sh|c|cu|cuh))`", cell)}
    scripts = {p.relative_to(ROOT / "benchmarks").as_posix() for p in (ROOT / "benchmarks").rglob("*")
               if p.suffix in (".py", ".sh", ".c", ".cu", ".cuh")}
    assert len(scripts) > 30
    assert not scripts - named, f"benchmarks/README.md does not describe: {sorted(scripts - named)}"
    assert not named - scripts, f"benchmarks/README.md names scripts that do not exist: {sorted(named - scripts)}"
