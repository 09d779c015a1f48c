"""Which planned results a plain run must measure again, and how Snakemake is made to,
with or without its metadata (.snakemake/).

The project, not Snakemake, says when a result is up to date: its seal holds
(dpscale.results.audit), and what it records having been measured with (its code's
digest, its protocol, the machine's fingerprint, the backend, the variant's environment,
the data cache's sha256) is what the plan asks for now. Snakemake compares params only
through its metadata, which users lose (they delete .snakemake/, copy results/ to another
clone, cache results/ in CI, run --cleanup-metadata); and it reruns a job whose output is
missing only if a job downstream must run (checked with 9.27: a result deleted by hand
under a newer report is never measured again).

So the decision is carried by files, which Snakemake compares by existence and mtime:

- Per result, `k<k>.failures` (dpscale.results.failures_path) holds one line per failed
  attempt (the watchdog) and per result this planner found not up to date. Its count n
  names the result's attempt stamp, `k<k>.attempt-<n>` (layout.attempt_stamp), an input
  of the measurement made by a trivial rule: a new count names a stamp that does not exist
  yet, the stamp's job runs, and the measurement after it.
- The report reads every stamp, and one of its outputs is named after a key of the
  counts, the resolved configuration and the report's code (`report_key`): a new count
  names a report output that does not exist, so the report must run, and Snakemake then
  follows its inputs down to the stamps and the measurements behind them. Without that
  output, an up-to-date report hides every missing file below it.

A dry run (`snakemake -n`) writes nothing and shows the same plan: the counts it names
are the ones the real run writes. Why a count and not a token: a token "found damaged"
recorded by the run that repairs the result would differ from the "sound" of the run
after it, one needless rerun later; a count changes only when something is found.

Only the main process looks and writes; a job-mode parse (a compute node) reads the counts
as the main process left them, and the report's key from the environment the main process
exported (a job that failed meanwhile must not rename the report's outputs under it).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dpscale import layout, results
from dpscale.plan import jobs

REPORT_PLAN = str(layout.working().plan)   # the last report's plan: results/report/plan.json
KEY_ENV = "DPSCALE_REPORT_KEY"
STAMP_RULE = "attempt_stamp"   # rules/measure.smk   # the main process's report key, for job-mode parses

# What a result records about how it was measured, compared with its job's spec now.
RECORDED = ("config", "fingerprint", "backend", "env", "launch")


def not_this_plan(targets, resolved: dict, fingerprint_path) -> list[str]:
    """One line per planned result that holds a number measured otherwise than the plan
    asks (stale): what a report built from it (--allowed-rules report after a protocol
    change) says in its header and closing lines."""
    try:
        fp = json.loads(Path(fingerprint_path).read_text())
    except (OSError, ValueError):
        return []
    plan, out = jobs.planned_of(resolved, fp), []
    for t in targets:
        if not results.audit(t).sound:
            continue
        try:
            why = stale(json.loads(Path(t).read_text()), *plan(t))
        except (KeyError, ValueError):   # not a job of this registry: nothing to compare it with
            continue
        if why:
            out.append(f"{t}: {why}")
    return out


def last_report_read(plan_path: str | Path = REPORT_PLAN) -> set[str]:
    """The result files the last report was built from (its plan.json's targets, as
    job labels "experiment/variant/k<k>"); empty when no report was built."""
    try:
        plan = json.loads(Path(plan_path).read_text())
    except (OSError, ValueError):
        return set()
    return {str(t).removesuffix(".json") for t in plan.get("targets", [])}


def _canon(x):
    return json.loads(json.dumps(x, sort_keys=True, default=str))


def _leaf_diffs(recorded, planned, prefix: str = "") -> list[str]:
    """The keys where two records differ, with both values: 'protocol.train_images 128 (plan: 256)'."""
    if isinstance(recorded, dict) and isinstance(planned, dict):
        out = []
        for key in sorted(set(recorded) | set(planned), key=str):
            out += _leaf_diffs(recorded.get(key), planned.get(key), f"{prefix}{key}.")
        return out
    if recorded == planned:
        return []
    return [f"{prefix.rstrip('.')} {json.dumps(recorded)} (plan: {json.dumps(planned)})"]


def stale(record: dict, spec: dict, code_sha: str, cache_sha: str | None = None) -> str | None:
    """Why a sound result is not what its job would measure now, or None. spec: the job's
    spec now (dpscale.plan.specs.job_spec); code_sha: the digest of the code it runs
    (dpscale.plan.jobs.code_of); cache_sha: the data cache's sha256 now, when it exists."""
    recorded_code = (record.get("code") or {}).get("sources_sha256")
    if recorded_code != code_sha:
        return (f"measured by other code (sources sha256 {recorded_code}, the plan's {code_sha}: "
                "the code was changed, or the result comes from another version)")
    diffs = []
    for key in RECORDED:
        diffs += _leaf_diffs(_canon(record.get(key)), _canon(spec.get(key)), f"{key}.")
    if diffs:
        shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
        return f"measured with another protocol or on another machine than the plan's: {shown}"
    if (record.get("status") == "skipped") != bool(spec.get("skip_reason")):
        return (f"recorded {record.get('status')}, and the plan "
                + (f"skips it now ({spec['skip_reason']})" if spec.get("skip_reason") else "runs it now"))
    recorded_cache = (record.get("data") or {}).get("cache_sha256")
    if cache_sha and recorded_cache and recorded_cache != cache_sha:
        return f"measured on another data cache (sha256 {recorded_cache[:12]}, now {cache_sha[:12]})"
    return None


