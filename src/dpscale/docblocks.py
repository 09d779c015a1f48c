"""Number blocks in the project's pages, generated: a page holds, between

    <!-- BEGIN dpscale <subcommand> <args> -->
    ...what that command prints...
    <!-- END -->

exactly what the named `dpscale` command prints, run from the repository's root, with
the root's own path left out (so the page reads the same on every clone). `dpscale docs`
rewrites every block of README.md and docs/*.md from reference/ and the public data;
`dpscale docs --check` says which blocks differ and changes nothing (a test and CI run
it). Prose cites a block or a dated report; it never copies a number.

Hand-written on purpose: the format is three lines of regular expression, and the runner
is the project's own CLI (passed in: this module sits at the ground floor)."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path
from typing import Callable

BLOCK = re.compile(r"(<!-- BEGIN (dpscale [^>]*?) -->\n)(.*?)(<!-- END -->)", re.S)
PAGES = ("README.md", "docs/*.md")


def pages(root: Path) -> list[Path]:
    return [p for pat in PAGES for p in sorted(root.glob(pat))]


def run(command: str, root: Path, main: Callable[[list[str]], int]) -> str:
    """What `command` ('dpscale <subcommand> <args>') prints, its paths taken from root and
    root's own path left out of the output."""
    args = shlex.split(command)[1:]
    args = [a if a.startswith("-") or i == 0 or not (root / a).exists() else str(root / a) for i, a in enumerate(args)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(args)
    if rc:
        raise RuntimeError(f"{command}: exit {rc}")
    return out.getvalue().replace(str(root) + "/", "")


def regenerate(root: Path, main: Callable[[list[str]], int], write: bool) -> list[str]:
    """Every block of every page: rewritten (write) or compared. Returns one line per
    block that differed: 'PAGE: COMMAND'."""
    stale, cache = [], {}
    for page in pages(root):
        text = page.read_text()

        def fill(m: re.Match) -> str:
            if m.group(2) not in cache:
                cache[m.group(2)] = run(m.group(2), root, main)
            new = cache[m.group(2)]
            if new != m.group(3):
                stale.append(f"{page.relative_to(root)}: {m.group(2)}")
            return m.group(1) + new + m.group(4)
        new_text = BLOCK.sub(fill, text)
        if write and new_text != text:
            page.write_text(new_text)
    return stale
