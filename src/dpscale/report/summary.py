"""The closing summary: the answer in plain text, the last lines a run prints.

    text(data, html_path)    per machine and k: the speed-up in samples/s and in time to
                             accuracy (both forms) with intervals, statistical efficiency,
                             the forecast's knee and the predicted soonest and cheapest k;
                             what failed in this run, with its log; the report's path
    write(path, text)        results/report/summary.txt, atomically (the report rule's output)
    closing(...)             what the Snakefile's onsuccess / onerror print last, from the
                             planned results as they are at the end of the run: the summary
                             when the report read exactly these (plan.json's digests), else
                             each missing, damaged, failed or hung result with what recovers
                             it, and where the (other) report is; after a Snakemake error,
                             the failed jobs and the tail of their logs
    announce(text)           print it when the process exits: after Snakemake's own
                             closing lines (its log's path, the run time)

The numbers are the answer chapter's (dpscale.report.chapters.answer), from the same
records. Parse-time light: the report's modules are imported inside text() only.
"""
from __future__ import annotations

import atexit
import json
import re
import sys
from pathlib import Path

from dpscale import layout, provenance, results
from dpscale.report.machines import refused_data
from dpscale.results import job_label, write_atomic

RULE = "=" * 100
HEAD = "dpscale: will k GPUs reach the target accuracy sooner?"


def _x(d: dict | None, key: str = "value") -> str:
    if not d or d.get(key) is None:
        return "–"
    lo, hi = d.get("lo"), d.get("hi")
    return f"{d[key]:.2f}x" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else "")


def _ratio(p: dict | None, key: str, pct: bool = False) -> str:
    if not p or p.get(key) is None:
        return "–"
    f = (lambda v: f"{100 * v:.1f}") if pct else (lambda v: f"{v:.2f}")
    lo, hi = p.get(f"{key}_lo"), p.get(f"{key}_hi")
    return f(p[key]) + ("%" if pct else "x") + (f" [{f(lo)}, {f(hi)}]" if lo is not None and hi is not None else "")


def _pct(x: float | None) -> str:
    return "" if x is None else f"({100 * x:.0f}% eval.)"


COLUMNS = (f"  {'k':>4}  {'samples/s (step that trained)':<32} {'time to accuracy: training only':<32} "
           f"{'with evaluation on the clock':<38} {'statistical efficiency':<24} run")


def k_line(r: dict) -> str:
    """One measured k: the samples/s growth of the step that trained (its source), time to
    accuracy training only, then with the evaluation on the clock (its share), statistical
    efficiency."""
    t, p = r["throughput"], r["point"]
    level = next(iter(re.findall(r"\d+%", (t or {}).get("covers", ""))), "")
    thr = f"{_x(t)} {'forecast ' + level if (t or {}).get('source') == 'forecast' else ''}".strip()
    if p and not p["scored"]:
        from dpscale.report.chapters.tta import no_score_text
        return f"  {r['k']:>4}  {thr:<32} {no_score_text(p):<96} {p['run']}"
    clock = f"{_ratio(p, 'speedup')} {_pct(r['eval_share']) if p else ''}".strip()
    return (f"  {r['k']:>4}  {thr:<32} {_ratio(p, 'speedup_train'):<32} {clock:<38} "
            f"{_ratio(p, 'statistical_efficiency', True):<24} {(p or {}).get('run', '')}")


def forecast_at(r: dict) -> str:
    """The forecast at one k, both forms, its evaluation share."""
    return (f"k={r['k']}: forecast {_ratio(r['predicted_train'], 'speedup')} training only, "
            f"{_ratio(r['predicted'], 'speedup')} with evaluation {_pct(r['predicted_eval_share'])}"
            + (" beyond the evidence" if (r["predicted"] or {}).get("beyond_evidence") else ""))


