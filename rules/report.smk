# Every result JSON -> figures (PNG + SVG), tables (CSV), report.html (self-contained)
# and report.md. Figures and tables are declared one by one, wrapped in report(), so
# `snakemake --report report.html` (Snakemake's own report) shows them with captions
# from report/<name>.rst. Reference machines (reference/<name>/fingerprint.json and
# reference/<name>/runs/...) and the book's numbers (reference/book_4090.yaml) are
# inputs too: committing a new machine's results rebuilds the report, nothing else.
import os
from pathlib import Path

from dpscale.report import FIGURES, TABLES

REPORT = "results/report"
REFERENCES = "reference"
BOOK = f"{REFERENCES}/book_4090.yaml"
REFERENCE_FILES = sorted(
    str(p)
    for pattern in ("*/fingerprint.json", "*/runs/*/*/k*.json")
    for p in Path(REFERENCES).glob(pattern)
)
# Categories in the order the report tells the story: "1. Overview", "2. DDP scaling", ...
_CATEGORY_ORDER = list(dict.fromkeys(cat for cat, _ in FIGURES.values()))
FIGURE_CATEGORY = {
    name: f"{_CATEGORY_ORDER.index(cat) + 1}. {cat}"
    for name, (cat, _) in FIGURES.items()
}


report: "../report/workflow.rst"


rule report:
    input:
        runs=TARGETS,
        fingerprint="results/fingerprint.json",
        cache_meta=CACHE_META,
        book=BOOK,
        references=REFERENCE_FILES,
    output:
        html=report(
            f"{REPORT}/report.html",
            caption="../report/report.rst",
            category="0. Report",
        ),
        md=f"{REPORT}/report.md",
        figures=[
            report(
                f"{REPORT}/figures/{name}.png",
                caption=f"../report/{name}.rst",
                category=FIGURE_CATEGORY[name],
                labels={"figure": name},
            )
            for name in FIGURES
        ],
        svg=[f"{REPORT}/figures/{name}.svg" for name in FIGURES],
        tables=[
            report(
                f"{REPORT}/tables/{name}.csv",
                caption="../report/tables.rst",
                category=f"{len(_CATEGORY_ORDER) + 1}. Tables",
                labels={"table": name},
            )
            for name in TABLES
        ],
    log:
        "logs/report.log",
    conda:
        "../envs/report.yaml"
    params:
        scripts=SCRIPTS,
        # folders derived from the files rather than typed twice (snakemake --lint)
        references=lambda w, input: os.path.dirname(input.book),
        out_dir=lambda w, output: os.path.dirname(output.html),
    shell:
        "python {params.scripts}/report.py --runs results/runs --fingerprint {input.fingerprint}"
        " --references {params.references} --book {input.book} --out-dir {params.out_dir}"
        " > {log} 2>&1"
