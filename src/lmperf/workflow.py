"""Helpers for the Snakemake workflow (rules/*.smk): the machine's name and scale (and whether
it can measure them), each benchmark rule's command, code inputs and params from its job's
declaration (lmperf.declare, lmperf.catalog), and the result files a full run promises with the
cases each must hold (the renderer reads them too). The
config's cross-field checks are lmperf.planning's. Imports neither torch nor triton, so
planning stays fast (the case lists of the ladder and e2e do: they are cached, `listed_case_ids`)."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass

from lmperf import catalog, declare, hardware, providers, repeats, sources
from lmperf.catalog import DISTRIBUTED_STUDIES  # noqa: F401 (rules/repeats.smk's wildcard)
from lmperf.specs import (  # noqa: F401 (each job's spec: the rules and tests call them as wf.<name>)
    e2e_jobs, e2e_spec, ladder_spec, convergence_spec, fa_bench_jobs, workers, with_provider_modules,
    fa_check_spec, fa_bench_spec, provider_inputs, lrpe_check_spec, lrpe_bench_spec, adamw_master_check_spec,
    fused_check_spec, float8_delayed_check_spec, profile_spec, memory_spec, distributed_spec, attention_spec,
    with_contenders, warm_threads)


SCALES = ("smoke", "quick", "full")
# The quick scale's results folder is the machine's with this suffix (results/<hw>-quick), and
# its report report/quick/report.md: neither overwrites nor mixes with the full run's.
QUICK_SUFFIX = "-quick"
DEPTHS = ("standard", "deep")


def machine(config: dict) -> tuple[str, str]:
    """(hw, scale): the results folder name and the grid scale, 'auto' resolved."""
    gpu = hardware.gpu_name()
    scale = config["scale"] if config["scale"] != "auto" else ("full" if gpu else "smoke")
    hw = config["hw"] if config["hw"] != "auto" else hardware.hw_slug(gpu) + (QUICK_SUFFIX if scale == "quick" else "")
    return hw, scale


def report_path(scale: str) -> str:
    """The report the workflow renders at `scale`: the quick scale's has a folder of its own."""
    return "report/quick/report.md" if scale == "quick" else "report/report.md"


def runs(config: dict, section: str, scale: str) -> bool:
    """Whether `section` has jobs at `scale`: not where its entry is {run: false} (the quick
    scale's sections that the summary does not read) or missing (a section with nothing to
    set, `precision`, runs at every scale)."""
    return declare.PlanContext(config, scale, "").runs(section)


def deep_files(files) -> list:
    """The deep target's result files among `files`: those of the sections declared deep
    (lmperf.catalog: the repeats, the FP8 rung's convergence) and those a section's plan marks
    deep (the end-to-end sizes beyond the standard run's)."""
    deep = {s.name for s in catalog.load() if s.deep}
    return [f for f in files if f.section in deep or f.deep]


def run_files(files, depth: str) -> list:
    """The result files a run at `depth` needs (the report rule's inputs): all of them when
    deep, else all but the deep target's, which are then neither measured nor deleted."""
    deep = {f.path for f in deep_files(files)} if depth != "deep" else set()
    return [f for f in files if f.path not in deep]


def measured_scale(results: str) -> str:
    """The scale a results folder was measured at, from its env/env.csv (key `scale`); a
    ValueError naming the file where it cannot be read."""
    import csv
    path = os.path.join(results, "env", "env.csv")
    try:
        with open(path, newline="") as f:
            scale = {row["key"]: row["value"] for row in csv.DictReader(f)}.get("scale")
    except (OSError, KeyError) as exc:
        raise ValueError(f"{path}: cannot read the scale these results were measured at ({exc})") from None
    if scale not in SCALES:
        raise ValueError(f"{path}: no scale ({', '.join(SCALES)}) in it: {scale!r}")
    return scale


def cannot_measure(hw: str, scale: str, gpu: str | None) -> str | None:
    """Why a machine whose GPU is `gpu` (None: no CUDA GPU) cannot run the benchmarks of
    results/<hw> at `scale`, or None when it can. Snakemake deletes a job's old CSV before the
    job starts, so a benchmark that then refuses would lose a result: the workflow stops
    before any job instead (rules/common.smk)."""
    if gpu:
        return None
    if hw != "cpu":
        return (f"config hw={hw} names a GPU's results folder, but this machine has no CUDA GPU: "
                f"its benchmarks would refuse to run, after Snakemake had deleted the CSVs they "
                f"were to replace. To render those results here: python -m lmperf.report "
                f"--results results/{hw} --scale {scale}")
    if scale in ("full", "quick"):
        return (f"config scale={scale} on a machine without a CUDA GPU: the {scale} grids (models up to "
                "2.7B parameters, attention over 16,384 tokens and more) are measured on a GPU; "
                "use scale=smoke (the default without one)")
    return None


