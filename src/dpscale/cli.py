"""`dpscale`: the commands around the workflow.

    dpscale keep NAME         keep this machine's results as reference/NAME/, to compare later
    dpscale experiments       list the experiments the registry declares
    dpscale forecast [DIR ...]  the scaling forecast (to 16 nodes, with band and knee) and its
                              validation against every measured k, from kept results
    dpscale compare A B       machine B against machine A (kept folders), ratios with intervals
    dpscale export [DIR ...]  the tidy results table (results.csv) of kept machines
    dpscale answer DIR        a kept machine's answer: its verdict per k, its table against k=1
    dpscale docs [--check]    regenerate (or check) the number blocks of README.md and docs/
    dpscale convergence FILE ...  the E(B) model checked out of sample on published
                              convergence tables (MLPerf RCP JSON, or CSV)

`keep` copies what a later report needs to set this machine beside another (the
layout: dpscale.layout): the results, the fingerprint, the model's FLOPs, the data's
provenance (source.json, the caches' metadata), a per-layer profile where one was made,
the plan the last report was built against, the job, rank and Snakemake logs, and a
report rebuilt with this machine named NAME. A copied record names its paths relative
to its run folder (an older one that named them absolute is rewritten so). The copy is
made beside the target and renamed into place, so an interrupted keep leaves no half
reference. The next `snakemake report` draws reference/NAME/ beside this run, one
colour per machine.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

from dpscale import layout, registry
from dpscale import results as contract
from dpscale.results import portable
from dpscale.report import book as bookmod, convergence as convergence_cmd

NAME_OK = "letters, digits, '-', '_' and '.'"
RESERVED_NAMES = {"book"}   # the published machine's label beside every kept one (report.book)
ROOT = Path(__file__).resolve().parents[2]
COMPARE_HELP = """Machine B against machine A, like for like: for every (experiment, variant, k) that
both kept folders (<dir>/runs/<experiment>/<variant>/k<k>.json, as `dpscale keep` writes
them) hold with status ok, one row per metric both carry (samples_per_s; the all-reduce's
busbw_GBps_64MiB and avg_busbw_GBps): A, B, and B/A with its 95% interval computed on
the ratio (Fieller's; the two machines' samples are independent) and what the interval
covers: independent launches (samples_per_s_launches) or the timed epochs within one
launch (samples_per_s_repeats). A result with one number (no repeats) gives B/A with no
interval, and its note says so; so does one measurement found in both folders (a run and
its kept copy). A note also names what differs: protocol keys, the tuned step's choices,
the data's source (real or the synthetic stand-in).

