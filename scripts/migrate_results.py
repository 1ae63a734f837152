"""Rewrite results CSVs written by older lmperf code into today's columns, once, so that the
report reads the CSVs alone (it used to patch old rows with code imported from the benchmarks):

    python scripts/migrate_results.py results/h100-80gb-hbm3 [more results folders...]

What it changes (each step does nothing to rows already in the new form, so a second run
rewrites nothing):
- std is left empty where a metric has a single sample (a std of 0.0 claimed no spread);
- e2e: the MFU rows' peak moves from the message ("peak 989 TFLOP/s (bf16 dense, datasheet)")
  into a `peak_tflops` column, and the message is cleared;
- profile: rows of named ranges (phase.*, attention.*, ProfilerStep*, Optimizer.*) listed as
  kernels by older runs are dropped;
- memory: an allocation made with no Python frame reads as the bench writes it today;
- precision: the accumulation rows get the experiment's size (`additions`, `addend`).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

PEAK = re.compile(r"^peak ([0-9.]+) TFLOP/s \((\w+) dense, datasheet\)$")
ANNOTATIONS = ("phase.", "attention.", "ProfilerStep", "Optimizer.")        # bench/profile.py's
NO_STACK = "(no Python frame: autograd engine thread, i.e. backward)"        # bench/memory.py's
ADDITIONS, ADDEND = 1000, 0.01                                               # bench/precision.py's


def migrate(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    if {"n", "std"} <= set(df.columns):
        df.loc[df["n"] == 1, "std"] = float("nan")
    section = df["section"].iloc[0] if "section" in df and len(df) else ""
    if section == "e2e" and "message" in df:
        peak = df["message"].astype(str).str.extract(PEAK)[0].astype(float)
        if peak.notna().any():
            df["peak_tflops"] = peak.where(df["metric"] == "mfu_pct",
                                           df.get("peak_tflops", pd.Series(float("nan"), index=df.index)))
            df.loc[peak.notna(), "message"] = ""
            cols = list(df.columns)
            cols.remove("peak_tflops")
            cols.insert(cols.index("metric"), "peak_tflops")  # beside the other case columns
            df = df[cols]
    if section == "profile" and "kernel" in df:
        df = df[~((df["metric"] == "kernel_us_per_step") & df["kernel"].astype(str).str.startswith(ANNOTATIONS))]
    if section == "memory" and "made_by" in df:
        df["made_by"] = df["made_by"].replace("(no stack)", NO_STACK)
    if section == "precision" and "variant" in df:
        acc = df["case_id"] == "accumulation"
        for col, value in (("additions", ADDITIONS), ("addend", ADDEND)):
            if col not in df:
                df[col] = pd.NA
            df.loc[acc & df[col].isna(), col] = value
    return df


def main(folders: list[str]) -> None:
    for folder in folders:
        for path in sorted(Path(folder).rglob("*.csv")):
            if ".journal" in path.parts:
                continue
            before = path.read_text()
            df = pd.read_csv(path, keep_default_na=False, na_values=[""])
            after = migrate(df).to_csv(index=False)
            if after != before:
                path.write_text(after)
                print(f"migrated {path}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
