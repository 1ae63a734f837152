"""One report section rendered alone, through its own template, like the whole report
(lmperf.report.render): a preview of one section's results, e.g. a multi-GPU run's.

    python -m lmperf.report.section distributed --results results/h200-x2 --out report/distributed/h200-x2/distributed.md

Its figures go to the `figures` folder beside --out. Nobody imports this module: it sits above
render, which loads the sections' modules.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from lmperf import catalog
from lmperf.report import render
from lmperf.report.sections import report_sections


def main(argv=None) -> None:
    sections = report_sections(catalog.load())
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("section", choices=[s.name for s in sections])
    p.add_argument("--results", type=Path, required=True, help="the results folder (results/<hw>, results/<gpu>-x<count>)")
    p.add_argument("--templates", type=Path, default=Path("templates"))
    p.add_argument("--out", type=Path, required=True, help="markdown file to write")
    args = p.parse_args(argv)
    section = [s for s in sections if s.name == args.section]
    render.render(args.results, args.templates, args.out, args.out.parent / "figures", "full",
                  render.bars_from_config(), sections=section, template=f"{args.section}.md.j2")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
