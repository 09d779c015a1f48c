"""Which planned results a plain run must measure again although Snakemake would not.

Snakemake (checked with 9.27) reruns a job when its output is missing only if a job
downstream of it must run: a result deleted by hand, or left deleted by an interrupted
`--forcerun`, while the report built from it is present and newer, is never measured
again; and a result whose content was truncated, replaced or edited is a file like any
other to it. Either way the next report would serve the number the file no longer holds.

So every measurement rule's `retry` param (dpscale.plan.jobs.retry_of) counts, per
result, the lines of its `.failures` file (dpscale.results.failures_path). When the
planner finds a result that is not sound (dpscale.results.audit: unreadable, altered,
unsealed) or missing although the last report read it (results/report/plan.json lists
it), it appends a line saying so: the count changes, Snakemake sees the params changed,
and the job runs again; the report downstream follows. A damaged file is first copied
aside (`k2.json` -> `k2.json.altered-<UTC>`), so the hand-edited number is kept, not lost.

Why a count and not a token (the same reason as for failed attempts): Snakemake records
params as they were when the DAG was built. "damaged" recorded by the run that repairs
the result would differ from the "sound" of the run after it, one needless rerun later.
The count changes only when something is found, and is read the same by every later run.

A dry run (`snakemake -n`) writes nothing: its count is the one the real run would
write, so the plan it shows is the plan that will run. Only the main process writes
(a job-mode parse on a compute node reads what the main process recorded).
"""
from __future__ import annotations

import datetime as _dt
import json
import shutil
from pathlib import Path
from typing import Callable

from dpscale import layout, results

REPORT_PLAN = str(layout.working().plan)   # the last report's plan: results/report/plan.json


def last_report_read(plan_path: str | Path = REPORT_PLAN) -> set[str]:
    """The result files the last report was built from (its plan.json's targets, as
    job labels "experiment/variant/k<k>"); empty when no report was built."""
    try:
        plan = json.loads(Path(plan_path).read_text())
    except (OSError, ValueError):
        return set()
    return {str(t).removesuffix(".json") for t in plan.get("targets", [])}


class Replanner:
    """One per workflow parse: `attempts(result)` is the retry param's count, with a
    line appended (real runs, main process) for a result found missing or damaged.

    dry: returns whether this run is a dry run (Snakemake knows it only once the DAG is
    built: workflow.dryrun, read when the params are evaluated, not at parse time).
    say: where the one line per result found goes (Snakemake's logger)."""

    def __init__(self, dry: Callable[[], bool], main: bool, say: Callable[[str], None] = print,
                 plan_path: str | Path = REPORT_PLAN):
        self.dry, self.main, self.say = dry, main, say
        self.reported = last_report_read(plan_path)
        self.seen: dict[str, int] = {}   # a job's params may be evaluated more than once a run
        self.found: list[str] = []       # one line per result found, for the end of the run

    def finding(self, result: str) -> str | None:
        """Why `result` must be measured again, or None."""
        a = results.audit(result)
        if a.state == results.MISSING:
            if results.label_of(result) in self.reported:
                return ("missing: the last report read it, and it was deleted since (by hand, or by an "
                        "interrupted --forcerun)")
            return None   # never measured, or the report is gone too: Snakemake plans it itself
        return None if a.sound else f"{a.state}: {a.reason}"

    def attempts(self, result: str) -> int:
        if result in self.seen:
            return self.seen[result]
        n = results.failed_attempts(result)
        why = self.finding(result)
        if why is not None:
            if self.main and not self.dry():
                kept = self._set_aside(result)
                results.record_failure(result, f"replanned: {why}")
                self.found.append(f"{result}: {why}" + (f" (the file is kept as {kept})" if kept else ""))
                self.say(f"{self.found[-1]}; measured again")
            else:
                self.say(f"{result}: {why}; a real run measures it again")
            n += 1
        self.seen[result] = n
        return n

    @staticmethod
    def _set_aside(result: str) -> str | None:
        """Copy a damaged file out of the results' glob (k*.json), keeping its bytes; the
        file itself stays until its job starts (Snakemake removes a job's outputs then, and
        one moved away under it while it builds the DAG stops the run)."""
        p = Path(result)
        if not p.exists():
            return None
        state = results.audit(p).state
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        dest = p.with_name(f"{p.name}.{state}-{stamp}")
        shutil.copy2(p, dest)
        return str(dest)