def refuse_to_measure(reason: str | None, jobs, local: bool) -> None:
    """Called when Snakemake starts running (onstart): raise if this machine cannot measure
    (`cannot_measure`) and a job that measures (one declaring the `gpu` resource) is about to
    run here. A dry run, a cluster executor (the jobs run elsewhere) and a run that only
    renders the report go on."""
    measuring = sorted({job.rule.name for job in jobs if job.resources.get("gpu", 0)})
    if reason and local and measuring:
        raise RuntimeError(f"lmperf: not starting: {reason}. Jobs that would measure: "
                           f"{', '.join(measuring)}. No file was touched.")


# Inductor's and Triton's compile caches of a benchmark job: one pair per results folder, under
# .cache/<hw>/ in the repository (ignored by git), not the machine-wide /tmp/torchinductor_<user>
# that every checkout and user shares (a bad entry there would fail every run on the machine).
COMPILE_CACHES = ('TORCHINDUCTOR_CACHE_DIR="$PWD/.cache/{params.hw}/inductor" '
                  'TRITON_CACHE_DIR="$PWD/.cache/{params.hw}/triton"')
# torchrun's jobs: the caches, and the GPU held for the whole run (lmperf.bench.device)
TORCHRUN = COMPILE_CACHES + " python -m lmperf.bench.device -- python -m torch.distributed.run"


def bench(args: str) -> str:
    """A benchmark rule's shell command (its CSV output named `csv`): `python -m
    lmperf.bench.<args>` with the results folder's compile caches, then the tail every benchmark
    shares (`run_module`)."""
    return run_module(f"lmperf.bench.{args}")


def run_module(args: str) -> str:
    """`python -m <args>` (a module and its arguments) with the results folder's compile caches,
    then the tail every benchmark shares: where to write, provenance, the log, and the library
    versions the benchmark must find (it refuses to run with others)."""
    return (f"{COMPILE_CACHES} python -m {args} --out {{output.csv}} --hw {{params.hw}} "
            "--log {log} --expect-torch {params.torch} --expect-triton {params.triton}")


def code_inputs(module: str) -> list[str]:
    """The code inputs of a rule whose command runs `python -m <module>`: the source files of
    every lmperf module it can import (lmperf.sources), as paths from the repository root (a
    module outside the package, a section's: its own file by its full path)."""
    root = sources.SRC.parent
    return [str(p.relative_to(root)) if p.is_relative_to(root) else str(p) for p in sources.files(module)]


def section_files(sections: list) -> list[str]:
    """The files of the sections outside the package: each one's declaring module (its report
    module), and its templates (inputs of the report rule)."""
    from pathlib import Path
    builtin = catalog.builtin_names()
    out = []
    for s in sections:
        if s.name not in builtin:
            out += [str(sources.outside_file(s.report_module) or s.report_module),
                    *(sorted(str(p) for p in Path(s.templates).glob("*.md.j2")) if s.templates else [])]
    return out


def section_code_inputs(section: str, sections: list | None = None) -> list[str] | None:
    """The code inputs of the benchmark rule that writes a section's rows (its declared bench
    module, lmperf.bench.<section> by default); None where it has no such module."""
    found = [s for s in sections or catalog.load() if s.name == section]
    module = found[0].bench_module if found else f"lmperf.bench.{section}"
    if sources.module_file(module) is None and (module.startswith("lmperf.") or sources.outside_file(module) is None):
        return None
    return code_inputs(module)


# ---------------------------------------------------------------------------------------------
# Scaling across GPUs (the `study` jobs): one torchrun job per study and process count


def distributed_hw(config: dict) -> str:
    """The results folder of the multi-GPU section: '<gpu>-x<count>' ('h200-x2') so that boxes
    with different GPU counts never mix, 'cpu' without a GPU, or config `hw` when it is set."""
    if config["hw"] != "auto":
        return config["hw"]
    return hardware.machine_slug(hardware.gpu_name(), hardware.gpu_count())


