"""Energy per token beside tokens/s and MFU, shared by the end-to-end and the ladder sections:
the rows `joules_per_token`, `mean_power_w`, `power_limit_w` and `mean_sm_clock_mhz` that a CUDA
case of bench/e2e.py's `time_steps` writes over its timed steps (bench/energy.py: the GPU's NVML
energy counter, read before and after the timed steps, over the tokens they processed; the power
draw and SM clock sampled in between). A case without them (older results, a CPU run, the
ladder's floors) shows an empty cell; a case whose counter could not be read (the row is NaN, its
`message` says why) shows "not measured", and the note under its table gives the reason.

`power_note` is the line under a table that says whether the power limit binds: the cases' mean
power against the limit, and their mean SM clock (a GPU held at its power limit lowers its clock).
"""
from __future__ import annotations

import math

import pandas as pd

JOULES = "joules_per_token"
POWER = ("mean_power_w", "power_limit_w", "mean_sm_clock_mhz")
ENERGY_METRICS = (JOULES, *POWER)
NOT_MEASURED = "not measured"
NEAR_LIMIT = 0.9  # a case drawing at least this share of its power limit is named in the note
MAX_NAMED = 6  # cases the note names at most; the rest are counted


def _median(case: pd.DataFrame, metric: str) -> float | None:
    """A case's median of `metric`: None where it has no such row, NaN where the row is empty."""
    row = case[case["metric"] == metric]
    if row.empty:
        return None
    value = pd.to_numeric(row["median"], errors="coerce").iloc[0]
    return float(value) if pd.notna(value) else math.nan


def joules_cell(case: pd.DataFrame):
    """A case's J/token as its table shows it: the median over its timed steps, its status if it
    did not run `ok`, "not measured" where the row is empty (why: `power_note`'s `why_not`), None
    where the case has no joules row."""
    if case.empty:
        return None
    status = case["status"].iloc[0]
    if status != "ok":
        return status
    joules = _median(case, JOULES)
    if joules is None:
        return None
    return joules if math.isfinite(joules) else NOT_MEASURED


def power_cell(case: pd.DataFrame) -> str | None:
    """A case's mean power over its timed steps against the power limit, "688 / 700" (W); None
    where either was not measured or the case did not run `ok`."""
    if case.empty or case["status"].iloc[0] != "ok":
        return None
    power, limit = _median(case, "mean_power_w"), _median(case, "power_limit_w")
    if power is None or limit is None or not (math.isfinite(power) and math.isfinite(limit)):
        return None
    return f"{power:,.0f} / {limit:,.0f}"


def columns(case: pd.DataFrame, power: bool = True) -> dict:
    """{"J/token": ..., "W / limit": ...} of one case (the W column with `power`)."""
    out = {"J/token": joules_cell(case)}
    if power:
        out["W / limit"] = power_cell(case)
    return out


def power_note(df: pd.DataFrame, label) -> dict:
    """What the line under a table says (templates/power.md.j2), from the rows of its ok cases:
    how many cases were measured, their mean power's range against the power limit(s), their mean
    SM clock's range, the cases within `NEAR_LIMIT` of the limit (label(first row of the case),
    their power and SM clock, the highest share first), and why a joules row is empty (each
    distinct message, with how many cases). n 0, nothing else, where nothing was measured."""
    nothing = {"n": 0, "n_power": 0, "why_not": []}
    if df.empty or "metric" not in df:
        return nothing
    rows = df[(df["status"] == "ok") & df["metric"].isin(ENERGY_METRICS)]
    if rows.empty:
        return nothing
    values = rows.assign(median=pd.to_numeric(rows["median"], errors="coerce")).groupby(
        ["case_id", "metric"])["median"].first().unstack().reindex(columns=list(ENERGY_METRICS))
    empty = rows[(rows["metric"] == JOULES) & values[JOULES].reindex(rows["case_id"]).isna().to_numpy()]
    empty = empty.drop_duplicates("case_id")  # a case shown in several studies counts once
    messages = empty["message"] if "message" in empty else pd.Series("", index=empty.index, dtype=object)
    messages = messages.astype(object).fillna("").astype(str).replace("", "no reason recorded")
    why_not = [{"message": m, "n": int(n)} for m, n in messages.value_counts(sort=False).items()]
    measured = values.dropna(subset=["mean_power_w", "power_limit_w"])
    out = {"n": int(values[JOULES].notna().sum()), "why_not": why_not, "n_power": len(measured)}
    if measured.empty:
        return out
    first = rows.drop_duplicates("case_id").set_index("case_id")
    share = measured["mean_power_w"] / measured["power_limit_w"]
    clock = measured["mean_sm_clock_mhz"].dropna()
    near = share[share >= NEAR_LIMIT].sort_values(ascending=False)
    out.update({
        "power_min": float(measured["mean_power_w"].min()), "power_max": float(measured["mean_power_w"].max()),
        "share_max": float(share.max()), "limits": sorted({float(x) for x in measured["power_limit_w"]}),
        **({"clock_min": float(clock.min()), "clock_max": float(clock.max())} if len(clock) else {}),
        "near_limit_pct": 100 * NEAR_LIMIT, "n_near": len(near),
        "near": [{"case": label(first.loc[c]), "power": float(measured.loc[c, "mean_power_w"]),
                  "share_pct": 100 * float(share[c]), "clock": float(measured.loc[c, "mean_sm_clock_mhz"])}
                 for c in near.index[:MAX_NAMED]]})
    return out
