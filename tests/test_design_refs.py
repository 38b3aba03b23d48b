"""What the code says of docs/DESIGN.md is there: every section a docstring or comment cites (the path, then the
section's title in double quotes) is a heading or a bold paragraph title of DESIGN (its words before a bracket
enough), and the C ABI version DESIGN names is the header's."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "DESIGN.md"
SOURCES = ("seer_trt/**/*.py", "export/**/*.py", "tools/*.py", "tests/*.py", "cpp/**/*.cpp", "cpp/**/*.hpp",
           "cpp/**/*.h")  # fmt: skip
CITATION = re.compile(r'(?:docs/DESIGN\.md|DESIGN)[,:]?\s*((?:"[^"\n]+"(?:,\s*)?)+)')


def titles(text: str) -> set[str]:
    """Headings, and the bold titles that open a paragraph or a list item (``**The end tail.**``)."""
    heads = {m.group(1).strip() for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}
    bold = {m.group(1).strip().rstrip(".:") for m in re.finditer(r"^(?:- )?\*\*([^*]+)\*\*", text, re.M)}
    every = heads | bold
    return every | {t.split(" (")[0] for t in every}


def citations() -> dict[str, list[str]]:
    """Cited section name -> the files citing it."""
    out: dict[str, list[str]] = {}
    for pattern in SOURCES:
        for path in ROOT.glob(pattern):
            for match in CITATION.finditer(path.read_text(errors="replace")):
                for name in re.findall(r'"([^"\n]+)"', match.group(1)):
                    out.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return out


def test_every_design_section_the_code_cites_exists():
    cited = citations()
    assert len(cited) >= 15  # the pattern finds the citations (so an empty result cannot pass)
    have = titles(DESIGN.read_text())
    missing = {name: files[:3] for name, files in cited.items() if name not in have and name.split(" (")[0] not in have}
    assert missing == {}, missing


def test_design_names_the_c_abi_version_of_the_header():
    header = (ROOT / "cpp" / "include" / "seer" / "seer_c.h").read_text()
    version = re.search(r"#define SEER_C_ABI_VERSION (\d+)", header).group(1)
    named = re.findall(r"ABI version (\d+)", DESIGN.read_text())
    assert named and set(named) == {version}, (named, version)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return kept.replace(" ", "-")


def test_every_anchor_link_in_the_docs_lands_on_a_heading():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    anchors = {p.resolve(): {slug(h) for h in re.findall(r"^#+\s+(.*)$", p.read_text(), re.M)} for p in docs}
    links, broken = 0, []
    for doc in docs:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", doc.read_text()):
            path = (doc.parent / target).resolve() if target else doc.resolve()
            if path not in anchors:
                continue  # a file outside the docs (its anchor is another tool's)
            links += 1
            if anchor not in anchors[path]:
                broken.append(f"{doc.name} -> {target or doc.name}#{anchor}")
    assert links > 20 and broken == [], broken
