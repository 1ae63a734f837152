"""Read every results CSV of one machine, check it, build each section's view, render the templates.

    python -m lmperf.report --results results/cpu --scale smoke --templates templates \
        --out report/report.md --figures report/figures

The result files a full run writes at that scale, and the cases each must hold, are derived
from the configuration (config/config.yaml, or --config-json: what the report rule passes, with
its --config overrides) through `lmperf.workflow.result_files`. A damaged CSV stops the render
with the file named (`validate`); a missing one is listed at the top of the report and under the
heading of each section it leaves partial. The report and its figures are rendered into a
temporary folder and moved into place only when everything rendered.
`render` also renders a subset of the sections through one of their templates:
`python -m lmperf.report.section distributed` renders the distributed section alone.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import jinja2
import pandas as pd

from lmperf import catalog, contenders as contenders_mod, planning, providers, workflow as wf
from lmperf.report import format as fmt
from lmperf.report import references as published
from lmperf.report import claims, contenders, quick, summary, validate
from lmperf.report.rows import code_section, load_section, measured_at_older_code, section_csvs  # noqa: F401 (render.<name> for callers)
from lmperf.report.correctness import KERNEL_SECTIONS
from lmperf.report.sections import (DEEP, SECTIONS, Inputs, Section, figure_paths, frame_names, report_sections,
                                    result_dirs)

CONFIG = Path("config/config.yaml")
SCHEMA = Path("config/schema.yaml")


def bars_from_config(path: Path = CONFIG) -> dict:
    """The `report` mapping of a config file set on the built-in sections' own bars (their files
    config/sections/<name>.yaml, beside it): {section: {bar: threshold}}."""
    return catalog.read_config(path)["report"]


def load_config(path: Path = CONFIG, overrides: dict | None = None) -> dict:
    """A config file as the workflow sees it: with `overrides` (top-level keys, as `--config
    KEY=VALUE` gives them), set on its sections' defaults (config/sections/<name>.yaml beside it;
    a section outside the package, config `sections`, brings its own: lmperf.catalog.with_defaults),
    validated against config/schema.yaml (which fills the defaults of the keys a file leaves out)
    and cross-checked (`lmperf.planning.check_config`)."""
    import yaml
    from snakemake.utils import validate as validate_schema
    config = {**yaml.safe_load(Path(path).read_text()), **(overrides or {})}
    part = catalog.schema_part(config, catalog.load(config), Path(path).parent)
    validate_schema(part, str(Path(path).parent / SCHEMA.name))
    config.update(part)
    planning.check_config(config)
    return config


def distributed_folders(results: Path) -> list[str]:
    """By hand, the multi-GPU folders whose files a run promised: results/<hw>-x<N> for every N
    there is (the GPU count of a run is not in the config), or results/<hw> itself for a CPU
    (its Gloo run) or where it has a distributed/ folder."""
    folders = [str(d.parent) for d in result_dirs(results, "distributed")[1:]]
    if results.name == "cpu" or (results / "distributed").is_dir():
        folders.insert(0, str(results))
    return folders


def measured_contenders(config: dict, results: Path) -> dict:
    """`config` with the contenders `results` was measured with, where it names none: the
    contenders/ CSVs' (contender, source) pairs, a source relative to the repository the folder
    sits in (results/<hw>). With a contender, a run's grids hold its cases too (the ladder's
    rung numbers among them), so the folder's files are checked against those grids."""
    if config.get("contenders") or not (results / "contenders").is_dir():
        return config
    named = {}
    for path in sorted((results / "contenders").glob("*.csv")):
        rows = pd.read_csv(path, usecols=lambda c: c in ("contender", "source")).dropna()
        for name, source in rows.drop_duplicates().itertuples(index=False):
            repo_path = Path(results).resolve().parent.parent / source
            named[name] = str(repo_path if repo_path.is_file() else source)
    return {**config, "contenders": named} if named else config


