# Every planned result -> the report (src/dpscale/report): report.html (self-contained,
# opens from disk), report.md, figures (PNG + SVG), tables (CSV), results.csv (the
# tidy table: one row per machine, result and metric) and plan.json. The
# chapters declare their figures and tables (dpscale.report.chapters: light, nothing is
# drawn at parse time); each output is wrapped in report() so that `snakemake --report`
# shows it too, captioned by the same prose the HTML report uses. Reference machines
# (reference/<name>/ in the workflow's folder and in the working folder) and the book's
# numbers are inputs: keeping a machine (`dpscale keep NAME`) rebuilds the report.
from dpscale.report import book as dsbook
from dpscale.report.chapters import CHAPTERS, csv_tables

REPORT = layout.REPORT
PROSE = "../src/dpscale/report/prose"  # report() captions: relative to this file
BOOK = f"{workflow.basedir}/{dsbook.SOURCE}"
REFERENCE_DIRS = list(
    dict.fromkeys(
        str(Path(d).resolve())
        for d in (f"{workflow.basedir}/reference", "reference")
        if Path(d).is_dir()
    )
)
REFERENCE_FILES = sorted(
    str(p)
    for d in REFERENCE_DIRS
    for pattern in (
        f"*/{layout.FINGERPRINT}",
        f"*/{layout.PLAN}",
        f"*/{layout.RUNS_DIR}/{layout.RESULT_GLOB}",
    )
    for p in Path(d).glob(pattern)
)


report: f"{PROSE}/snakemake_workflow.rst"


# The machine the results were measured on, written by a rule rather than when the
# workflow is parsed: a dry run writes nothing, and a new machine's fingerprint lands
# only with the run that measures on it. Its input is a stamp named after the machine,
# and the report's key holds the machine too: a new machine reruns both, also without
# Snakemake's metadata (dpscale.plan.replan).
rule fingerprint:
    input:
        layout.machine_stamp(dsfp.digest(FP)),
    output:
        layout.FINGERPRINT_PATH,
    log:
        f"{layout.LOGS}/fingerprint.log",
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        scripts=SCRIPTS,
        fingerprint=dsfp.dumps(FP),
    shell:
        "python {params.scripts:q}/fingerprint.py --json {params.fingerprint:q} --out {output:q} > {log:q} 2>&1"


rule machine_stamp:
    output:
        layout.machine_stamp("{digest}"),
    log:
        f"{layout.LOGS}/machine-{{digest}}.log",
    wildcard_constraints:
        digest=r"[0-9a-f]+",
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "touch {output:q} > {log:q} 2>&1"


rule report:
    input:
        runs=TARGETS,
        fingerprint=layout.FINGERPRINT_PATH,
        cache_meta=INPUT_FILES["meta"],
        book=BOOK,
        references=REFERENCE_FILES,
        # every result's attempt stamp (dpscale.plan.replan): with the key below, how a
        # result found missing, damaged, failed or stale is measured again without metadata
        stamps=lambda w: report_stamps(workflow.dag_settings.allowed_rules),
    output:
        key=layout.report_key_path(
            REPLAN.report_key(
                specs.dumps(RESOLVED), provenance.report_digest(), dsfp.dumps(FP)
            )
        ),
        html=report(
            f"{REPORT}/report.html",
            caption=f"{PROSE}/snakemake_report.rst",
            category="0. Report",
        ),
        md=f"{REPORT}/report.md",
        # the tidy table: one row per machine, result and metric (dpscale.report.tidy)
        results=f"{REPORT}/results.csv",
        plan=f"{REPORT}/{layout.PLAN}",
        # every machine's forecast, band and validation (dpscale.report.forecast)
        forecast=f"{REPORT}/forecast.json",
        # the answer in plain text, printed last by onsuccess (dpscale.report.summary)
        summary=f"{REPORT}/summary.txt",
        figures=[
            report(
                f"{REPORT}/figures/{spec.name}.png",
                caption=f"{PROSE}/figures/{spec.name}.rst",
                category=f"{i}. {chapter.title}",
                labels={"figure": spec.name},
            )
            for i, chapter in enumerate(CHAPTERS, 1)
            for spec in chapter.figures
        ],
        svg=[
            f"{REPORT}/figures/{spec.name}.svg"
            for chapter in CHAPTERS
            for spec in chapter.figures
        ],
        tables=[
            report(
                f"{REPORT}/tables/{key}.csv",
                caption=f"{PROSE}/snakemake_tables.rst",
                category=f"{len(CHAPTERS) + 1}. Tables",
                labels={"table": key},
            )
            for key in csv_tables()
        ],
    log:
        f"{layout.LOGS}/report.log",
    conda:
        "../envs/report.yaml"
    # the figures are drawn in parallel (drawing them is most of the report's time in one
    # process: docs/measurements/readme-run_h200_2026-12-03.md); Snakemake scales 8 down
    # to --cores (1: one process), and a cluster gives the job 8 CPUs (workflow.cores is
    # not defined there)
    threads: 8
    params:
        scripts=SCRIPTS,
        references=REFERENCE_DIRS,
        # the resolved configuration: the report states its hash, plan.json keeps it
        resolved=specs.dumps(RESOLVED),
        # what draws the report: a change to it rebuilds the report (no measurement)
        code=provenance.report_digest(),
        out_dir=lambda w, output: os.path.dirname(output.html),
    shell:
        "python {params.scripts:q}/report.py"
        f" --runs {layout.RUNS}"
        " --fingerprint {input.fingerprint:q}"
        " --targets {input.runs:q} --references {params.references:q} --book {input.book:q}"
        " --resolved {params.resolved:q} --out-dir {params.out_dir:q} --key {output.key:q}"
        " --workers {threads} > {log:q} 2>&1"
