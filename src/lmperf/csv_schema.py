"""The results CSVs' schema: the columns every row has and their order (a benchmark's case
columns between the ids and the metric), the row of a case that measured nothing, and the write
of a CSV that no reader sees half-written."""
from __future__ import annotations

import contextlib
import math
import os
import tempfile
from pathlib import Path

import pandas as pd

from lmperf import hardware

# Columns every results row has, in this order; benchmark-specific case columns go between
# ID_COLUMNS and the metric columns.
ID_COLUMNS = ["section", "study", "case_id"]
METRIC_COLUMNS = ["metric", "unit", "mean", "std", "median", "q20", "q80", "min", "max", "n",
                  "samples", "status", "message"]
# The GPU's SM and memory clocks (MHz), power (W) and temperature (C) at the start and end of a
# case's timed work (bench/timing.py), after the metric columns; a CSV written before them lacks them
CLOCK_COLUMNS = list(hardware.CLOCK_COLUMNS)
# Where the row was measured (lmperf.provenance), last
PROVENANCE_COLUMNS = ["hw", "gpu", "torch", "triton", "cuda", "python", "commit", "measured_at"]


def failure_row(status: str, message: str) -> dict:
    """The metric columns of a case that measured nothing: its status and message, no values."""
    return {"metric": "", "unit": "", "mean": math.nan, "std": math.nan, "median": math.nan,
            "q20": math.nan, "q80": math.nan, "min": math.nan, "max": math.nan, "n": 0,
            "samples": "", "status": status, "message": message}


def in_column_order(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with every column of the schema (an absent quantile or clock column empty), in its
    order: ids, the case's own columns as they come, metric, clocks, provenance."""
    df = df.reindex(columns=[*df.columns, *(c for c in ("q20", "q80") if c not in df)])
    df = df.reindex(columns=[*df.columns, *(c for c in CLOCK_COLUMNS if c not in df)])
    known = ID_COLUMNS + METRIC_COLUMNS + CLOCK_COLUMNS + PROVENANCE_COLUMNS
    case_cols = [c for c in df.columns if c not in known]
    return df[ID_COLUMNS + case_cols + METRIC_COLUMNS + CLOCK_COLUMNS + PROVENANCE_COLUMNS]


def write_csv_atomic(df: pd.DataFrame, path: Path) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file.
    The file gets the mode a plain open() gives (0644 under the usual umask 022; mkstemp's
    temporary file is 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", newline="") as f:
            df.to_csv(f, index=False)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