# ---------------------------------------------------------------------------------------------
# What a full run promises: every result CSV of one machine and scale, and the cases each holds


def layout(sections: list | None = None) -> dict[str, str]:
    """The result-file layout: the CSV each benchmark rule writes under its results folder, by
    rule name, its wildcards in braces, from the sections' declarations (lmperf.declare). The
    rules take their `output:` from here (`output`) and result_files formats the same patterns:
    one source, so the rules' outputs and the files the renderer expects cannot disagree."""
    return {j.rule: j.layout for s in sections or catalog.load() for j in s.jobs}


LAYOUT = layout(catalog.SECTIONS)  # the built-in sections'


def output(folder: str, rule: str, sections: list | None = None) -> str:
    """The `output:` pattern of a benchmark rule (its wildcards in braces), under `folder`."""
    return f"{folder}/{layout(sections)[rule]}"


@dataclass(frozen=True)
class ResultFile:
    """One result CSV a full run writes: its path, the benchmark's section and study, and the
    job's spec (the JSON its rule passes) with its size (e2e) or process count (distributed); a
    repeat's job and case patterns (lmperf.repeats); the rule that writes it and its wildcards
    (the declared layout); the module that lists its cases where the section is not built in."""
    path: str
    section: str
    study: str
    spec: str | None = None
    arg: str | None = None
    repeat_of: ResultFile | None = None
    cases: tuple[str, ...] = ()  # a repeat's, or a job's own --cases: shell-style patterns of its case ids
    rule: str = ""
    wildcards: tuple[tuple[str, str], ...] = ()
    module: str | None = None
    deep: bool = False  # the deep target's alone, in a section the standard run measures too

    def case_ids(self) -> list[str] | None:
        """The case ids its job writes rows for, from the benchmark's own case list over the
        spec (`listed_case_ids`); None for env.csv, a key/value table."""
        if self.section == "env":
            return None
        if self.repeat_of is not None:  # the job's cases the patterns select (ValueError if one selects none)
            from lmperf.bench.jobs import select
            return [c["case_id"] for c in select([{"case_id": c} for c in self.repeat_of.case_ids()], list(self.cases))]
        listed = listed_case_ids(self.section, self.study, self.spec, self.arg, self.module)
        if self.cases:  # a job that runs only some of its cases (a grid's `cases`: its --cases)
            from lmperf.bench.jobs import select
            return [c["case_id"] for c in select([{"case_id": c} for c in listed], list(self.cases))]
        return listed


# Planning lists the cases of every result file at each Snakemake call (the report rule's check
# of the results, the repeats' patterns), and the ladder's and e2e's case lists import
# lmperf.train, so torch (about 3 s). The lists are kept under .cache/case-ids/ (ignored by git),
# keyed by the job (section, study, spec, size or process count) and the sha256 of every file its
# benchmark module can import: an edit to any of them lists the cases again.
CASE_IDS_CACHE = sources.SRC.parent / ".cache" / "case-ids"


def listed_case_ids(section: str, study: str, spec: str | None, arg: str | None,
                    module: str | None = None) -> list[str]:
    """The case ids of one job, from the cache or from its benchmark module's case list (a
    built-in section's, lmperf.catalog, unless `module` names it)."""
    if module is None:
        found = [s for s in catalog.SECTIONS if s.name == section]
        module = found[0].case_module(study) if found else f"lmperf.bench.{section}"
    key = hashlib.sha256(json.dumps([section, study, spec, arg, sources.digest(module)]).encode()).hexdigest()
    path = CASE_IDS_CACHE / f"{key[:32]}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    ids = benchmark_case_ids(module, section, study, spec, arg)
    try:  # a cache that cannot be written (a read-only checkout) only costs the next planning its time
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_text(json.dumps(ids))
        os.replace(part, path)
    except OSError:
        pass
    return ids


def benchmark_case_ids(module: str, section: str, study: str, spec: str | None, arg: str | None) -> list[str]:
    """The case ids of one job from its benchmark module's own case list (what the cache keeps):
    `job_cases(study, spec, arg)`, the signature every benchmark module shares."""
    import importlib
    bench = importlib.import_module(module)
    return [c["case_id"] for c in bench.job_cases(study, json.loads(spec) if spec else None, arg)]


