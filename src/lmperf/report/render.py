"""Read every results CSV of one machine, build each section's view, render the templates.

    python -m lmperf.report --results results/cpu --scale smoke --templates templates \
        --out report/report.md --figures report/figures
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path

import jinja2
import pandas as pd

from lmperf.report import figures, sections


def load_section(results: Path, section: str) -> pd.DataFrame:
    """All CSVs under results/<section>/ (journals of unfinished runs excluded), concatenated."""
    paths = sorted(p for p in (results / section).rglob("*.csv") if ".journal" not in p.parts)
    frames = [pd.read_csv(p, keep_default_na=False, na_values=[""]) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def only_study(df: pd.DataFrame, study: str) -> pd.DataFrame:
    """The rows of one study of a section (an empty section stays empty)."""
    return df[df["study"] == study] if not df.empty else df


CONFIG = Path(__file__).resolve().parents[3] / "config" / "config.yaml"


def missing_csvs(results: Path, scale: str, config_path: Path = CONFIG) -> tuple[list[str], int]:
    """(the result files a full run at this scale writes that are not there yet, how many it
    writes), from the grids in config/config.yaml."""
    import yaml

    from lmperf import workflow
    if not config_path.exists():
        return [], 0
    config = yaml.safe_load(config_path.read_text())
    if scale not in config.get("e2e", {}):
        return [], 0
    expected = workflow.expected_csvs(config, scale, str(results))
    return [str(Path(p).relative_to(results)) for p in expected if not Path(p).exists()], len(expected)


def render(results: Path, templates: Path, out: Path, figures_dir: Path, scale: str) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    figures_dir.mkdir(parents=True, exist_ok=True)
    rel = lambda p: os.path.relpath(p, out.parent)
    e2e = load_section(results, "e2e")
    fa = load_section(results, "flash_attention")
    fa_bench = only_study(fa, "bench")
    lrpe = load_section(results, "lrpe")
    lrpe_bench = only_study(lrpe, "bench")
    attention = load_section(results, "attention")
    precision = load_section(results, "precision")
    profile = load_section(results, "profile")
    memory = load_section(results, "memory")
    figs = {**figures.e2e_figures(e2e, figures_dir), **figures.fa_figures(fa_bench, figures_dir),
            **figures.lrpe_figures(lrpe_bench, figures_dir),
            **figures.attention_figures(attention, figures_dir),
            **figures.memory_figures(memory, figures_dir)}
    context = {
        "env": sections.env_view(load_section(results, "env"), results, scale,
                                 {"e2e": e2e, "flash_attention": fa, "lrpe": lrpe,
                                  "attention": attention, "precision": precision,
                                  "profile": profile, "memory": memory}),
        "e2e": sections.e2e_view(e2e),
        "correctness": sections.correctness_view({"flash_attention": fa, "lrpe": lrpe}),
        "fa": sections.fa_view(fa_bench),
        "lrpe": sections.lrpe_view(lrpe_bench),
        "attention": sections.attention_view(attention),
        "precision": sections.precision_view(precision, e2e),
        "profile": sections.profile_view(profile),
        "memory": sections.memory_view(memory, results, out.parent),
        "figures": {name: rel(path) for name, path in figs.items()},
        "rendered_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    context["missing"], context["expected"] = missing_csvs(results, scale)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    text = env.get_template("report.md.j2").render(**context)
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
    args = p.parse_args(argv)
    if not args.results.is_dir():
        p.error(f"--results {args.results} is not a folder")
    render(args.results, args.templates, args.out, args.figures, args.scale)
    print(f"wrote {args.out}")
