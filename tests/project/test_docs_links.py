"""Every relative link in README.md and docs/*.md resolves: markdown links and images name an
existing file, and a ``#anchor`` names a heading of the target file as GitHub spells it
(lowercase; punctuation other than hyphens, underscores and spaces dropped; spaces to hyphens;
``-1``, ``-2`` for repeats). Links with a scheme (http, https, mailto) are not checked, and
neither is anything inside code (fenced blocks and inline spans)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(_INLINE_CODE.sub("", line))
    return out


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: link text kept, markup and punctuation dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """Every heading anchor of a markdown file, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            base = github_anchor(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: pathlib.Path) -> list[str]:
    """The targets of every markdown link and image in ``path``, outside code."""
    return [m.group(1) for line in _prose_lines(path.read_text(encoding="utf-8"))
            for m in _LINK.finditer(line)]


def broken_links(path: pathlib.Path) -> list[str]:
    """One line per relative link of ``path`` that does not resolve (file, then anchor)."""
    problems = []
    for target in links(path):
        if not target or _SCHEME.match(target):
            continue  # http(s), mailto, ...: not checked here
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path.resolve()
        if not dest.exists():
            problems.append(f"{path.name}: {target!r}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{path.name}: {target!r}: no heading with anchor #{anchor} in {dest.name}"
                            f" (it has: {sorted(anchors(dest))})")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: pathlib.Path) -> None:
    assert links(page), f"{page.name} has no links: is the link pattern still right?"
    assert broken_links(page) == []


def test_readme_links_every_docs_page() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")
              if t and not _SCHEME.match(t)}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


@pytest.mark.parametrize("heading, anchor", [
    ("The engine and the `draftgraph` command", "the-engine-and-the-draftgraph-command"),
    ("The SGLang reference (the differential tests' oracle)",
     "the-sglang-reference-the-differential-tests-oracle"),
    ("Graph capture (`draftgraph.graphs`)", "graph-capture-draftgraphgraphs"),
    ("Several ranks (tensor parallel)", "several-ranks-tensor-parallel"),
    ("Graph replay vs eager", "graph-replay-vs-eager"),
    ("A [link](x.md) and snake_case", "a-link-and-snake_case"),
])
def test_github_anchor(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_the_check_finds_broken_links(tmp_path: pathlib.Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Same\n\n## Same\n", encoding="utf-8")
    (tmp_path / "plot.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#other-page) [ok](other.md#same-1) [ok](#page)\n"
        "![ok](plot.png) [skipped](https://example.com/missing.md) [skipped](mailto:a@b.c)\n"
        "`[in code](missing-inline.md)`\n"
        "```\n[in a fence](missing-fenced.md)\n```\n"
        "[bad file](missing.md) ![bad image](missing.png) [bad anchor](other.md#nowhere)\n"
        "[bad local anchor](#not-a-heading) [bad repeat](other.md#same-2)\n",
        encoding="utf-8")
    problems = broken_links(page)
    assert len(problems) == 5, problems
    for target in ("missing.md", "missing.png", "other.md#nowhere", "#not-a-heading", "other.md#same-2"):
        assert any(repr(target) in p for p in problems), (target, problems)
