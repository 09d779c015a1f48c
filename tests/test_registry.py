"""The registry is the one place an experiment is declared: everything else derives
from it, and the static files that cannot (the config schema) agree with it."""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path
from unittest import mock

import pytest
import yaml
from conftest import CPU_FP, ROOT
from hypothesis import given, settings, strategies as st

from dpscale.plan import config as dsconfig, jobs, specs
from dpscale import provenance, registry
from dpscale.report.chapters import CHAPTERS

PARSED = ("src", "rules", "scripts", "Snakefile", "schemas", "config.yaml")


def measure_dummy(ctx) -> dict:
    """The dummy experiment's measurement (what a worker would call)."""
    return {"value_ms": 1.0}


@pytest.fixture
def dummy(monkeypatch):
    """An experiment added to the registry alone: no other file knows it."""
    exp = registry.Experiment("dummy_probe", "a dummy collective", "torch", "test_registry:measure_dummy",
                              (registry.DEFAULT,), registry.multi_k, ("image_size",), "communication")
    monkeypatch.setitem(registry.EXPERIMENTS, exp.name, exp)
    return exp


def _resolved(**over):
    cfg = {"scale": "smoke", "ks": [1, 2], "hardware_file": None, "tuned": "auto", "experiments": "all",
           "data": {"source": "auto", "local_dir": None}, "watchdog": {"hang_timeout_s": "auto", "grace_s": 15},
           "scales": {}, **over}
    return dsconfig.resolve(cfg, CPU_FP)


def planned_jobs(workdir: Path, config: dict) -> dict[str, list[str]]:
    """{rule: outputs} of an in-process dry run of the workflow (Snakemake's API), so a
    registry patched in this process is the one the Snakefile reads. No SLURM: see
    conftest.local_env (the SLURM plugin's scontrol call when snakemake is imported)."""
    with mock.patch.dict(os.environ, {"SLURM_CONF": os.devnull}):
        return _planned_jobs(workdir, config)


def _planned_jobs(workdir: Path, config: dict) -> dict[str, list[str]]:
    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=1), config_settings=ConfigSettings(config=config),
                          snakefile=ROOT / "Snakefile", workdir=workdir)
        dag = wf.dag(dag_settings=DAGSettings(targets={"report"}))
        dag.execute_workflow(executor="dryrun")
        jobs = wf._workflow.dag.jobs   # the API exposes no job list; its DAG holds them
        out: dict[str, list[str]] = {}
        for j in jobs:
            out.setdefault(j.rule.name, []).extend(str(f) for f in j.output)
        return out


def test_a_new_experiment_is_planned_dispatched_and_reported(dummy, tmp_path):
    resolved = _resolved(experiments=["dummy_probe", "ddp_weak"])
    assert "results/runs/dummy_probe/default/k2.json" in specs.targets(resolved)
    spec = specs.job_spec(resolved, CPU_FP, "dummy_probe", "default", 2, {})
    assert spec["backend"] == "gloo" and spec["config"]["protocol"] == {"image_size": 32}
    assert registry.entry_point("dummy_probe") is measure_dummy            # the workers' dispatch
    jobs = planned_jobs(tmp_path / "wf", {"scale": "smoke", "ks": [1, 2], "experiments": ["dummy_probe"]})
    assert jobs["dummy_probe"] == ["results/runs/dummy_probe/default/k2.json"]
    assert "results/report/report.html" in jobs["report"]

    from dpscale import report
    from dpscale.results import write_json_atomic
    write_json_atomic(tmp_path / "fp.json", CPU_FP)
    s = report.build(tmp_path / "runs", tmp_path / "fp.json", tmp_path / "out", references=[], book_path=None,
                     targets=specs.targets(resolved, str(tmp_path / "runs")))
    assert s["counts"]["this run"]["not run"] == len(specs.targets(resolved))
    html = (tmp_path / "out" / "report.html").read_text()
    jobs_table = re.search(r'<table id="table-jobs_communication".*?</table>', html, re.S).group(0)
    assert "dummy_probe" in jobs_table and "NOT RUN" in jobs_table


