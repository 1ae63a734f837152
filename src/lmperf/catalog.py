"""The built-in report sections, each declared once (lmperf.declare): its jobs, how it plans them
from the config at a scale (each job's spec from lmperf.specs), its config defaults
(config/sections/<name>.yaml: its grids and its thresholds, under what config/config.yaml and the
command line set: `with_defaults`), and its report side. In
report order: the report shows them so, and the workflow plans their result files so. `load`
gives the whole list: these, then those of the modules config `sections` names.
Imports neither torch nor triton, nor any benchmark or report module: the Snakefile reads it.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from lmperf import declare, specs
from lmperf.declare import (PRIORITY_CHECK, PRIORITY_LONG_WARMS, PRIORITY_WARMS, Job, PlanContext, Planned,
                            Section)

# config/: config.yaml (what a user sets) and sections/<name>.yaml (each built-in section's defaults)
CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"

# Scaling across GPUs: one torchrun job per study and process count
DISTRIBUTED_STUDIES = ("allreduce", "ddp")


def check_job(section: str, labels: dict | None = None, providers: bool = False) -> Job:
    """A kernel's correctness check: `python -m lmperf.bench.<section> check`, in its workers. It
    checks ours and the provider modules' kernels, never a user's contenders (their own check job
    does): their files are none of its inputs, so an edit to a student's code leaves it as it is."""
    return Job(f"{section}_check", "check", f"{section}/check.csv",
               "check --spec {params.spec:q} --workers {params.workers}", grid="check", workers=True,
               threads="workers", priority=PRIORITY_CHECK, providers=providers, contenders=False,
               labels={"job": "check"} if labels is None else labels or None)


def _check_plan(section: str, spec) -> callable:
    """The plan of a section whose one job is its check, where its grid at the scale has one."""
    def plan(ctx: PlanContext) -> list[Planned]:
        grid = ctx.grid(section)
        return [Planned(f"{section}_check", "check", spec(ctx.config, grid))] if "check" in grid else []
    return plan


def _plan_env(ctx):
    return [Planned("env", "env")]


def _plan_e2e(ctx):
    """One job a study and size: a study's `sizes` in every run, its `deep_sizes` in the deep
    target's alone."""
    if not ctx.runs("e2e"):
        return []
    e2e = ctx.grid("e2e")
    jobs = [(study, size, deep) for study, spec in e2e["studies"].items()
            for deep, sizes in ((False, spec.get("sizes", [])), (True, spec.get("deep_sizes", [])))
            for size in sizes]
    return [Planned("e2e_study", study, specs.e2e_spec(ctx.config, e2e, study, size), size,
                    {"study": study, "size": size}, deep=deep) for study, size, deep in jobs]


def _plan_ladder(ctx):
    ladder = ctx.grid("ladder")
    # a scale's `cases` (rung patterns) reach the job as --cases, not in its spec
    grid = {k: v for k, v in ladder.items() if k != "cases"}
    return [Planned("ladder_size", "ladder", specs.ladder_spec(ctx.config, grid, size), size, {"size": size},
                    cases=tuple(ladder.get("cases", ()))) for size in ladder["sizes"]]


def _plan_convergence(ctx):
    if "size" not in ctx.grid("convergence"):  # a scale without a convergence size has no job
        return []
    return [Planned("convergence_run", "convergence", specs.convergence_spec(ctx.config, ctx.scale))]


def _plan_flash_attention(ctx):
    fa, config = ctx.grid("flash_attention"), ctx.config
    planned = [Planned("flash_attention_check", "check", specs.fa_check_spec(fa, config)),
               *(Planned("flash_attention_bench", "bench", specs.fa_bench_spec(fa, config["models"], job, config),
                         wildcards={"job": job}) for job in specs.fa_bench_jobs(fa, config["models"]))]
    if "deep" in fa:  # the deep target's grid (its `deep`), its jobs as the bench's
        deep = {"bench": fa["deep"]}
        planned += [Planned("flash_attention_bench", "bench", specs.fa_bench_spec(deep, config["models"], job, config),
                            wildcards={"job": job}, deep=True) for job in specs.fa_bench_jobs(deep, config["models"])]
    return planned


