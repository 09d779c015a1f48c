"""README.md's "Forecast" section and docs/forecast.md's "Every row, today" state what
`dpscale forecast` prints over the committed references through generated blocks
(`dpscale forecast --markdown summary|validation`, filled by `dpscale docs`;
tests/test_docs.py fails when a block differs from the live output). Here: the blocks are
where the pages say, and the section's prose holds no number of its own, so no number in
it can go stale: what is not a block holds no digit but in file names, issue numbers and
formulas."""
from __future__ import annotations

import re
from pathlib import Path

from dpscale import docblocks

ROOT = Path(__file__).resolve().parents[1]

ALLOWED = [r"[\w./-]*\d[\w./-]*\.(txt|json|yaml|md|py)",   # file names
           r"#\d+",                                          # issue numbers
           r"2\(k-1\)/k", r"2\(N-1\)/N", r"k >= 2", r"k=\d+",
           r"\b(G?H\d{3}|A100|RTX \d{4})\b", r"\d+ x H200"]


def section(path: str, heading: str) -> str:
    text = (ROOT / path).read_text()
    m = re.search(rf"^{re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"{path} has no '{heading}' section"
    return m.group(1)


def test_the_forecast_pages_hold_their_numbers_in_generated_blocks():
    readme = section("README.md", "## Forecast")
    rows = section("docs/forecast.md", "## Every row, today")
    assert [m.group(2) for m in docblocks.BLOCK.finditer(readme)] == ["dpscale forecast --markdown summary"]
    assert [m.group(2) for m in docblocks.BLOCK.finditer(rows)] == ["dpscale forecast --markdown validation"]
    assert "| machine | rows | model: mean / max error |" in readme   # filled, not an empty block
    assert "| machine | point | predicted from |" in rows


def test_the_forecast_section_s_prose_copies_no_number():
    prose = docblocks.BLOCK.sub(" ", section("README.md", "## Forecast"))
    prose = re.sub(r"```.*?```", " ", prose, flags=re.S)   # the commands' example lines
    for pattern in ALLOWED:
        prose = re.sub(pattern, " ", prose)
    leftover = re.findall(r"[^\s]*\d[^\s]*", prose)
    assert not leftover, f"numbers in the Forecast section outside its generated block: {leftover}"
