"""What a results CSV must hold before anything reads it: a complete CSV table (every row as
long as the header, the last one ended), the columns every results row has, numbers where the
harness writes numbers, and, where its job's promise is known (`lmperf.workflow.ResultFile`),
exactly the cases that job promised. A file that fails is damaged: the renderer refuses it,
naming it, and the workflow reruns its job (rules/report.smk checks at planning).

Imports nothing heavy (the csv module, not pandas): the Snakefile runs it while planning.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from lmperf import providers
from lmperf.hardware import CLOCK_COLUMNS

# Every results row has these (bench/common.py writes them); env.csv is a key/value table
# whose `hw` and `scale` keys the report reads.
TABLE_COLUMNS = ("case_id", "status")
ENV_COLUMNS, ENV_KEYS = ("key", "value"), ("hw", "scale")
# Columns the harness fills with numbers (or leaves empty): summarize() and failure_row(), and
# the GPU's clocks, power and temperature at a case's timed start and end (bench/timing.py's
# CLOCK_COLUMNS: a CSV written before them has none, and is read as it is)
NUMBER_COLUMNS = ("mean", "std", "median", "q20", "q80", "min", "max", "n", "wall_s", *CLOCK_COLUMNS)
REMAKE = ("Remake a damaged file with `snakemake --cores 1 report/report.md` (planning finds it and "
          "reruns its job), or restore a committed one with `git checkout -- <file>`.")


class DamagedResults(ValueError):
    """Result files that must not be read, each named with what is wrong with it."""

    def __init__(self, problems: dict[str, str]):
        self.problems = problems
        lines = [f"  {path} {problem}" for path, problem in problems.items()]
        super().__init__(f"{len(problems)} damaged result file(s):\n" + "\n".join(lines) + "\n" + REMAKE)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _few(items, k: int = 3) -> str:
    items = sorted(items)
    return ", ".join(items[:k]) + (f" and {len(items) - k} more" if len(items) > k else "")


def problem(path: str | Path, case_ids: list[str] | None = None, env: bool = False,
            earlier_grid: bool = False, older_code: bool = False) -> str | None:
    """What is wrong with one results CSV, or None if nothing is. `case_ids`: the cases its job
    promised (None: not known, not checked); `env`: the file is env.csv (key/value);
    `earlier_grid`: every promised case and more is a larger grid, not damage (render.load_section
    shows the promised ones, or all of them under the report's line on older code);
    `older_code`: the file was measured at older code (report/freshness.py), whose grid may also
    have lacked cases its job promises now (it is shown as measured; a job cut short writes no CSV)."""
    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return "is not text (a binary file?)"
    if not text.strip():
        return "is empty"
    if not text.endswith("\n"):
        return "ends mid-row (its last line is not ended: cut short while being written or copied)"
    try:
        rows = [r for r in csv.reader(io.StringIO(text, newline="")) if r]
    except csv.Error as e:
        return f"is not a readable CSV ({e})"
    header, body = rows[0], rows[1:]
    required = ENV_COLUMNS if env else TABLE_COLUMNS
    if [c for c in required if c not in header]:
        return (f"is not a results table: its header has no column {', '.join(c for c in required if c not in header)} "
                f"(header: {','.join(header)[:80]})")
    if not body:
        return "has a header but no rows"
    short = [i + 2 for i, r in enumerate(body) if len(r) != len(header)]
    if short:
        return (f"has rows whose field count is not the header's {len(header)} (line(s) "
                f"{_few(map(str, short))}): cut short or edited")
    col = {name: i for i, name in enumerate(header)}
    if env:
        keys = {r[col["key"]] for r in body}
        missing = [k for k in ENV_KEYS if k not in keys]
        return f"has no {', '.join(missing)} row" if missing else None
    no_status = [i + 2 for i, r in enumerate(body) if not r[col["status"]].strip()]
    if no_status:
        return f"has rows without a status (line(s) {_few(map(str, no_status))})"
    for name in NUMBER_COLUMNS:
        if name in col:
            bad = [(i + 2, r[col[name]]) for i, r in enumerate(body) if r[col[name]] and not _is_number(r[col[name]])]
            if bad:
                return f"has non-numbers in column {name} (line {bad[0][0]}: {bad[0][1][:40]!r})"
    if case_ids is None:
        return None
    new = lambda case_id: providers.renamed_id(case_id, "model_attention")  # rows written before a rename
    got, want = {new(r[col["case_id"]]) for r in body}, {new(c) for c in case_ids}
    if want - got and not older_code:
        return (f"holds {len(want & got)} of the {len(want)} cases its job promises (missing: "
                f"{_few(want - got)})")
    if got - want and not earlier_grid:
        return (f"holds {len(got - want)} case(s) its job does not promise ({_few(got - want)}): "
                f"measured with another grid")
    return None


def damaged(files) -> dict[str, str]:
    """{path: problem} of the promised files (`lmperf.workflow.ResultFile`s) that exist and are
    damaged; a job's case list is computed only for a file that is there."""
    out = {}
    for f in files:
        if Path(f.path).exists() and (p := problem(f.path, f.case_ids(), env=f.section == "env")):
            out[f.path] = p
    return out
