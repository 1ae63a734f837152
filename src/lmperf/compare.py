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

A timing row is host-bound when its GPU sat idle more than `--host-bound-pct` (the report's
`host_bound_idle_pct`, 10) % of its median call in either run (the rows' `gpu_idle_pct`; a row
without it takes its case's highest in that run): its time follows the host's speed, which
differs between machines and processes more than the GPU's, so it is judged and marked but
never fails the regression check, and the summary counts it apart.

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

from lmperf import providers, stats
from lmperf.csv_schema import CLOCK_COLUMNS, METRIC_COLUMNS, PROVENANCE_COLUMNS
from lmperf.compare_page import DIFFERS, EQUAL, gpus, pct, render, summary
from lmperf.report.format import Spread

DEFAULT_THRESHOLD = 0.08
HOST_BOUND_IDLE_PCT = 10.0  # config report.host_bound_idle_pct, which the workflow rule passes
CASE = ["section", "study", "case_id"]
KEY = [*CASE, "metric"]
TIME_UNITS = {"ms", "s", "us", "ns"}
RATE_UNITS = {"TFLOP/s", "GB/s", "tokens/s"}
RATE_METRIC_PREFIXES = ("mfu",)  # MFU is in %, a unit other metrics share
EXACT_UNITS = {"count", "FLOP", "MiB", "blocks", "sequences", "value"}
FAILED = {"oom", "error"}  # statuses that, after an ok baseline, fail the regression check


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


def in_one_spelling(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both runs' rows in today's provider names (`providers.read_renamed`) where that pairs rows
    that a rename between the runs kept apart; else as written (two runs of before a rename
    compare under the names they were measured with)."""
    new_a, new_b = providers.read_renamed(a), providers.read_renamed(b)
    ids = lambda x, y: len(set(x["case_id"]) & set(y["case_id"]))
    return (new_a, new_b) if ids(new_a, new_b) > ids(a, b) else (a, b)


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
    not_case = {*KEY, *METRIC_COLUMNS, *CLOCK_COLUMNS, *PROVENANCE_COLUMNS, "wall_s", "detail"}
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


def with_idle(df: pd.DataFrame) -> pd.DataFrame:
    """`_idle`: a row's gpu_idle_pct, else the highest of its case's rows in its run (the
    benchmarks measure it on some directions of a case only), else NaN."""
    idle = pd.to_numeric(df["gpu_idle_pct"], errors="coerce") if "gpu_idle_pct" in df \
        else pd.Series(math.nan, index=df.index)
    case_max = idle.groupby([df["_run"], *(df[c] for c in CASE)], dropna=False).transform("max")
    return df.assign(_idle=idle.fillna(case_max))


SAME_CODE, CODE_CHANGED = "same", "code changed"


def same_code(paired: pd.DataFrame) -> pd.Series:
    """Per paired row: "same" where both runs measured it at one commit, or at commits between
    which none of its section's code files (report/freshness.py's) differ; else "code changed"
    (git cannot tell, for a commit not in this checkout, counts as changed)."""
    from lmperf.report import freshness
    memo: dict = {}

    def state(section, ca, cb) -> str:
        ca, cb = str(ca), str(cb)
        if ca == cb and ca not in ("nan", "", "unknown") and not ca.endswith("-dirty"):
            return SAME_CODE
        if (section, ca, cb) not in memo:
            files = freshness.code_files(str(section))
            verdict = CODE_CHANGED
            if files and not any(c in ("nan", "", "unknown") or c.endswith("-dirty") for c in (ca, cb)):
                diff = freshness.changed_between(ca, cb, files)  # None: git cannot tell, not known the same
                verdict = SAME_CODE if diff == [] else CODE_CHANGED
            memo[section, ca, cb] = verdict
        return memo[section, ca, cb]
    return pd.Series([state(s, a, b) for s, a, b in zip(paired["section"], paired["commit_a"], paired["commit_b"])],
                     index=paired.index, dtype=object)


def compare(a: pd.DataFrame, b: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD,
            host_bound_pct: float = HOST_BOUND_IDLE_PCT) -> dict:
    """Join two runs' rows and judge each: {"rows": every paired row with its verdict,
    "only": rows in one run only (with their status), "not_ok": cases in both runs and not ok
    in one or both, "hardware": whether the runs are on different GPUs, "gpus", "failing": the
    rows and cases that fail the regression check}."""
    if not 0 < threshold < 1:
        raise ValueError(f"--threshold must be a fraction between 0 and 1 (0.08 is 8%), got {threshold}")
    cases = case_status(a).add_suffix("_a").join(case_status(b).add_suffix("_b"), how="outer")
    in_both = cases["status_a"].notna() & cases["status_b"].notna()
    not_ok = cases[in_both & (cases["status_a"].ne("ok") | cases["status_b"].ne("ok"))]
    both = with_idle(add_detail(pd.concat([a.assign(_run="a"), b.assign(_run="b")], ignore_index=True)))
    both = both[~both.set_index(CASE).index.isin(not_ok.index)]
    columns = [*KEY, "detail", "unit", "status", "median", "q20", "q80", "samples", "_idle", "commit"]
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
    rows["host_bound"] = (paired["_idle_a"].gt(host_bound_pct) | paired["_idle_b"].gt(host_bound_pct)).values
    rows["code"] = same_code(paired).values
    ga, gb = gpus(a), gpus(b)
    hardware = bool(ga and gb and ga != gb)
    slower = rows[(rows["verdict"] == stats.SLOWER) & rows["basis"].isin(stats.BASES[:2]) & ~rows["host_bound"]]
    broke = not_ok[not_ok["status_a"].eq("ok") & not_ok["status_b"].isin(FAILED)]
    failing = {"slower": pd.DataFrame() if hardware else slower,
               "broke": pd.DataFrame() if hardware else broke}
    return {"rows": rows, "not_ok": not_ok.reset_index(),
            "only": only.assign(run=only["_merge"].map({"left_only": "A", "right_only": "B"}))
            [[*KEY, "detail", "unit", "run", "status"]].reset_index(drop=True),
            "hardware": hardware, "gpus": (ga, gb), "threshold": threshold, "failing": failing,
            "host_bound_pct": host_bound_pct}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", help="the baseline results folder (e.g. results/h100-80gb-hbm3)")
    p.add_argument("b", help="the results folder compared with it")
    p.add_argument("--out", type=Path, help="write the page here (default: print it)")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"the practical threshold, a fraction (default {DEFAULT_THRESHOLD}: "
                        f"{pct(DEFAULT_THRESHOLD)})".replace("%", "%%"))
    p.add_argument("--host-bound-pct", type=float, default=HOST_BOUND_IDLE_PCT,
                   help=f"a timing row whose GPU sat idle more than this share (%%) of its call in "
                        f"either run is host-bound: judged, never failing (default {HOST_BOUND_IDLE_PCT:g})")
    p.add_argument("--exit-zero", action="store_true",
                   help="exit 0 whatever the verdict (the workflow rule: the page is the product)")
    args = p.parse_args(argv)
    try:
        a, b = in_one_spelling(load(args.a), load(args.b))
        result = compare(a, b, args.threshold, args.host_bound_pct)
    except ValueError as e:
        p.error(str(e))
    page = render(result, args.a, args.b, a, b, figure=args.out.with_suffix(".png") if args.out else None)
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