def promised_files(config: dict, results: Path, scale: str, distributed: list[str]) -> dict:
    """{normalised path: ResultFile} of every CSV a full run at `scale` writes, with the
    contenders the folder was measured with (`measured_contenders`)."""
    files = wf.result_files(measured_contenders(config, Path(results)), str(results), scale, distributed)
    return {os.path.normpath(f.path): f for f in files}


def missing(results: Path, promised: dict, sections: list[Section] = SECTIONS) -> dict[str, list[str]]:
    """{section: the promised files that are not there, as results/<hw>/...}; `correctness`
    gets the kernel sections' missing `check` files."""
    out: dict[str, list[str]] = {name: [] for name in frame_names(sections)}
    for path, f in sorted(promised.items()):
        if not Path(path).exists():
            name = os.path.join(results.parent.name, os.path.relpath(path, results.parent))
            out.setdefault(f.section, []).append(name)
            if f.section in KERNEL_SECTIONS and f.study == "check":
                out["correctness"].append(name)
    return out


def deep_status(promised: dict, absent: dict[str, list[str]]) -> dict[str, str]:
    """{deep section: "measured" where some of its result files are here, "not_measured" where a
    run at this scale writes some but none is here (the deep target has not run: `make
    report-deep`), "none" where no job at this scale writes any (the quick scale's)}."""
    status = {}
    for name in DEEP:
        files = [f for f in promised.values() if f.section == name]
        status[name] = "none" if not files else "not_measured" if len(absent[name]) == len(files) else "measured"
    return status


def deep_grids_not_run(promised: dict) -> set[str]:
    """The paths of the deep target's files in sections not declared deep (their deep grids:
    lmperf.declare.Planned.deep), of each section none of whose such files is here."""
    grids: dict[str, list[str]] = {}
    for path, f in promised.items():
        if getattr(f, "deep", False) and f.section not in DEEP:
            grids.setdefault(f.section, []).append(path)
    return {p for paths in grids.values() if not any(Path(p).exists() for p in paths) for p in paths}


def environment(templates: Path, sections: list[Section] = ()) -> jinja2.Environment:
    """The templates' environment: `templates`, then the template folders sections outside the
    package declare; the filters of lmperf.report.format."""
    folders = [templates, *dict.fromkeys(s.templates for s in sections if s.templates)]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folders), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    tables = fmt.Tables()  # the legend of the host-bound mark counts the rows of the table above it
    env.filters.update(table=tables.table, fmt=fmt.fmt, anchor=fmt.anchor)
    env.globals.update(marked_rows=tables.marked)
    return env


def views(inputs: Inputs, sections: list[Section] = SECTIONS) -> dict:
    """{section: its view}, in report order."""
    return {s.name: importlib.import_module(s.report_module).view(inputs) for s in sections}


def draw(inputs: Inputs, figures_dir: Path, sections: list[Section] = SECTIONS) -> tuple[dict[str, Path], dict[str, str]]:
    """Every figure of these sections that has rows to show, written: ({name: path}, {name: why
    it was not drawn}); the template shows the reason in place of a figure not drawn."""
    figures_dir.mkdir(parents=True, exist_ok=True)
    paths = figure_paths(figures_dir, sections)
    drawn, not_drawn = {}, {}
    for s in sections:
        if s.figures:
            why = importlib.import_module(s.report_module).figures(inputs, {k: paths[k] for k in s.figures})
            written = {k: paths[k] for k in s.figures if k not in why}
            if lost := [str(p) for p in written.values() if not p.exists()]:
                raise RuntimeError(f"{s.report_module}.figures neither wrote {lost} nor said why")
            drawn.update(written)
            not_drawn.update(why)
    return drawn, not_drawn


