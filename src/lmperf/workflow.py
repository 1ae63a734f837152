"""Helpers for the Snakemake workflow (rules/*.smk): config checks, the machine's name and
scale, and each rule's params. Imports neither torch nor triton, so planning stays fast."""
from __future__ import annotations

import json

from lmperf import hardware


def check_config(config: dict) -> None:
    """Cross-field checks the JSON schema cannot express; raise ValueError naming the key."""
    for scale, prof in config["profile"].items():
        unknown = [c["size"] for c in prof["cases"] if c["size"] not in config["models"]]
        if unknown:
            raise ValueError(f"config: profile.{scale}.cases names sizes {unknown}, which are not "
                             f"under models: {sorted(config['models'])}")
    for scale, mem in config["memory"].items():
        if mem["size"] not in config["models"]:
            raise ValueError(f"config: memory.{scale}.size is {mem['size']!r}, which is not under "
                             f"models: {sorted(config['models'])}")
    for scale, lrpe in config["lrpe"].items():
        for i, grid in enumerate(lrpe["check"]["grids"]):
            if len(grid["shape"]) * grid["e"] < grid["d"]:
                raise ValueError(f"config: lrpe.{scale}.check.grids[{i}]: m * e = "
                                 f"{len(grid['shape'])} * {grid['e']} < d = {grid['d']}")
    for scale, e2e in config["e2e"].items():
        for study, spec in e2e["studies"].items():
            unknown = [s for s in spec["sizes"] if s not in config["models"]]
            if unknown:
                raise ValueError(f"config: e2e.{scale}.studies.{study}.sizes names {unknown}, "
                                 f"which are not under models: {sorted(config['models'])}")


def machine(config: dict) -> tuple[str, str]:
    """(hw, scale): the results folder name and the grid scale, 'auto' resolved."""
    gpu = hardware.gpu_name()
    hw = hardware.hw_slug(gpu) if config["hw"] == "auto" else config["hw"]
    scale = config["scale"] if config["scale"] != "auto" else ("full" if gpu else "smoke")
    return hw, scale


def e2e_csvs(results: str, e2e: dict) -> list[str]:
    return [f"{results}/e2e/{study}/{size}.csv"
            for study, spec in e2e["studies"].items() for size in spec["sizes"]]


def expected_csvs(config: dict, scale: str, results: str) -> list[str]:
    """Every results CSV a full run of the DAG writes at this scale (the report's inputs)."""
    fa, lrpe = config["flash_attention"][scale], config["lrpe"][scale]
    return [f"{results}/env/env.csv", *e2e_csvs(results, config["e2e"][scale]),
            f"{results}/flash_attention/check.csv",
            *[f"{results}/flash_attention/bench/{job}.csv" for job in fa_bench_jobs(fa)],
            f"{results}/lrpe/check.csv",
            *[f"{results}/lrpe/bench_{g['dims']}d.csv" for g in lrpe["bench"]["grids"]],
            *[f"{results}/{s}/{s}.csv" for s in ("attention", "precision", "profile", "memory")]]


def e2e_spec(config: dict, e2e: dict, study: str, size: str) -> str:
    """The JSON spec of one e2e job: a rerun trigger for exactly what that job measures."""
    spec = e2e["studies"][study]
    return json.dumps({"batch_size": e2e["batch_size"], "timed_steps": e2e["timed_steps"],
                       "attention": spec["attention"], "grid": spec["grid"],
                       "models": {size: config["models"][size]}}, sort_keys=True)


def fa_bench_jobs(fa: dict) -> dict[str, dict]:
    """{'<group>_d<D>': spec} : one benchmark job per group and head dim."""
    jobs = {}
    for group in fa["bench"]["groups"]:
        for d in group["head_dims"]:
            jobs[f"{group['name']}_d{d}"] = {"groups": [{**group, "head_dims": [d]}]}
    return jobs


def fa_check_spec(fa: dict) -> str:
    return json.dumps(fa["check"], sort_keys=True)


def fa_bench_spec(fa: dict, job: str) -> str:
    return json.dumps(fa_bench_jobs(fa)[job], sort_keys=True)


def lrpe_check_spec(lrpe: dict) -> str:
    return json.dumps(lrpe["check"], sort_keys=True)


def lrpe_bench_spec(lrpe: dict, dims: str) -> str:
    """The spec of one benchmark job: the shared settings and the grid with `dims` axes."""
    bench = {k: v for k, v in lrpe["bench"].items() if k != "grids"}
    grid = next(g for g in lrpe["bench"]["grids"] if g["dims"] == int(dims))
    return json.dumps({**bench, **grid}, sort_keys=True)


def profile_spec(config: dict, prof: dict) -> str:
    models = {c["size"]: config["models"][c["size"]] for c in prof["cases"]}
    return json.dumps({**prof, "models": models}, sort_keys=True)


def memory_spec(config: dict, mem: dict) -> str:
    return json.dumps({**mem, "model": config["models"][mem["size"]]}, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# Scaling across GPUs (rules/distributed.smk): one torchrun job per study and process count

DISTRIBUTED_STUDIES = ("allreduce", "ddp")


def check_distributed_config(config: dict) -> None:
    """The distributed section's sizes are model names (raise ValueError naming the key)."""
    for scale in ("full", "smoke"):
        unknown = [s for s in config["distributed"][scale]["ddp"]["sizes"] if s not in config["models"]]
        if unknown:
            raise ValueError(f"config: distributed.{scale}.ddp.sizes names {unknown}, which are "
                             f"not under models: {sorted(config['models'])}")


def distributed_hw(config: dict) -> str:
    """The results folder of the multi-GPU section: '<gpu>-x<count>' ('h200-x2') so that boxes
    with different GPU counts never mix, 'cpu' without a GPU, or config `hw` when it is set."""
    if config["hw"] != "auto":
        return config["hw"]
    return hardware.machine_slug(hardware.gpu_name(), hardware.gpu_count())


def distributed_csvs(results: str, dist: dict) -> list[str]:
    """Every CSV of the section at one scale: <results>/distributed/<study>_n<procs>.csv."""
    return [f"{results}/distributed/{study}_n{n}.csv"
            for study in DISTRIBUTED_STUDIES for n in dist[study]["procs"]]


def distributed_spec(config: dict, dist: dict, study: str) -> str:
    """One study's spec (the process count is the job's, not the spec's), with the model dims."""
    spec = {k: v for k, v in dist[study].items() if k != "procs"}
    if study == "ddp":
        spec["models"] = {s: config["models"][s] for s in spec["sizes"]}
    return json.dumps(spec, sort_keys=True)