def planned_file(section, planned: declare.Planned, results: str, builtin: bool = True) -> ResultFile:
    """The ResultFile of one file a section's plan promises (under `results`, or its own folder)."""
    folder = planned.folder or results
    wildcards = {k: str(v) for k, v in planned.wildcards.items()}
    job = next(j for j in section.jobs if j.rule == planned.rule)
    return ResultFile(f"{folder}/{job.layout}".format(**wildcards), section.name, planned.study, planned.spec,
                      planned.arg, cases=tuple(planned.cases), rule=planned.rule, wildcards=tuple(wildcards.items()),
                      module=None if builtin else section.case_module(planned.study), deep=planned.deep)


def result_files(config: dict, results: str, scale: str, distributed: list[str],
                 sections: list | None = None) -> list[ResultFile]:
    """Every CSV a full run at `scale` writes into `results` (results/<hw>) and, for the
    multi-GPU section, into each of the `distributed` folders (results/<gpu>-x<count>, or
    results/cpu), with their jobs' specs: each declared section's plan (lmperf.declare; the
    built-in ones in lmperf.catalog, the config's `sections` after them), then the repeats of
    config `repeats`. The rules take their specs and the files of each section from here; by
    hand, the renderer derives the files a run promises from it."""
    from lmperf import contenders
    providers.load_config(config)  # the providers the config adds: the report's columns read them too
    contenders.register(config.get("contenders"))  # and a user's contenders
    sections = catalog.load(config) if sections is None else sections
    builtin = catalog.builtin_names()
    ctx = declare.PlanContext(config, scale, results, tuple(distributed))
    files = [planned_file(s, planned, results, s.name in builtin) for s in sections if s.plan for planned in s.plan(ctx)]
    return files + repeats.repeat_files(config, results, scale, files, sections)


def check_cases(files, scale: str) -> None:
    """Every `cases` pattern of a job's grid selects one of its cases (ValueError naming it): a
    typo fails at planning, not after the GPU has started."""
    for f in files:
        if f.cases and f.repeat_of is None:
            try:
                f.case_ids()
            except ValueError as e:
                raise ValueError(f"config: {f.section}.{scale}.cases: job {f.path}: {e}") from None


# ---------------------------------------------------------------------------------------------
# The generic rules of the job kinds (rules/jobs.smk): what each declared job's rule holds


def jobs(sections: list, kind: str) -> list[tuple]:
    """(section, job) of every declared job of `kind` (lmperf.declare.KINDS)."""
    return [(s, j) for s in sections for j in s.jobs if j.kind == kind]


def job_grid(config: dict, section, job, scale: str) -> dict:
    """A job's settings at `scale`: its part (`job.grid`) of its section's grid, empty where none
    (and where the section's config key holds no grid: `contenders` names the user's contenders)."""
    settings = config.get(section.name, {})
    grid = settings.get(scale, {}) if isinstance(settings, dict) else {}
    grid = grid if isinstance(grid, dict) else {}
    return grid.get(job.grid, {}) if job.grid else grid


def job_code(config: dict, section, job) -> list[str]:
    """A job's code inputs: every file its command's module can import, and the files of the
    providers the config adds where it runs providers (the contenders' files too, unless the job
    declares that it runs none of theirs: `Job.contenders`)."""
    contenders = job.providers if job.contenders is None else job.contenders
    return code_inputs(section.bench_module) + (provider_inputs(config, contenders) if job.providers else [])


def job_params(config: dict, section, job, scale: str) -> dict:
    """A job's params beyond its provenance and spec: its workers, its `cases`, its own (env's
    scale). Params are a rerun trigger: a job has only those its command reads."""
    grid = job_grid(config, section, job, scale)
    return {**({"workers": workers(grid)} if job.workers else {}), **(cases_params(grid) if job.cases else {}),
            **(job.params(scale) if job.params else {})}


def job_threads(config: dict, section, job, scale: str, local: bool) -> int:
    """A job's `threads:`: its worker processes' cores ("workers"), one in a local run for a job
    that warms its compiles in them ("warm", lmperf.specs.warm_threads), else one."""
    grid = job_grid(config, section, job, scale)
    return {"workers": workers(grid), "warm": warm_threads(grid, local)}.get(job.threads, 1)


def job_shell(config: dict, section, job, scale: str) -> str:
    """A check's or bench's shell command: `python -m <its module> <its arguments>` (with
    --cases where its grid names cases) and the tail every benchmark shares."""
    args = with_cases(job.args, job_grid(config, section, job, scale)) if job.cases else job.args
    return run_module(" ".join(filter(None, [section.bench_module, args])))


