"""Each benchmark job's spec: the JSON its rule passes (`--spec`), from the config, holding
exactly what the job measures (a rerun trigger: what a job measures changes, it reruns), and
the job lists of the sections with several. lmperf.workflow.result_files pairs each with its
result file; the rules read them from there. Imports neither torch nor triton."""
from __future__ import annotations

import json

from lmperf import providers


def e2e_jobs(e2e: dict) -> list[tuple[str, str]]:
    """(study, size) of every end-to-end job: one CSV each."""
    return [(study, size) for study, spec in e2e["studies"].items() for size in spec["sizes"]]


def e2e_spec(config: dict, e2e: dict, study: str, size: str) -> str:
    """The JSON spec of one e2e job: a rerun trigger for exactly what that job measures."""
    spec = e2e["studies"][study]
    steps = {k: e2e[k] for k in ("timed_steps", "min_timed_steps", "timed_window_s", "median_within") if k in e2e}
    return json.dumps({"batch_size": e2e["batch_size"], **steps, "attention": spec["attention"],
                       "grid": spec["grid"], "models": {size: config["models"][size]}}, sort_keys=True)


def ladder_spec(config: dict, ladder: dict, size: str) -> str:
    """The JSON spec of one ladder job (one model size): the ladder's settings and that size's
    dims, so that adding a size reruns no other size's job; a user's contenders where the config
    names any (each a rung of its own)."""
    settings = _measured(ladder, "sizes")
    return json.dumps(with_contenders({**settings, "models": {size: config["models"][size]}}, config), sort_keys=True)


def convergence_spec(config: dict, scale: str) -> str:
    """The JSON spec of the convergence job at `scale`: its settings, the ladder's (whose FP8 rung
    and the rung before it it trains), its size's dims, and a user's contenders where the config
    names any (rungs of the ladder job: the runs' rung labels are that job's numbers)."""
    conv, ladder = config["convergence"][scale], config["ladder"][scale]
    settings = _measured(ladder, "sizes")
    return json.dumps(with_contenders({**conv, "ladder": settings, "models": {conv["size"]: config["models"][conv["size"]]}},
                                      config), sort_keys=True)


def fa_bench_jobs(fa: dict, models: dict) -> dict[str, dict]:
    """{'<group>_d<D>': spec} : one benchmark job per group and head dim; a group of model
    sizes is one job '<group>', its sizes resolved to their dims. Groups of one name that reach
    the same head dim are one job (e.g. the grid's bf16 rows at every head dim and its fp32 rows
    at one: its job at that head dim runs both). A group that names its `job` runs in that one at
    every head dim (one process start for a few short cases)."""
    jobs: dict[str, dict] = {}
    for group in fa["bench"]["groups"]:
        job = group.get("job")
        group = {k: v for k, v in group.items() if k != "job"}  # where it runs, not what it measures
        if "models" in group:
            jobs.setdefault(job or group["name"], {"groups": []})["groups"].append(
                {**group, "models": {m: models[m] for m in group["models"]}})
            continue
        for d in group["head_dims"]:
            jobs.setdefault(job or f"{group['name']}_d{d}", {"groups": []})["groups"].append({**group, "head_dims": [d]})
    return jobs


def workers(settings: dict) -> int:
    """A check's or bench's worker processes (`--workers`, bench/workers.py): how a job runs, not
    what it measures, so a param of their own and never part of a spec (`_measured`)."""
    return settings.get("workers", 1)


def warm_threads(settings: dict, local: bool) -> int:
    """The cores a job that warms its compiles in worker processes declares (its rule's
    `threads:`): on a cluster node its workers' (lmperf.cluster asks for them); in a local run one.
    Its workers run only in its warm-up, about a minute of a job that then waits for the device
    alone for minutes: holding their cores for the whole job kept the next warming jobs out of
    the in-flight slots, and timing jobs took them (an H100 run's ladder started 3 minutes after
    the checks and warmed alone, 86 s: tools/data/side_by_side_h100/at_669075a)."""
    return 1 if local else workers(settings)


def _measured(settings: dict, *leave_out: str) -> dict:  # what a check's or bench's cases measure
    return {k: v for k, v in settings.items() if k not in ("workers", *leave_out)}


