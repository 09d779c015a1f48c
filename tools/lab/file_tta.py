"""File a run's time-to-accuracy measurement into a kept machine, beside the ones it
pools with (dpscale.report.tta_pool), and rebuild that machine's report (its earlier
measurement's logs go with it, under earlier/LABEL/logs/):

    python tools/lab/file_tta.py RUN_DIR reference/h200 LABEL

RUN_DIR is the working folder of a finished `snakemake --cores 1 report` (its results/
and logs/). The kept machine's current ddp_tta results move to earlier/LABEL/ (LABEL:
the commit that measured them), the run's go to runs/ddp_tta/ with their paths made
relative to the run folder and sealed again (cli._copy, as `dpscale keep` does), their
logs beside; every other experiment of the machine stays as it was. `dpscale keep
--force` would replace the whole machine with what this one run measured (on one GPU,
time to accuracy and k=1 only), so it is not used for this.
"""
import sys
from pathlib import Path

from dpscale import cli, layout
from dpscale.report import tta_pool

EXPERIMENT = tta_pool.registry.ANSWER.experiment


def main(run_dir: Path, machine: Path, label: str) -> None:
    run, kept = layout.working(run_dir), layout.kept(machine)
    new = sorted((run.runs / EXPERIMENT).glob("*/k*.json"))
    if not new:
        sys.exit(f"file_tta: no {EXPERIMENT} result under {run.runs}")
    if (kept.earlier / label).exists():
        sys.exit(f"file_tta: {kept.earlier / label} exists; choose another LABEL")
    moved = tta_pool.file_earlier(kept.root, label, EXPERIMENT)
    print(f"filed {len(moved)} earlier result(s) under {kept.earlier / label}")
    for f in new:
        cli._copy(f, kept.runs / f.relative_to(run.runs), run_dir)
    if (kept.logs / EXPERIMENT).is_dir():   # the earlier measurement's logs go with it
        (kept.earlier / label / layout.LOGS_DIR).mkdir(parents=True, exist_ok=True)
        (kept.logs / EXPERIMENT).rename(kept.earlier / label / layout.LOGS_DIR / EXPERIMENT)
    if (run.logs / EXPERIMENT).is_dir():
        cli._copy(run.logs / EXPERIMENT, kept.logs / EXPERIMENT, run_dir)
    print(f"filed {len(new)} new result(s) under {kept.runs / EXPERIMENT}; rebuilding {kept.report}")
    cli._report_of_kept(kept.root, kept.root.name, kept.root.parent)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