def _plan_attention(ctx):
    """The attention job at the scale's grid, and the deep target's (its `deep`: PyTorch's own
    attention alone, dtypes and N to the first out-of-memory case) where the scale has one."""
    if not ctx.runs("attention"):
        return []
    grid = ctx.grid("attention")
    planned = [Planned("attention", "attention",
                       specs.attention_spec(ctx.config, {k: v for k, v in grid.items() if k != "deep"}))]
    if "deep" in grid:
        planned.append(Planned("attention_deep", "attention_deep", specs.attention_spec({}, grid["deep"]), deep=True))
    return planned


def _plan_lrpe(ctx):
    lrpe = ctx.grid("lrpe")
    return [Planned("lrpe_check", "check", specs.lrpe_check_spec(lrpe)),
            *(Planned("lrpe_bench", "bench", specs.lrpe_bench_spec(lrpe, g["dims"]), wildcards={"dims": g["dims"]})
              for g in lrpe["bench"]["grids"])]


def _plan_adamw_master(ctx):
    if not ctx.runs("adamw_master"):
        return []
    return [Planned("adamw_master_check", "check", specs.adamw_master_check_spec(ctx.config, ctx.grid("adamw_master")))]


def _one_job(section: str, spec=None):
    """The plan of a section with one job named after it (its study too)."""
    def plan(ctx: PlanContext) -> list[Planned]:
        if not ctx.runs(section):
            return []
        return [Planned(section, section, spec(ctx.config, ctx.grid(section)) if spec else None)]
    return plan


def _plan_distributed(ctx):
    if not ctx.runs("distributed"):
        return []
    dist = ctx.grid("distributed")
    return [Planned("distributed_study", study, specs.distributed_spec(ctx.config, dist, study), str(n),
                    {"study": study, "procs": n}, folder=folder)
            for folder in ctx.distributed for study in DISTRIBUTED_STUDIES for n in dist[study]["procs"]]


def _plan_contenders(ctx):
    from lmperf import contenders
    if not contenders.normalise(ctx.config.get("contenders")):  # a user's contenders: their checks
        return []
    return [Planned("contenders_study", study, contenders.study_spec(ctx.config, ctx.scale, study),
                    wildcards={"study": study}) for study in contenders.STUDIES]


def _contender_files(config: dict) -> dict:
    from lmperf import contenders
    return {"contenders": contenders.code_inputs(config.get("contenders"))}