def named_contenders_only(frames: dict, named: set[str]) -> dict:
    """The sections' rows less those of contenders not among `named` (the configuration's): rows
    an earlier configuration left in CSVs a run did not rewrite, or in a study no job of this
    configuration writes. A contender's rows live and die with the configuration."""
    from lmperf.report.contenders import NAMED_BY

    def keep(section: str, name) -> bool:
        if not isinstance(name, str):  # a row that names no implementation (pandas 3 keeps it missing)
            return section != "contenders"
        if section == "contenders":
            return name in named
        if section == "distributed":
            who, _, contract = name.rpartition("-")
            return contract not in contenders_mod.DISTRIBUTED or who in named or not who
        if section == "ladder":
            return not name.startswith("contender_") or contenders_mod.owner(name.removeprefix("contender_")) in named
        provider = providers.find(name)
        if provider is not None and provider.role != "contender":
            return True  # ours or a peer
        if section == "attention" and name in ("eager", "compiled"):
            return True
        if provider is None and not name.endswith(tuple(f"_{k}" for k in contenders_mod.ATTENTION)):
            return True  # no contender's (a provider module's, say)
        return contenders_mod.owner(name) in named
    out = dict(frames)
    columns = {**{s: c for s, (c, _) in NAMED_BY.items()}, "contenders": "contender"}
    for section, column in columns.items():
        df = frames.get(section)
        if df is None or df.empty or column not in df:
            continue
        kept = df[column].map(lambda n, s=section: keep(s, n)).astype(bool)
        out[section] = df[kept]
    return out