def study_shell(section, job) -> str:
    """A study's shell command: torchrun (run as `python -m torch.distributed.run`, the
    environment's own) over {wildcards.procs} processes of `python -m <its module> <its
    arguments>`, and the tail its benchmark takes."""
    return (TORCHRUN + " --standalone --nproc_per_node={wildcards.procs} "
            f"-m {section.bench_module} {job.args} --out {{output}} "
            "--hw {params.hw} --progress-log {log} --expect-torch {params.torch} --expect-triton {params.triton}")


def job_log(folder: str, job) -> str:
    return f"{folder}/{job.log_path()}"


def job_outputs(folder: str, job) -> dict:
    """A job's outputs beyond its CSV (memory's snapshot pages), as folders."""
    return {name: f"{folder}/{path}" for name, path in job.outputs.items()}


def constraints(files, job) -> dict:
    """A job's wildcard constraints: its declared ones (a study's), else the values each of its
    wildcards takes in `files`."""
    return job.constraints or {name: wildcard(files, job.rule, name) for name in job.wildcards}


def study_spec(config: dict, section, job, scale: str, wildcards) -> str:
    """A study's spec from the config and its wildcards (lmperf.declare.Job.make_spec)."""
    return job.make_spec(config, job_grid(config, section, job, scale), dict(wildcards.items()))


def aggregates(sections: list) -> list:
    """The sections with a rule of their own that asks for all their files (`snakemake e2e`):
    those with jobs, none of which is named after the section."""
    return [s for s in sections if s.jobs and s.name not in declare.own_rules([s])]


def cases_params(grid: dict) -> dict:
    """A timing rule's `cases` param where its grid at this scale names some (the quick scale's
    ladder), else none: the full and smoke jobs' params stay as they were (params rerun a job)."""
    return {"cases": list(grid["cases"])} if "cases" in grid else {}


def with_cases(args: str, grid: dict) -> str:
    """That rule's benchmark arguments, with `--cases` where its grid names cases."""
    return args + (" --cases {params.cases:q}" if "cases" in grid else "")


def paths(files, section: str) -> list[str]:
    """The paths of a section's result files among `files` (a section's rule: all of them)."""
    return [f.path for f in files if f.section == section]


def spec_of(files, path) -> str:
    """The spec of the job that writes `path` (a rule's params: `lambda w, output: ...`)."""
    found = [f for f in files if f.path == str(path)]
    if not found:
        raise ValueError(f"{path}: no job of this configuration writes it (lmperf.workflow.result_files)")
    return found[0].spec


def wildcard(files, rule: str, name: str) -> str:
    """The values `name` takes in `rule`'s result files, as a rule's wildcard constraint (a
    pattern that matches nothing where the rule has no job)."""
    import re
    values = sorted({v for f in files if f.rule == rule for k, v in f.wildcards if k == name})
    return "|".join(map(re.escape, values)) or "(?!)"


def checked_results(files: tuple[ResultFile, ...], dag, damaged) -> list[str]:
    """The paths of `files`, for the report rule's input function: it runs while Snakemake
    builds the DAG, the moment to check the results. A damaged one (cut short, emptied, not a
    results table, other cases than its job promises) is newer than its inputs, so Snakemake
    would keep it: it is named and its job forced to rerun, by adding it to the DAG's forced
    files (which --forcerun fills: Snakemake reads --forcerun only after the Snakefile, and
    reruns no job whose output is merely older than its inputs, since it compares their
    checksums). A missing one is forced too: Snakemake plans no job for a missing input of a
    report that is newer than the inputs it has (one rendered after its results, or a copy
    whose files share one time), so a deleted result would otherwise stay missing and the
    report keep numbers no file holds. `damaged(files) -> {path: problem}` is the report's own
    check (lmperf.report.validate.damaged, which the report rule passes: the workflow imports
    nothing of the report)."""
    dag.forcefiles.update(_damaged(files, damaged))
    dag.forcefiles.update(_missing(files))
    return [f.path for f in files]


def _missing(files: tuple[ResultFile, ...]) -> tuple[str, ...]:
    return tuple(f.path for f in files if not os.path.exists(f.path))


@functools.cache
def _damaged(files: tuple[ResultFile, ...], damaged) -> tuple[str, ...]:
    """The damaged ones among `files`, each named once on stderr."""
    found = damaged(files)
    for path, problem in found.items():
        print(f"lmperf: {path} {problem}; its job is forced to rerun", file=sys.stderr)
    return tuple(found)