SECTIONS = [
    Section(
        "env", doc="the machine, the libraries, the scale, each section's commits and GPU minutes",
        jobs=(Job("env", "bench", "env/env.csv", "--scale {params.scale}", spec=False,
                  params=lambda scale: {"scale": scale}),),
        plan=_plan_env, subcategory="Environment"),
    Section("correctness", doc="every kernel's check rows: worst error against its tolerance"),
    Section(
        "contenders", doc="a user's contenders (config `contenders`) checked against float64 and one process",
        jobs=(Job("contenders_study", "check", "contenders/{study}.csv", "{wildcards.study} --spec {params.spec:q}",
                  priority=PRIORITY_CHECK, labels={"study": "{study}"}, inputs=_contender_files),),
        plan=_plan_contenders, subcategory="Contenders"),
    Section(
        "e2e", doc="model sizes timed per phase: fp32 and bf16, eager and compiled, warm-up and context",
        jobs=(Job("e2e_study", "bench", "e2e/{study}/{size}.csv",
                  "--study {wildcards.study} --size {wildcards.size} --spec {params.spec:q}",
                  labels={"study": "{study}", "model": "{size}"}),),
        plan=_plan_e2e, figures={"step_vs_size": "e2e_step_vs_size.png", "step_vs_context": "e2e_step_vs_context.png"},
        model=True, subcategory="End-to-end timings"),
    Section(
        "ladder", doc="one model size from the assignment's setting to the GPU's limit, one change a rung",
        jobs=(Job("ladder_size", "bench", "ladder/{size}.csv",
                  "--size {wildcards.size} --spec {params.spec:q} --workers {params.workers}",
                  workers=True, threads="warm", priority=PRIORITY_LONG_WARMS, providers=True, cases=True,
                  repeatable=True, labels={"model": "{size}"}),),
        plan=_plan_ladder, figures={"ladder": "e2e_ladder.png"}, model=True, subcategory="The ladder"),
    Section(
        "convergence", doc="the FP8 rung's losses against bf16 over a fixed token stream",
        jobs=(Job("convergence_run", "bench", "convergence/convergence.csv", "--spec {params.spec:q}"),),
        plan=_plan_convergence, figures={"convergence": "convergence_loss.png"}, deep=True,
        subcategory="FP8 convergence"),
    Section(
        "profile", doc="torch.profiler over training steps, phase by phase",
        jobs=(Job("profile", "bench", "profile/profile.csv", "--spec {params.spec:q}"),),
        plan=_one_job("profile", specs.profile_spec), model=True, subcategory="Kernel-level profile"),
    Section(
        "memory", doc="peak memory and the snapshot timeline of one step",
        jobs=(Job("memory", "bench", "memory/memory.csv", "--spec {params.spec:q}",
                  # one snapshot page per case (not in git) and one picture of it (kept)
                  outputs={"html": "memory/html", "snapshots": "memory/snapshots"}),),
        plan=_one_job("memory", specs.memory_spec), figures={"memory": "memory_timelines.png"}, model=True,
        subcategory="Memory"),
    Section(
        "precision", doc="accumulation in fp32 and fp16, autocast's dtypes",
        jobs=(Job("precision", "bench", "precision/precision.csv", "", spec=False),),
        plan=_one_job("precision"), model=True, subcategory="Mixed precision"),
    Section(
        "attention", doc="PyTorch attention, eager and compiled: time and memory",
        jobs=(Job("attention", "bench", "attention/attention.csv", "--spec {params.spec:q} --workers {params.workers}",
                  workers=True, threads="warm", priority=PRIORITY_LONG_WARMS, providers=True),
              Job("attention_deep", "bench", "attention/deep.csv", "--spec {params.spec:q} --workers {params.workers}",
                  grid="deep", workers=True, threads="warm", priority=PRIORITY_LONG_WARMS)),
        plan=_plan_attention, figures={"attention": "attention_vs_seq_len.png"},
        model=True, subcategory="Attention in PyTorch"),
    Section(
        "flash_attention", doc="our FlashAttention-2 checked against float64 and timed against its peers",
        jobs=(check_job("flash_attention", providers=True),
              Job("flash_attention_bench", "bench", "flash_attention/bench/{job}.csv",
                  "bench --spec {params.spec:q} --workers {params.workers}", grid="bench", workers=True,
                  threads="warm", priority=PRIORITY_WARMS, providers=True, repeatable=True, labels={"job": "{job}"})),
        plan=_plan_flash_attention, figures={"fa_tflops": "fa_tflops_vs_seq_len.png", "fa_ratio": "fa_ours_over_peer.png"},
        kernel=True, subcategory="FlashAttention-2"),
    Section(
        "lrpe", doc="multi-dimensional LRPE-cosine checked and timed against the copy bandwidth",
        jobs=(check_job("lrpe"),
              Job("lrpe_bench", "bench", "lrpe/bench_{dims}d.csv", "bench --spec {params.spec:q} --workers {params.workers}",
                  grid="bench", workers=True, threads="workers", repeatable=True, labels={"job": "bench {dims}-D"})),
        plan=_plan_lrpe, figures={"lrpe_bandwidth": "lrpe_bandwidth.png"}, kernel=True, subcategory="LRPE-cosine"),
    # kernels without a section of their own: their check rows are in the correctness section
    Section(
        "adamw_master", doc="the master-weight AdamW checked against float64 and fused AdamW",
        jobs=(check_job("adamw_master", labels={}),), plan=_plan_adamw_master, report=False, kernel=True,
        subcategory="AdamW with fp32 masters"),
    Section(
        "fused", doc="the fused RMSNorm, SwiGLU and RoPE kernels checked against float64",
        jobs=(check_job("fused"),), plan=_check_plan("fused", specs.fused_check_spec), report=False, kernel=True,
        subcategory="Fused kernels"),
    Section(
        "float8_delayed", doc="our float8 matmuls with delayed scaling checked against float64",
        jobs=(check_job("float8_delayed"),),
        plan=_check_plan("float8_delayed", lambda config, grid: specs.float8_delayed_check_spec(grid)),
        report=False, kernel=True, subcategory="Float8 training"),
    Section(
        "distributed", doc="all-reduce bandwidth and data-parallel training over several processes",
        jobs=(Job("distributed_study", "study", "distributed/{study}_n{procs}.csv",
                  "{wildcards.study} --spec {params.spec:q}", providers=True, repeatable=True,
                  labels={"study": "{study}", "processes": "{procs}"},
                  constraints={"study": "|".join(DISTRIBUTED_STUDIES), "procs": r"\d+"},
                  make_spec=lambda config, grid, w: specs.distributed_spec(config, grid, w["study"])),),
        plan=_plan_distributed, figures={"dist_busbw": "distributed_busbw_vs_size.png",
                                         "dist_step_vs_gpus": "distributed_step_vs_gpus.png"},
        multi_gpu=True, cases_module="lmperf.bench.distributed.{study}", subcategory="Scaling across GPUs"),
    # its jobs are the timing jobs' own, planned from config `repeats` (lmperf.repeats, rules/repeats.smk)
    Section("repeats", doc="headline cases measured again in fresh processes (config `repeats`)", deep=True,
            multi_gpu=True),
]


