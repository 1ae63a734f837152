"""Render the README's results block (between the markers) from one machine's CSVs:

    python -m lmperf.report.readme --results results/h100-80gb-hbm3 --readme README.md

The block is never edited by hand; tests/test_report.py checks it matches a fresh render.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import jinja2
import pandas as pd

from lmperf.report import sections
from lmperf.report.render import load_section

BEGIN = "<!-- results:begin (rendered by python -m lmperf.report.readme; do not edit) -->"
END = "<!-- results:end -->"


def headline(e2e: pd.DataFrame) -> str:
    """Per model size: the training step in each variant at the variants study's context."""
    v = e2e[(e2e["study"] == "variants") & (e2e["mode"] == "train") & (e2e["status"] == "ok")]
    v = v.assign(variant=v["dtype"] + " " + v["compile"].astype(str).str.lower()
                 .map({"true": "compiled", "false": "eager"}))
    step = v[v["metric"] == "step_ms"].pivot_table(index="size", columns="variant", values="mean")
    mfu = v[v["metric"] == "mfu_pct"].pivot_table(index="size", columns="variant", values="mean")
    order = [s for s in sections.size_order(e2e) if s in step.index]
    rows = []
    for size in order:
        row = {"model": size}
        for variant in ("fp32 eager", "fp32 compiled", "bf16 eager", "bf16 compiled"):
            if variant in step.columns:
                cell = f"{sections.fmt(step.loc[size, variant])} ms"
                if variant in mfu.columns:
                    cell += f" ({sections.fmt(mfu.loc[size, variant])}% MFU)"
                row[variant] = cell
        rows.append(row)
    return sections.table(pd.DataFrame(rows))


def render_block(results: Path, templates: Path) -> str:
    e2e = load_section(results, "e2e")
    env = load_section(results, "env")
    facts = dict(zip(env["key"], env["value"].astype(str))) if not env.empty else {}
    seconds = sections.measured_seconds({"e2e": e2e})
    context = {"hw": results.name, "facts": facts, "headline": headline(e2e),
               "context": int(e2e[e2e["study"] == "variants"]["context"].iloc[0]),
               "batch_size": int(e2e["batch_size"].iloc[0]),
               "minutes": sections.fmt(sum(seconds.values()) / 60),
               "peaks": sorted(set(e2e[e2e["metric"] == "mfu_pct"]["message"].dropna()))}
    env_j2 = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), trim_blocks=True,
                                lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    return env_j2.get_template("readme_results.md.j2").render(**context).strip()


def replace_block(text: str, block: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"README has no results block ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--readme", type=Path, default=Path("README.md"))
    p.add_argument("--templates", type=Path, default=Path("templates"))
    args = p.parse_args(argv)
    args.readme.write_text(replace_block(args.readme.read_text(), render_block(args.results, args.templates)))
    print(f"updated the results block of {args.readme}")


if __name__ == "__main__":
    main()
