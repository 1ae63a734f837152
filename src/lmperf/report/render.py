"""Read every results CSV of one machine, build each section's view, render the templates.

    python -m lmperf.report --results results/cpu --scale smoke --templates templates \
        --out report/report.md --figures report/figures --bars '{...}' --expected '[...]'

The report rule passes the bars (config/config.yaml's `report`) and the result files a full run
writes (its own inputs) as params; by hand, --bars defaults to the config file's and no
missing files are listed. `render` also renders a subset of the sections through one of their
templates: `python -m lmperf.report.distributed` renders the distributed section alone.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
from pathlib import Path

import jinja2
import pandas as pd

from lmperf.report import format as fmt
from lmperf.report.sections import SECTIONS, Inputs, Section, figure_paths, result_dirs

CONFIG = Path("config/config.yaml")


def load_section(results: Path, section: str) -> pd.DataFrame:
    """All CSVs of a section's folders (`sections.result_dirs`: results/<section>/, and the
    multi-GPU folders' for `distributed`), journals of unfinished runs excluded, concatenated."""
    paths = [p for d in result_dirs(results, section)
             for p in sorted(d.rglob("*.csv")) if ".journal" not in p.parts]
    frames = [pd.read_csv(p, keep_default_na=False, na_values=[""]) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def bars_from_config(path: Path = CONFIG) -> dict:
    """The `report` mapping of a config file: {section: {bar: threshold}}."""
    import yaml
    return yaml.safe_load(Path(path).read_text())["report"]


def missing(results: Path, expected: list[str]) -> list[str]:
    """The expected result files (paths as the workflow names them) that are not there yet,
    relative to the results folder."""
    return [os.path.relpath(p, results) for p in expected if not Path(p).exists()]


def environment(templates: Path) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters.update(table=fmt.table, fmt=fmt.fmt)
    return env


def views(inputs: Inputs, sections: list[Section] = SECTIONS) -> dict:
    """{section: its view}, in report order."""
    return {s.name: importlib.import_module(f"lmperf.report.{s.name}").view(inputs) for s in sections}


def draw(inputs: Inputs, figures_dir: Path, sections: list[Section] = SECTIONS) -> dict[str, Path]:
    """Every figure of these sections, written; {name: path}."""
    figures_dir.mkdir(parents=True, exist_ok=True)
    paths = figure_paths(figures_dir)
    drawn = {}
    for s in sections:
        if s.figures:
            drawn.update({k: paths[k] for k in s.figures})
            importlib.import_module(f"lmperf.report.{s.name}").figures(inputs, {k: paths[k] for k in s.figures})
    return drawn


def render(results: Path, templates: Path, out: Path, figures_dir: Path, scale: str,
           bars: dict, expected: list[str] | None = None, sections: list[Section] = SECTIONS,
           template: str = "report.md.j2") -> str:
    """Render `template` (the whole report, or one section's template for a subset of the
    sections) from the CSVs under `results`, its figures into figures_dir; write it to `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    frames = {s.name: load_section(results, s.name) for s in sections}
    inputs = Inputs(results=results, frames=frames, bars=bars, out_dir=out.parent, scale=scale)
    figures = draw(inputs, figures_dir, sections)
    context = {**views(inputs, sections), "sections": [s.name for s in sections],
               "figures": {name: os.path.relpath(p, out.parent) for name, p in figures.items()},
               "missing": missing(results, expected or []), "expected": len(expected or []),
               "rendered_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    text = environment(templates).get_template(template).render(**context)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True, help="results/<hw> folder")
    p.add_argument("--scale", required=True)
    p.add_argument("--templates", type=Path, default=Path("templates"))
    p.add_argument("--out", type=Path, default=Path("report/report.md"))
    p.add_argument("--figures", type=Path, default=Path("report/figures"))
    p.add_argument("--bars", type=json.loads, help=f"the bars as JSON (default: {CONFIG}'s `report`)")
    p.add_argument("--expected", type=json.loads, default=[],
                   help="JSON list of the result files a full run writes; missing ones are named")
    args = p.parse_args(argv)
    if not args.results.is_dir():
        p.error(f"--results {args.results} is not a folder")
    bars = args.bars if args.bars is not None else bars_from_config()
    render(args.results, args.templates, args.out, args.figures, args.scale, bars, args.expected)
    print(f"wrote {args.out}")
