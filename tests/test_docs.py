"""The documentation's links resolve, the findings page stays short, and the results pages hold the tables
generated from the records (no training, no network)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS_PAGES = DOCS / "results"
REPORTS = ROOT / "reproductions" / "reports"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
#: docs/RESULTS.md opens with the findings table and links the per-experiment pages; the detail lives there
RESULTS_PAGE_LIMIT = 45_000

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
GENERATED = re.compile(r"<!-- generated:(\S+) -->\n(.*?)\n<!-- /generated:\1 -->", re.S)


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor ``page`` defines: its headings' (repeats numbered -1, -2, ... as GitHub does) and HTML ones."""
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    found = set(HTML_ANCHOR.findall(text))
    for heading in HEADING.findall(text):
        base = slug(heading)
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def relative_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I)]  # http:, https:, mailto: ...


def test_the_link_checker_reads_links_headings_and_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Lap2 paper, Tables III and II (reduced): MiniLM-L6\n\n## Findings\n\n### `bench.py`\n\n"
                    "## Findings\n\n[a](other.md#x) ![b](fig.png) [c](https://example.org) `[d](code.md)`\n"
                    "```\n[e](fenced.md)\n```\n[f](#findings-1)\n")
    assert relative_links(page) == ["other.md#x", "fig.png", "#findings-1"]
    assert anchors(page) == {"lap2-paper-tables-iii-and-ii-reduced-minilm-l6", "findings", "benchpy", "findings-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_anchor(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_findings_page_is_short_and_links_every_experiment_page():
    page = DOCS / "RESULTS.md"
    assert page.stat().st_size <= RESULTS_PAGE_LIMIT
    text = page.read_text()
    assert text.index("## Findings") < text.index("## Pages") < text.index("## How to reproduce")
    for experiment_page in sorted(RESULTS_PAGES.glob("*.md")):
        assert f"](results/{experiment_page.name})" in text, experiment_page.name


def test_results_pages_hold_the_tables_generated_from_the_records():
    """Each ``<!-- generated:NAME -->`` block is the body of reproductions/reports/NAME.md (what
    ``python -m reproductions --experiment figures --page docs/results`` writes), and every compact
    summary the reports hold is on a page."""
    from reproductions.reports import generated_body

    on_pages = {}
    for page in sorted(RESULTS_PAGES.glob("*.md")):
        for stem, body in GENERATED.findall(page.read_text()):
            assert stem not in on_pages, f"{stem} on {on_pages.get(stem)} and {page.name}"
            on_pages[stem] = page.name
            assert body.strip() == generated_body(REPORTS / f"{stem}.md"), f"{page.name}: stale {stem}"
    assert not GENERATED.findall((DOCS / "RESULTS.md").read_text())
    assert {p.stem for p in REPORTS.glob("summary_*.md")} <= set(on_pages)
