rule download:
    output:
        raw=RAW,
        provenance=f"{DATA}/source.json",
    log:
        f"{layout.LOGS}/data/download.log",
    conda:
        "../envs/torch.yaml"
    params:
        scripts=SCRIPTS,
        source=config["data"]["source"],
        mirrors=config["data"]["mirrors"],
        local_dir=config["data"]["local_dir"] or "",
        # the folders holding the four files now (data.local_dir, Debian's package): installing
        # the package after a synthetic fallback reruns the data stage, and what follows it
        found=dsfetch.local_candidates(config["data"]["local_dir"]),
        retries=config["data"]["retries"],
        timeout_s=config["data"]["timeout_s"],
    shell:
        'python {params.scripts:q}/download.py --root "$(dirname {output.provenance:q})"'
        " --source {params.source:q} --mirrors {params.mirrors:q} --local-dir={params.local_dir:q}"
        " --retries {params.retries} --timeout-s {params.timeout_s} > {log:q} 2>&1"


rule resize:
    input:
        raw=RAW,
        provenance=f"{DATA}/source.json",
    output:
        cache=f"{DATA}/fmnist_{{size}}px.npz",
        meta=f"{DATA}/fmnist_{{size}}px.json",
    log:
        f"{layout.LOGS}/data/resize_{{size}}px.log",
    wildcard_constraints:
        size=r"\d+",
    conda:
        "../envs/torch.yaml"
    params:
        scripts=SCRIPTS,
    shell:
        'python {params.scripts:q}/resize.py --root "$(dirname {input.provenance:q})"'
        " --size {wildcards.size} --out {output.cache:q} --meta {output.meta:q} > {log:q} 2>&1"


# The model's training FLOPs per sample, counted once by torch.utils.flop_counter:
# the numerator of MFU for the JAX runs too (they do not import torch).
rule model_flops:
    output:
        FLOPS,
    log:
        f"{layout.LOGS}/model/flops_{{size}}px.log",
    wildcard_constraints:
        size=r"\d+",
    conda:
        "../envs/torch.yaml"
    params:
        scripts=SCRIPTS,
    shell:
        "python {params.scripts:q}/flops.py --size {wildcards.size} --out {output:q} > {log:q} 2>&1"
