"""How a report section declares itself, once: its benchmark jobs (their kind, result files,
command and what they ask of the machine), how it plans them from the config at each scale, and
its report side (renderer, template, figures, captions). The workflow's rules, the result-file
layout, the report's list of sections, the run-cost model and the docs' table of sections are
derived from the list of declarations (lmperf.catalog.load); nothing else lists section names.

    SECTION = Section("mine", jobs=(Job("mine_bench", "bench", "mine/{size}.csv", "--size {wildcards.size} ..."),),
                      plan=plan)         # plan(ctx) -> [Planned(...)], one per result file

The built-in sections are declared in lmperf.catalog, which loads the list (`catalog.load`): a
section outside the package is a module named in config `sections` (importable from PYTHONPATH)
whose `SECTION` is its declaration; docs/architecture.md says how to add one. Imports no benchmark or report code: the Snakefile
reads it while planning.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# Job kinds, each with one generic rule (rules/jobs.smk):
#   check: correctness against a reference; shares the device with other checks, so it starts first
#   bench: one process timing or recording something, the device to itself
#   study: one job over several processes (torchrun), declaring as many GPUs
KINDS = ("check", "bench", "study")
# Which ready job Snakemake starts first (a rule's `priority:`; rules/common.smk says why)
PRIORITY_CHECK = 20
PRIORITY_WARMS = 10
PRIORITY_LONG_WARMS = 11  # the ladder's and PyTorch attention's warm-ups, the longest


@dataclass(frozen=True)
class Job:
    """One benchmark rule of a section: its rule name and kind, the CSV it writes under its results
    folder (`layout`, its wildcards in braces), and its command's arguments after `python -m
    <the section's bench module>` (Snakemake's placeholders: {params.spec:q}, {wildcards.size});
    the CLI tail every benchmark shares (--out, --hw, --log, the versions) is added to it."""
    rule: str
    kind: str
    layout: str
    args: str
    grid: str | None = None          # its settings within the section's grid at a scale (None: the grid itself)
    spec: bool = True                # passes its spec (`--spec`, a param: a rerun trigger)
    workers: bool = False            # passes its grid's `workers` (a param)
    threads: str | None = None       # "workers": its workers' cores; "warm": lmperf.specs.warm_threads; None: one
    priority: int | None = None      # None: Snakemake's default
    providers: bool = False          # the config's provider modules are code inputs (it runs providers)
    contenders: bool | None = None   # the user's contenders' files are code inputs too (None: as `providers`)
    cases: bool = False              # runs only its grid's `cases` where the grid names some (--cases)
    repeatable: bool = False         # a timing job whose cases can run alone (config `repeats`)
    labels: dict | None = None       # `snakemake --report`'s labels of its CSV
    log: str | None = None           # under logs/<hw>/; None: `layout` with .log (a one-file section: <section>.log)
    params: Callable[[str], dict] | None = None  # more params from the scale (env's)
    inputs: Callable[[dict], dict] | None = None  # more inputs from the config (contenders' files)
    outputs: dict = field(default_factory=dict)   # more outputs: {name: folder under results/<hw>}, directories
    # a study's wildcard constraints, and its spec from (config, its grid, its wildcards): a job asked
    # for by name runs at any process count, planned or not
    constraints: dict | None = None
    make_spec: Callable[[dict, dict, dict], str] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"job {self.rule}: kind {self.kind!r} is not one of {KINDS}")

    @property
    def wildcards(self) -> list[str]:
        return re.findall(r"{(\w+)}", self.layout)

    def log_path(self) -> str:
        if self.log is not None:
            return self.log
        folder, _, name = self.layout.rpartition("/")
        stem = name.removesuffix(".csv")
        return f"{stem}.log" if folder == stem else f"{folder}/{stem}.log"

    def command(self, bench: str) -> str:
        """`python -m` arguments: the module and this job's arguments."""
        return f"{bench} {self.args}"


@dataclass(frozen=True)
class Planned:
    """One result file a section's plan promises at a scale: the job (rule) that writes it, its
    study, spec (the JSON its rule passes) and argument (a model size, a process count), its
    wildcards' values, the case patterns it alone runs, its results folder where that is not
    results/<hw> (the multi-GPU section's), and whether the deep target alone measures it."""
    rule: str
    study: str
    spec: str | None = None
    arg: str | None = None
    wildcards: dict = field(default_factory=dict)
    cases: tuple[str, ...] = ()
    folder: str | None = None
    deep: bool = False   # the deep target's alone (config `depth: deep`) in a section both measure