def predicted_lines(o: dict) -> list[str]:
    """The time-to-accuracy forecast's answer (chapters.answer.opening's): at the measured
    k's after the measurement, soonest k, fewest GPU-hours, the far point, and where the
    evaluation protocol is most of the clock."""
    from dpscale.report.chapters.answer import dominance_text, models_text, no_soonest_text
    pr, rule = o["predicted"], o["rule"]
    if not pr:
        why = no_soonest_text(o)
        return [f"  {why}"] if why else []
    fast, cheap, far = pr["soonest"], pr["cheapest"], pr["far"]
    at = [r for r in o["rows"] if r["k"] > 1 and r["point"] and (r["predicted"] or {}).get("speedup") is not None]
    out = [f"  predicted ({rule['rule']} LR, {models_text(pr['models'])}, over samples/s; batches above "
           f"{pr['extrapolated_above']:,} extrapolated" + (f"; soonest named among batches up to {pr['supported']:,.0f}, "
                                                           "past it beyond the evidence" if pr.get("supported") else "")
           + "):"]
    if at:
        out.append("    forecast at the measured k (after the measurement): " + "; ".join(forecast_at(r) for r in at))
    out.append(f"    soonest to {rule['target']:.0%}: k={fast['k']} (soonest in {fast['predicted']['p_fastest']:.0%} of "
               f"draws), {fast['predicted']['time_s']:.1f} s [{fast['predicted']['time_s_lo']:.1f}, "
               f"{fast['predicted']['time_s_hi']:.1f}]; fewest GPU-hours: k={cheap['k']} "
               f"({cheap['predicted']['gpu_hours']:.2g} GPU-h); " + forecast_at(far)
               + (f" ({pr['far_nodes']} nodes of {far['k'] // pr['far_nodes']})" if pr["far_nodes"] > 1 else ""))
    dom = dominance_text(pr)
    return out + ([f"    {dom}: there the training-only form says how the training scales"] if dom else [])


def machine_lines(data, m) -> list[str]:
    """A machine's block: its k's against k=1, the forecast's knee, the predicted answer."""
    from dpscale.report import forecast as fcr, forecast_text as fct
    from dpscale.report.chapters.answer import opening, step_words
    o = opening(data, m)
    rows = [r for r in o["rows"] if r["k"] > 1 and (r["point"] or (r["throughput"] or {}).get("source") == "measured")]
    f = next((f for f in fcr.compute(data) if f["machine"] == m.name), None)
    s = next((s for s in (f or {}).get("series", []) if s["family"] == "torch" and s["variant"] == o["variant"]),
             fcr.primary(f) if f else None)
    pred = predicted_lines(o)
    if not rows and not pred:
        return []
    sources = ", ".join(m.data_sources()) or "–"
    out = [f"{'the book' if m.kind == 'book' else m.label}: {m.hardware}, {m.scale} scale, data {sources}; "
           f"{step_words(o)}"]
    out += [COLUMNS] + [k_line(r) for r in rows] if rows else []
    if s:
        out.append(f"  {fct.naive_lead(f)}forecast knee (efficiency < {100 * s['knee_threshold']:.0f}%, {s['series']}): "
                   f"weak {fct.knee_text(s, 'weak')}, strong {fct.knee_text(s, 'strong')}")
    return out + pred


def failed_lines(m) -> list[str]:
    """This run's measurements that left no number, each with its reason and log."""
    bad = [r for (_e, _v, _k), r in sorted(m.results.items()) if r.get("status") in ("failed", "hung")]
    if not bad:
        return []
    rows = [f"  {job_label(r['experiment'], r['variant'], r['k'])} {r['status']}: {r.get('reason')}"
            + (f" (log {r['log']})" if r.get("log") else "") for r in bad]
    return [f"{len(rows)} measurement(s) failed or hung; a plain rerun retries the failed ones (a hung one is a "
            "result: --forcerun its rule to try again):"] + rows


def lone_lines(m) -> list[str]:
    """The series not measured on this machine because their k=1 alone gives no ratio."""
    from dpscale.plan.specs import LONE_K1
    lone = sorted({f"{e}/{v}" for (e, v, _k), r in m.results.items()
                   if r.get("status") == "skipped" and LONE_K1 in (r.get("reason") or "")})
    if not lone:
        return []
    return [f"{m.label}: not measured, {LONE_K1} on this machine (no k >= 2 can run): {', '.join(lone)}"]


def skipped_lines(m, most: int = 6) -> list[str]:
    """The k's this machine skipped (not the lone k=1 series: lone_lines says those),
    grouped by their reason: 'skipped at k = 4, 8: <reason> (ddp_weak/cached, ...)'."""
    from dpscale.plan.specs import LONE_K1
    by: dict = {}
    for (e, v, k), r in sorted(m.results.items()):
        why = r.get("reason") or "no reason recorded"
        if r.get("status") == "skipped" and LONE_K1 not in why:
            key = re.sub(r"\d+", "N", why)   # one line per kind of reason, not per k
            by.setdefault(key, {"ks": set(), "series": set(), "why": why})   # the first (smallest k)'s words
            by[key]["ks"].add(k)
            by[key]["series"].add(f"{e}/{v}")
    out = []
    for x in by.values():
        series = sorted(x["series"])
        named = ", ".join(series[:most]) + (f" and {len(series) - most} more" if len(series) > most else "")
        ks = sorted(x["ks"])
        out.append(f"{m.label}: skipped at k = {', '.join(map(str, ks))}: {x['why']}"
                   + (" (and so at each k)" if len(ks) > 1 else "") + f" ({named})")
    return out