def test_a_variants_k_range_is_planned_from_the_registry_alone(monkeypatch, tmp_path):
    """A variant with min_k or max_k (the linear LR rule from k=2; the book's fp32 loop at
    k=1 only) is planned at those k and no other, by specs, the workflow and the report."""
    once = registry.Variant("once", "only at k=1", max_k=1)
    later = registry.Variant("later", "from k=2", min_k=2)
    exp = registry.Experiment("dummy_range", "a dummy with ranged variants", "torch", "test_registry:measure_dummy",
                              (registry.DEFAULT, once, later), registry.every_k, ("image_size",), "communication")
    monkeypatch.setitem(registry.EXPERIMENTS, exp.name, exp)
    resolved = _resolved(experiments=["dummy_range"], ks=[1, 2, 4])
    assert specs.planned(resolved) == [("dummy_range", "default", 1), ("dummy_range", "default", 2),
                                       ("dummy_range", "default", 4), ("dummy_range", "once", 1),
                                       ("dummy_range", "later", 2), ("dummy_range", "later", 4)]
    jobs = planned_jobs(tmp_path / "wf", {"scale": "smoke", "ks": [1, 2], "experiments": ["dummy_range"]})
    assert sorted(jobs["dummy_range"]) == ["results/runs/dummy_range/default/k1.json",
                                           "results/runs/dummy_range/default/k2.json",
                                           "results/runs/dummy_range/later/k2.json",
                                           "results/runs/dummy_range/once/k1.json"]
    from dpscale import report
    from dpscale.results import write_json_atomic
    write_json_atomic(tmp_path / "fp.json", CPU_FP)
    targets = specs.targets(resolved, str(tmp_path / "runs"))
    s = report.build(tmp_path / "runs", tmp_path / "fp.json", tmp_path / "out", references=[], book_path=None,
                     targets=targets)
    assert s["counts"]["this run"]["not run"] == 6
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())["targets"]
    assert sorted(plan) == sorted(t.removeprefix(f"{tmp_path}/runs/") for t in targets)


def test_the_schema_agrees_with_the_registry():
    schema = dsconfig.schema()
    protocol = schema["$defs"]["protocol"]["properties"]
    assert set(protocol) == registry.protocol_keys(), "schema $defs/protocol against registry.protocol_keys()"
    for scale in ("smoke", "paper"):
        assert set(schema["properties"]["scales"]["properties"][scale]["default"]) == set(protocol), scale
    for key, prop in protocol.items():
        assert prop.get("description"), f"protocol key {key} has no description"
    assert "enum" not in str(schema["properties"]["experiments"].get("items", {})), "names belong to the registry"


def test_every_experiment_is_complete():
    chapters = {c.key for c in CHAPTERS}
    for exp in registry.EXPERIMENTS.values():
        assert exp.family in registry.FAMILIES and exp.chapter in chapters, exp.name
        assert set(exp.inputs) <= set(registry.INPUTS), exp.name
        assert all(n.experiment in registry.EXPERIMENTS for n in exp.needs), exp.name
        module, _, func = exp.entry.partition(":")
        tree = ast.parse((ROOT / "src" / (module.replace(".", "/") + ".py")).read_text())
        assert func in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, exp.entry
        assert module in exp.sources and registry.FAMILY_JOB[exp.family] in exp.sources, exp.name
        for name in exp.sources:
            assert provenance.module_path(name).exists(), name


def test_an_unknown_experiment_is_one_clear_line():
    with pytest.raises(dsconfig.ConfigError) as e:
        _resolved(experiments=["ddp_weak", "warp_drive"])
    msg = str(e.value)
    assert "\n" not in msg and "'warp_drive' is not an experiment" in msg and "jax_equality" in msg