@dataclass(frozen=True)
class PlanContext:
    """What a plan reads: the config, the scale, the results folder results/<hw>, and the
    multi-GPU folders results/<gpu>-x<count>."""
    config: dict
    scale: str
    results: str
    distributed: tuple[str, ...] = ()

    def grid(self, section: str) -> dict:
        return self.config.get(section, {}).get(self.scale, {})

    def runs(self, section: str) -> bool:
        """Whether `section` has jobs at this scale: not where its entry is {run: false} (the
        quick scale's sections that the summary does not read)."""
        return self.grid(section).get("run", True) is not False


@dataclass(frozen=True)
class Section:
    """A report section, or a kernel checked without a section of its own (`report=False`: its
    rows are in the correctness table). Its benchmark module is `bench` (default
    lmperf.bench.<name>), its report module `view_module` (default lmperf.report.<name>: `view`,
    and `figures` where it names figures), its template `<name>.md.j2` under `templates` (default
    the repository's templates/), its CSVs results/<hw>/<name>/."""
    name: str
    jobs: tuple[Job, ...] = ()
    plan: Callable[[PlanContext], list[Planned]] | None = None
    figures: dict[str, str] = field(default_factory=dict)  # {name in templates: file name}
    # measured by the deep target only (config `depth: deep`, `make report-deep`): a standard run
    # neither measures nor needs its results, and the report says where they come from
    deep: bool = False
    report: bool = True              # a section of the report (False: a kernel with rows in correctness)
    kernel: bool = False             # its `check` rows are correctness rows
    model: bool = False              # its cases run the whole model (tools/run_cost.py's collection cost)
    multi_gpu: bool = False          # its rows come from results/<hw>-x<N>/ too
    bench: str | None = None
    cases_module: str | None = None  # the module whose job_cases lists a job's cases ({study} filled); default `bench`
    view_module: str | None = None
    templates: str | None = None
    caption: str | None = None       # `snakemake --report`'s caption, from rules/ (default captions/<name>.rst where it exists)
    subcategory: str = ""            # its results' heading in `snakemake --report`
    doc: str = ""                    # what it holds, in a line (the docs' table of sections)
    # its config at each scale ({scale: grid}), under what the user's config sets (lmperf.catalog.
    # with_defaults); a built-in section's is its file config/sections/<name>.yaml instead (its
    # keys, its thresholds under `report`), checked by config/schema.yaml
    defaults: dict = field(default_factory=dict)

    @property
    def bench_module(self) -> str:
        return self.bench or f"lmperf.bench.{self.name}"

    @property
    def report_module(self) -> str:
        return self.view_module or f"lmperf.report.{self.name}"

    def caption_path(self, rules: str = "rules") -> str | None:
        """Its caption's path from the rules/ folder (`rules`: where that is from the working
        directory, the repository's root); None where it has none."""
        path = self.caption or f"captions/{self.name}.rst"
        return path if (Path(rules) / path).is_file() else None

    def case_module(self, study: str) -> str:
        return (self.cases_module or self.bench_module).format(study=study)


def own_rules(sections: list[Section]) -> set[str]:
    """Section names that are the rule name of one of the section's own jobs (`attention`)."""
    return {s.name for s in sections if any(j.rule == s.name for j in s.jobs)}


def job(sections: list[Section], rule: str) -> tuple[Section, Job]:
    """The section and job whose rule is `rule`."""
    for s in sections:
        for j in s.jobs:
            if j.rule == rule:
                return s, j
    raise KeyError(rule)


def table(sections: list[Section]) -> str:
    """The docs' table of sections (docs/architecture.md): each section, its jobs with their kind
    and result files, and its report side."""
    lines = ["| section | what it holds | jobs (kind): result files under results/&lt;hw&gt;/ | in the report |",
             "|---|---|---|---|"]
    for s in sections:
        jobs = "<br>".join(f"`{j.rule}` ({j.kind}): `{j.layout}`" for j in s.jobs) or "none of its own"
        shown = ("deep target" if s.deep else "yes") if s.report else "rows in Correctness"
        lines.append(f"| `{s.name}` | {s.doc} | {jobs} | {shown} |")
    return "\n".join(lines) + "\n"