def text(data, html_path) -> str:
    """The closing summary of a built report (dpscale.report.build writes it)."""
    out = ["", RULE, HEAD, "(speed-up over k=1 [95% interval]; samples/s of the step the time-to-accuracy runs "
           "trained with, forecast: its band at the level printed beside it; time to accuracy = samples to target x (1 / samples/s + evaluation "
           "per sample): training only, then with the evaluation on the clock and its share; chapter 'Will k "
           "GPUs train sooner?')", ""]
    if data.current is not None and data.current.not_planned:   # before any number read from them
        out += [f"NOT THIS PLAN'S: {len(data.current.not_planned)} result(s) of this run were measured otherwise "
                "than the plan asks, and are shown as they are:"] + [f"  {a}" for a in data.current.not_planned]
        out += [f"  to measure them as planned: {provenance.rerun_command()}", ""]
    if data.current is not None:
        from dpscale.report.chapters.answer import opening, verdict_text
        first = verdict_text(opening(data, data.current))
        out += [f"answer: {first}", ""] if first else []
    for m in data.machines:
        block = machine_lines(data, m) or ([f"{m.label}: {m.hardware}, {m.scale} scale: no speed-up yet (needs k=1 "
                                            "and a larger k)"] if m is data.current else [])
        out += block + ([""] if block else [])
    cur = data.current
    out += (failed_lines(cur) or [f"{cur.label}: every planned measurement left a number or was skipped"]) if cur \
        else []
    out += [f"data: {a}" for a in (cur.alerts if cur else [])]
    out += [f"flagged: {job_label(r['experiment'], r['variant'], r['k'])}: {r['oversubscribed']['why']}"
            for r in (cur.results.values() if cur else []) if r.get("status") == "ok" and r.get("oversubscribed")]
    out += lone_lines(cur) + skipped_lines(cur) if cur else []
    out += ["", f"report: {Path(html_path).resolve()}"]
    return "\n".join(out) + "\n"


def write(path, summary: str) -> None:
    write_atomic(path, summary)


# ---------------------------------------------------------------- the end of a Snakemake run

def _logs(snakemake_log) -> list[str]:
    """Snakemake's log file(s): onerror's `log` is one path or (Snakemake 9) a list."""
    if not snakemake_log:
        return []
    return [str(x) for x in snakemake_log] if isinstance(snakemake_log, (list, tuple)) else [str(snakemake_log)]


def failed_jobs(snakemake_log) -> list[tuple[str, list[str], str | None]]:
    """(rule, its log files, the block's message) of every job Snakemake reported as
    failed in its log (the message: an executor's reason, e.g. sbatch's error), each
    job once (the SLURM executor reports a failed job's error block twice: its jobid and
    log are the same)."""
    lines = []
    for path in _logs(snakemake_log):
        try:
            lines += Path(path).read_text(errors="replace").splitlines()
        except OSError:
            continue
    out, seen = [], set()
    for i, line in enumerate(lines):
        m = re.match(r"\s*Error in rule (\S+?):", line)
        if m:
            block = []   # the job's own lines: up to the next error block or a blank line
            for x in lines[i + 1:i + 40]:   # an executor's block holds its sbatch call and script
                if re.match(r"\s*Error in rule ", x) or not x.strip():
                    break
                block.append(x)
            logs = next((re.sub(r"\s*\(check log.*$", "", x.split("log:", 1)[1]).split(", ")
                         for x in block if x.strip().startswith("log:")), [])
            jobid = next((x.split(":", 1)[1].strip() for x in block if x.strip().startswith("jobid:")), None)
            message = next((x.split(":", 1)[1].strip() for x in block if x.strip().startswith("message:")), None)
            job = (m.group(1), [x.strip() for x in logs if x.strip()], message or None)
            if (key := (job[0], jobid, tuple(job[1]))) not in seen:
                seen.add(key)
                out.append(job)
    return out


def tail(path, n: int = 6) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return ["(no log file)"]


def run_started(snakemake_log) -> float | None:
    """When the run began (Unix time), from its log's name, which Snakemake stamps with
    its start (.snakemake/log/2026-12-07T204411.439967.snakemake.log); None if unnamed so."""
    import datetime as dt
    for path in _logs(snakemake_log):
        if m := re.match(r"(\d{4}-\d\d-\d\dT\d{6}\.\d+)\.snakemake\.log$", Path(path).name):
            return dt.datetime.strptime(m.group(1), "%Y-%m-%dT%H%M%S.%f").timestamp()   # local time, as named
    return None


def this_runs_tail(path, started: float | None) -> list[str]:
    """A failed job's log's last lines, unless the file is older than the run: a job that
    never started (sbatch refused it) leaves an earlier run's log at its path."""
    try:
        if started is not None and Path(path).stat().st_mtime < started:
            return ["(not this run's: the job never wrote its log, which is an earlier run's)"]
    except OSError:
        pass
    return tail(path)