def test_an_experiments_name_is_written_in_few_places():
    """Adding an experiment touches its registry entry, its run module and its chapter."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *PARSED], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    holding = sorted(f for f in listed if (ROOT / f).is_file() and "jax_equality" in (ROOT / f).read_text(errors="ignore"))
    assert len(holding) <= 3, holding
    assert "src/dpscale/registry.py" in holding


def test_variants_and_ks_policies():
    ks = [1, 2, 4]
    assert registry.get("allreduce").ks(ks) == [2, 4] and registry.get("ddp_weak").ks(ks) == [1, 2, 4]
    assert registry.get("ddp_bucket_sweep").ks([1, 4, 8]) == [4] and registry.get("jax_equality").ks([1]) == [2]
    assert registry.get("ddp_weak").variant_names(tuned=False) == ["seed", "cached"]
    with pytest.raises(KeyError, match="no experiment 'nope'"):
        registry.get("nope")
    assert dataclasses.replace(registry.get("fsdp"), name="x").name == "x"   # frozen, copyable declarations


def test_every_experiment_asks_the_cluster_for_its_resources_from_the_registry_and_config():
    """profiles/slurm (issue #55) names no rule: set-resources there would override what
    each rule derives per job (its watchdog's limits, whole nodes only for a job that
    measures) and need a line per experiment of the registry. Every measurement rule asks
    for CPUs and memory per GPU from the config's `cluster`, whose schema holds the defaults."""
    prof = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    assert "set-resources" not in prof, "profiles/slurm names rules; the rules ask for their own resources"
    measure = (ROOT / "rules/measure.smk").read_text()
    assert "runtime=jobs.runtime_of(" in measure and "**measure_resources(" in measure
    schema = yaml.safe_load((ROOT / "schemas/config.schema.yaml").read_text())["properties"]["cluster"]["properties"]
    cluster = {key: schema[key]["default"] for key in schema}
    r = jobs.resources(cluster, {**CPU_FP, "gpu_count": 8, "gpu_model": "H200"}, {"dir": "/x", "wait_s": 1})
    assert (r["cpus_per_gpu"], r["mem_mb_per_cpu"]) == (cluster["cpus_per_gpu"], cluster["mem_mb_per_cpu"])


class _W:
    def __init__(self, variant, k):
        self.variant, self.k = variant, str(k)


@settings(max_examples=30, deadline=None)
@given(scale=st.sampled_from(["smoke", "paper"]), gpus=st.sampled_from([0, 1, 8]),
       hang=st.one_of(st.just("auto"), st.integers(1, 20000)), grace=st.integers(0, 120),
       wait=st.one_of(st.just("auto"), st.integers(0, 7200)), tta=st.integers(1, 50000),
       k=st.sampled_from([1, 2, 8]))
def test_a_jobs_cluster_time_limit_covers_everything_its_watchdog_may_take(scale, gpus, hang, grace, wait, tta, k):
    """SLURM ends a job at its runtime; the watchdog must end it first and say why: the
    runtime covers the lock wait plus every launch's limit and grace, for every job."""
    fp = {**CPU_FP, "gpu_count": gpus, "cpu_count": 8, "gpu_model": "H200" if gpus else None}
    cfg = {"scale": scale, "ks": [1, 2, 8], "hardware_file": None, "tuned": "auto", "experiments": "all",
           "data": {"source": "auto", "local_dir": None}, "watchdog": {"hang_timeout_s": hang, "grace_s": grace},
           "scales": {scale: {"tta_timeout_s": tta}}, "locks": {"wait_s": wait}}
    resolved = dsconfig.resolve(cfg, fp)
    locks = dsconfig.resolve_locks(cfg, resolved["scale"])
    for exp in registry.EXPERIMENTS.values():
        for variant in exp.variant_names(resolved["tuned"], True):
            if not exp.variant(variant).runs_at(k):
                continue
            spec = specs.job_spec(resolved, fp, exp.name, variant, k, jobs.job_inputs(exp, resolved["protocol"]))
            minutes = jobs.runtime_of(exp, resolved, fp, locks)(_W(variant, k))
            assert isinstance(minutes, int) and minutes >= 1
            if not spec["skip_reason"]:
                n = specs.launch_count(spec)
                assert minutes * 60 >= locks["wait_s"] + n * (spec["limit_s"] + spec["grace_s"]), (exp.name, variant)


@settings(max_examples=25, deadline=None)
@given(ks=st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=1, max_size=4, unique=True),
       gpus=st.sampled_from([0, 1, 2, 8]), cores=st.integers(1, 16))
