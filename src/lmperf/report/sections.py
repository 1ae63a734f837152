"""The report's sections, in the order the report shows them: the one table the renderer, the
report rule (its figure outputs) and the report template loop over.

A section `<name>` is one entry here, one module `lmperf.report.<name>` and one template
`templates/<name>.md.j2`. The module has `view(inputs) -> dict` (numbers and frames, no
markdown) and, when the entry names figures, `figures(inputs, paths) -> None` writing them.
Its results, if any, are the CSVs under `results/<hw>/<name>/`. This module imports nothing
heavy: the Snakefile reads it while planning.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Section:
    name: str
    figures: dict[str, str] = field(default_factory=dict)  # {name in templates: file name}


SECTIONS = [
    Section("env"),
    Section("correctness"),
    Section("e2e", {"ladder": "e2e_ladder.png", "step_vs_size": "e2e_step_vs_size.png",
                    "step_vs_context": "e2e_step_vs_context.png"}),
    Section("profile"),
    Section("memory", {"memory": "memory_timelines.png"}),
    Section("precision"),
    Section("attention", {"attention": "attention_vs_seq_len.png"}),
    Section("flash_attention", {"fa_tflops": "fa_tflops_vs_seq_len.png"}),
    Section("lrpe", {"lrpe_bandwidth": "lrpe_bandwidth.png"}),
]


def figure_paths(figures_dir: str | Path) -> dict[str, Path]:
    """{figure name: path} of every figure the report links."""
    return {name: Path(figures_dir) / file for s in SECTIONS for name, file in s.figures.items()}


@dataclass
class Inputs:
    """What a view reads: every section's rows, the bars (thresholds, from config/config.yaml's
    `report`), the results folder and the folder the report is written to."""
    results: Path
    frames: dict            # {section: DataFrame of all its CSVs}, empty frames included
    bars: dict              # {section: {bar: threshold}}
    out_dir: Path
    scale: str = "full"

    def rows(self, section: str, study: str | None = None):
        df = self.frames[section]
        return df[df["study"] == study] if study is not None and not df.empty else df
