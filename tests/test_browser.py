"""Open report.html in headless Chromium: every <img> decodes, the tables render.

The check injects a small script into a copy of the page; on `load` it writes what
it found (images and their naturalWidth, tables, rows) into a <pre id="browser-check">,
which `chromium --dump-dom` prints. A screenshot is saved beside the copy (and for
a real report, as results/report/screenshot.png).

Chromium: /usr/bin/chromium (Debian's `apt-get install chromium`; `.ci/chromium.sh`
installs it), or $CHROMIUM. Without it the test is skipped, except under CI=true,
where a missing browser is a failure.

Also a script:  python tests/test_browser.py results/report/report.html
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


def check_report(html_path: Path, screenshot: Path | None = None, exe: str | None = None) -> dict:
    """Load the report in headless Chromium; return what the page saw. Raises on no answer."""
    exe = exe or find_chromium()
    if not exe:
        raise RuntimeError("no chromium")
    html_path = Path(html_path).resolve()
    with tempfile.TemporaryDirectory(prefix="dpscale-browser-") as tmp:
        tmp = Path(tmp)
        page = tmp / "checked.html"
        text = html_path.read_text()
        page.write_text(text.replace("</body>", CHECK_JS + "</body>", 1) if "</body>" in text else text + CHECK_JS)
        p = run_chromium(exe, ["--virtual-time-budget=10000", "--dump-dom", page.as_uri()], tmp / "profile-dom")
        m = re.search(r'<pre id="browser-check">(.*?)</pre>', p.stdout, re.S)
        if not m:
            raise AssertionError(f"chromium printed no check result (rc {p.returncode}); stderr tail:\n"
                                 + p.stderr[-2000:])
        found = json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                           .replace("&amp;", "&"))
        if screenshot is not None:
            screenshot = Path(screenshot).resolve()
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            shot = tmp / "shot.png"
            q = run_chromium(exe, ["--window-size=1280,6000", f"--screenshot={shot}", "--virtual-time-budget=10000",
                                   html_path.as_uri()], tmp / "profile-shot")
            if not shot.exists():
                raise AssertionError(f"chromium wrote no screenshot (rc {q.returncode}): {q.stderr[-2000:]}")
            shutil.copyfile(shot, screenshot)
            found["screenshot"] = str(screenshot)
    return found


@pytest.fixture(scope="module")
def fixture_report(tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_report import build_fixture   # the same fixture results as the report's own tests
    return build_fixture(tmp_path_factory.mktemp("browser"))["out"] / "report.html"


def test_report_renders_in_chromium(fixture_report, tmp_path):
    from dpscale.report.chapters import figure_specs
    exe = require_chromium()
    found = check_report(fixture_report, tmp_path / "screenshot.png", exe)
    assert found["images"] == len(figure_specs()), found
    assert found["broken"] == [], found
    for key in ("book_comparison", "status", "fingerprint", "weak_side", "allreduce", "k8_prediction", "plan"):
        assert key in found["table_ids"], key
    assert found["rows"] > 50
    shot = Path(found["screenshot"])
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def test_real_report_if_built():
    """The pipeline's own report, when one has been built here (results/report/report.html,
    or $DPSCALE_REPORT_HTML); its screenshot goes beside it (results/report/screenshot.png)."""
    html = Path(os.environ.get("DPSCALE_REPORT_HTML", Path(__file__).resolve().parents[1]
                               / "results" / "report" / "report.html"))
    if not html.exists():
        pytest.skip(f"no report at {html} (run `snakemake --cores 1 report` first)")
    exe = require_chromium()
    found = check_report(html, html.parent / "screenshot.png", exe)
    assert found["images"] >= 6 and found["broken"] == [], found
    assert found["tables"] >= 5


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="Check a built report.html in headless Chromium and screenshot it.")
    ap.add_argument("html", nargs="?", default="results/report/report.html")
    ap.add_argument("--screenshot", default=None, help="PNG path (default: screenshot.png beside the report)")
    a = ap.parse_args()
    shot = Path(a.screenshot) if a.screenshot else Path(a.html).parent / "screenshot.png"
    res = check_report(Path(a.html), shot)
    print(json.dumps({k: v for k, v in res.items() if k != "widths"}, indent=1))
    sys.exit(0 if res["images"] and not res["broken"] else 1)