def test_the_plans_skipped_line_counts_the_jobs_that_will_skip(ks, gpus, cores):
    """The line said when the workflow is parsed (a dry run lists skipped jobs as jobs)
    counts exactly the planned results whose spec will be recorded skipped, and names
    every k that is short of devices."""
    fp = {**CPU_FP, "gpu_count": gpus, "cpu_count": cores, "gpu_model": "H200" if gpus else None}
    resolved = dsconfig.resolve({"scale": "smoke", "ks": sorted(ks), "hardware_file": None, "tuned": "auto",
                                 "experiments": "all", "data": {"source": "auto", "local_dir": None},
                                 "watchdog": {"hang_timeout_s": "auto", "grace_s": 15}, "scales": {}}, fp)
    plan = jobs.planned_of(resolved, fp)
    skips = [t for t in specs.targets(resolved) if plan(t)[0]["skip_reason"]]
    line = specs.plan_line(resolved, fp)
    devices = gpus or cores
    head = (f"Plan: {len(specs.targets(resolved))} results at smoke scale, {'nccl' if gpus else 'gloo'} on "
            f"{devices} {'GPU' if gpus else 'CPU device'}{'s' * (devices != 1)}")
    if not skips:
        assert line == head + ", none skipped"
        return
    assert line.startswith(head + f"; {len(skips)} of them recorded as skipped without running: "), line
    short = {plan(t)[0]["k"] for t in skips if plan(t)[0]["skip_reason"].startswith("k=")}
    for k in short:
        assert re.search(rf"\bk={k}\b", line), (k, line)


@settings(max_examples=30, deadline=None)
@given(ks=st.lists(st.integers(1, 64), min_size=1, max_size=5, unique=True))
def test_a_plan_without_k1_is_told_at_parse_time_with_a_fix_that_has_it(ks):
    """Every ratio the answer gives is over k=1: a plan without it is warned, naming the
    key and a list that adds it (which parses and is warned no more)."""
    ks = sorted(ks)
    line = specs.no_base_warning({"ks": ks})
    if 1 in ks:
        assert line is None
        return
    assert line.startswith(f"ks: {ks} has no k=1"), line
    fix = yaml.safe_load(re.search(r"'ks=(\[[^]]*\])'", line).group(1))
    assert fix[0] == 1 and fix[1:] == ks and specs.no_base_warning({"ks": fix}) is None


@settings(max_examples=40, deadline=None)
@given(nodes=st.integers(1, 8), per_node=st.integers(1, 8), local=st.booleans(),
       ks=st.lists(st.integers(1, 64), min_size=1, max_size=5, unique=True))
def test_a_local_run_of_a_k_that_spans_nodes_is_told_at_its_start(nodes, per_node, local, ks):
    """Only a SLURM allocation gives several nodes: a local run warns, naming exactly the
    ks that span them (above one node's devices, within cluster.nodes of them), and the
    fixes; a SLURM run, or a plan whose every k fits one node or is skipped, says nothing."""
    from dpscale.plan import cluster as dscluster
    ks = sorted(ks)
    line = dscluster.spanning_locally(local, ks, {"nodes": nodes, "gpus_per_node": per_node}, CPU_FP)
    spans = [k for k in ks if per_node < k <= nodes * per_node]
    if not (local and spans):
        assert line is None
        return
    named = [int(k) for k in re.match(r"cluster.nodes=\d+: k=([\d, ]+) span", line).group(1).split(", ")]
    assert named == spans, (line, spans)
    assert "--workflow-profile profiles/slurm" in line and "cluster.nodes=1" in line


@settings(max_examples=40, deadline=None)
@given(gpus=st.sampled_from([0, 1, 2, 8]), nodes=st.integers(1, 4), exclusive=st.booleans(),
       k=st.sampled_from([1, 2, 4, 8, 16]), data=st.data())
