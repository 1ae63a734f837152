"""profiles/slurm: what each job asks sbatch for (a dry run), the check that a cluster run names
its machine, and (marked slow) the smoke workflow run through a one-node Slurm
(tests/slurm_cluster.py), every job seen in sacct. The commands are those of docs/cluster.md,
the partition and the machine (hw=cpu scale=smoke) aside."""
import csv
import os
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, copy_repo, snakemake

import slurm_cluster
from lmperf import cluster, hardware
from lmperf.report.sections import DEEP

PROFILE = ("--profile", "profiles/slurm", "--workflow-profile", "none")
# docs/cluster.md's options with the test cluster's partition and a CPU node's machine
ON_CLUSTER = (*PROFILE, "--default-resources", f"slurm_partition={slurm_cluster.PARTITION}",
              "--config", "hw=cpu", "scale=smoke")


def documented_command() -> list[str]:
    """docs/cluster.md's first command (its arguments after `snakemake`), the test cluster's
    partition and a CPU node's hw and scale in place of the GPU cluster's."""
    block = re.search(r"```sh\n(.*?)```", (REPO / "docs" / "cluster.md").read_text(), re.S)[1]
    command = next(line for line in block.replace("\\\n", " ").splitlines() if line.startswith("snakemake "))
    ours = {"slurm_partition": slurm_cluster.PARTITION, "hw": "cpu", "scale": "smoke"}
    return [re.sub(r"^(\w+)=.*", lambda m: f"{m[1]}={ours[m[1]]}" if m[1] in ours else m[0], arg)
            for arg in shlex.split(command)[1:]]


def test_the_documented_command_is_the_one_the_slurm_test_runs():
    args = documented_command()
    assert [a for a in args if a not in ON_CLUSTER] == ["report/report.md", "distributed"]
    assert [a for a in args if a in ON_CLUSTER] == list(ON_CLUSTER)


def job_resources(out: str, rule: str) -> dict[str, dict]:
    """{output: {resource: value}} of each job of `rule` in a dry run's listing."""
    jobs = {}
    for m in re.finditer(rf"rule {rule}:\n(.*?)\n\n", out + "\n\n", re.S):
        output = re.search(r"output: (\S+)", m[1])[1].rstrip(",")
        listed = re.search(r"resources: ([^\n]*)", m[1])[1]
        jobs[output] = dict(kv.split("=", 1) for kv in listed.split(", "))
    return jobs


def test_rules_declare_what_each_job_asks_and_command_line_resources_keep_it(tmp_path):
    """A dry run with profiles/slurm and the partition given on the command line (which
    replaces the profile's default-resources): every job keeps its memory, wall time and CPUs
    (the rules declare them), each multi-GPU job asks one GPU and one CPU a process and runs in its
    batch step (mpi, one node), the report no GPU, and a --set-resources changes one resource of
    one rule only. The executor plugin must be installed: the profile names it."""
    try:
        from snakemake_executor_plugin_slurm.utils import set_gres_string
    except ImportError:
        pytest.fail("snakemake-executor-plugin-slurm is missing: envs/setup.sh installs it "
                    "(envs/requirements.txt)")
    repo = copy_repo(tmp_path / "lmperf")
    out = snakemake(repo, "-n", "--forceall", *documented_command(), "--set-resources", "report:runtime=5").stdout
    smoke = cluster.JOBS["benchmark"]["smoke"]
    benchmarks = job_resources(out, "e2e_study") | job_resources(out, "flash_attention_bench")
    assert len(benchmarks) >= 2
    for output, res in benchmarks.items():
        assert res["slurm_partition"] == "debug" and res["gpu"] == "1", output
        assert (res["mem_mb"], res["runtime"], res["cpus_per_task"]) == (
            str(smoke["mem_mb"]), str(smoke["runtime"]), "1"), output
    dist = job_resources(out, "distributed_study")
    assert sorted(Path(o).name for o in dist) == ["allreduce_n2.csv", "ddp_n1.csv", "ddp_n2.csv"]
    per_rank = cluster.JOBS["distributed"]["smoke"]
    for output, res in dist.items():
        procs = int(re.search(r"_n(\d+)\.csv", output)[1])
        assert res["gpu"] == str(procs) and res["cpus_per_task"] == str(per_rank["cpus"]), output
        assert res["mem_mb"] == str(procs * per_rank["mem_mb"]) and res["nodes"] == "1", output
        assert res["mpi"] == "torchrun" and res["slurm_partition"] == "debug", output
    (report,) = job_resources(out, "report").values()
    assert "gpu" not in report and report["runtime"] == "5"
    assert report["mem_mb"] == str(cluster.JOBS["report"]["smoke"]["mem_mb"])
    resources = type("Resources", (dict,), {"__getattr__": dict.get})
    assert set_gres_string(SimpleNamespace(resources=resources(gpu=2))) == " --gpus=2"


