"""What each job asks of a cluster (profiles/slurm, docs/cluster.md), and the check that a
cluster run knows which machine it measures.

The rules declare these resources themselves (`resources: **cluster.job(SCALE, threads)`), not a
profile: Snakemake replaces a profile's whole `default-resources` with any `--default-resources`
given on the command line, and its whole `set-resources` with any `--set-resources`, so values
kept there vanish when a user sets one. A rule's own resources stay; `--set-resources
<rule>:<resource>=<value>` changes that one. A local run counts only `gpu` (profiles/default caps
it at one) and the cores; the others are what snakemake-executor-plugin-slurm turns into sbatch's
--mem, -t and --cpus-per-task.

Importing this module does not import torch: the Snakefile uses it at parse time.
"""
from __future__ import annotations

# What one job of each kind asks for, by scale: CPUs (per GPU for a multi-GPU job), memory in MB
# (likewise), wall time in minutes. A smoke job is a tiny model on one CPU core (about a minute;
# torch and a compile worker or two stay under 4 GB); a full one a 2.7B model or a long attention
# grid on one GPU: a CPU core for each compile worker (`threads`, the config's `workers`), at
# least 8, and host memory for the model's weights and optimizer state before they move.
JOBS = {
    "benchmark": {"smoke": {"cpus": 1, "mem_mb": 4000, "runtime": 30},
                  "full": {"cpus": 8, "mem_mb": 64000, "runtime": 60}},
    # one torchrun process a GPU (Gloo's all-reduce runs on the CPU)
    "distributed": {"smoke": {"cpus": 1, "mem_mb": 3000, "runtime": 30},
                    "full": {"cpus": 8, "mem_mb": 32000, "runtime": 60}},
    # the report: CSVs in, markdown and figures out; no GPU
    "report": {"smoke": {"cpus": 1, "mem_mb": 4000, "runtime": 30},
               "full": {"cpus": 2, "mem_mb": 16000, "runtime": 30}},
}


def _ask(kind: str, scale: str) -> dict:
    """The kind's resources at `scale`; the quick scale's jobs are the full one's models and
    shapes, fewer of them, so they ask what a full job asks."""
    return JOBS[kind]["full" if scale == "quick" else scale]


def job(scale: str, kind: str = "benchmark") -> dict:
    """A one-GPU (or no-GPU) job's resources at `scale`: `cpus_per_task` is its threads (its
    compile workers) where they are more than the kind's CPUs. The rule declares `gpu` itself."""
    ask = _ask(kind, scale)
    return {"cpus_per_task": lambda wildcards, threads: max(threads, ask["cpus"]),
            "mem_mb": ask["mem_mb"], "runtime": ask["runtime"]}


def per_gpu_job(scale: str) -> dict:
    """A multi-GPU job's resources at `scale` (its rule has a `procs` wildcard: GPUs = torchrun
    processes). The plugin asks sbatch for one task a GPU (--ntasks-per-gpu=1), each of
    `cpus_per_task` CPUs, so that is the CPUs of one rank, not of the job. `mpi` makes the job
    run its command in the batch step, which holds every CPU and GPU of the allocation: without
    it the plugin starts the command with `srun -n1`, which under --ntasks-per-gpu=1 starts one
    copy of it a GPU. `nodes=1`: torchrun --standalone starts its ranks on one machine."""
    ask = _ask("distributed", scale)
    return {"cpus_per_task": ask["cpus"], "mem_mb": lambda wildcards: ask["mem_mb"] * int(wildcards.procs),
            "runtime": ask["runtime"], "nodes": 1, "mpi": "torchrun"}


def unknown_machine(config: dict, gpu: str | None, local: bool) -> str | None:
    """Why a run cannot start: its jobs run on other machines (a cluster executor: `local` is
    False), this one has no GPU, and config `hw` or `scale` is left to `auto`, which would
    resolve to this machine (cpu, smoke) rather than to the nodes the jobs run on. None when the
    run may start."""
    auto = [key for key in ("hw", "scale") if config[key] == "auto"]
    if local or gpu or not auto:
        return None
    return (f"the jobs run on cluster nodes, and this machine has no GPU to tell their hardware and "
            f"scale: config {' and '.join(auto)} {'are' if len(auto) > 1 else 'is'} 'auto'. Name them, "
            f"e.g. --config hw=h100-80gb-hbm3 scale=full (hw: the GPU's name as results/ folders "
            f"spell it; scale=smoke with hw=cpu measures tiny models on CPU nodes)")


def ensure_user() -> None:
    """USER as the login name where the environment has none (a container, su, some CI runners):
    the Slurm executor plugin reads it to find the account, and stops with KeyError without it."""
    import getpass
    import os
    if not os.environ.get("USER"):
        os.environ["USER"] = getpass.getuser()