def test_only_a_job_that_measures_asks_for_whole_nodes(gpus, nodes, exclusive, k, data):
    """sbatch --exclusive (cluster.exclusive) for every job that measures; never for one
    that only records `skipped`, whatever the machine, nodes and k."""
    fp = {**CPU_FP, "gpu_count": gpus, "cpu_count": 2, "gpu_model": "H200" if gpus else None}
    cluster = {"nodes": nodes, "gpus_per_node": None, "exclusive": exclusive}
    exp = data.draw(st.sampled_from(sorted(registry.EXPERIMENTS)))
    variant = data.draw(st.sampled_from(list(registry.get(exp).variant_names(True, True))))
    r = jobs.resources(cluster, fp, {"dir": "/x", "wait_s": 1}, None, exp)
    skipped = specs.skip_reason(exp, variant, k, fp, cluster) is not None
    assert r["slurm_extra"](_W(variant, k)) == ("--exclusive" if exclusive and not skipped else "")


def test_a_job_that_only_records_skipped_asks_the_cluster_for_one_node_no_gpu_and_no_whole_node():
    """The memcpy switch has no gloo equivalent: its k=8 job on a CPU cluster of 4 nodes
    of 2 writes `skipped`; it must not hold four exclusive nodes to do so. Its default
    sibling at the same k spans the four; on GPU nodes a skipped k asks for no GPU."""
    cpu = {**CPU_FP, "cpu_count": 2}
    cluster = {"nodes": 4, "gpus_per_node": 2}
    locks = {"dir": "/tmp/x", "wait_s": 1}
    r = jobs.resources(cluster, cpu, locks, None, "allreduce")
    assert r["nodes"](_W("memcpy", 8)) == 1 and r["tasks"](_W("memcpy", 8)) == 0 and r["mpi"](_W("memcpy", 8)) == ""
    assert r["nodes"](_W("default", 8)) == 4 and r["tasks"](_W("default", 8)) == 4
    gpu = {**CPU_FP, "gpu_count": 2, "gpu_model": "H200"}
    r = jobs.resources({"nodes": 1, "gpus_per_node": None}, gpu, locks, None, "allreduce")
    assert r["gpu"](_W("default", 2)) == 2 and r["gpu"](_W("default", 4)) == 0
    r = jobs.resources({"nodes": 1, "gpus_per_node": None}, gpu, locks, None, "ddp_weak")   # no cudnn_frontend
    assert r["gpu"](_W("tuned", 2)) == 2 and r["gpu"](_W("tuned_fp16", 2)) == 0
    # whole nodes for what measures, none for what only writes `skipped`; off when asked
    assert r["slurm_extra"](_W("tuned", 2)) == "--exclusive" and r["slurm_extra"](_W("tuned_fp16", 2)) == ""
    assert r["slurm_extra"](_W("tuned", 4)) == ""
    r = jobs.resources({"nodes": 1, "gpus_per_node": None, "exclusive": False}, gpu, locks, None, "ddp_weak")
    assert r["slurm_extra"](_W("tuned", 2)) == ""


def test_the_cluster_docs_time_limits_are_what_the_rules_ask():
    """docs/cluster.md and profiles/slurm name the paper-scale limits a DDP throughput job
    and a time-to-accuracy job ask for: those are what jobs.runtime_of gives today."""
    fp = {**CPU_FP, "gpu_count": 8, "gpu_model": "H200", "interconnect": "NV18"}
    cfg = {"scale": "paper", "ks": [1, 2], "hardware_file": None, "tuned": "auto", "experiments": "all",
           "data": {"source": "auto", "local_dir": None}, "watchdog": {"hang_timeout_s": "auto", "grace_s": 15},
           "scales": {}}
    resolved = dsconfig.resolve(cfg, fp)
    locks = dsconfig.resolve_locks(cfg, "paper")
    ddp = jobs.runtime_of(registry.get("ddp_weak"), resolved, fp, locks)(_W("tuned", 2))
    tta = jobs.runtime_of(registry.get("ddp_tta"), resolved, fp, locks)(_W("book", 2))
    doc = " ".join((ROOT / "docs/cluster.md").read_text().split())
    prof = " ".join((ROOT / "profiles/slurm/config.yaml").read_text().replace("#", " ").split())
    assert f"at paper scale {ddp} for a DDP throughput job, {tta} for time to accuracy" in doc, (ddp, tta)
    assert f"asks for {tta} minutes, a DDP k=2 job for {ddp}" in prof, (ddp, tta)
