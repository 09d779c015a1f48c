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


def test_a_band_past_100_percent_says_why():
    """`dpscale forecast` over the committed machines: every series whose band reaches past
    100% efficiency says so, with the k's and why, and whether any point does."""
    from dpscale.report import forecast as fcr, forecast_text as fct
    from dpscale.report.machines import load_reference
    m = load_reference(ROOT / "reference" / "h200x2")
    f = fcr.of_machines([m], fcr.settings(None), fcr.default_fabric(fcr.settings(None)))[0]
    for s in f["series"]:
        over = [r["k"] for r in s["rows"] if any((r.get(f"{sc}_efficiency_hi") or 0) > 1 for sc in ("weak", "strong"))]
        text = "\n".join(fct.series_text(s))
        assert (f"bands past 100% at k = {', '.join(map(str, over))}: " in text) == bool(over), (s["series"], over)
