"""The one place the report formats values. Views return numbers, strings (a case's status,
e.g. `oom`) and `Spread`s in plain frames and dicts; templates turn them into text with the
`fmt` and `table` filters defined here."""
from __future__ import annotations

import math
import re
from typing import NamedTuple

import numpy as np
import pandas as pd


class Spread(NamedTuple):
    """A measurement with its spread: `mean ± std`, or the median and its 20%-80% quantiles."""
    center: float
    std: float = math.nan
    q20: float = math.nan
    q80: float = math.nan

    def __str__(self) -> str:
        if _finite(self.q20) and _finite(self.q80):
            return f"{fmt(self.center)} [{fmt(self.q20)}, {fmt(self.q80)}]"
        if _finite(self.std):
            return f"{fmt(self.center)} ± {fmt(self.std, 2)}"
        return fmt(self.center)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def fmt(x, digits: int = 3) -> str:
    """A number with `digits` significant digits, no scientific notation for everyday sizes."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if x == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{x:,.{decimals}f}"


def show(value) -> str:
    """A table cell as text: floats with `fmt`, integers as they are, a `Spread` as its
    mean ± std (or median [q20, q80]), strings (statuses, names) verbatim, missing as empty."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, Spread):
        return str(value)
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return fmt(float(value))
    return str(value)


def cell(case: pd.DataFrame, metric: str, spread: bool = False, column: str = "mean"):
    """One case's value of one metric, the rule every view shares: the case's status if it did
    not run `ok`, else its `column` (a `Spread` with the row's std or quantiles when `spread`);
    None when the case has no such metric."""
    if case.empty:
        return None
    status = case["status"].iloc[0]
    if status != "ok":
        return status
    row = case[case["metric"] == metric]
    if row.empty:
        return None
    r = row.iloc[0]
    if not spread:
        return float(r[column])
    get = lambda key: float(r[key]) if key in r and pd.notna(r[key]) else math.nan
    one_sample = "n" in r and pd.notna(r["n"]) and r["n"] <= 1  # a std of 0 there is no spread
    if column != "median":  # the quantiles are the median's spread, the std the mean's
        return Spread(float(r[column]), math.nan if one_sample else get("std"))
    return Spread(float(r[column]), math.nan if one_sample else get("std"), get("q20"), get("q80"))


HOST_BOUND = "‡"  # the mark of a host-bound row (its legend: templates/host_bound.md.j2)


def host_bound(rows: pd.DataFrame, threshold: float) -> pd.Series:
    """Per row: whether its GPU sat idle more than `threshold` % of its median call (the rows'
    `gpu_idle_pct`, bench/timing.py); False where it was not measured (a CPU, older results)."""
    if "gpu_idle_pct" not in rows:
        return pd.Series(False, index=rows.index)
    return pd.to_numeric(rows["gpu_idle_pct"], errors="coerce").gt(threshold)


def host_bound_legend(rows: pd.DataFrame, threshold: float) -> dict:
    """What the legend of the host-bound mark says (templates/host_bound.md.j2): the threshold,
    how many of `rows` are marked, and whether any was measured at all (no legend on a CPU)."""
    measured = "gpu_idle_pct" in rows and rows["gpu_idle_pct"].notna().any()
    return {"measured": bool(measured), "threshold": threshold, "mark": HOST_BOUND,
            "n": int(host_bound(rows, threshold).sum())}


def idle_text(idle, threshold: float):
    """A row's GPU idle % as a table shows it: the number, with the host-bound mark above the
    threshold; None where not measured."""
    if idle is None or not isinstance(idle, (int, float)) or not math.isfinite(idle):
        return None
    return f"{fmt(float(idle))} {HOST_BOUND}" if idle > threshold else float(idle)


def anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading: its text in lower case, without punctuation,
    spaces as hyphens ("## FlashAttention-2 (Triton)" -> "flashattention-2-triton")."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def unavailable(why: str, **extra) -> dict:
    """The view of a section without results: the template prints `Not available: <why>.`"""
    return {"available": False, "why": why, **extra}


def table(df: pd.DataFrame | None) -> str:
    """A markdown table of a view's frame (the `table` filter). Columns that are empty in every
    row (e.g. MFU on a CPU) and columns named `_...` (values the view keeps for tests) are left out."""
    if df is None or not len(df):
        return "(no rows)"
    text = df.loc[:, [c for c in df.columns if not str(c).startswith("_")]].map(show)
    text = text.loc[:, [c for c in text.columns if (text[c] != "").any()]]
    return text.rename(columns=HEADERS).to_markdown(index=False, disable_numparse=True)


# Column names a view keeps for code and tests, and the heading a reader sees.
HEADERS = {"bar": "target"}


def marked_rows(markdown: str) -> int:
    """How many rows of a markdown table carry the host-bound mark."""
    return sum(HOST_BOUND in line for line in markdown.splitlines()[2:])


class Tables:
    """The `table` filter of one render, which remembers how many rows of the table it wrote
    last carry the host-bound mark: the legend under a table (templates/host_bound.md.j2) counts
    that table's own rows, whatever the section's other tables hold."""

    def __init__(self):
        self.last_marked = 0

    def table(self, df: pd.DataFrame | None) -> str:
        text = table(df)
        self.last_marked = marked_rows(text) if df is not None and len(df) else 0
        return text

    def marked(self) -> int:
        return self.last_marked


def ratio_range(ratios: pd.Series) -> dict:
    """{n, min, max, mean} of a series of ratios (NaN dropped): the numbers prose quotes."""
    ratios = ratios.dropna()
    if ratios.empty:
        return {"n": 0}
    return {"n": len(ratios), "min": float(ratios.min()), "max": float(ratios.max()),
            "mean": float(ratios.mean())}


def bar(text: str, value: float, measured: str, met: bool) -> dict:
    """One line of a section's targets (the config's `report`): what is asked, the
    measured value (kept as a number for tests, `_value`), how the report states it, and whether
    it holds. Its `bar` column is headed "target" in the report (`HEADERS`)."""
    return {"bar": text, "measured": measured, "met": bool(met), "_value": float(value)}


def stop_rule(cases) -> dict | None:
    """The stop rule of step-timed cases (bench/timing.py's sample_until), from one row per
    timing: {"within": the median's share, "early": timings it stopped, "timings": timings};
    None for rows of a run without it."""
    import pandas as pd
    if "median_within" not in cases or not cases["median_within"].notna().any():
        return None
    stops = cases["stop"].astype(str) if "stop" in cases else pd.Series(dtype=str)
    return {"within": float(cases["median_within"].dropna().iloc[0]),
            "early": int(stops.str.startswith("median").sum()), "timings": len(cases)}
