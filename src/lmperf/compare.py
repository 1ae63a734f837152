"""Compare two results folders row by row: is run B the same as run A, within noise?

    python -m lmperf.compare results/h100-80gb-hbm3 results/h100-rerun [--out page.md]
        [--threshold 0.08] [--exit-zero]

Every CSV under each folder (journals of unfinished jobs excluded) is read, and rows are joined
by (section, study, case_id, metric); where a study writes several rows of one metric per case
(the profile's kernels, the memory section's allocations), the case columns that tell them apart
are added to the key and shown as the row's `detail`.

What is judged, by the metric's unit:
- times (ms, s, us) and rates (TFLOP/s, GB/s, tokens/s, MFU; higher is better, so "faster"
  is inverted): the ratio of medians B/A and a verdict, same within noise / faster / slower
  (`lmperf.stats.verdict`: outside the noise and beyond the threshold). The noise comes from
  the rows' samples where both runs have at least `stats.MIN_SAMPLES` (a bootstrap interval,
  basis `samples`), else from their 20%/80% quantiles (rows timed by do_bench keep only those:
  basis `quantiles`, the two ranges must not overlap), else there is none (basis `one value`:
  judged on the threshold alone, shown, but never failing the regression check);
- counts and sizes (parameters, FLOP, MiB, ...): equal or differs;
- everything else (errors against float64 on fresh random inputs, fractions): shown only.

A case in both runs that did not run `ok` in one or both (oom, error, skipped, ...) is listed
with both statuses instead of being judged; rows present in one run only are listed with their
status, never dropped.

Two framings, chosen from the rows' `gpu` provenance. The same GPU in both folders: a
regression check of B against the baseline A, which exits with status 1 when a row is slower
beyond the threshold and outside the noise, or a case that ran ok in A fails (oom, error) in B,
so it can gate a user's CI. The default threshold, 8%, sits above the spread between fresh
processes seen on an H100 (the FlashAttention-2 headline: 5.01 ms in a fresh clone against
4.75 ms committed, +5.5%; SDPA-flash 7.05 against 6.89 ms, +2.3%), which samples from one
process do not show. Different GPUs: a hardware comparison, which says so and exits 0.

The page: the summary first, then the rows that disagree, the cases not ok in a run, the rows
in one run only, and every row folded in <details>.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from lmperf import stats
from lmperf.bench.common import METRIC_COLUMNS, PROVENANCE_COLUMNS
from lmperf.report.format import Spread

DEFAULT_THRESHOLD = 0.08
CASE = ["section", "study", "case_id"]
KEY = [*CASE, "metric"]
TIME_UNITS = {"ms", "s", "us", "ns"}
RATE_UNITS = {"TFLOP/s", "GB/s", "tokens/s"}
RATE_METRIC_PREFIXES = ("mfu",)  # MFU is in %, a unit other metrics share
EXACT_UNITS = {"count", "FLOP", "MiB", "blocks", "sequences", "value"}
FAILED = {"oom", "error"}  # statuses that, after an ok baseline, fail the regression check
EQUAL, DIFFERS = "equal", "differs"
LARGEST = 3  # differences the summary names


def result_csvs(folder) -> list[str]:
    """The results CSVs under a folder (also the Snakemake rule's inputs) but journals and the
    repeats (`repeats/`: cases its jobs hold, measured again); a ValueError where there are none."""
    paths = [str(p) for p in sorted(Path(folder).rglob("*.csv"))
             if ".journal" not in p.parts and p.relative_to(folder).parts[0] != "repeats"]
    if not paths:
        raise ValueError(f"{folder}: no results CSVs under it" if Path(folder).is_dir()
                         else f"{folder}: no such results folder")
    return paths


def load(folder) -> pd.DataFrame:
    """Every results row under `folder`."""
    text = {c: str for c in ("section", "study", "case_id", "metric", "unit", "samples", "status")}
    frames = [pd.read_csv(p, keep_default_na=False, na_values=[""], dtype=text)
              for p in result_csvs(folder)]
    frames = [f for f in frames if {*KEY, "status"} <= set(f.columns)]  # not env/env.csv's key-value
    if not frames:
        raise ValueError(f"{folder}: no results CSVs with section, study, case_id, metric and "
                         "status columns under it")
    return pd.concat(frames, ignore_index=True)


def kind(metric, unit) -> str:
    """'time' (lower is better), 'rate' (higher is better), 'exact' (a count or size) or 'info'."""
    if unit in TIME_UNITS:
        return "time"
    if unit in RATE_UNITS or str(metric).startswith(RATE_METRIC_PREFIXES):
        return "rate"
    return "exact" if unit in EXACT_UNITS else "info"


def add_detail(both: pd.DataFrame) -> pd.DataFrame:
    """A `detail` column that, with KEY, identifies a row within its run (`_run`): for each
    (section, study, metric) with repeated keys, the first case columns in file order that
    tell the rows apart ("kernel=..."), fewest first, an occurrence number as the last resort."""
    both = both.assign(detail="")
    not_case = {*KEY, *METRIC_COLUMNS, *PROVENANCE_COLUMNS, "wall_s", "detail"}
    repeated = both[both.duplicated(["_run", *KEY], keep=False)]
    for _, group in repeated.groupby(["section", "study", "metric"], dropna=False):
        chosen = []
        for c in (c for c in both.columns if c not in not_case and not c.startswith("_")):
            if group.groupby(["_run", *KEY], dropna=False)[c].nunique(dropna=False).max() > 1:
                chosen.append(c)
                if not group.duplicated(["_run", *KEY, *chosen]).any():
                    break
        for c in chosen[:-1]:  # drop what the later columns made redundant (a measured dtype)
            if not group.duplicated(["_run", *KEY, *(x for x in chosen if x != c)]).any():
                chosen.remove(c)
        both.loc[group.index, "detail"] = [
            ", ".join(f"{c}={show_value(v)}" for c, v in zip(chosen, values))
            for values in group[chosen].itertuples(index=False)] if chosen else ""
    again = both.duplicated(["_run", *KEY, "detail"], keep=False)
    if again.any():
        occurrence = both[again].groupby(["_run", *KEY, "detail"], dropna=False).cumcount() + 1
        both.loc[again, "detail"] += " #" + occurrence.astype(str)
    return both


def show_value(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return "" if pd.isna(v) else str(v)


def case_status(df: pd.DataFrame) -> pd.DataFrame:
    """Per case (section, study, case_id): its status (the first one not ok, else ok) and message."""
    first_bad = df.assign(_ok=df["status"].eq("ok")).sort_values("_ok", kind="stable")
    return first_bad.drop_duplicates(CASE).set_index(CASE)[["status", "message"]]


def side(row, suffix: str) -> tuple[stats.Quantiles, np.ndarray]:
    """One run's median and quantiles in a joined row (as recorded, else from its samples), and
    its samples."""
    samples = stats.parse_samples(row["samples" + suffix])
    recorded = stats.Quantiles(*(float(row[c + suffix]) for c in stats.Quantiles._fields))
    if np.size(samples) == 1:  # one sample: its "quantiles" are the value itself, no spread
        recorded = stats.Quantiles(recorded.median, math.nan, math.nan)
    return stats.complete(recorded, samples), samples


def judge(row, threshold: float) -> dict:
    """The ratio B/A of one joined row, its interval, the basis of that interval and the verdict."""
    (qa, sa), (qb, sb) = side(row, "_a"), side(row, "_b")
    k = kind(row["metric"], row["unit"])
    out = {"kind": k, "A": Spread(qa.median, q20=qa.q20, q80=qa.q80),
           "B": Spread(qb.median, q20=qb.q20, q80=qb.q80), "ratio": qb.median / qa.median if qa.median else math.nan,
           "low": math.nan, "high": math.nan, "basis": "", "verdict": ""}
    if k == "exact":
        same = qa.median == qb.median or (math.isnan(qa.median) and math.isnan(qb.median))
        return {**out, "verdict": EQUAL if same else DIFFERS}
    if k == "info":
        return out
    if not (qa.median > 0 and qb.median > 0):
        return {**out, "basis": "no positive median", "verdict": "n/a"}
    j = stats.judge(qa, sa, qb, sb, threshold, higher_is_better=k == "rate")
    return {**out, "low": j.ratio.low, "high": j.ratio.high, "basis": j.basis, "verdict": j.verdict}


def gpus(df: pd.DataFrame) -> list[str]:
    """The GPUs a run's rows name (`gpu` provenance; `hw` where it is empty, as on a CPU)."""
    names = df["gpu"] if "gpu" in df else pd.Series(math.nan, index=df.index, dtype=object)
    return sorted(set(names.fillna(df["hw"] if "hw" in df else math.nan).dropna().astype(str)))


def compare(a: pd.DataFrame, b: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> dict:
    """Join two runs' rows and judge each: {"rows": every paired row with its verdict,
    "only": rows in one run only (with their status), "not_ok": cases in both runs and not ok
    in one or both, "hardware": whether the runs are on different GPUs, "gpus", "failing": the
    rows and cases that fail the regression check}."""
    if not 0 < threshold < 1:
        raise ValueError(f"--threshold must be a fraction between 0 and 1 (0.08 is 8%), got {threshold}")
    cases = case_status(a).add_suffix("_a").join(case_status(b).add_suffix("_b"), how="outer")
    in_both = cases["status_a"].notna() & cases["status_b"].notna()
    not_ok = cases[in_both & (cases["status_a"].ne("ok") | cases["status_b"].ne("ok"))]
    both = add_detail(pd.concat([a.assign(_run="a"), b.assign(_run="b")], ignore_index=True))
    both = both[~both.set_index(CASE).index.isin(not_ok.index)]
    columns = [*KEY, "detail", "unit", "status", "median", "q20", "q80", "samples"]
    for c in columns:
        both[c] = both[c] if c in both else math.nan
    joined = pd.merge(both.loc[both["_run"] == "a", columns], both.loc[both["_run"] == "b", columns],
                      on=[*KEY, "detail"], how="outer", suffixes=("_a", "_b"), indicator=True)
    joined["unit"] = joined["unit_a"].fillna(joined["unit_b"])
    joined["status"] = joined["status_a"].fillna(joined["status_b"])
    only = joined[joined["_merge"] != "both"]
    paired = joined[joined["_merge"] == "both"].reset_index(drop=True)
    judged = pd.DataFrame([judge(r, threshold) for _, r in paired.iterrows()],
                          columns=["kind", "A", "B", "ratio", "low", "high", "basis", "verdict"])
    rows = pd.concat([paired[[*KEY, "detail", "unit"]], judged], axis=1)
    ga, gb = gpus(a), gpus(b)
    hardware = bool(ga and gb and ga != gb)
    slower = rows[(rows["verdict"] == stats.SLOWER) & rows["basis"].isin(stats.BASES[:2])]
    broke = not_ok[not_ok["status_a"].eq("ok") & not_ok["status_b"].isin(FAILED)]
    failing = {"slower": pd.DataFrame() if hardware else slower,
               "broke": pd.DataFrame() if hardware else broke}
    return {"rows": rows, "not_ok": not_ok.reset_index(),
            "only": only.assign(run=only["_merge"].map({"left_only": "A", "right_only": "B"}))
            [[*KEY, "detail", "unit", "run", "status"]].reset_index(drop=True),
            "hardware": hardware, "gpus": (ga, gb), "threshold": threshold, "failing": failing}


# ---------------------------------------------------------------------------------------------
# The page


def pct(fraction: float) -> str:
    return f"{100 * fraction:g}%"


def describe(df: pd.DataFrame) -> str:
    """A run's provenance in one line: GPU, commits, library versions, when it was measured."""
    def values(column, most=3):
        v = sorted(set(df[column].dropna().astype(str))) if column in df else []
        return ", ".join(v[:most]) + (f" and {len(v) - most} more" if len(v) > most else "") or "n/a"
    dates = sorted(df["measured_at"].dropna().astype(str).str[:10]) if "measured_at" in df else []
    when = f"measured {dates[0]} to {dates[-1]}" if dates else "no measurement dates"
    return (f"{', '.join(gpus(df)) or 'n/a'}; commit {values('commit')}; torch {values('torch')}, "
            f"triton {values('triton')}; {when}")


def time_ratio(rows: pd.DataFrame) -> pd.Series:
    """B's time over A's per row: the ratio itself for times, its reciprocal for rates."""
    return rows["ratio"].where(rows["kind"] != "rate", 1 / rows["ratio"])


def label(r) -> str:
    detail = f" ({r['detail']})" if r["detail"] else ""
    return f"`{r['section']}/{r['study']}/{r['case_id']}` {r['metric']}{detail}"


def largest(rows: pd.DataFrame, n: int = LARGEST) -> str:
    """The n rows whose time ratio is farthest from 1, as prose."""
    top = rows.assign(_d=np.log(time_ratio(rows)).abs()).nlargest(n, "_d")
    return "; ".join(f"{label(r)} B/A {r['ratio']:.3f} ({r['verdict']})" for _, r in top.iterrows())


def framing(result: dict, name_a: str, name_b: str) -> str:
    (ga, gb), t = result["gpus"], result["threshold"]
    if result["hardware"]:
        return (f"**Hardware comparison**: {', '.join(gb)} (B, `{name_b}`) against {', '.join(ga)} "
                f"(A, `{name_a}`). Differences here are the hardware's: this is not a regression "
                "check, and the exit status is 0.")
    return (f"**Regression check** on {', '.join(ga) or 'one machine'}: B (`{name_b}`) against "
            f"the baseline A (`{name_a}`), threshold {pct(t)}.")


def agreement(result: dict) -> str:
    """How many timing rows agree, which differ most."""
    rows, t = result["rows"], result["threshold"]
    timing = rows[rows["kind"].isin(["time", "rate"])
                  & rows["verdict"].isin([stats.SAME, stats.FASTER, stats.SLOWER])]
    if not len(timing):
        return "The two runs have no timing row in common."
    count = timing["verdict"].value_counts()
    same, faster, slower = (int(count.get(v, 0)) for v in (stats.SAME, stats.FASTER, stats.SLOWER))
    if result["hardware"]:
        tr = time_ratio(timing)
        text = (f"Of {len(timing)} timing rows, B is faster in {faster}, slower in {slower} and the "
                f"same within noise in {same} (threshold {pct(t)}); B's time over A's: median "
                f"{tr.median():.3f}, from {tr.min():.3f} to {tr.max():.3f}.")
    else:
        text = (f"**{same} of {len(timing)} timing rows agree within noise**; B is slower in "
                f"{slower} and faster in {faster} (beyond {pct(t)} and outside the noise).")
    differ = timing[timing["verdict"] != stats.SAME]
    if len(differ):
        return f"{text} The largest differences: {largest(differ)}."
    return f"{text} No row differs beyond the noise; the largest ratios: {largest(timing)}."


def summary(result: dict, name_a: str, name_b: str, a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """The page's first lines (also what the command prints)."""
    rows, t = result["rows"], result["threshold"]
    lines = [framing(result, name_a, name_b), "", f"- A: {describe(a)}", f"- B: {describe(b)}", "",
             agreement(result), ""]
    one_value = int((rows["basis"] == stats.BASES[2]).sum())
    if one_value:
        lines.append(f"- {one_value} timing rows have one value and no spread in a run: they are judged "
                     "on the threshold alone and never fail the check.")
    exact = rows[rows["kind"] == "exact"]
    if len(exact):
        lines.append(f"- Of {len(exact)} counts and sizes, {int((exact['verdict'] == EQUAL).sum())} are equal.")
    only = result["only"]["run"].value_counts()
    changed = int(status_changed(result["not_ok"]).sum())
    lines += [f"- {int(only.get('A', 0))} rows are in A only and {int(only.get('B', 0))} in B only.",
              f"- Of the cases in both runs, {changed} changed status (ok, oom, skipped, ...) and "
              f"{len(result['not_ok']) - changed} were not ok in both alike (listed below).", ""]
    if not result["hardware"]:
        slow, broke = result["failing"]["slower"], result["failing"]["broke"]
        if len(slow) or len(broke):
            lines.append(f"**Result: fail** (exit status 1): {len(slow)} rows slower beyond {pct(t)} and "
                         f"outside the noise; {len(broke)} cases that ran ok in A fail (oom, error) in B.")
        else:
            lines.append("**Result: pass** (exit status 0): no row slower beyond the threshold and "
                         "outside the noise, no case that ran ok in A fails in B.")
    return lines


METHOD = ("B/A is the ratio of the two runs' medians (for TFLOP/s, GB/s, tokens/s and MFU, above 1 "
          f"is faster). Its interval: a {stats.LEVEL:.0%} percentile bootstrap over both runs' samples "
          f"({stats.RESAMPLES:,} resamples, seed {stats.SEED}; basis `samples`), or, for rows that "
          "keep only a median and 20%/80% quantiles (do_bench), B's 20%-80% range against A's "
          "(basis `quantiles`: the interval excludes 1 when the ranges do not overlap). A row is "
          "slower or faster when its interval lies wholly on one side of 1 and its ratio is beyond "
          "the threshold; rows with one value (basis `one value`) on the threshold alone. Counts "
          "and sizes are equal or differ; other values (errors on fresh random inputs, fractions) "
          "are shown only.")


def status_changed(not_ok: pd.DataFrame) -> pd.Series:
    return not_ok["status_a"] != not_ok["status_b"]


def view(rows: pd.DataFrame) -> pd.DataFrame:
    """Judged rows as the page's table: numbers as text (medians with their 20%-80% ranges)."""
    ratio = lambda x: f"{x:.3f}" if math.isfinite(x) else ""
    interval = [f"[{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
                for lo, hi in zip(rows["low"], rows["high"])]
    return pd.DataFrame({
        "row": (rows["section"] + "/" + rows["study"] + "/" + rows["case_id"]).values,
        "metric": rows["metric"].values, "detail": rows["detail"].values, "unit": rows["unit"].values,
        "A": [str(x) for x in rows["A"]], "B": [str(x) for x in rows["B"]],
        "B/A": rows["ratio"].map(ratio).values, "interval": interval,
        "basis": rows["basis"].values, "verdict": rows["verdict"].values})


def markdown(frame: pd.DataFrame) -> str:
    """A markdown table without the alignment padding `format.table` adds: every row of a
    results folder is thousands of lines, and padding to the widest cell would multiply them."""
    if not len(frame):
        return "(no rows)"
    cell = lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) \
        else str(v).replace("|", r"\|").replace("\n", " ")
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in frame.itertuples(index=False)]
    return "\n".join(lines)


def folded(title: str, text: str) -> list[str]:
    return ["<details>", f"<summary>{title}</summary>", "", text, "", "</details>", ""]


def render(result: dict, name_a: str, name_b: str, a: pd.DataFrame, b: pd.DataFrame) -> str:
    """The page: summary, rows that disagree, cases not ok, rows in one run only, every row
    (one folded table a section)."""
    rows = result["rows"]
    kind_of = "hardware comparison" if result["hardware"] else "regression check"
    out = [f"# `{name_b}` against `{name_a}` ({kind_of})", "",
           *summary(result, name_a, name_b, a, b), "", METHOD, ""]
    disagree = rows[rows["verdict"].isin([stats.FASTER, stats.SLOWER, DIFFERS])]
    disagree = disagree.assign(_d=np.log(time_ratio(disagree)).abs()).sort_values("_d", ascending=False)
    out += ["## Rows that disagree", "", markdown(view(disagree)), ""]
    not_ok = result["not_ok"].copy()
    for c in ("message_a", "message_b"):
        not_ok[c] = not_ok[c].map(lambda m: "" if pd.isna(m) else str(m)[:120])
    not_ok = not_ok.rename(columns={"status_a": "A status", "status_b": "B status",
                                    "message_a": "A message", "message_b": "B message"})
    changed = status_changed(result["not_ok"])
    out += ["## Cases not ok in a run", "", "Status changed between the runs:", "",
            markdown(not_ok[changed.values]), ""]
    out += folded(f"Not ok in both runs alike ({int((~changed).sum())} cases)", markdown(not_ok[~changed.values]))
    only = result["only"]
    out += ["## Rows in one run only", ""]
    out += folded(f"{len(only)} rows", markdown(only)) if len(only) > 20 else [markdown(only), ""]
    out += ["## Every row", ""]
    for section, group in view(rows).groupby(rows["section"].values, sort=False):
        out += folded(f"{section} ({len(group)} rows)", markdown(group))
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", help="the baseline results folder (e.g. results/h100-80gb-hbm3)")
    p.add_argument("b", help="the results folder compared with it")
    p.add_argument("--out", type=Path, help="write the page here (default: print it)")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"the practical threshold, a fraction (default {DEFAULT_THRESHOLD}: "
                        f"{pct(DEFAULT_THRESHOLD)})".replace("%", "%%"))
    p.add_argument("--exit-zero", action="store_true",
                   help="exit 0 whatever the verdict (the workflow rule: the page is the product)")
    args = p.parse_args(argv)
    try:
        a, b = load(args.a), load(args.b)
        result = compare(a, b, args.threshold)
    except ValueError as e:
        p.error(str(e))
    page = render(result, args.a, args.b, a, b)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(page)
        print("\n".join(summary(result, args.a, args.b, a, b)))
        print(f"written: {args.out}")
    else:
        print(page)
    failing = any(len(f) for f in result["failing"].values())
    return 0 if args.exit_zero or not failing else 1


if __name__ == "__main__":
    sys.exit(main())