def test_full_scale_jobs_ask_for_a_gpu_nodes_share():
    full = cluster.job("full")
    assert full["mem_mb"] == 64000 and full["runtime"] == 60
    assert full["cpus_per_task"](None, threads=1) == 8 and full["cpus_per_task"](None, threads=12) == 12
    dist = cluster.per_gpu_job("full")
    assert dist["cpus_per_task"] == 8 and dist["mem_mb"](SimpleNamespace(procs="4")) == 4 * 32000


def test_a_cluster_run_from_a_host_without_a_gpu_must_name_hw_and_scale():
    auto = {"hw": "auto", "scale": "auto"}
    assert cluster.unknown_machine(auto, None, local=True) is None  # a local CPU run: cpu, smoke
    assert cluster.unknown_machine(auto, "NVIDIA H200", local=False) is None  # the login node's GPU
    assert cluster.unknown_machine({"hw": "h200", "scale": "full"}, None, local=False) is None
    why = cluster.unknown_machine({"hw": "auto", "scale": "smoke"}, None, local=False)
    assert "config hw is 'auto'" in why and "--config hw=" in why


def test_the_slurm_profile_refuses_to_start_without_hw_and_scale_on_a_host_without_a_gpu(tmp_path):
    """The profile's run (not a dry run) with hw and scale left to auto stops before submitting
    anything, saying what to give; SLURM_CONF names no file, so that nothing can be submitted
    if the check were missing."""
    if hardware.gpu_name():
        pytest.skip(f"this host has a GPU ({hardware.gpu_name()}): auto names the run after it")
    repo = copy_repo(tmp_path / "lmperf")
    proc = snakemake(repo, "env", *PROFILE, "--default-resources", "slurm_partition=debug", check=False,
                     env={"SLURM_CONF": str(tmp_path / "no-slurm.conf"), "USER": "lmperf"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "lmperf: not starting: the jobs run on cluster nodes" in out and "--config hw=" in out, out[-3000:]
    assert "has been submitted" not in out and not (repo / "results").exists()


# ---------------------------------------------------------------------------------------------
# A one-node Slurm


@pytest.fixture(scope="session")  # its tests' group starts with built_repo's (tests/conftest.py)
def slurm(tmp_path_factory):
    """A one-node Slurm with 2 fake GPUs and this machine's CPUs, up for this module's tests.
    Skipped where it cannot start (not root, the packages missing), unless LMPERF_SLURM_REQUIRED
    is set (.ci/run sets it once it has installed them): then that is a failure."""
    why = slurm_cluster.missing()
    if why:
        if os.environ.get("LMPERF_SLURM_REQUIRED") == "1":
            pytest.fail(f"LMPERF_SLURM_REQUIRED=1, but {why}", pytrace=False)
        pytest.skip(why)
    with slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm"), gpus=2) as cluster_:
        yield cluster_


def submitted(out: str) -> dict[str, str]:
    """{Slurm job id: rule} of each job Snakemake's slurm executor reports it submitted (its
    Slurm log is .snakemake/slurm_logs/rule_<rule>/...)."""
    return {m[1]: m[2] for m in re.finditer(
        r"has been submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/rule_(\w+)/", out)}


def case_rows(results: Path) -> dict[str, list[str]]:
    """{CSV path under results/cpu: its rows' ids, sorted}: case_id where a CSV has it, else key."""
    rows = {}
    for path in sorted(results.rglob("*.csv")):
        if ".journal" in path.parts:
            continue
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            column = "case_id" if "case_id" in reader.fieldnames else reader.fieldnames[0]
            rows[str(path.relative_to(results))] = sorted(row[column] for row in reader)
    return rows


@pytest.mark.slow
def test_smoke_workflow_through_slurm_every_job_completed_in_sacct(slurm, tmp_path, request):
    """docs/cluster.md's command on the one-node Slurm (SLURM_CONF and USER set, as the docs
    say): first for the `distributed` target alone (multi-GPU jobs: one batch step each), then
    as written, for the whole smoke report. Every job Snakemake ran outside its own process went through sbatch, and sacct lists
    each COMPLETED under its rule; the results hold the cases of a local run's (built_repo) and
    the report has its headings. Its jobs mostly wait for the plugin's checks in sacct, so it
    runs on a worker of its own while built_repo is built on another, and asks for that only at
    the end."""
    repo = copy_repo(tmp_path / "lmperf")
    (repo / ".cache").symlink_to(REPO / ".cache")  # the compile caches, which built_repo's run fills too
    runs = [snakemake(repo, *args, env=slurm.env, timeout=1800)
            for args in (["distributed", *ON_CLUSTER], documented_command())]
    built_repo = request.getfixturevalue("built_repo")
    outs = [run.stdout + run.stderr for run in runs]
    jobs = {job: rule for out in outs for job, rule in submitted(out).items()}
    # Snakemake lists a job it runs in its own process as `localrule` (the target rules), any other as `rule`
    assert len(jobs) == sum(len(re.findall(r"^rule \w+:", out, re.M)) for out in outs), outs[-1][-3000:]
    assert sorted(r for r in jobs.values() if r == "distributed_study") == ["distributed_study"] * 3
    assert "report" in jobs.values() and "env" in jobs.values()

    accounted = {row["JobID"]: row for row in slurm.sacct()}
    assert sorted(accounted, key=int) == sorted(jobs, key=int)  # nothing else ran on the cluster
    states = {job: accounted.get(job, {}).get("State") for job in jobs}
    assert all(state == "COMPLETED" for state in states.values()), states
    for job, rule in jobs.items():  # the plugin's comment names the rule (and the wildcards)
        assert accounted[job]["Comment"].startswith(f"rule_{rule}"), (job, rule, accounted[job])
    dist = [accounted[j] for j, r in jobs.items() if r == "distributed_study"]
    assert sorted(re.search(r"gres/gpu=(\d+)", row["AllocTRES"])[1] for row in dist) == ["1", "2", "2"]

    # built_repo's run is the deep one (tests/conftest.py's SMOKE); the documented command runs the
    # standard depth, which leaves the deep target's files out: its sections (repeats, convergence)
    # and the files other sections' plans mark deep (the end-to-end compile study's)
    local, on_slurm = built_repo / "results" / "cpu", repo / "results" / "cpu"
    from lmperf import workflow
    from lmperf.report import render
    files = workflow.result_files(render.load_config(REPO / "config" / "config.yaml"), "results/cpu", "smoke",
                                  ["results/cpu"])
    deep = {os.path.relpath(f.path, "results/cpu") for f in workflow.deep_files(files)}
    assert set(DEEP) <= {k.split("/")[0] for k in deep} and "e2e/compile/tiny.csv" in deep
    standard = {k: v for k, v in case_rows(local).items() if k not in deep}
    assert case_rows(on_slurm) == standard
    headings = [[line for line in (r / "report" / "report.md").read_text().splitlines() if line.startswith("#")]
                for r in (repo, built_repo)]
    assert headings[0] == headings[1]
    print(f"\n{len(jobs)} Slurm jobs, all COMPLETED in sacct:")
    for job in sorted(jobs, key=int):
        print(f"  {job:>4} {accounted[job]['State']:<10} {accounted[job]['Elapsed']} {accounted[job]['Comment']}")