def error_lines(snakemake_log) -> list[str]:
    """After a Snakemake error: each failed job's rule, log and the log's last lines."""
    jobs = failed_jobs(snakemake_log)
    started = run_started(snakemake_log)
    logs = ", ".join(_logs(snakemake_log))
    where = f" (its log: {logs})" if logs else ""
    if not jobs:   # stopped (Ctrl-C, SIGTERM, a lost node) rather than a job failing
        return [f"Snakemake stopped before the run finished; no job reported a failure{where}"]
    out = [f"Snakemake stopped: {len(jobs)} job(s) failed{where}"]
    for rule, logs, message in jobs:
        out.append(f"  rule {rule}: log {', '.join(logs) or 'none named in the error'}"
                   + (f"; {message}" if message else ""))
        out += [f"    | {x}" for path in logs for x in this_runs_tail(path, started)]
    return out


def _read_json(path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def result_lines(audits) -> list[str]:
    """What the planned results hold now: each missing or damaged one, then each failed
    or hung record, with what recovers it."""
    bad = [a for a in audits if not a.sound]
    out = []
    if bad:
        out.append(f"{len(bad)} planned result(s) hold no number now (a plain `{provenance.rerun_command()}` "
                   "measures them again):")
        out += [f"  {a.path}: " + ("missing: no result file (its job did not finish: stopped, failed before "
                                   "writing, or the disk is full)" if a.state == results.MISSING
                                   else f"{a.state}: {a.reason}") for a in bad]
    records = [json.loads(Path(a.path).read_text()) for a in audits if a.sound and a.status in ("failed", "hung")]
    if records:
        out.append(f"{len(records)} measurement(s) failed or hung; a plain rerun retries the failed ones "
                   "(a hung one is a result: --forcerun its rule to try again):")
        out += [f"  {job_label(r['experiment'], r['variant'], r['k'])} {r['status']}: {r.get('reason')}"
                + (f" (log {r['log']})" if r.get("log") else "") for r in records]
    return out


def replanned_lines(outcome) -> list[str]:
    """What the planner found at the run's start (dpscale.plan.replan.Replanner.outcome:
    (finding, measured again) pairs), said as it ended: "measured again" only for a result
    a job of this run wrote; one that no job rewrote is named with the command that does."""
    done = [f for f, measured in outcome if measured]
    left = [f for f, measured in outcome if not measured]
    out = []
    if done:
        out += [f"at this run's start {len(done)} planned result(s) held no number it could serve, so they were "
                "measured again:"] + [f"  {f.line()}" for f in done]
    if left:
        out += [f"at this run's start {len(left)} planned result(s) held no number it could serve, and this run "
                "did not measure them again (Snakemake was told to run less: --allowed-rules, --until, a target "
                "or a failure):"]
        out += [f"  {f.line()}; to measure it: {provenance.rerun_command(f.result)}" for f in left]
    return out


def closing(targets, summary_path, html_path, snakemake_log=None, failed: bool = False,
            replanned: list | None = None) -> str:
    """What a run prints last, from the planned results as they are now. The report's
    summary only while every one is sound and is the one the report read (its
    plan.json's `read` digests); else what each missing, damaged, failed or hung one
    needs, and where the report is, said to be built from other results. After a
    Snakemake error, the failed jobs first. replanned: what the planner found missing or
    damaged at the start of this run (dpscale.plan.replan), said first."""
    out = error_lines(snakemake_log) if failed else []
    out += replanned_lines(replanned or [])
    audits = [results.audit(t) for t in targets]
    read = _read_json(Path(summary_path).with_name("plan.json")).get("read")
    now = {f"{results.label_of(a.path)}.json": a.digest for a in audits}
    summary, html = Path(summary_path), Path(html_path)
    if summary.exists() and read is not None and all(a.sound for a in audits) \
            and all(read.get(key) == digest for key, digest in now.items()):
        return "\n".join(out + [summary.read_text().rstrip("\n")])
    out += result_lines(audits)
    out += [f"data: {line}" for line in refused_data(layout.working(Path(summary_path).parent.parent.parent))]
    if html.exists():
        out.append(f"report (built from other results than these, not rebuilt: none of its numbers is "
                   f"this run's answer): {html.resolve()}")
    else:
        out.append(f"no report built yet: {provenance.rerun_command()}")
    return "\n".join(out)


def announce(message: str, stream=None) -> None:
    """Print `message` when the process exits: Snakemake's onsuccess and onerror run
    before it logs its own last lines, and the answer should come after them."""
    def say():
        print(message, file=stream or sys.stderr, flush=True)
    atexit.register(say)