example: dpscale compare reference/h200 reference/h200x2"""


def _copy(src: Path, dest: Path, run_dir: Path) -> None:
    """A file or folder, each JSON record in it with its paths relative to run_dir (the
    run's working folder); one that already names them so is copied byte for byte."""
    def one(s, d):
        if str(s).endswith(".json"):
            try:
                obj = json.loads(Path(s).read_text())
            except (OSError, ValueError):
                obj = None
            if obj is not None and (rel := portable(obj, run_dir)) != obj:
                if isinstance(obj, dict) and "digest" in obj:
                    if contract.audit(s).state != contract.SOUND:
                        return shutil.copy2(s, d)     # keep refuses it; never seal a damaged one
                    # the rewrite changes paths only: seal it again, or every kept result reads "altered"
                    contract.write_json_atomic(d, contract.seal({x: v for x, v in rel.items() if x != "digest"}))
                else:
                    Path(d).write_text(json.dumps(rel, indent=2) + "\n")
                shutil.copystat(s, d)
                return d
        return shutil.copy2(s, d)
    if src.is_dir():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.tmp", "*.ranks"), copy_function=one)
    elif src.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        one(src, dest)


def name_left_out(command: str, machines) -> None:
    """Every result a command could not read as measured (missing, unreadable, altered,
    unsealed) and every other problem of a machine's folder, one line each on stderr:
    a command leaves such a result out, and says so."""
    lines = [f"  {m.label}: {e}" for m in machines for e in getattr(m, "errors", [])]
    if lines:
        print(f"dpscale {command}: {len(lines)} problem(s) in the folders read; what cannot be read "
              "as measured is left out:", *lines, sep="\n", file=sys.stderr)


def unsound_kept(run) -> list[str]:
    """Why the results a report was built from cannot be kept as they are: one line per
    planned result that is not sound now or differs from what the report read (run: the
    working folder, dpscale.layout.working)."""
    from dpscale.results import audit
    plan = json.loads(run.plan.read_text())
    read = plan.get("read") or {}
    out = []
    for t in plan.get("targets", []):
        a = audit(run.runs / t)
        if a.state == "missing" and t not in read:
            continue   # planned, never written (the report shows it "not run")
        if not a.sound:
            out.append(a.line())
        elif t in read and read[t] != a.digest:
            out.append(f"{a.path}: changed since the report was built (not the result the report read)")
    return out


def machine_name(name: str) -> str:
    """A kept machine's name (argparse type): a folder the report reads (not hidden), not
    the book's label, in plain ASCII so every tool and URL takes it."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise argparse.ArgumentTypeError(f"{name!r}: use {NAME_OK}, starting with a letter or digit")
    if name.lower() in RESERVED_NAMES:
        raise argparse.ArgumentTypeError(f"{name!r} is the book's label in every report; choose another NAME")
    return name


def _finish_interrupted_keep(to: Path, name: str) -> None:
    """A keep killed between setting the old machine aside and finishing (SIGKILL, a power
    cut) left it as .NAME.replaced: it is put back, and the half-kept one goes."""
    aside = to / f".{name}.replaced"
    if aside.is_dir():
        shutil.rmtree(to / name, ignore_errors=True)
        aside.rename(to / name)
        print(f"dpscale keep: an interrupted keep of {name} had set {to / name} aside; put it back",
              file=sys.stderr)


def keep(name: str, workdir: Path, to: Path, force: bool = False) -> Path:
    run, kept = layout.working(workdir), layout.kept(to / name)
    for needed in (run.runs, run.fingerprint, run.plan):
        if not needed.exists():
            raise SystemExit(f"dpscale keep: {needed} is missing; run `snakemake --cores 1 report` in {workdir} first")
    if bad := unsound_kept(run):
        raise SystemExit("\n".join([f"dpscale keep: {len(bad)} result(s) are not the ones the report was built "
                                     "from; nothing kept. Run `snakemake --cores 1 report` first (it measures "
                                     "them again), then keep:"] + [f"  {b}" for b in bad]))
    target = kept.root
    _finish_interrupted_keep(to, name)
    if target.exists() and not force:
        raise SystemExit(f"dpscale keep: {target} exists; choose another NAME or pass --force to replace it")
    if target.exists() and not layout.is_kept(target):
        raise SystemExit(f"dpscale keep: {target} is not a kept machine (no runs/, no fingerprint.json); "
                         "--force replaces only a kept machine: choose another NAME")
    try:
        to.mkdir(parents=True, exist_ok=True)
        tmp = layout.kept(tempfile.mkdtemp(prefix=f".{name}.", dir=to))
    except OSError as e:
        raise SystemExit(f"dpscale keep: cannot write in {to}: {e.strerror}; pass --to a folder you can write")
    # SIGTERM (kill, a scheduler's time limit) unwinds as Ctrl-C does: the old machine is
    # put back and the copy removed, never a half reference
    stop = signal.signal(signal.SIGTERM, _raise_terminated) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        for attr in ("runs", "fingerprint", "model", "roofline", "plan", "logs"):
            _copy(getattr(run, attr), getattr(tmp, attr), workdir)
        for meta in sorted(run.data.glob("*.json")):   # where the data came from, which check passed
            _copy(meta, tmp.data / meta.name, workdir)
        for log in sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log")):
            _copy(log, tmp.logs / "snakemake" / log.name, workdir)
        if kept.earlier.is_dir():   # the machine's earlier measurements stay with it (report.tta_pool)
            shutil.copytree(kept.earlier, tmp.earlier)
        # The report is built where it will live: the paths it names are the kept ones.
        # The machine it replaces waits aside until the build succeeds, then goes.
        old = target.rename(to / f".{name}.replaced") if target.exists() else None
        tmp.root.rename(target)
        try:
            _report_of_kept(target, name, to)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            if old is not None:
                old.rename(target)
            raise
        if old is not None:   # renamed first: a .replaced folder always means "not finished"
            gone = old.rename(Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".gone", dir=to)))
            shutil.rmtree(gone, ignore_errors=True)
    finally:
        shutil.rmtree(tmp.root, ignore_errors=True)
        if stop is not None:
            signal.signal(signal.SIGTERM, stop)
    return target


def _raise_terminated(signum, frame):
    raise SystemExit(128 + signum)


def _report_of_kept(folder: Path, name: str, to: Path) -> None:
    from dpscale.report import build   # matplotlib: only now
    kept = layout.kept(folder)
    plan_info = json.loads(kept.plan.read_text())
    build(kept.runs, kept.fingerprint, kept.report, name=name, references=[to],
          targets=[str(kept.runs / t) for t in plan_info["targets"]], plan_info=plan_info,
          book_path=bookmod.PATH)


def add_forecast_parser(sub) -> None:
    f = sub.add_parser("forecast", help="print the scaling forecast and its validation from kept results")
    f.add_argument("dirs", nargs="*", type=Path, help="machine folders, each with runs/ and fingerprint.json "
                   "(reference/NAME, or results/ of a run); default: every folder under reference/")
    f.add_argument("--book", type=Path, default=bookmod.PATH,
                   help=f"the book's numbers, one more machine (default: {bookmod.SOURCE})")
    f.add_argument("--no-book", action="store_true", help="leave the book out")
    f.add_argument("--json", type=Path, default=None, help="also write the forecast JSON here")
    f.add_argument("--fabric", type=Path, action="append", default=None, metavar="FILE",
                   help="a measured all-reduce, used for the tier it covers over the machine's own: nccl-tests' "
                        "all_reduce_perf output (the printed table or -J JSON) or an all-reduce result JSON; one host "
                        "gives the in-node ring, several hosts the tier between nodes and the nodes' size; repeat for "
                        "both (default: schemas/config.schema.yaml forecast.fabric_files, only for tiers a machine "
                        "did not measure)")
    f.add_argument("--fabric-check", type=Path, default=None, metavar="DIR",
                   help="instead of a forecast, check the fabric model on public nccl-tests outputs of one cluster at "
                        "several scales (DIR/scales.yaml; reference/fabrics/nccl-tests; docs/fabric-check.md)")
    f.add_argument("--write-prior", action="store_true",
                   help="regenerate the band's declared prior, reference/forecast-prior.json, from the committed "
                        "machines (their out-of-sample errors, each with its hardware class), and stop")
    f.add_argument("--markdown", choices=("summary", "validation", "fabric"), default=None,
                   help="instead of the text, print a page's block (`dpscale docs` fills README.md and "
                        "docs/forecast.md with them): summary, the per-machine table and the fabric check's figures "
                        "(of --fabric-check DIR, default reference/fabrics/nccl-tests); validation, every row; "
                        "fabric, docs/fabric-check.md's cases, every payload of each")
    for key, kind, what in (("gpus_per_node", int, "devices per node"), ("max_nodes", int, "most nodes"),
                            ("knee_efficiency", float, "efficiency threshold of the knee, a fraction"),
                            ("bootstrap_draws", int, "bootstrap draws of the band")):
        f.add_argument(f"--{key.replace('_', '-')}", dest=key, type=functools.partial(_forecast_value, key, kind),
                       default=None, help=f"{what} (default: schemas/config.schema.yaml forecast.{key})")


def _forecast_value(key: str, kind, text: str):
    """An option's value, held to the schema's bounds for forecast.<key> (one source with
    the configuration: --max-nodes 0 ran a forecast of no node, --knee-efficiency 80 one of
    8000%)."""
    import jsonschema
    from dpscale.plan.config import schema
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'a whole number' if kind is int else 'a number'}")
    prop = schema()["properties"]["forecast"]["properties"][key]
    for e in jsonschema.Draft202012Validator(prop).iter_errors(value):
        raise argparse.ArgumentTypeError(f"{text}: {e.message} (forecast.{key} in schemas/config.schema.yaml, "
                                         f"default {prop['default']})")
    return value


def forecast(a) -> int:
    from dpscale.analysis.forecast.fabric_file import FabricFileError
    from dpscale.report import forecast as fcr, forecast_text as fct
    from dpscale.report.machines import load_reference, reference_folders
    if a.write_prior:
        rec = fcr.write_prior()
        print(f"wrote {fcr.PRIOR}: {len(rec['rows'])} rows; classes "
              + "; ".join(f"{c}: {', '.join(ms) or 'none'}" for c, ms in rec["classes"].items()))
        return 0
    if a.markdown == "fabric":
        print(fct.fabric_markdown(a.fabric_check or ROOT / "reference" / "fabrics" / "nccl-tests"), end="")
        return 0
    if a.fabric_check and not (a.fabric_check / "scales.yaml").is_file():
        raise SystemExit(f"dpscale forecast: --fabric-check {a.fabric_check} holds no scales.yaml; name a folder "
                         "of one cluster's nccl-tests outputs and its scales.yaml (docs/fabric-check.md), e.g. "
                         "reference/fabrics/nccl-tests")
    if not a.no_book and not a.book.is_file():
        raise SystemExit(f"dpscale forecast: --book {a.book}: no such file; name the book's numbers "
                         f"(default {bookmod.SOURCE}) or pass --no-book")
    if a.fabric_check and not a.markdown:
        print(_writing("forecast", a.json, lambda: fct.fabric_check_text(a.fabric_check, json_path=a.json)))
        return 0
    # one machine named twice (reference/x and reference/x/) would count its rows twice
    named: dict[Path, Path] = {}
    for d in a.dirs:
        named.setdefault(Path(d).resolve(), Path(d))
    dirs = list(named.values()) or reference_folders([default_reference("forecast")])
    bad = [d for d in dirs if not layout.kept(d).has_results()]
    if bad:
        raise SystemExit(f"dpscale forecast: {bad[0]} has no runs/ folder; pass a folder kept by `dpscale keep` "
                         "(reference/NAME) or a run's results/")
    machines = [load_reference(Path(d)) for d in dirs]
    name_left_out("forecast", machines)
    book = None if a.no_book else bookmod.load(a.book)
    machines += [book] if book else []
    cfg = fcr.settings(None, **{k: getattr(a, k) for k in ("gpus_per_node", "max_nodes", "knee_efficiency",
                                                          "bootstrap_draws")})
    try:
        given = (fcr.given_fabric([str(p.resolve()) for p in a.fabric], per_node=a.gpus_per_node) if a.fabric
                 else fcr.default_fabric(cfg))
    except (FabricFileError, ValueError) as e:
        raise SystemExit(f"dpscale forecast: {e}") from None
    forecasts = fcr.of_machines(machines, cfg, given)
    if a.markdown == "summary":
        print(fct.summary_markdown(forecasts, a.fabric_check or ROOT / "reference" / "fabrics" / "nccl-tests"), end="")
        return 0
    if a.markdown == "validation":
        print(fct.validation_markdown(forecasts), end="")
        return 0
    print(fct.text(forecasts))
    print(fct.tta_text(machines, forecasts))
    if a.json:
        _writing("forecast", a.json, lambda: fcr.write(a.json, forecasts))
        print(f"\nwrote {a.json}")
    return 0


EXPORT_HELP = """\
Write the tidy results table of kept machines: one row per (machine, experiment,
variant, k, metric) with unit, value, ci_lo, ci_hi (numbers; empty where none), n,
what the interval covers, status, data source and commit (dpscale.report.tidy; the
report writes the same table as results/report/results.csv).

  dpscale export                                  every machine under ./reference
  dpscale export reference/h200 reference/h200x2 --to h200s.csv
  dpscale export --to - | head                    to standard output

Read it with pandas.read_csv: value, ci_lo and ci_hi come back as float64."""


def default_reference(command: str) -> Path:
    """Where `forecast` and `export` read kept machines without a folder named: ./reference
    (a run's working folder, where `dpscale keep` puts them), else this repository's
    reference/ (outside a project folder), said on stderr: both commands answer alike."""
    here = Path("reference")
    if here.is_dir():
        return here
    print(f"dpscale {command}: no ./reference here; reading the repository's {ROOT / 'reference'}", file=sys.stderr)
    return ROOT / "reference"


def export(dirs: list[Path], to: str) -> int:
    """The tidy table of the machines kept in `dirs` (reference/<name>/ folders, or
    folders of them) to the file `to` ('-': standard output). Returns the row count."""
    from dpscale.report import machines, tidy   # pandas: only here
    folders = []
    for d in dirs:
        if not d.is_dir():
            raise SystemExit(f"dpscale export: {d} is not a folder; name a kept machine (reference/NAME) "
                             "or a folder of them (reference)")
        found = [d] if layout.kept(d).has_results() else machines.reference_folders([d])
        if not found:
            raise SystemExit(f"dpscale export: {d} holds no kept machine (no runs/ in it or in its "
                             "sub-folders); keep one with `dpscale keep NAME`")
        folders += found
    from dpscale.report.chapters.tta import tidy_rows
    kept = [machines.load_reference(f) for f in dict.fromkeys(folders)]
    name_left_out("export", kept)
    # the report's numbers computed from several results (time to accuracy's speed-ups,
    # statistical efficiency, the forecast): the same table as results/report/results.csv
    derived = tidy_rows(machines.ReportData(machines=kept))
    df = tidy.table(kept, derived)
    if to == "-":
        sys.stdout.write(df.to_csv(index=False))
    else:
        _writing("export", to, lambda: tidy.write(kept, to, derived))
    return len(df)


def _writing(command: str, path, write):
    """write(), with a path the user named that cannot be written said in one line (a
    folder, a read-only disk, a missing parent), not a traceback."""
    try:
        return write()
    except OSError as e:
        if path is None or e.filename is None:
            raise
        parents = [p for p in Path(path).parents if p.exists()][:1]
        why = f"{parents[0]} is not a folder" if parents and not parents[0].is_dir() else e.strerror
        raise SystemExit(f"dpscale {command}: cannot write {path}: {why}; name a file in a folder you "
                         "can write") from None


def answer(folder: Path) -> int:
    """A kept machine's answer as the closing lines give it (its verdict per k, then its
    table against k=1, the forecast's knee and its predicted soonest k), in a fenced block:
    what the README shows, generated (dpscale.docblocks)."""
    from dpscale import report   # matplotlib-free, but pandas and scipy: only here
    from dpscale.report import summary
    from dpscale.report.chapters.answer import opening, verdict_text
    if not layout.kept(folder).has_results():
        raise SystemExit(f"dpscale answer: {folder} has no runs/ folder; name a kept machine (reference/NAME)")
    k = layout.kept(folder)
    data = report.load(k.runs, k.fingerprint, references=[], book_path=None, name=folder.name)
    o = opening(data, data.current)
    lines = [verdict_text(o) or f"{folder.name}: no time to accuracy at k >= 2"] + summary.machine_lines(data, data.current)
    print("```\n" + "\n".join(lines) + "\n```")
    return 0


def docs(check: bool) -> int:
    """Regenerate (or, with check, compare) every number block of README.md and docs/."""
    from dpscale import docblocks
    stale = docblocks.regenerate(ROOT, main, write=not check)
    if check and stale:
        print("\n".join(["dpscale docs --check: these blocks differ from what their command prints now; run "
                          "`dpscale docs` and commit:"] + [f"  {s}" for s in stale]))
        return 1
    print(f"dpscale docs: {len(stale)} block(s) " + ("differ" if check else "rewritten") if stale else
          "dpscale docs: every block is what its command prints")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dpscale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    k = sub.add_parser("keep", help="keep this machine's results as reference/NAME/")
    k.add_argument("name", type=machine_name, help=f"the machine's name in reports, e.g. h200x2 ({NAME_OK})")
    k.add_argument("--workdir", type=Path, default=Path("."), help="the workflow's working folder (default: .)")
    k.add_argument("--to", type=Path, default=None, help="the reference folder (default: <workdir>/reference)")
    k.add_argument("--force", action="store_true", help="replace an existing kept machine reference/NAME/")
    e = sub.add_parser("experiments", help="list the experiments (src/dpscale/registry.py)")
    e.add_argument("--digest", action="store_true",
                   help="also print each experiment's digest: the modules whose change reruns it")
    add_forecast_parser(sub)
    convergence_cmd.add_parser(sub)
    c = sub.add_parser("compare", help="print B/A for every point both kept machines measured, with 95%% intervals",
                       description=COMPARE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("a", type=Path, help="machine A, the denominator: a kept folder, e.g. reference/h200")
    c.add_argument("b", type=Path, help="machine B, the numerator: a kept folder, e.g. reference/h200x2")
    x = sub.add_parser("export", help="write the tidy results table (CSV) of kept machines",
                       description=EXPORT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    x.add_argument("dirs", nargs="*", type=Path, metavar="DIR",
                   help="a kept machine (reference/NAME) or a folder of them (default: ./reference)")
    x.add_argument("--to", default="results.csv",
                   help="the CSV file to write, '-' for standard output (default: %(default)s)")
    w = sub.add_parser("answer", help="a kept machine's answer: its verdict per k and its table against k=1")
    w.add_argument("folder", type=Path, help="a kept machine, e.g. reference/h200")
    d = sub.add_parser("docs", help="regenerate the number blocks of README.md and docs/ (between BEGIN/END markers)")
    d.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each block that differs")
    return ap


def experiments(digest: bool) -> None:
    """One line per experiment; with digest, the modules of its code digest under it
    (dpscale.provenance: what its worker imports; a change to one reruns it)."""
    from dpscale import provenance
    print("(variants marked + are `extended`: planned where the config's `extended` is on)")
    for e in registry.EXPERIMENTS.values():
        variants = "|".join(v.name + "+" * v.extended for v in e.variants)
        print(f"{e.name:<20} {e.family:<6} {registry.KS_TEXT[e.ks]:<26} {variants:<26} {e.title}")
        if digest:
            print(f"    digest {provenance.source_digest(e.sources)}, {len(e.sources)} modules: "
                  + " ".join(m.removeprefix("dpscale.") for m in e.sources))


def main(argv: list[str] | None = None) -> int:
    try:
        rc = _main(argv)
        sys.stdout.flush()   # inside the try: a short output is still buffered here
        return rc
    except BrokenPipeError:
        # `dpscale experiments --digest | head -3`: the reader left. Python's recipe (the
        # signal module's notes): stdout to /dev/null so the exit's flush cannot raise
        # again, and the status a shell gives a process SIGPIPE ended, not a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: list[str] | None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    if a.command == "forecast":
        return forecast(a)
    if a.command == "convergence":
        return convergence_cmd.run(a)
    if a.command == "compare":
        from dpscale.report import compare   # pandas and scipy: only now
        print(compare.compare(a.a, a.b))
        return 0
    if a.command == "export":
        rows = export(a.dirs or [default_reference("export")], a.to)
        if a.to != "-":
            print(f"wrote {rows} rows to {a.to}")
        return 0
    if a.command == "experiments":
        experiments(a.digest)
        return 0
    if a.command == "answer":
        return answer(a.folder)
    if a.command == "docs":
        return docs(a.check)
    to = a.to or a.workdir / "reference"
    target = keep(a.name, a.workdir, to, a.force)
    if to.resolve() == (a.workdir / "reference").resolve():
        print(f"kept this machine's results as {target}; the next `snakemake report` shows it beside this run")
    else:   # the report reads <working folder>/reference/ only
        print(f"kept this machine's results as {target}; a report shows it once it is under the "
              "working folder's reference/ (`dpscale forecast` and `compare` read it where it is)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
