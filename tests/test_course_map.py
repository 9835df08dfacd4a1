"""Chapter 00's map, its journey diagram and the README's chapter table describe the chapters that
exist in chapters/: every notebook has its row and link, no row names a chapter that is not there,
and nothing calls a written chapter "coming"."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = {p.name[:2]: p.name for p in sorted((REPO / "chapters").glob("[0-9][0-9]_*.ipynb"))}


def markdown_of_chapter_00() -> list[str]:
    cells = json.loads((REPO / "chapters" / "00_setup.ipynb").read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def section(title: str) -> str:
    found = [text for text in markdown_of_chapter_00() if text.startswith(title)]
    assert len(found) == 1, f"chapter 00 should have one cell starting with {title!r}, found {len(found)}"
    return found[0]


def table_rows(text: str) -> dict[str, str]:
    """'| 05 | [prefix cache](05_prefix_cache.ipynb) | ...' -> {'05': the row}."""
    return {m.group(1): line for line in text.splitlines() if (m := re.match(r"\|\s*(\d\d)\s*\|", line))}


def test_the_map_has_one_linked_row_per_notebook():
    rows = table_rows(section("## The map"))
    assert sorted(rows) == sorted(NOTEBOOKS), f"the map's rows {sorted(rows)} against chapters/ {sorted(NOTEBOOKS)}"
    for number, row in rows.items():
        if number == "00":
            continue  # the map is in chapter 00 itself
        links = re.findall(r"\]\(([^)]+)\)", row)
        assert links == [NOTEBOOKS[number]], f"row {number} should link to {NOTEBOOKS[number]}, links {links}"


def test_the_map_says_how_many_chapters_there_are():
    text = section("## The map")
    first, last = min(NOTEBOOKS), max(NOTEBOOKS)
    assert f"{first}–{last}" in text, f"the map's first line should name the chapters {first}–{last}"


def test_the_journey_names_only_chapters_that_exist():
    text = section("## The journey of one request")
    diagram = text.split("```")[1]
    header = next(line for line in diagram.splitlines() if "chapters" in line)
    column = header.index("chapters")
    named = {n for line in diagram.splitlines()[1:] for n in re.findall(r"\b\d\d\b", line[column:])}
    assert named, "the journey diagram names no chapter"
    assert named <= set(NOTEBOOKS), f"the journey names chapters without a notebook: {sorted(named - set(NOTEBOOKS))}"


def test_nothing_written_is_called_coming():
    for text in markdown_of_chapter_00():
        for line in text.splitlines():
            assert not re.search(r"\bcoming\b|not yet (written|exist)", line, re.I), f"chapter 00 says: {line!r}"


def test_the_readme_lists_every_chapter():
    rows = table_rows((REPO / "README.md").read_text())
    assert sorted(rows) == sorted(NOTEBOOKS), f"README's chapter rows {sorted(rows)} against {sorted(NOTEBOOKS)}"
    for number, row in rows.items():
        assert f"chapters/{NOTEBOOKS[number]}" in row, f"README row {number} should name chapters/{NOTEBOOKS[number]}"
