"""Reading a section's results: every CSV of its folders, each checked against the cases its job
promised (lmperf.report.validate), concatenated into the rows its view reads. The renderer reads
every section so, and a section's module reads another machine's folder so (the distributed
section's other GPU counts), without importing the renderer that loads it.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from lmperf import providers
from lmperf.report import validate
from lmperf.report.sections import result_dirs


def section_csvs(results: Path, section: str) -> list[Path]:
    """The CSVs of a section's folders (`sections.result_dirs`: results/<section>/, and the
    multi-GPU folders' for `distributed`), journals of unfinished runs excluded."""
    return [p for d in result_dirs(results, section) for p in sorted(d.rglob("*.csv")) if ".journal" not in p.parts]


def load_section(results: Path, section: str, promised: dict | None = None) -> pd.DataFrame:
    """All CSVs of a section, each checked first (`validate.problem`; against the cases its job
    promised where `promised`, {path: ResultFile}, names it), concatenated. Raises
    validate.DamagedResults naming every damaged file.

    A promised file holding every case its job promises and more is a larger grid of the same
    job: measured at older code, it is shown as it was (under the report's line on older code,
    as is one of older code that lacks cases its job has promised since);
    at the section's code now, the grid has shrunk since (the configuration measures less) and
    only the cases the job promises are shown, each as that run measured it. (Snakemake still
    reruns such a job: the workflow's own check, `validate.damaged`, refuses any other grid.)"""
    paths = section_csvs(results, section)
    promised = promised or {}
    problems, keep = {}, {}
    for p in paths:
        f = promised.get(os.path.normpath(p))
        ids = f.case_ids() if f else None
        older = ids is not None and measured_at_older_code(p, code_section(f))
        if problem := validate.problem(p, ids, env=section == "env", earlier_grid=bool(f), older_code=older):
            stray = promised and not f  # in a section's folder, but no job of this config writes it
            problems[str(p)] = problem + ("; no job of this configuration writes it: move it out of "
                                          "the results folder" if stray else "")
        elif ids is not None and not older:
            keep[p] = set(ids)
    if problems:
        raise validate.DamagedResults(problems)
    frames = [providers.read_renamed(pd.read_csv(p, keep_default_na=False, na_values=[""])) for p in paths]
    frames = [df[df["case_id"].isin(keep[p])] if p in keep else df for p, df in zip(paths, frames)]
    # the rows of a file the deep target alone measures, in a section the standard run measures
    # too (a deep grid): marked, so that each run's wall time counts its own (report/env.py)
    frames = [df.assign(deep_target=True) if getattr(promised.get(os.path.normpath(p)), "deep", False) else df
              for p, df in zip(paths, frames)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def code_section(f) -> str:
    """The section whose code measured a promised file (`lmperf.workflow.ResultFile`): its own,
    or for a repeat its job's (a repeat at older code may hold an earlier case list)."""
    return f.repeat_of.section if f.repeat_of is not None else f.section


def measured_at_older_code(path: Path, section: str) -> bool:
    """Whether every row of a results CSV names a commit whose code for `section` has changed
    since (report/freshness.py): such a file may hold an earlier configuration's grid."""
    from lmperf.report import freshness
    try:
        commits = set(pd.read_csv(path, usecols=["commit"], dtype=str)["commit"].dropna())
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return False
    files = freshness.code_files(section)
    return bool(commits and files) and all(freshness.changed_since(c, files)[0] for c in commits)
