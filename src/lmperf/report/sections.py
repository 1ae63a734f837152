"""The report's sections, in the order the report shows them: the one table the renderer, the
report rule (the results it reads) and the report template loop over, derived from the
sections' declarations (lmperf.declare; the built-in ones in lmperf.catalog).

A section `<name>` is one declaration, one module `lmperf.report.<name>` (or the one it declares)
and one template `templates/<name>.md.j2`. The module has `view(inputs) -> dict` (numbers and
frames, no markdown) and, when the declaration names figures, `figures(inputs, paths) -> {name:
why}` writing those it has rows for and saying why for the others (no figure is drawn without
data).
Its results, if any, are the CSVs under `results/<hw>/<name>/` (`result_dirs`), with one
exception: `distributed` (Scaling across GPUs) runs on machines named by their GPU count, so the
report of results/<hw> reads results/<hw>/distributed/ (the CPU's Gloo run, or a `hw` set in the
config) and results/<hw>-x<N>/distributed/ for every N (e.g. results/h200 -> results/h200-x2 and
results/h200-x4): the folders the distributed section's `study` jobs write on a machine of that GPU. This
module imports nothing heavy: the Snakefile reads it while planning.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from lmperf import catalog
from lmperf.declare import Section


def report_sections(declared: list[Section]) -> list[Section]:
    """The sections of the report among the declared ones, in their order."""
    return [s for s in declared if s.report]


SECTIONS = report_sections(catalog.SECTIONS)
# The sections of the deep target: the headline cases in fresh processes, the FP8 rung's convergence.
DEEP = tuple(s.name for s in SECTIONS if s.deep)
# Kernels checked by a rule of their own (results/<hw>/<name>/check.csv) with no section of
# their own: the correctness section reads their rows.
CHECKED_ONLY = tuple(s.name for s in catalog.SECTIONS if not s.report)


def frame_names(sections: list[Section]) -> list[str]:
    """The folders whose rows these sections read: each section's, and CHECKED_ONLY's where the
    correctness section is among them."""
    names = [s.name for s in sections]
    return names + list(CHECKED_ONLY) * ("correctness" in names)


# Sections whose results come from the multi-GPU folders results/<hw>-x<N>/ too (the repeats:
# those of the distributed jobs, lmperf.repeats).
MULTI_GPU = {s.name for s in catalog.SECTIONS if s.multi_gpu}


def result_dirs(results: str | Path, section: str) -> list[Path]:
    """The folders whose CSVs are a section's rows in the report of `results` (results/<hw>):
    results/<hw>/<section>/, and for a multi-GPU section also results/<hw>-x<N>/<section>/ for
    every GPU count N there is, in order of N."""
    results = Path(results)
    dirs = [results / section]
    if section in MULTI_GPU:
        pattern = re.compile(re.escape(results.name) + r"-x(\d+)")
        counts = sorted((int(m[1]), p) for p in results.parent.glob(f"{results.name}-x*")
                        if (m := pattern.fullmatch(p.name)))
        dirs += [p / section for _, p in counts]
    return dirs


def figure_paths(figures_dir: str | Path, sections: list[Section] | None = None) -> dict[str, Path]:
    """{figure name: path} of every figure the report links."""
    return {name: Path(figures_dir) / file for s in sections or SECTIONS for name, file in s.figures.items()}


@dataclass
class Inputs:
    """What a view reads: every section's rows, the bars (thresholds, from the config's
    `report`), the results folder and the folder the report is written to, and the model sizes
    the grids ran (config/config.yaml's `models`: their dimensions are not in the rows)."""
    results: Path
    frames: dict            # {section: DataFrame of all its CSVs}, empty frames included
    bars: dict              # {section: {bar: threshold}}
    out_dir: Path
    scale: str = "full"
    models: dict = field(default_factory=dict)  # {size: {d_model, d_ff, n_layers, n_heads}}

    def rows(self, section: str, study: str | None = None):
        df = self.frames[section]
        return df[df["study"] == study] if study is not None and not df.empty else df
