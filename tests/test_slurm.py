"""The workflow through a real SLURM: munge, slurmctld and two slurmd on this
machine (.ci/slurm.sh), Snakemake's SLURM executor with profiles/slurm.

- test_gpu_requests_reach_slurm: the profile + plugin turn the rules' resources
  into SLURM requests: gpu=k -> --gpus=k on one node; gres=gpu:G, nodes=N, tasks=N,
  mpi -> G GPUs on each of N nodes, the rule's own srun starting one task per node.
  (The node's GPUs are bookkeeping only: device files cloned from /dev/null.)
  Started from a venv and a folder whose paths have a space (snakemake#2645: the
  interpreter's path goes into the job command unquoted; profiles/slurm works round it).
- test_pipeline_runs_through_slurm: the smoke pipeline (ddp_weak, k=1,2) to its report,
  on a copy of the repo whose data stage has run, every job an sbatch job.
- test_multinode_jobs_span_two_nodes: with cluster.gpus_per_node=1 the k=2 jobs
  span the two nodes: srun + torchrun --nnodes=2 with the c10d rendezvous.

Needs root, and apt-get or the packages already installed (Debian/Ubuntu:
slurmctld slurmd slurm-client munge), and snakemake-executor-plugin-slurm.
Without them the tests skip, saying why; with CI=true they fail instead.
Daemons this module started are stopped by pid at the end (.ci/slurm.sh stop).
Snakemake runs through tests/slurm_snakemake.py: the plugin's status polling capped at
2 s (its back-off of 10 s more a query is not a setting), so a job is seen done ~2 s
after it ends, not up to 30 s.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import copy_primed

REPO = Path(__file__).resolve().parents[1]
SLURM_SH = REPO / ".ci" / "slurm.sh"
CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
PIPELINE_TIMEOUT_S = 1200
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.?$", re.M)   # a log path may hold spaces

pytestmark = [pytest.mark.slow, pytest.mark.workflow, pytest.mark.timeout(1800)]


def unavailable(reason: str):
    if CI:
        pytest.fail(f"CI=true, but a real SLURM cannot run here: {reason}")
    pytest.skip(reason)


def clean_env(python: str = sys.executable) -> dict:
    """This interpreter's environment, its bin folder first on PATH (the jobs'
    `python` and `torchrun`), without variables of an enclosing SLURM job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def python_under_a_space(folder: Path) -> str:
    """This interpreter as a user whose venv's path has a space starts it: through a
    link `folder/venv with space` to the venv (its pyvenv.cfg makes it the same
    environment). Outside a venv (nothing to link), this interpreter itself."""
    if sys.prefix == sys.base_prefix or " " in sys.executable:
        return sys.executable
    link = folder / "venv with space"
    link.symlink_to(sys.prefix, target_is_directory=True)
    return str(link / "bin" / Path(sys.executable).name)


def daemons_alive(pids_file: Path) -> bool:
    try:
        rows = [line.split() for line in pids_file.read_text().splitlines() if line.strip()]
    except OSError:
        return False
    if not rows:
        return False
    for _name, pid in rows:
        try:
            os.kill(int(pid), 0)
        except (ProcessLookupError, ValueError):
            return False
    return True


