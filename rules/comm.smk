# Communication: the bare all-reduce sweep (NCCL default vs the memcpy switch),
# the no_sync() probe against the cost model, and DDP training with the switch on.


rule allreduce:
    input:
        meta=CACHE_META,
    output:
        json="results/runs/allreduce/{variant}/k{k}.json",
    log:
        "logs/allreduce/{variant}/k{k}.log",
    wildcard_constraints:
        variant="default|memcpy",
        k=r"\d+",
    conda:
        "../envs/torch.yaml"
    resources:
        **MEASURE,
    params:
        scripts=SCRIPTS,
        spec=spec_of("allreduce"),
    shell:
        TORCHRUN


rule ddp_comm_probe:
    input:
        meta=CACHE_META,
        # beta is measured, not typed in: the k=2 all-reduce sweep prices each bucket
        allreduce="results/runs/allreduce/default/k2.json",
    output:
        json="results/runs/ddp_comm_probe/default/k{k}.json",
    log:
        "logs/ddp_comm_probe/k{k}.log",
    wildcard_constraints:
        k=r"\d+",
    conda:
        "../envs/torch.yaml"
    resources:
        **MEASURE,
    params:
        scripts=SCRIPTS,
        spec=spec_of("ddp_comm_probe"),
    shell:
        TORCHRUN


rule ddp_memcpy_training:
    input:
        cache=CACHE,
        meta=CACHE_META,
    output:
        json="results/runs/ddp_memcpy_training/default/k{k}.json",
    log:
        "logs/ddp_memcpy_training/k{k}.log",
    wildcard_constraints:
        k=r"\d+",
    conda:
        "../envs/torch.yaml"
    resources:
        **MEASURE,
    params:
        scripts=SCRIPTS,
        spec=spec_of("ddp_memcpy_training"),
    shell:
        TORCHRUN