# The sections outside the package that this process has loaded (`load` with a config): a later
# `load()` without one (the report's freshness check, the run-cost model) finds them too, as
# lmperf.providers keeps the providers a config adds.
_LOADED: list[Section] = []


def load(config: dict | None = None) -> list[Section]:
    """The sections: the built-in ones, then those of the modules config `sections` names (each
    module's `SECTION`), in that order; without a config, those loaded so far."""
    extra = list(_LOADED) if config is None else [extra_section(name) for name in config.get("sections", [])]
    sections = [*SECTIONS, *extra]
    names = [s.name for s in sections]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"config: sections: {', '.join(dup)} declared twice")
    rules = [j.rule for s in sections for j in s.jobs]
    if dup := sorted({r for r in rules if rules.count(r) > 1} | (set(rules) & set(names) - declare.own_rules(sections))):
        raise ValueError(f"config: sections: rule names {', '.join(dup)} taken twice")
    if config is not None:
        _LOADED[:] = extra
    return sections


def extra_section(module: str) -> Section:
    """The declaration of a section outside the package: `module`'s SECTION (ValueError naming the
    module where it has none)."""
    try:
        found = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"config: sections: cannot import {module!r} ({e}); is its folder on PYTHONPATH?") from None
    section = getattr(found, "SECTION", None)
    if not isinstance(section, Section):
        raise ValueError(f"config: sections: {module} has no SECTION = lmperf.declare.Section(...)")
    return section


def schema_part(config: dict, sections: list[Section], config_dir: Path = CONFIG_DIR) -> dict:
    """`config` less the keys of the sections outside the package (config/schema.yaml knows the
    built-in ones only), after filling every section's with its defaults (`with_defaults`)."""
    own = {s.name for s in sections} - builtin_names()
    with_defaults(config, sections, config_dir)
    return {k: v for k, v in config.items() if k not in own}


def merged(base: dict, over: dict) -> dict:
    """`over` set on `base`: mappings merged key by key, anything else (a list, a value) replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def section_defaults(sections: list[Section], config_dir: Path = CONFIG_DIR) -> dict:
    """The config the sections declare: a built-in section's file config/sections/<name>.yaml (its
    keys, and its thresholds under `report`), another's `defaults` ({scale: grid}) under its name."""
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML has it: 8x faster
    out: dict = {}
    for s in sections:
        path = Path(config_dir) / "sections" / f"{s.name}.yaml"
        if s.name in builtin_names() and path.is_file():
            out = merged(out, yaml.load(path.read_text(), Loader=loader) or {})
        elif s.defaults:
            out = merged(out, {s.name: s.defaults})
    return out


def read_config(path: Path = CONFIG_DIR / "config.yaml") -> dict:
    """A config file set on the built-in sections' defaults (config/sections/ beside it): the config
    as Snakemake has it before the schema fills the keys left out and the sections of config
    `sections` add theirs (lmperf.report.render.load_config does both)."""
    import yaml
    path = Path(path)
    return with_defaults(yaml.safe_load(path.read_text()), list(SECTIONS), path.parent)


def with_defaults(config: dict, sections: list[Section], config_dir: Path = CONFIG_DIR) -> dict:
    """`config` (in place) set on its sections' defaults (`section_defaults`, `merged`): a key the
    config sets wins, a mapping it sets in part keeps the defaults' other keys."""
    for key, value in merged(section_defaults(sections, config_dir), dict(config)).items():
        config[key] = value
    return config


def builtin_names() -> set[str]:
    return {s.name for s in SECTIONS}