@dataclass(frozen=True)
class Finding:
    """A planned result found not up to date at the run's start."""
    result: str
    why: str
    before: str | None = None   # its digest then (None: missing or unreadable)
    kept: str | None = None     # where its bytes were copied aside

    def line(self) -> str:
        return f"{self.result}: {self.why}" + (f" (the file is kept as {self.kept})" if self.kept else "")


class Replanner:
    """One per workflow parse.

    targets: the planned results; plan(result) -> (spec, code_sha, cache_sha or None), what
    the job would measure with now; dry() whether this is a dry run (Snakemake knows it only
    once the DAG is built: workflow.dryrun, read by the input functions, not at parse time);
    say: where one line per finding goes (Snakemake's logger)."""

    def __init__(self, targets: list[str], plan: Callable[[str], tuple] | None, dry: Callable[[], bool],
                 main: bool, say: Callable[[str], None] = print, plan_path: str | Path = REPORT_PLAN):
        self.targets, self.dry, self.main, self.say = list(targets), dry, main, say
        self.reported = last_report_read(plan_path)
        self.base = {t: results.failed_attempts(t) for t in self.targets}   # before this run wrote any
        self.pending: dict[str, str] = {}
        if main:
            for t in self.targets:
                if (why := self.finding(t, plan)) is not None:
                    self.pending[t] = why
        self.found: list[Finding] = []   # what this run recorded, for the closing lines
        self._done: set[str] = set()

    def finding(self, result: str, plan: Callable[[str], tuple] | None = None) -> str | None:
        """Why `result` must be measured again, or None."""
        a = results.audit(result)
        if a.state == results.MISSING:
            if results.label_of(result) in self.reported:
                return ("missing: the last report read it, and it was deleted since (by hand, or by an "
                        "interrupted --forcerun)")
            return None   # never measured, or the report is gone too: Snakemake plans it itself
        if not a.sound:
            return f"{a.state}: {a.reason}"
        if plan is None:
            return None
        spec, code_sha, cache_sha = plan(result)
        why = stale(json.loads(Path(result).read_text()), spec, code_sha, cache_sha)
        return f"stale: {why}" if why else None

    def count(self, result: str) -> int:
        """The result's attempt count as this run leaves it: failed attempts so far, plus one
        if it was found now (read-only: what a dry run shows is what a real run writes)."""
        return self.base.get(result, results.failed_attempts(result)) + (result in self.pending)

    def attempts(self, result: str) -> int:
        """count(result), recording the finding first (real runs, main process, once)."""
        if result in self.pending and result not in self._done:
            self._done.add(result)
            why = self.pending[result]
            if self.main and not self.dry():
                before = results.audit(result).digest
                kept = self._set_aside(result)
                results.record_failure(result, f"replanned: {why}")
                self.found.append(Finding(result, why, before, kept))
                self.say(f"{self.found[-1].line()}; planned to be measured again")
            else:
                self.say(f"{result}: {why}; a real run measures it again")
        return self.count(result)

    def stamp(self, result: str) -> list[str]:
        """The measurement's attempt-stamp input: none before its first failure or finding."""
        n = self.attempts(result)
        return [layout.attempt_stamp(result, n)] if n else []

    def stamps(self, allowed_rules=()) -> list[str]:
        """Every planned result's current stamp, for the report's input (read-only); when
        Snakemake may run only `allowed_rules` and the stamps' rule is not among them,
        those that exist (the report is built from what there is, and says so)."""
        out = [layout.attempt_stamp(t, n) for t in self.targets if (n := self.count(t))]
        if allowed_rules and STAMP_RULE not in allowed_rules:
            out = [p for p in out if Path(p).exists()]
        return out

    def report_key(self, *extra: str) -> str:
        """12 hex digits naming one of the report's outputs: the attempt counts and `extra`
        (the resolved configuration, the report's code). The main process exports it, so
        a job-mode parse names the same output."""
        if not self.main and os.environ.get(KEY_ENV):
            return os.environ[KEY_ENV]
        h = hashlib.sha256()
        for t in self.targets:
            h.update(f"{t}\0{self.count(t)}\0".encode())
        for x in extra:
            h.update(x.encode() + b"\0")
        key = h.hexdigest()[:12]
        if self.main:
            os.environ[KEY_ENV] = key
        return key

    def outcome(self) -> list[tuple[Finding, bool]]:
        """Each finding of this run and whether its result was measured again: sound now,
        and not the bytes it held when it was found."""
        out = []
        for f in self.found:
            a = results.audit(f.result)
            out.append((f, a.sound and a.digest != f.before))
        recorded = {f.result for f in self.found}   # found, but its rule was not run (--allowed-rules)
        out += [(Finding(t, why), False) for t, why in self.pending.items() if t not in recorded]
        return out

    @staticmethod
    def _set_aside(result: str) -> str | None:
        """Copy a damaged file out of the results' glob (k*.json), keeping its bytes; the
        file itself stays until its job starts (Snakemake removes a job's outputs then, and
        one moved away under it while it builds the DAG stops the run)."""
        p = Path(result)
        if not p.exists():
            return None
        a = results.audit(p)
        state = "stale" if a.sound else a.state
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        dest = p.with_name(f"{p.name}.{state}-{stamp}")
        shutil.copy2(p, dest)
        return str(dest)
