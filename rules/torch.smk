# PyTorch DDP throughput (weak and strong scaling), the bucket sweep and FSDP.
# Every job: torchrun, one process per device, under the watchdog; one JSON out.


rule ddp_weak:
    input:
        cache=CACHE,
        meta=CACHE_META,
        raw=RAW,
    output:
        json="results/runs/ddp_weak/{variant}/k{k}.json",
    log:
        "logs/ddp_weak/{variant}/k{k}.log",
    wildcard_constraints:
        variant="seed|cached|tuned",
        k=r"\d+",
    conda:
        "../envs/torch.yaml"
    resources:
        **MEASURE,
    params:
        scripts=SCRIPTS,
        spec=spec_of("ddp_weak"),
    shell:
        TORCHRUN


rule ddp_strong:
    input:
        cache=CACHE,
        meta=CACHE_META,
        raw=RAW,
    output:
        json="results/runs/ddp_strong/{variant}/k{k}.json",
    log:
        "logs/ddp_strong/{variant}/k{k}.log",
    wildcard_constraints:
        variant="seed|cached|tuned",
        k=r"\d+",
    conda:
        "../envs/torch.yaml"
    resources:
        **MEASURE,
    params:
        scripts=SCRIPTS,
        spec=spec_of("ddp_strong"),
    shell:
        TORCHRUN


rule ddp_bucket_sweep:
    input:
        meta=CACHE_META,
    output:
        json="results/runs/ddp_bucket_sweep/default/k{k}.json",
    log:
        "logs/ddp_bucket_sweep/k{k}.log",
    wildcard_constraints:
        k=r"\d+",
    conda:
        "../envs/torch.yaml"
    resources:
        **MEASURE,
    params:
        scripts=SCRIPTS,
        spec=spec_of("ddp_bucket_sweep"),
    shell:
        TORCHRUN


rule fsdp:
    input:
        meta=CACHE_META,
    output:
        json="results/runs/fsdp/default/k{k}.json",
    log:
        "logs/fsdp/k{k}.log",
    wildcard_constraints:
        k=r"\d+",
    conda:
        "../envs/torch.yaml"
    resources:
        **MEASURE,
    params:
        scripts=SCRIPTS,
        spec=spec_of("fsdp"),
    shell:
        TORCHRUN
