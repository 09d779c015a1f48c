"""Open report.html in headless Chromium: every <img> decodes, the tables render.

The check injects a small script into a copy of the page; on `load` it writes what
it found (images and their naturalWidth, tables, rows) into a <pre id="browser-check">,
which `chromium --dump-dom` prints. A screenshot is saved beside the copy (and for
a real report, as results/report/screenshot.png).

Chromium: /usr/bin/chromium (Debian's `apt-get install chromium`; `.ci/chromium.sh`
installs it), or $CHROMIUM. Without it the test is skipped, except under CI=true,
where a missing browser is a failure.

Also a script:  python tests/test_browser.py results/report/report.html
(screenshots at 900 and 1400 px beside it, and the smallest text each width shows)
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.report   # builds whole reports: scheduled before the second-long modules (conftest.TIERS)

CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--disable-dev-shm-usage", "--mute-audio"]

CHECK_JS = r"""
<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var out = {
    images: imgs.length,
    broken: imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                .map(function (i) { return i.alt || i.src.slice(0, 60); }),
    widths: imgs.map(function (i) { return i.naturalWidth; }),
    viewport: window.innerWidth,
    // the smallest text each figure shows, in CSS pt at this window width: its smallest
    // font (data-min-font-pt, at its design width of data-width-in x 96 px) scaled by
    // the width it is displayed at
    shown_pt: imgs.filter(function (i) { return i.dataset.minFontPt; }).map(function (i) {
      return {figure: i.dataset.figure, pt: parseFloat(i.dataset.minFontPt) * i.clientWidth /
              (parseFloat(i.dataset.widthIn) * 96), shown_px: i.clientWidth}; }),
    tables: document.querySelectorAll('table').length,
    table_ids: Array.prototype.map.call(document.querySelectorAll('table[data-table]'),
                                        function (t) { return t.getAttribute('data-table'); }),
    rows: document.querySelectorAll('tbody tr').length,
    title: document.title
  };
  var pre = document.createElement('pre');
  pre.id = 'browser-check';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env and (Path(env).exists() or shutil.which(env)):
        return shutil.which(env) or env
    for c in CANDIDATES:
        p = shutil.which(c) if not c.startswith("/") else (c if Path(c).exists() else None)
        if p:
            return p
    return None


def require_chromium() -> str:
    exe = find_chromium()
    if exe:
        return exe
    msg = ("headless Chromium not found (looked for $CHROMIUM, " + ", ".join(CANDIDATES) + "); "
           "install it with `sudo .ci/chromium.sh` (Debian: apt-get install -y chromium)")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail("CI is set and " + msg, pytrace=False)
    pytest.skip(msg)


def run_chromium(exe: str, args: list[str], profile: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [exe, *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check_report(html_path: Path, shots: Path | None = None, exe: str | None = None,
                 widths: tuple[int, ...] = (900, 1400)) -> dict[int, dict]:
    """Load the report in headless Chromium at each window width; return what the page
    saw there, and save a screenshot per width into `shots` (screenshot-<width>.png)."""
    exe = exe or find_chromium()
    if not exe:
        raise RuntimeError("no chromium")
    html_path = Path(html_path).resolve()
    out = {}
    with tempfile.TemporaryDirectory(prefix="dpscale-browser-") as tmp:
        tmp = Path(tmp)
        page = tmp / "checked.html"
        text = html_path.read_text()
        page.write_text(text.replace("</body>", CHECK_JS + "</body>", 1) if "</body>" in text else text + CHECK_JS)
        for w in widths:
            p = run_chromium(exe, [f"--window-size={w},2000", "--virtual-time-budget=10000", "--dump-dom",
                                   page.as_uri()], tmp / f"profile-dom-{w}")
            m = re.search(r'<pre id="browser-check">(.*?)</pre>', p.stdout, re.S)
            if not m:
                raise AssertionError(f"chromium printed no check result (rc {p.returncode}); stderr tail:\n"
                                     + p.stderr[-2000:])
            out[w] = json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                                .replace("&amp;", "&"))
            if shots is not None:
                shot = Path(shots).resolve() / f"screenshot-{w}.png"
                shot.parent.mkdir(parents=True, exist_ok=True)
                q = run_chromium(exe, [f"--window-size={w},6000", f"--screenshot={shot}",
                                       "--virtual-time-budget=10000", html_path.as_uri()], tmp / f"profile-shot-{w}")
                if not shot.exists():
                    raise AssertionError(f"chromium wrote no screenshot (rc {q.returncode}): {q.stderr[-2000:]}")
                out[w]["screenshot"] = str(shot)
    return out


def assert_legible(found: dict[int, dict], n_figures: int) -> None:
    """Every figure loads at every width, and none shows text under 9 pt."""
    for w, f in found.items():
        assert f["images"] == n_figures and f["broken"] == [], (w, f["broken"])
        small = [x for x in f["shown_pt"] if x["pt"] < 9 - 1e-6]
        assert len(f["shown_pt"]) == n_figures and not small, (w, small)


@pytest.fixture(scope="module")
def fixture_report(built):
    return built["out"] / "report.html"   # conftest's: the report test_report.py checks


def test_report_renders_in_chromium(fixture_report, tmp_path):
    from dpscale.report.chapters import figure_specs
    exe = require_chromium()
    found = check_report(fixture_report, tmp_path, exe)
    assert_legible(found, len(figure_specs()))
    for key in ("book_comparison", "status", "fingerprint", "weak_side", "allreduce", "forecast", "plan"):
        assert key in found[900]["table_ids"], key
    assert found[900]["rows"] > 50
    for w in (900, 1400):
        shot = Path(found[w]["screenshot"])
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def test_real_report_if_built():
    """The pipeline's own report, when one has been built here (results/report/report.html,
    or $DPSCALE_REPORT_HTML); its screenshot goes beside it (results/report/screenshot.png)."""
    html = Path(os.environ.get("DPSCALE_REPORT_HTML", Path(__file__).resolve().parents[1]
                               / "results" / "report" / "report.html"))
    if not html.exists():
        pytest.skip(f"no report at {html} (run `snakemake --cores 1 report` first)")
    from dpscale.report.chapters import figure_specs
    found = check_report(html, html.parent, require_chromium())
    assert_legible(found, len(figure_specs()))


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="Check a built report.html in headless Chromium and screenshot it.")
    ap.add_argument("html", nargs="?", default="results/report/report.html")
    ap.add_argument("--shots", default=None, help="folder for screenshot-<width>.png (default: beside the report)")
    a = ap.parse_args()
    res = check_report(Path(a.html), Path(a.shots) if a.shots else Path(a.html).parent)
    for w, f in res.items():
        print(w, json.dumps({k: v for k, v in f.items() if k not in ("widths", "shown_pt")}),
              "smallest text shown:", min((x["pt"] for x in f["shown_pt"]), default=None))
    sys.exit(0 if all(f["images"] and not f["broken"] for f in res.values()) else 1)
