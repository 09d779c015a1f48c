# Every result JSON -> figures, tables and a self-contained report.html.


rule report:
    input:
        runs=TARGETS,
        fingerprint="results/fingerprint.json",
        cache_meta=CACHE_META,
    output:
        html="results/report/report.html",
        md="results/report/report.md",
    log:
        "logs/report.log",
    params:
        references="reference",
    shell:
        "python {SCRIPTS}/report.py --runs results/runs --fingerprint {input.fingerprint}"
        " --references {params.references} --out-dir results/report > {log} 2>&1"
