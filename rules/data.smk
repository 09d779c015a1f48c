rule download:
    output:
        raw=RAW,
        provenance=f"{DATA}/source.json",
    log:
        "logs/data/download.log",
    params:
        source=config["data"]["source"],
        mirrors=config["data"]["mirrors"],
        local_dir=config["data"]["local_dir"] or "",
        retries=config["data"]["retries"],
        timeout_s=config["data"]["timeout_s"],
    shell:
        "python {SCRIPTS}/download.py --root {DATA} --source {params.source}"
        " --mirrors {params.mirrors:q} --local-dir={params.local_dir:q}"
        " --retries {params.retries} --timeout-s {params.timeout_s} > {log} 2>&1"


rule resize:
    input:
        raw=RAW,
        provenance=f"{DATA}/source.json",
    output:
        cache=f"{DATA}/fmnist_{{size}}px.npz",
        meta=f"{DATA}/fmnist_{{size}}px.json",
    log:
        "logs/data/resize_{size}px.log",
    wildcard_constraints:
        size=r"\d+",
    shell:
        "python {SCRIPTS}/resize.py --root {DATA} --size {wildcards.size}"
        " --out {output.cache} --meta {output.meta} > {log} 2>&1"
