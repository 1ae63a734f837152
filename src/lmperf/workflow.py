"""Helpers for the Snakemake workflow (rules/*.smk): config checks, the machine's name and
scale, each benchmark rule's command, code inputs and params. Imports neither torch nor triton,
so planning stays fast."""
from __future__ import annotations

import json

from lmperf import hardware, sources


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
    for scale, fa in config["flash_attention"].items():
        for group in fa["bench"]["groups"]:
            unknown = [m for m in group.get("models", []) if m not in config["models"]]
            if unknown:
                raise ValueError(f"config: flash_attention.{scale}.bench group {group['name']!r} names "
                                 f"sizes {unknown}, which are not under models: {sorted(config['models'])}")
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


# Inductor's and Triton's compile caches of a benchmark job: one pair per results folder, under
# .cache/<hw>/ in the repository (ignored by git), not the machine-wide /tmp/torchinductor_<user>
# that every checkout and user shares (a bad entry there would fail every run on the machine).
COMPILE_CACHES = ('TORCHINDUCTOR_CACHE_DIR="$PWD/.cache/{params.hw}/inductor" '
                  'TRITON_CACHE_DIR="$PWD/.cache/{params.hw}/triton"')


def bench(args: str) -> str:
    """A benchmark rule's shell command (its CSV output named `csv`):
    `python -m lmperf.bench.<args>` with the results folder's compile caches, then the tail every
    benchmark shares: where to write, provenance, the log, and the library versions the
    benchmark must find (it refuses to run with others)."""
    return (f"{COMPILE_CACHES} python -m lmperf.bench.{args} --out {{output.csv}} --hw {{params.hw}} "
            "--log {log} --expect-torch {params.torch} --expect-triton {params.triton}")


def code_inputs(module: str) -> list[str]:
    """The code inputs of a rule whose command runs `python -m <module>`: the source files of
    every lmperf module it can import (lmperf.sources), as paths from the repository root."""
    return [str(path.relative_to(sources.SRC.parent)) for path in sources.files(module)]


def results_of(rule) -> list[str]:
    """The result CSVs of a section's rule: a job's outputs, or an aggregate rule's inputs."""
    return [str(f) for f in (rule.output or rule.input) if str(f).endswith(".csv")]


def e2e_jobs(e2e: dict) -> list[tuple[str, str]]:
    """(study, size) of every end-to-end job: one CSV each."""
    return [(study, size) for study, spec in e2e["studies"].items() for size in spec["sizes"]]


def e2e_spec(config: dict, e2e: dict, study: str, size: str) -> str:
    """The JSON spec of one e2e job: a rerun trigger for exactly what that job measures."""
    spec = e2e["studies"][study]
    models = {size: config["models"][size]}
    if "ladder" in spec:
        return json.dumps({"ladder": spec["ladder"], "models": models}, sort_keys=True)
    return json.dumps({"batch_size": e2e["batch_size"], "timed_steps": e2e["timed_steps"],
                       "attention": spec["attention"], "grid": spec["grid"], "models": models},
                      sort_keys=True)


def fa_bench_jobs(fa: dict, models: dict) -> dict[str, dict]:
    """{'<group>_d<D>': spec} : one benchmark job per group and head dim; a group of model
    sizes is one job '<group>', its sizes resolved to their dims."""
    jobs = {}
    for group in fa["bench"]["groups"]:
        if "models" in group:
            jobs[group["name"]] = {"groups": [{**group, "models": {m: models[m] for m in group["models"]}}]}
            continue
        for d in group["head_dims"]:
            jobs[f"{group['name']}_d{d}"] = {"groups": [{**group, "head_dims": [d]}]}
    return jobs


def fa_check_spec(fa: dict) -> str:
    return json.dumps(fa["check"], sort_keys=True)


def fa_bench_spec(fa: dict, models: dict, job: str) -> str:
    return json.dumps(fa_bench_jobs(fa, models)[job], sort_keys=True)


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
