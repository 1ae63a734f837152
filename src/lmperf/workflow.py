"""Helpers for the Snakemake workflow (rules/*.smk): the machine's name and scale (and whether
it can measure them), each benchmark rule's command, code inputs and params, and the result
files a full run promises with the cases each must hold (the renderer reads them too). The
config's cross-field checks are lmperf.planning's. Imports neither torch nor triton, so
planning stays fast (the case lists of the ladder and e2e do: they are cached, `listed_case_ids`)."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass

from lmperf import hardware, providers, repeats, sources
from lmperf.specs import (  # noqa: F401 (each job's spec: the rules and tests call them as wf.<name>)
    e2e_jobs, e2e_spec, ladder_spec, convergence_spec, fa_bench_jobs, workers, with_provider_modules,
    fa_check_spec, fa_bench_spec, provider_inputs, lrpe_check_spec, lrpe_bench_spec, adamw_master_check_spec,
    fused_check_spec, float8_delayed_check_spec, profile_spec, memory_spec, distributed_spec, attention_spec,
    with_contenders)


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
    return config.get(section, {}).get(scale, {}).get("run", True) is not False


def deep_files(files) -> list:
    """The deep target's result files among `files`: those of the sections marked deep in
    lmperf.report.sections (the repeats, the FP8 rung's convergence)."""
    from lmperf.report.sections import DEEP
    return [f for f in files if f.section in DEEP]


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


def section_code_inputs(section: str) -> list[str] | None:
    """The code inputs of the benchmark rule that writes a section's rows (`python -m
    lmperf.bench.<section>`); None where no benchmark module has that name."""
    module = f"lmperf.bench.{section}"
    return code_inputs(module) if sources.module_file(module) is not None else None


# ---------------------------------------------------------------------------------------------
# Scaling across GPUs (rules/distributed.smk): one torchrun job per study and process count

DISTRIBUTED_STUDIES = ("allreduce", "ddp")


def distributed_hw(config: dict) -> str:
    """The results folder of the multi-GPU section: '<gpu>-x<count>' ('h200-x2') so that boxes
    with different GPU counts never mix, 'cpu' without a GPU, or config `hw` when it is set."""
    if config["hw"] != "auto":
        return config["hw"]
    return hardware.machine_slug(hardware.gpu_name(), hardware.gpu_count())


def distributed_csvs(results: str, dist: dict) -> list[str]:
    """Every CSV of the section at one scale: <results>/distributed/<study>_n<procs>.csv."""
    return [result_path(results, "distributed_study", study=study, procs=n)
            for study in DISTRIBUTED_STUDIES for n in dist[study]["procs"]]


# ---------------------------------------------------------------------------------------------
# What a full run promises: every result CSV of one machine and scale, and the cases each holds


# The result-file layout: the CSV each benchmark rule writes, under its results folder, by rule
# name, its wildcards in braces. The rules take their `output:` from here (`output`) and
# result_files formats the same patterns (`result_path`): one source, so the rules' outputs and
# the files the renderer expects cannot disagree.
LAYOUT = {
    "env": "env/env.csv",
    "e2e_study": "e2e/{study}/{size}.csv",
    "ladder_size": "ladder/{size}.csv",
    "convergence_run": "convergence/convergence.csv",
    "flash_attention_check": "flash_attention/check.csv",
    "flash_attention_bench": "flash_attention/bench/{job}.csv",
    "lrpe_check": "lrpe/check.csv",
    "lrpe_bench": "lrpe/bench_{dims}d.csv",
    "adamw_master_check": "adamw_master/check.csv",
    "fused_check": "fused/check.csv",
    "float8_delayed_check": "float8_delayed/check.csv",
    "attention": "attention/attention.csv",
    "precision": "precision/precision.csv",
    "profile": "profile/profile.csv",
    "memory": "memory/memory.csv",
    "distributed_study": "distributed/{study}_n{procs}.csv",
    "contenders_study": "contenders/{study}.csv",
}


def output(folder: str, rule: str) -> str:
    """The `output:` pattern of a benchmark rule (its wildcards in braces), under `folder`."""
    return f"{folder}/{LAYOUT[rule]}"


def result_path(folder: str, rule: str, **wildcards) -> str:
    """One CSV of a benchmark rule: its `output` pattern with the wildcards filled."""
    return output(folder, rule).format(**wildcards)


@dataclass(frozen=True)
class ResultFile:
    """One result CSV a full run writes: its path, the benchmark's section and study, and the
    job's spec (the JSON its rule passes) with its size (e2e) or process count (distributed); a
    repeat's job and case patterns (lmperf.repeats); the rule that writes it and its wildcards
    (`LAYOUT`)."""
    path: str
    section: str
    study: str
    spec: str | None = None
    arg: str | None = None
    repeat_of: ResultFile | None = None
    cases: tuple[str, ...] = ()  # a repeat's, or a job's own --cases: shell-style patterns of its case ids
    rule: str = ""
    wildcards: tuple[tuple[str, str], ...] = ()

    def case_ids(self) -> list[str] | None:
        """The case ids its job writes rows for, from the benchmark's own case list over the
        spec (`listed_case_ids`); None for env.csv, a key/value table."""
        if self.section == "env":
            return None
        if self.repeat_of is not None:  # the job's cases the patterns select (ValueError if one selects none)
            from lmperf.bench.jobs import select
            return [c["case_id"] for c in select([{"case_id": c} for c in self.repeat_of.case_ids()], list(self.cases))]
        listed = listed_case_ids(self.section, self.study, self.spec, self.arg)
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


def listed_case_ids(section: str, study: str, spec: str | None, arg: str | None) -> list[str]:
    """The case ids of one job, from the cache or from lmperf.bench.<section>'s case list."""
    module = f"lmperf.bench.distributed.{study}" if section == "distributed" else f"lmperf.bench.{section}"
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


def _file(folder: str, rule: str, section: str, study: str, spec: str | None = None, arg: str | None = None,
          wildcards: dict | None = None) -> ResultFile:
    wildcards = wildcards or {}
    return ResultFile(result_path(folder, rule, **wildcards), section, study, spec, arg, rule=rule,
                      wildcards=tuple((k, str(v)) for k, v in wildcards.items()))


def result_files(config: dict, results: str, scale: str, distributed: list[str]) -> list[ResultFile]:
    """Every CSV a full run at `scale` writes into `results` (results/<hw>) and, for the
    multi-GPU section, into each of the `distributed` folders (results/<gpu>-x<count>, or
    results/cpu), with their jobs' specs: the rules' jobs (rules/*.smk take their outputs'
    patterns from `LAYOUT`, their specs and the files of each section from here); by hand, the
    renderer derives the files a run promises from it."""
    from lmperf import contenders
    providers.load_config(config)  # the providers the config adds: the report's columns read them too
    contenders.register(config.get("contenders"))  # and a user's contenders
    models, e2e, fa = config["models"], config["e2e"][scale], config["flash_attention"][scale]
    lrpe, dist = config["lrpe"][scale], config["distributed"][scale]
    files = [_file(results, "env", "env", "env")]
    if runs(config, "e2e", scale):
        files += [_file(results, "e2e_study", "e2e", study, e2e_spec(config, e2e, study, size), size,
                        {"study": study, "size": size})
                  for study, size in e2e_jobs(e2e)]
    ladder = config["ladder"][scale]
    # a scale's `cases` (rung patterns) reach the job as --cases, not in its spec (rules/ladder.smk)
    ladder_grid = {k: v for k, v in ladder.items() if k != "cases"}
    files += [dataclasses.replace(_file(results, "ladder_size", "ladder", "ladder", ladder_spec(config, ladder_grid, size),
                                        size, {"size": size}), cases=tuple(ladder.get("cases", ())))
              for size in ladder["sizes"]]
    if "size" in config.get("convergence", {}).get(scale, {}):  # a scale without a convergence size has no job
        files.append(_file(results, "convergence_run", "convergence", "convergence", convergence_spec(config, scale)))
    files.append(_file(results, "flash_attention_check", "flash_attention", "check", fa_check_spec(fa, config)))
    files += [_file(results, "flash_attention_bench", "flash_attention", "bench", fa_bench_spec(fa, models, job, config),
                    wildcards={"job": job}) for job in fa_bench_jobs(fa, models)]
    files.append(_file(results, "lrpe_check", "lrpe", "check", lrpe_check_spec(lrpe)))
    files += [_file(results, "lrpe_bench", "lrpe", "bench", lrpe_bench_spec(lrpe, g["dims"]),
                    wildcards={"dims": g["dims"]})
              for g in lrpe["bench"]["grids"]]
    if runs(config, "adamw_master", scale):
        files.append(_file(results, "adamw_master_check", "adamw_master", "check",
                           adamw_master_check_spec(config, config["adamw_master"][scale])))
    if "check" in config["fused"][scale]:  # a scale without a fused check has no job
        files.append(_file(results, "fused_check", "fused", "check", fused_check_spec(config, config["fused"][scale])))
    if "check" in config["float8_delayed"][scale]:  # a scale without a float8 check has no job
        files.append(_file(results, "float8_delayed_check", "float8_delayed", "check",
                           float8_delayed_check_spec(config["float8_delayed"][scale])))
    if runs(config, "attention", scale):
        files.append(_file(results, "attention", "attention", "attention", attention_spec(config, config["attention"][scale])))
    if runs(config, "precision", scale):
        files.append(_file(results, "precision", "precision", "precision"))
    files += [_file(results, "profile", "profile", "profile", profile_spec(config, config["profile"][scale])),
              _file(results, "memory", "memory", "memory", memory_spec(config, config["memory"][scale]))]
    for folder in distributed if runs(config, "distributed", scale) else []:
        files += [_file(folder, "distributed_study", "distributed", study, distributed_spec(config, dist, study), str(n),
                        {"study": study, "procs": n})
                  for study in DISTRIBUTED_STUDIES for n in dist[study]["procs"]]
    if contenders.normalise(config.get("contenders")):  # a user's contenders: their checks
        files += [_file(results, "contenders_study", "contenders", study, contenders.study_spec(config, scale, study),
                        wildcards={"study": study}) for study in contenders.STUDIES]
    return files + repeats.repeat_files(config, results, scale, files)


def check_cases(files, scale: str) -> None:
    """Every `cases` pattern of a job's grid selects one of its cases (ValueError naming it): a
    typo fails at planning, not after the GPU has started."""
    for f in files:
        if f.cases and f.repeat_of is None:
            try:
                f.case_ids()
            except ValueError as e:
                raise ValueError(f"config: {f.section}.{scale}.cases: job {f.path}: {e}") from None


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


def checked_results(files: tuple[ResultFile, ...], dag) -> list[str]:
    """The paths of `files`, for the report rule's input function: it runs while Snakemake
    builds the DAG, the moment to check the results. A damaged one (cut short, emptied, not a
    results table, other cases than its job promises) is newer than its inputs, so Snakemake
    would keep it: it is named and its job forced to rerun, by adding it to the DAG's forced
    files (which --forcerun fills: Snakemake reads --forcerun only after the Snakefile, and
    reruns no job whose output is merely older than its inputs, since it compares their
    checksums). A missing one is forced too: Snakemake plans no job for a missing input of a
    report that is newer than the inputs it has (one rendered after its results, or a copy
    whose files share one time), so a deleted result would otherwise stay missing and the
    report keep numbers no file holds."""
    dag.forcefiles.update(_damaged(files))
    dag.forcefiles.update(_missing(files))
    return [f.path for f in files]


def _missing(files: tuple[ResultFile, ...]) -> tuple[str, ...]:
    return tuple(f.path for f in files if not os.path.exists(f.path))


@functools.cache
def _damaged(files: tuple[ResultFile, ...]) -> tuple[str, ...]:
    """The damaged ones among `files`, each named once on stderr."""
    from lmperf.report import validate
    found = validate.damaged(files)
    for path, problem in found.items():
        print(f"lmperf: {path} {problem}; its job is forced to rerun", file=sys.stderr)
    return tuple(found)
