"""The repository stands alone: every relative link in README.md and docs/*.md resolves (file and
#anchor), and every `sources.md §x` citation in code, profiles and docs names a section that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "history").glob("*.md")),
         ROOT / "benchmarks" / "README.md"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"sources\.md \\?(?:§|\\u00a7) ?(K?\d+[a-z]?(?:\.\d+)?)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page):
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not followed
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: link to {target}: no such file"
        assert ROOT in file.parents, f"{page.name}: link to {target} leaves the repository"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file), f"{page.name}: link to {target}: no such heading"


def test_the_link_checker_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title\n[ok](#a-title) [bad](#nope) [gone](missing.md)\n")
    assert anchors(page) == {"a-title"} and links(page) == ["#a-title", "#nope", "missing.md"]


def _citations() -> list[tuple[str, str]]:
    files = [*(ROOT / "simulator").rglob("*.py"), *(ROOT / "simulator").rglob("*.toml"), *PAGES,
             *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    return [(f.name, m.group(1)) for f in files if f.name != "test_docs_links.py"
            for m in CITED.finditer(f.read_text(encoding="utf-8"))]


def test_every_sources_section_cited_exists():
    sources = (ROOT / "docs" / "sources.md").read_text()
    sections = {re.match(r"§(\S+)", h).group(1) for h in re.findall(r"^#+ (§\S+)", sources, re.M)}
    sections |= set(re.findall(r"^- \*\*§(\S+)\*\*", (ROOT / "docs" / "sources.md").read_text(), re.M))
    cited = _citations()
    assert len(cited) > 100, "the hardware profiles cite sources.md"
    missing = sorted({(name, s) for name, s in cited if s not in sections})
    assert not missing, f"cited but not in docs/sources.md: {missing}"


def test_no_citation_points_outside_the_repository():
    shipped = [*(ROOT / "simulator").rglob("*"), *(ROOT / "models").rglob("*"), *(ROOT / "scenarios").rglob("*")]
    for page in [*shipped, *PAGES]:
        if page.suffix in (".py", ".toml", ".md", ".json"):
            text = page.read_text(encoding="utf-8")
            for outside in ("../shared/", "reference/hardware.md", "reference/kimi_k3.md", "hardware.md §"):
                assert outside not in text, f"{page.name} cites {outside}"