@pytest.fixture(scope="module")
def slurm():
    """A running SLURM with two nodes (partition gpu; 16 CPUs, 128 GB, 2 GPUs each, declared)."""
    if sys.platform != "linux" or os.geteuid() != 0:
        unavailable("a real SLURM needs root on Linux (it writes /etc/slurm, starts daemons)")
    binaries = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue")
    if not shutil.which("apt-get") and not all(shutil.which(b) for b in binaries):
        unavailable("neither apt-get nor slurmctld/slurmd/slurm-client/munge are available")
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        unavailable("snakemake-executor-plugin-slurm is not installed (pip install snakemake-executor-plugin-slurm)")
    env = {**clean_env(), "DPSCALE_SLURM_NODES": "2", "DPSCALE_SLURM_FAKE_GPUS": "2",
           "DPSCALE_SLURM_CPUS": "16", "DPSCALE_SLURM_MEM_MB": "131072"}
    state = Path(env.get("DPSCALE_SLURM_STATE", "/tmp/dpscale-slurm"))
    already = daemons_alive(state / "pids")
    try:
        r = subprocess.run(["bash", str(SLURM_SH), "start"], env=env, capture_output=True,
                           text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        unavailable(f".ci/slurm.sh start did not finish in 900 s:\n{e.stderr}")
    if r.returncode != 0:
        unavailable(f".ci/slurm.sh start failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    pids_file = Path(r.stdout.strip().splitlines()[-1])
    assert pids_file.exists(), r.stdout + r.stderr
    jobs: list[str] = []
    yield {"pids_file": pids_file, "jobs": jobs, "log": r.stderr}
    # leave nothing queued behind, then stop what we started (by pid)
    live = [j for j in jobs if squeue_rows([j]).get(j, {}).get("state") in ("PENDING", "RUNNING", "CONFIGURING")]
    if live:
        subprocess.run(["scancel", *live], capture_output=True)
    if not already:
        subprocess.run(["bash", str(SLURM_SH), "stop"], env=env, capture_output=True, text=True, timeout=120)


def squeue_rows(job_ids: list[str]) -> dict:
    """id -> state, nodes, nodelist, time limit, oversubscribe (NO: --exclusive), minimum
    memory (per CPU or per node), comment (finished jobs stay listed for MinJobAge)."""
    if not job_ids:
        return {}
    r = subprocess.run(["squeue", "--states=all", "-h", "-j", ",".join(job_ids),
                        "-o", "%i|%T|%D|%N|%l|%h|%m|%k"], capture_output=True, text=True)
    rows = {}
    for line in r.stdout.splitlines():
        jid, state, nodes, nodelist, limit, share, mem, comment = line.split("|", 7)
        rows[jid] = {"state": state, "nodes": int(nodes), "nodelist": nodelist, "time_limit": limit,
                     "oversubscribe": share, "min_memory": mem, "comment": comment}
    return rows


def snakemake(workdir: Path, args: list[str], slurm: dict, timeout: int = PIPELINE_TIMEOUT_S,
              python: str = sys.executable):
    """Run snakemake with the SLURM executor in workdir (through slurm_snakemake.py: the
    plugin's status polling capped); kill its process group and cancel its jobs on
    timeout. Returns (returncode, output, {slurm job id: log})."""
    cmd = [python, str(REPO / "tests" / "slurm_snakemake.py"), "--workflow-profile", str(REPO / "profiles" / "slurm"),
           # no accounting database here: no account, and squeue instead of sacct
           "--slurm-no-account", "--slurm-status-command", "squeue",
           "--slurm-init-seconds-before-status-checks", "1", *args]
    log = workdir / "snakemake.out"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=workdir, env=clean_env(python), stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGINT, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(10)
            rc = None
    out = log.read_text(errors="replace")
    submitted = dict(SUBMITTED.findall(out))
    slurm["jobs"].extend(submitted)
    if rc is None:
        subprocess.run(["scancel", *submitted], capture_output=True)
        pytest.fail(f"snakemake --executor slurm did not finish in {timeout} s:\n{out[-6000:]}")
    return rc, out, submitted


def copy_repo(dest: Path) -> Path:
    """The repo's tracked and untracked-not-ignored files (no venv, results, logs)."""
    try:
        files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], capture_output=True, check=True).stdout
        names = [n for n in files.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = None
    if names:
        for name in names:
            src = REPO / name
            if src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
    else:
        shutil.copytree(REPO, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "results", "logs", ".snakemake", "__pycache__", ".pytest_cache", "*.egg-info"))
    return dest


def supports_cluster_key() -> bool:
    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
    return "cluster" in schema.get("properties", {})


# ------------------------------------------------------------------ tests

