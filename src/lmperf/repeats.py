"""The workflow's repeats (rules/repeats.smk): some cases of a timing job measured again, each
time in a fresh process, with the job's own command and spec and `--cases` (bench/jobs.py).

    repeats:                       # config/sections/repeats.yaml
      full:
        processes: 2               # fresh processes, beyond the job's own (a job may set its own)
        jobs:
          - {job: lrpe/bench_1d, cases: [1d-n32768-l0-*]}

A job is named by its results file under its results folder, without .csv: results/<hw>/ for
one GPU, the multi-GPU folder results/<gpu>-x<count>/ for `distributed/...` (the `study` jobs, rules/jobs.smk);
its repeats are <folder>/repeats/<job>/run<k>.csv, k = 1 ... processes. Files are
lmperf.workflow.ResultFile (section `repeats`, `repeat_of` the job's, `cases` the patterns).
Imports nothing heavy: the Snakefile plans with it.
"""
from __future__ import annotations

import dataclasses

from lmperf import catalog, declare


def repeatable(sections: list | None = None) -> set[str]:
    """The rules of the timing jobs whose command takes --cases (bench/jobs.py), as declared."""
    return {j.rule for s in sections or catalog.load() for j in s.jobs if j.repeatable}


def folder(f, results: str) -> str:
    """The results folder of a job's file: a multi-GPU job's own (results/<gpu>-x<count>)."""
    return results if f.path.startswith(results + "/") else f.path.rsplit(f"/{f.section}/", 1)[0]


def repeat_files(config: dict, results: str, scale: str, files: list, sections: list | None = None) -> list:
    """The ResultFiles of config `repeats.<scale>`, from the jobs' own among `files` (a
    ValueError names a job that is not one of them, or not a timing job declared repeatable)."""
    repeats = config.get("repeats", {}).get(scale)
    if not repeats or repeats.get("run", True) is False:  # none at this scale ({run: false}: quick's)
        return []
    rules = repeatable(sections)
    by_job = {f.path[len(folder(f, results)) + 1:-len(".csv")]: f for f in files
              if f.path.startswith(folder(f, results) + "/")}
    out = []
    for entry in repeats["jobs"]:
        job = by_job.get(entry["job"])
        if job is None or job.rule not in rules:
            timing = sorted(j for j, f in by_job.items() if f.rule in rules)
            raise ValueError(f"config: repeats.{scale}.jobs names {entry['job']!r}, which is not a timing job "
                             f"of this configuration whose cases can run alone: {', '.join(timing)}")
        out += [dataclasses.replace(job, path=f"{folder(job, results)}/repeats/{entry['job']}/run{k}.csv",
                                    section="repeats", repeat_of=job, cases=tuple(entry["cases"]))
                for k in range(1, entry.get("processes", repeats["processes"]) + 1)]
    return out


def check(files: list, scale: str) -> None:
    """Every case pattern of a repeat selects a case of its job (ValueError naming it): a typo
    fails at planning, not after the GPU has started."""
    for f in files:
        try:
            f.case_ids()
        except ValueError as e:
            raise ValueError(f"config: repeats.{scale}: job {f.repeat_of.path}: {e}") from None


def by_run(files: list) -> dict:
    """{(job, k): its repeat's ResultFile} of the repeats among `files` (rules/repeats.smk's wildcards)."""
    runs = {}
    for f in files:
        if f.section == "repeats":
            job, run = f.path.split("/repeats/", 1)[1][:-len(".csv")].rsplit("/", 1)
            runs[job, run.removeprefix("run")] = f
    return runs


def job_command(f, sections: list | None = None) -> str:
    """The arguments of `python -m lmperf.bench.` before --spec in the command that writes the
    timing job `f`: its declared arguments (lmperf.declare.Job.args) up to --spec, its
    wildcards filled."""
    section, job = declare.job(sections or catalog.load(), f.rule)
    prefix = "lmperf.bench."
    if not job.repeatable or not section.bench_module.startswith(prefix) or " --spec" not in f" {job.args}":
        raise ValueError(f"{f.path}: a {f.section} job cannot run some of its cases alone")
    args = f" {job.args}".split(" --spec", 1)[0].strip()
    filled = args.replace("{wildcards.", "{").format(**dict(f.wildcards))
    return " ".join(filter(None, [section.bench_module.removeprefix(prefix), filled]))
