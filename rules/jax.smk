# JAX data parallelism: one process sees k devices (GPUs, or k host devices on a
# CPU-only machine); weak scaling, the HLO all-reduce census, the equality check.
JAXRUN = (
    "python {params.scripts}/watchdog.py --spec {params.spec:q} --result {output.json}"
    " --rank-logs {log}.ranks --"
    " python {params.scripts}/jax_worker.py --spec {params.spec:q} --result {output.json}"
    " > {log} 2>&1"
)


rule jax_weak:
    input:
        cache=CACHE,
        meta=CACHE_META,
        flops=FLOPS.format(size=SIZE),
    output:
        json="results/runs/jax_weak/{variant}/k{k}.json",
    log:
        "logs/jax_weak/{variant}/k{k}.log",
    wildcard_constraints:
        variant="host|device|tuned",
        k=r"\d+",
    conda:
        "../envs/jax.yaml"
    resources:
        **MEASURE,
    params:
        scripts=SCRIPTS,
        spec=spec_of("jax_weak"),
    shell:
        JAXRUN


rule jax_hlo:
    input:
        cache=CACHE,
        meta=CACHE_META,
    output:
        json="results/runs/jax_hlo/default/k{k}.json",
    log:
        "logs/jax_hlo/k{k}.log",
    wildcard_constraints:
        k=r"\d+",
    conda:
        "../envs/jax.yaml"
    resources:
        **MEASURE,
    params:
        scripts=SCRIPTS,
        spec=spec_of("jax_hlo"),
    shell:
        JAXRUN


rule jax_equality:
    input:
        cache=CACHE,
        meta=CACHE_META,
    output:
        json="results/runs/jax_equality/default/k{k}.json",
    log:
        "logs/jax_equality/k{k}.log",
    wildcard_constraints:
        k=r"\d+",
    conda:
        "../envs/jax.yaml"
    resources:
        **MEASURE,
    params:
        scripts=SCRIPTS,
        spec=spec_of("jax_equality"),
    shell:
        JAXRUN