GPU_SNAKEFILE = r'''
# Rules named like measurement rules; their resources are what rules/common.smk
# declares (dpscale.plan.jobs.resources, the config's cluster defaults) for k=2 on
# 2-GPU nodes (one node) and for k=2 on 1-GPU nodes (two nodes).
rule all:
    input: "one_node.txt", "two_nodes.txt"

rule ddp_weak:
    output: "one_node.txt"
    resources: gpu=2, gres="", nodes=1, tasks=0, tasks_per_gpu=0, mpi="", measure=1, runtime=7,
               slurm_extra="--exclusive", cpus_per_gpu=8, mem_mb_per_cpu=4000
    shell: "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES > {output};"
           " scontrol show job $SLURM_JOB_ID >> {output}"

rule allreduce:
    output: "two_nodes.txt"
    resources: gpu=0, gres="gpu:1", nodes=2, tasks=2, tasks_per_gpu=0, mpi="srun", measure=1,
               slurm_extra="--exclusive", cpus_per_gpu=8, mem_mb_per_cpu=4000
    shell: "srun --whole --nodes=2 --ntasks=2 --ntasks-per-node=1 --label bash -c"
           " 'echo node=$SLURMD_NODENAME CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES' > {output};"
           " scontrol show job $SLURM_JOB_ID >> {output}"
'''


def test_gpu_requests_reach_slurm(slurm, tmp_path):
    work = tmp_path / "a folder with space"   # and the venv too: snakemake#2645
    work.mkdir()
    (work / "Snakefile").write_text(GPU_SNAKEFILE)
    python = python_under_a_space(tmp_path)
    rc, out, submitted = snakemake(work, ["--verbose"], slurm, timeout=300, python=python)
    assert rc == 0, out[-6000:]
    assert "-m snakemake" in out and f"{python} -m snakemake" not in out, out[-3000:]   # PATH's python
    assert len(submitted) == 2, out[-3000:]
    calls = {m.group(1): m.group(0).split(" --wrap=")[0]
             for m in re.finditer(r"sbatch call: sbatch .*?--comment (rule_\w+).*", out)}
    one_call, two_call = calls["rule_ddp_weak"], calls["rule_allreduce"]
    # -t 7: the rule's own runtime (dpscale.plan.jobs.runtime_of), which the profile leaves alone
    for flag in ("--gpus=2", "--nodes=1", "--cpus-per-gpu=8", "--mem-per-cpu 4000", "--exclusive", "-t 7", "-p gpu"):
        assert flag in one_call.split(" ") or flag in one_call, (flag, one_call)
    for flag in ("--gres=gpu:1", "--nodes=2", "--ntasks=2", "--cpus-per-gpu=8", "--exclusive"):
        assert flag in two_call, (flag, two_call)
    assert "--gpus=" not in two_call and "--ntasks-per-gpu" not in two_call, two_call

    one = (work / "one_node.txt").read_text()
    assert "CUDA_VISIBLE_DEVICES=0,1" in one, one          # --gpus=2: both GPUs of the node
    assert re.search(r"TresPerJob=gres:gpu:2\b", one), one
    assert re.search(r"NumNodes=1\b", one), one
    # the rule's --cpus-per-gpu=8, --mem-per-cpu=4000 and --exclusive
    assert re.search(r"CpusPerTres=gres:gpu:8\b", one), one
    assert re.search(r"MinMemoryCPU=4000M\b", one), one
    assert re.search(r"OverSubscribe=NO\b", one), one

    two = (work / "two_nodes.txt").read_text()
    assert re.search(r"^0: node=node\d CUDA_VISIBLE_DEVICES=0$", two, re.M), two
    assert re.search(r"^1: node=node\d CUDA_VISIBLE_DEVICES=0$", two, re.M), two
    assert len(set(re.findall(r"^\d: node=(node\d)", two, re.M))) == 2, two   # two different nodes
    assert re.search(r"TresPerNode=gres:gpu:1\b", two), two    # --gres=gpu:1 is per node
    assert re.search(r"NumNodes=2\b", two) and re.search(r"NumTasks=2\b", two), two
    assert re.search(r"NumCPUs=32\b", two), two             # 8 CPUs per GPU, whole nodes


