# Every measurement: one rule per experiment of the registry (src/dpscale/registry.py),
# named after it, one JSON out per variant and k. Each runs under the watchdog, which
# starts the experiment's worker (dpscale.run.command.worker_command: torchrun with one
# process per device and rank logs beside the job's log, or one JAX process that sees
# k devices; srun + one torchrun agent per node when k spans nodes) once it holds
# its devices' locks, and records a skipped, hung or failed run instead of leaving
# nothing behind: a failed job does not stop the workflow, the report shows it, and
# a plain rerun retries it: the attempt stamp (dpscale.plan.replan), also without
# Snakemake's metadata. The data files are ancient(): a cache rebuilt for another job
# (a fresh clone given results/ without results/data) must not rerun every measurement;
# the planner compares each result's recorded cache sha256 with the cache instead.
for _exp in registry.EXPERIMENTS.values():

    rule:
        name:
            _exp.name
        input:
            **jobs.rule_inputs(_exp, PROTO, ancient),
            attempt=jobs.attempt_of(_exp, REPLAN),
        output:
            json=layout.result_path(_exp.name, "{variant}", "{k}"),
        log:
            layout.log_path(_exp.name, "{variant}", "{k}"),
        wildcard_constraints:
            variant="|".join(_exp.variant_names()),
            k=r"\d+",
        conda:
            f"../envs/{_exp.family}.yaml"
        resources:
            **measure_resources(_exp),
            runtime=jobs.runtime_of(_exp, RESOLVED, FP, LOCKS),
        params:
            scripts=SCRIPTS,
            spec=jobs.spec_of(_exp, RESOLVED, FP),
            code=jobs.code_of(_exp),
            retry=jobs.retry_of(_exp, REPLAN),
        shell:
            "python {params.scripts:q}/watchdog.py --spec {params.spec:q} --result {output.json:q}"
            " --rank-logs {log:q}.ranks --lock-dir {resources.lock_dir:q}"
            " --lock-wait-s {resources.lock_wait_s} --cache-dir {resources.cache_dir:q}"
            " > {log:q} 2>&1"


# A result's n-th attempt (dpscale.plan.replan): an empty file whose name is new whenever
# an attempt failed or the planner found the result missing, damaged or stale.
rule attempt_stamp:
    output:
        layout.attempt_stamp(
            layout.result_path("{experiment}", "{variant}", "{k}"), "{n}"
        ),
    log:
        f"{layout.LOGS}/attempts/{{experiment}}/{{variant}}/k{{k}}.attempt-{{n}}.log",
    wildcard_constraints:
        k=r"\d+",
        n=r"\d+",
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "touch {output:q} > {log:q} 2>&1"