def render(results: Path, templates: Path, out: Path, figures_dir: Path, scale: str,
           bars: dict, promised: dict | None = None, sections: list[Section] = SECTIONS,
           template: str = "report.md.j2", references: list[dict] | None = None,
           models: dict | None = None, contenders_named: set[str] | None = None) -> str:
    """Render `template` (the whole report, or one section's template for a subset of the
    sections) from the CSVs under `results` into `out`, and its figures into `figures_dir`;
    `promised` ({path: ResultFile}, `promised_files`): the files a full run writes, checked and
    listed when missing (None: every CSV is still checked, but nothing is known to be missing);
    `references`: the published numbers (references.load) shown beside ours where they match;
    `models`: the configuration's model sizes (their dimensions, for the table of models);
    `contenders_named`: the contenders this machine's configuration names, whose rows alone are
    shown (None: every contender's rows, as another machine's results are rendered)."""
    promised, frames, problems = promised or {}, {}, {}
    for name in frame_names(sections):  # every section read before any is refused, so that all damage is named
        try:
            frames[name] = load_section(results, name, promised)
        except validate.DamagedResults as e:
            problems.update(e.problems)
    if problems:
        raise validate.DamagedResults(problems)
    if contenders_named is not None:
        frames = named_contenders_only(frames, contenders_named)
    frames = contenders.wrong_everywhere(frames)  # a contender that failed a check is timed nowhere
    inputs = Inputs(results=results, frames=frames, bars=bars, out_dir=out.parent, scale=scale, models=models or {})
    # a section's deep grid none of whose files is here (the deep target has not run): its view
    # says so, and its files are not counted missing
    not_run = deep_grids_not_run(promised)
    promised = {path: f for path, f in promised.items() if path not in not_run}
    absent = missing(results, promised, sections)
    # A deep section none of whose files is here comes from the deep target, which has not run:
    # it says so under its heading, and its files are not counted missing.
    deep = deep_status(promised, absent)
    left_out = {name for name, state in deep.items() if state != "measured"}
    promised_here = sum(1 for f in promised.values() if f.section not in left_out)
    absent = {name: ([] if name in left_out else files) for name, files in absent.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    figures_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".render-", dir=out.parent) as tmp:
        staged, not_drawn = draw(inputs, Path(tmp) / "figures", sections)
        section_views = views(inputs, sections)
        # the Snakemake target that writes it: report/<hw>/report.md for a results folder rendered
        # alone (rule hw_report), else the report of its scale; `root` leads from it to the
        # repository's top (the docs' links)
        target = (f"report/{results.name}/{out.name}" if out.parent.name == results.name
                  else wf.report_path(scale))
        context = {**section_views, "sections": [s.name for s in sections],
                   "summary": summary.view(section_views, references or [], results.name, claims.of(inputs)),
                   "deep": deep, "quick": quick.view(results, scale, bars),
                   "figures": {name: os.path.relpath(figure_paths(figures_dir, sections)[name], out.parent) for name in staged},
                   "no_figure": not_drawn,
                   "missing": sorted({m for files in absent.values() for m in files}),
                   "host_bound_pct": bars.get("host_bound_idle_pct", float("inf")), "host_bound_mark": fmt.HOST_BOUND,
                   "partial": absent, "expected": promised_here,
                   "references": published.by_section(references or [], results.name),
                   "rendered_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                   "target": target, "root": "../" * target.count("/")}
        text = environment(templates, sections).get_template(template).render(**context)
        (Path(tmp) / out.name).write_text(text)
        # everything rendered: move it into place (a rename each where on one file system); a
        # figure not drawn this time leaves no image of an earlier render behind
        for name, path in staged.items():
            shutil.move(path, figure_paths(figures_dir, sections)[name])
        for name in not_drawn:
            figure_paths(figures_dir, sections)[name].unlink(missing_ok=True)
        shutil.move(Path(tmp) / out.name, out)
    written = []
    if section_views.get("contenders", {}).get("names"):  # each contender's page, beside the report
        written = contenders.pages(section_views["contenders"], out.parent / "contenders",
                                   environment(templates).get_template("contender_page.md.j2"),
                                   training=section_views.get("memory", {}).get("contenders"))
    if contenders_named is not None:  # the page of a contender no longer named goes with its rows
        for page in set((out.parent / "contenders").glob("*.md")) - {Path(p) for p in written}:
            page.unlink()
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True, help="results/<hw> folder")
    p.add_argument("--scale", required=True, choices=list(wf.SCALES))
    p.add_argument("--templates", type=Path, default=Path("templates"))
    p.add_argument("--out", type=Path, default=Path("report/report.md"))
    p.add_argument("--figures", type=Path, default=Path("report/figures"))
    p.add_argument("--config", type=Path, default=CONFIG,
                   help="the configuration whose grids say which result files and cases a run writes, "
                        "and whose `report` has the bars (default: %(default)s)")
    p.add_argument("--config-json", type=json.loads,
                   help="the configuration as JSON, validated (what the report rule passes) instead of --config")
    p.add_argument("--only-configured-contenders", action="store_true",
                   help="show the rows of the contenders the configuration names alone (this machine's "
                        "report: rows an earlier configuration left are not shown)")
    p.add_argument("--references", type=Path, default=published.REFERENCES,
                   help="published numbers to show beside ours (default: %(default)s)")
    p.add_argument("--distributed", action="append",
                   help="a multi-GPU results folder the run wrote (repeatable; default: the "
                        "results/<hw>-x<N> folders there are, or results/cpu)")
    args = p.parse_args(argv)
    if not args.results.is_dir():
        p.error(f"--results {args.results} is not a folder")
    config = args.config_json if args.config_json is not None else load_config(args.config)
    distributed = args.distributed if args.distributed is not None else distributed_folders(args.results)
    promised = promised_files(config, args.results, args.scale, distributed)
    try:
        named = set(contenders_mod.normalise(config.get("contenders"))) if args.only_configured_contenders else None
        render(args.results, args.templates, args.out, args.figures, args.scale, config["report"], promised,
               sections=report_sections(catalog.load(config)), references=published.load(args.references),
               models=config["models"], contenders_named=named)
    except validate.DamagedResults as e:
        raise SystemExit(f"error: {e}\n{args.out} and its figures are left as they were.")
    print(f"wrote {args.out}")