@pytest.fixture(scope="module")
def pipeline(slurm, primed, tmp_path_factory):
    """The smoke pipeline through SLURM, once for the tests below, from a copy of the
    workflow whose data stage has run (conftest's `primed`, the same SMALL sizes):
    each SLURM job costs ~33 s here, most of it the plugin's status polling (1, 11,
    21 s apart), so the jobs this module is about are the measurements (four DDP jobs,
    k=2 across two nodes) and the report; the data jobs and the all-reduce sweep run
    through SLURM the same way and are tested locally elsewhere."""
    repo = copy_primed(primed, tmp_path_factory.mktemp("repo"), machines=False)
    multinode = supports_cluster_key()
    cfg = {
        "scale": "smoke", "ks": [1, 2], "experiments": ["ddp_weak"],
        "scales": {"smoke": {"image_size": 16, "train_images": 32}},   # conftest.SMALL
    }
    if multinode:
        # each emulated node holds one device: k=2 spans both nodes
        cfg["cluster"] = {"nodes": 2, "gpus_per_node": 1}
    (repo / "slurm-test.yaml").write_text(yaml.safe_dump(cfg))
    t0 = time.monotonic()
    rc, out, submitted = snakemake(repo, ["--configfile", "slurm-test.yaml"], slurm)
    return {"repo": repo, "rc": rc, "out": out, "submitted": submitted, "multinode": multinode,
            "seconds": time.monotonic() - t0}