def with_provider_modules(spec: dict, config: dict | None) -> dict:
    """A spec of a job that runs providers, with the config's `provider_modules` where it names
    any (the job loads them; a spec without them stays as it was)."""
    modules = providers.modules_of(config or {})
    return {**spec, "provider_modules": modules} if modules else spec


def fa_check_spec(fa: dict, config: dict | None = None) -> str:
    return json.dumps(with_provider_modules(_measured(fa["check"]), config), sort_keys=True)


def fa_bench_spec(fa: dict, models: dict, job: str, config: dict | None = None) -> str:
    return json.dumps(with_contenders(with_provider_modules(fa_bench_jobs(fa, models)[job], config), config),
                      sort_keys=True)


def attention_spec(config: dict, attention: dict) -> str:
    """The JSON spec of the PyTorch-attention job: its grid, with the config's contenders."""
    return json.dumps(with_contenders(_measured(attention), config), sort_keys=True)


def with_contenders(spec: dict, config: dict | None) -> dict:
    """A spec of a job that runs a user's contenders (lmperf.contenders) beside ours, with them
    and their time limit per case where the config names any (a spec without them stays as it was)."""
    from lmperf import contenders
    named = contenders.normalise((config or {}).get("contenders"))
    if not named:
        return spec
    return {**spec, "contenders": named, "contender_time_limit_s": config.get("contender_time_limit_s", 600),
            "contender_call_budget_s": config.get("contender_call_budget_s", 0.5)}


def provider_inputs(config: dict, contenders: bool = True) -> list[str]:
    """The files of the providers the config's `provider_modules` add: code inputs of every job
    that can run them (lmperf.providers.sources); with `contenders`, the user's contenders' files
    too (lmperf.contenders.code_inputs)."""
    from lmperf import contenders as contenders_mod
    providers.load_config(config)
    theirs = contenders_mod.code_inputs(config.get("contenders")) if contenders else []
    return sorted(set(providers.sources()) | set(theirs))


def lrpe_check_spec(lrpe: dict) -> str:
    return json.dumps(_measured(lrpe["check"]), sort_keys=True)


def lrpe_bench_spec(lrpe: dict, dims: str) -> str:
    """The spec of one benchmark job: the shared settings and the grid with `dims` axes."""
    bench = _measured(lrpe["bench"], "grids")
    grid = next(g for g in lrpe["bench"]["grids"] if g["dims"] == int(dims))
    return json.dumps({**bench, **grid}, sort_keys=True)


def adamw_master_check_spec(config: dict, adamw: dict) -> str:
    """The check's settings, its sizes resolved to their dims."""
    check = _measured(adamw["check"], "sizes")
    return json.dumps({**check, "models": {s: config["models"][s] for s in adamw["check"]["sizes"]}}, sort_keys=True)


def fused_check_spec(config: dict, fused: dict) -> str:
    """The check's settings, the model cases' sizes resolved to their dims."""
    check = _measured(fused["check"])
    model = {**check["model"], "models": {s: config["models"][s] for s in check["model"]["sizes"]}}
    return json.dumps({**check, "model": model}, sort_keys=True)


def float8_delayed_check_spec(float8: dict) -> str:
    return json.dumps(_measured(float8["check"]), sort_keys=True)


def profile_spec(config: dict, prof: dict) -> str:
    models = {c["size"]: config["models"][c["size"]] for c in prof["cases"]}
    return json.dumps({**prof, "models": models}, sort_keys=True)


def memory_spec(config: dict, mem: dict) -> str:
    return json.dumps({**mem, "model": config["models"][mem["size"]]}, sort_keys=True)


def distributed_spec(config: dict, dist: dict, study: str) -> str:
    """One study's spec (the process count is the job's, not the spec's), with the model dims."""
    spec = {k: v for k, v in dist[study].items() if k != "procs"}
    if study == "ddp":
        spec["models"] = {s: config["models"][s] for s in spec["sizes"]}
        spec = with_contenders(spec, config)  # a user's DDP, FSDP and sharded optimizer, variants beside ours
    return json.dumps(spec, sort_keys=True)