def smoke_runtime_min(repo: Path) -> int:
    """The limit a smoke ddp_weak job asks for: the lock wait, its launches' limit and
    grace, and the job's overhead, as the watchdog would allow them, in whole minutes."""
    from dpscale.plan import config as dsconfig
    from dpscale.run import launches
    schema = yaml.safe_load((REPO / "schemas/config.schema.yaml").read_text())
    smoke = schema["properties"]["scales"]["properties"]["smoke"]["default"]
    wait = dsconfig.resolve_locks({}, "smoke")["wait_s"]
    watched = wait + launches.count({"config": {"protocol": smoke}}) * (120 + 15)   # hang_timeout_s auto, grace_s
    return -(-(watched + 300) // 60)


def test_pipeline_runs_through_slurm(pipeline):
    repo, out = pipeline["repo"], pipeline["out"]
    assert pipeline["rc"] == 0, f"snakemake --executor slurm failed:\n{out[-8000:]}"

    results = sorted((repo / "results" / "runs").glob("*/*/k*.json"))
    names = {str(p.relative_to(repo / "results" / "runs")) for p in results}
    expected = {"ddp_weak/seed/k1.json", "ddp_weak/seed/k2.json",
                "ddp_weak/cached/k1.json", "ddp_weak/cached/k2.json"}
    assert expected <= names, f"missing results: {sorted(expected - names)}"
    for p in results:
        r = json.loads(p.read_text())
        assert r["status"] in ("ok", "skipped"), f"{p.name}: {r['status']} {r.get('reason')}"
        if r["status"] == "ok":
            assert r["metrics"], p
    for name in ("ddp_weak/seed/k2.json", "ddp_weak/cached/k1.json"):
        r = json.loads((repo / "results" / "runs" / name).read_text())
        assert r["status"] == "ok" and r["k"] == int(name[-6]), (name, r.get("reason"))
    assert (repo / "results" / "report" / "report.html").exists()

    # every job went through SLURM: submitted, listed by squeue as COMPLETED, its log kept
    submitted = pipeline["submitted"]
    logs = [Path(log) for log in submitted.values()]
    per_rule = {}
    for p in logs:
        rule = p.relative_to(repo / ".snakemake" / "slurm_logs").parts[0]
        per_rule[rule] = per_rule.get(rule, 0) + 1
    assert not {"rule_download", "rule_resize", "rule_model_flops"} & set(per_rule), per_rule   # primed: done
    assert per_rule.get("rule_ddp_weak") == 4 and per_rule.get("rule_report") == 1, per_rule
    rows = squeue_rows(list(submitted))
    assert set(rows) == set(submitted), f"squeue does not know jobs {set(submitted) - set(rows)}"
    assert {r["state"] for r in rows.values()} == {"COMPLETED"}, rows
    # each measurement's time limit is its own (dpscale.plan.jobs.runtime_of), not a flat one
    limits = {r["time_limit"] for r in rows.values() if r["comment"].startswith("rule_ddp_weak")}
    assert limits == {f"{smoke_runtime_min(pipeline['repo']):d}:00"}, limits
    # whole nodes for the measurements (the rules' slurm_extra, cluster.exclusive), not the report
    share = {r["comment"].split("_wildcards")[0]: r["oversubscribe"] for r in rows.values()}
    assert {r["oversubscribe"] for r in rows.values() if r["comment"].startswith("rule_ddp_weak")} == {"NO"}, rows
    assert share["rule_report"] != "NO", share
    # memory per CPU from the config's cluster.mem_mb_per_cpu (its schema default), not the profile
    assert {r["min_memory"] for r in rows.values() if r["comment"].startswith("rule_ddp_weak")} == {"4000M"}, rows
    for p in logs:
        assert p.exists() and "SNAKEMAKE" in p.read_text(errors="replace"), p   # the job step's own log
    # side by side: profiles/slurm is the workflow profile, so profiles/default's measure=1
    # is not loaded, and every measurement was submitted before the first one finished
    lines = out.splitlines()
    assert not any(line.startswith("Provided resources:") and "measure" in line for line in lines), out[:3000]
    sub = [i for i, line in enumerate(lines) if "has been submitted with SLURM jobid" in line and "rule_ddp_weak" in line]
    done = [i for i, line in enumerate(lines) if re.match(r"Finished jobid: \d+ \(Rule: ddp_weak\)", line)]
    assert len(sub) == 4 and done and max(sub) < min(done), "\n".join(lines[i] for i in sorted(sub + done))
    assert "run one at a time" not in out
    print(f"smoke pipeline through SLURM: {len(submitted)} jobs in {pipeline['seconds']:.0f} s")


def test_multinode_jobs_span_two_nodes(pipeline):
    if not pipeline["multinode"]:
        pytest.skip("the config has no `cluster` key yet (the multi-node launch of "
                    "docs/cluster.md is not in rules/common.smk and the schema)")
    repo = pipeline["repo"]
    assert pipeline["rc"] == 0, pipeline["out"][-6000:]
    rows = squeue_rows(list(pipeline["submitted"]))
    by_job = {jid: rows[jid] for jid in pipeline["submitted"] if jid in rows}
    spans = {r["comment"]: (r["nodes"], r["nodelist"]) for r in by_job.values()}
    for variant in ("seed", "cached"):
        for k, nodes in ((1, 1), (2, 2)):
            key = f"rule_ddp_weak_wildcards_{variant}_{k}"
            assert spans.get(key, (None,))[0] == nodes, (key, spans)

    # the all-reduce sweep's k=2 goes through the same launch (rules/common.smk)
    for name in ("ddp_weak/seed/k2", "ddp_weak/cached/k2"):
        log = (repo / "logs" / f"{name}.log").read_text(errors="replace")
        assert "srun --whole --nodes=2" in log and "--rdzv-backend=c10d" in log, log[:3000]
        assert "--nnodes=2 --nproc-per-node=1" in log, log[:3000]
        assert re.search(r"^0: ", log, re.M) and re.search(r"^1: ", log, re.M), log[-3000:]  # both nodes' output
        r = json.loads((repo / "results" / "runs" / f"{name}.json").read_text())
        assert r["status"] == "ok" and r["runtime"]["world_size"] == 2, r.get("reason")
    # one-node jobs are launched exactly as on a workstation: k=1 is one process, its worker alone
    log = (repo / "logs" / "ddp_weak" / "seed" / "k1.log").read_text(errors="replace")
    assert "torch_worker.py" in log and "torchrun" not in log and "srun" not in log, log[:2000]


def test_a_cluster_run_that_kept_the_workstations_limit_says_so():
    """Under `--profile profiles/slurm` Snakemake loads profiles/default as the workflow
    profile too, and its global measure=1 would run a cluster's measurements one at a time:
    the run says so at its start (the Snakefile's onstart), and names the fix."""
    from dpscale.plan import cluster
    default = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    assert f"{cluster.SERIAL_RESOURCE}=1" in default["resources"]
    assert "resources" not in yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert cluster.serialised_on_cluster(True, {"measure": 1}) is None             # a workstation: meant
    assert cluster.serialised_on_cluster(False, {"_cores": 8}) is None            # --workflow-profile
    line = cluster.serialised_on_cluster(False, {"measure": 1, "_cores": 8})
    assert "one at a time" in line and "--workflow-profile profiles/slurm" in line
    assert "dscluster.serialised_on_cluster(" in (REPO / "Snakefile").read_text()
