"""The page `python -m lmperf.compare` writes (lmperf.compare judges the rows): its summary
first, then the rows that disagree, the cases not ok in a run, the rows in one run only, and
every row folded in <details>."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lmperf import providers, stats
from lmperf.report.format import HOST_BOUND

EQUAL, DIFFERS = "equal", "differs"
LARGEST = 3  # differences the summary names


def gpus(df: pd.DataFrame) -> list[str]:
    """The GPUs a run's rows name (`gpu` provenance; `hw` where it is empty, as on a CPU)."""
    names = df["gpu"] if "gpu" in df else pd.Series(math.nan, index=df.index, dtype=object)
    return sorted(set(names.fillna(df["hw"] if "hw" in df else math.nan).dropna().astype(str)))


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


def farthest_first(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` by how far their time ratio is from 1, farthest first. The distance is rounded to 9
    decimals, so a time and the rate computed from it (the same ratio up to the last bits, which
    differ between NumPy builds) tie, and ties go in the order of the row's key: the same page
    from the same results on every machine."""
    key = ["section", "study", "case_id", "metric", "detail"]
    return (rows.assign(_d=np.log(time_ratio(rows)).abs().round(9))
            .sort_values(["_d", *key], ascending=[False] + [True] * len(key), kind="stable"))


# The headline numbers a comparison opens with (its chart): (label, section, study, case_id
# regular expression, metric), each read from one row both runs hold. A host-bound row is left
# out of the chart and named under it. Ours by the registry's names (lmperf.providers: under the
# leaderboard's harness, and called as it is); the peer beside ours is the page's choice.
HEADLINE = [
    ("FlashAttention-2 fwd+bwd, leaderboard shape", "flash_attention", "bench",
     rf"headline-{providers.ours(harness='leaderboard')}-.*", "fwd_bwd_ms"),
    ("cuDNN (SDPA) fwd+bwd, leaderboard shape", "flash_attention", "bench", r"headline-sdpa_cudnn-.*", "fwd_bwd_ms"),
    ("FlashAttention-2 forward, throughput shape", "flash_attention", "bench",
     rf"throughput-{providers.ours()}-bf16-full-.*", "forward_ms"),
    ("ladder: fp32 eager step (rung 1)", "ladder", "ladder", r".*-rung01-.*", "step_ms"),
    ("ladder: best bf16 rung (context 2,048)", "ladder", "ladder", r".*-rung15-.*", "step_ms"),
    ("ladder: FP8 rung", "ladder", "ladder", r".*-ours_float8_delayed", "step_ms"),
    ("ladder: context 4,096 with checkpointing", "ladder", "ladder", r".*-checkpoint", "step_ms"),
    ("e2e: 2.7B fp32 eager training step", "e2e", "variants", r"2\.7B-ctx256-fp32-eager-train-.*", "step_ms"),
    ("LRPE-cosine: device-to-device copy", "lrpe", "bench", r".*", "copy_gbs"),
]
# Rows of a first step, of the profiler's kernels and of checks are no steady-state timing: the
# "largest differences" are read among the others.
NOT_STEADY = {"sections": ("profile", "convergence"), "studies": ("check", "warmup"), "metrics": ("first_step_ms",)}


def steady(rows: pd.DataFrame) -> pd.DataFrame:
    """The timing rows of steady-state measurements (`NOT_STEADY` left out), not host-bound."""
    keep = (rows["kind"].isin(["time", "rate"]) & ~rows["host_bound"]
            & ~rows["section"].isin(NOT_STEADY["sections"]) & ~rows["study"].isin(NOT_STEADY["studies"])
            & ~rows["metric"].isin(NOT_STEADY["metrics"]))
    return rows[keep]


def headline(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per `HEADLINE` entry both runs hold: its label, B's time over A's, host-bound or not."""
    out = []
    for name, section, study, case, metric in HEADLINE:
        hit = rows[(rows["section"] == section) & (rows["study"] == study) & (rows["metric"] == metric)
                   & rows["case_id"].str.fullmatch(case) & rows["ratio"].notna()]
        if len(hit):
            r = hit.sort_values("case_id").iloc[0]
            out.append({"headline": name, "row": f"{section}/{study}/{r['case_id']} {metric}",
                        "B time / A time": float(time_ratio(hit.loc[[r.name]]).iloc[0]),
                        "verdict": r["verdict"], "host_bound": bool(r["host_bound"])})
    return pd.DataFrame(out)


def chart(table: pd.DataFrame, path, name_a: str, name_b: str) -> bool:
    """The headline ratios (not host-bound) as horizontal bars, B's time over A's; False where none."""
    shown = table[~table["host_bound"]] if len(table) else table
    if not len(shown):
        return False
    from lmperf.report.plot import plt, save
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(shown) + 1.2))
    y = range(len(shown))[::-1]
    ratios = shown["B time / A time"].tolist()
    ax.barh(list(y), ratios, color=["C2" if r < 1 else "C3" for r in ratios])
    ax.set_yticks(list(y), shown["headline"].tolist(), fontsize="small")
    ax.axvline(1, color="k", lw=0.8)
    for yi, r in zip(y, ratios):
        ax.annotate(f"{r:.2f}", (r, yi), textcoords="offset points", xytext=(4, -3), fontsize="x-small")
    ax.set_xlabel("B's time / A's (below 1: B is faster)")
    ax.set_title(f"Headline numbers: B = {name_b} against A = {name_a}", fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    save(fig, path)
    return True


def largest(rows: pd.DataFrame, n: int = LARGEST) -> str:
    """The n rows whose time ratio is farthest from 1, as prose."""
    top = farthest_first(rows).head(n)
    return "; ".join(f"{label(r)} B/A {r['ratio']:.3f} ({r['verdict']})" for _, r in top.iterrows())


CODE_CHANGED = "code changed"


def at_other_code(rows: pd.DataFrame) -> pd.Series:
    """Per row: whether the two runs measured it at code that differs (lmperf.compare.same_code)."""
    return rows["code"].eq(CODE_CHANGED) if "code" in rows else pd.Series(False, index=rows.index)


def framing(result: dict, name_a: str, name_b: str) -> str:
    (ga, gb), t = result["gpus"], result["threshold"]
    if result["hardware"]:
        other = int(at_other_code(result["rows"]).sum())
        return (f"**Hardware comparison**: {', '.join(gb)} (B, `{name_b}`) against {', '.join(ga)} "
                f"(A, `{name_a}`). Only rows that both runs measured at the same code are compared "
                f"here; {other} rows measured at code that differs between the runs are listed apart "
                "(\"code changed\") and judged by nothing. This is not a regression check, and the "
                "exit status is 0.")
    return (f"**Regression check** on {', '.join(ga) or 'one machine'}: B (`{name_b}`) against "
            f"the baseline A (`{name_a}`), threshold {pct(t)}.")


def counts(timing: pd.DataFrame) -> tuple[int, int, int]:
    count = timing["verdict"].value_counts()
    return tuple(int(count.get(v, 0)) for v in (stats.SAME, stats.FASTER, stats.SLOWER))


def agreement(result: dict) -> str:
    """How many timing rows agree, which differ most; host-bound rows counted apart (and, between
    two GPUs, rows at different code left out: they are listed apart)."""
    rows, t = result["rows"], result["threshold"]
    if result["hardware"]:
        rows = rows[~at_other_code(rows)]
    timing = rows[rows["kind"].isin(["time", "rate"])
                  & rows["verdict"].isin([stats.SAME, stats.FASTER, stats.SLOWER])]
    if not len(timing):
        return ("The two runs have no timing row in common measured at the same code." if result["hardware"]
                else "The two runs have no timing row in common.")
    host, timing = timing[timing["host_bound"]], timing[~timing["host_bound"]]
    same, faster, slower = counts(timing)
    if not len(timing):
        text = "Every timing row in common is host-bound."
    elif result["hardware"]:
        tr = time_ratio(timing)
        text = (f"Of {len(timing)} timing rows, B is faster in {faster}, slower in {slower} and the "
                f"same within noise in {same} (threshold {pct(t)}); B's time over A's: median "
                f"{tr.median():.3f}, from {tr.min():.3f} to {tr.max():.3f}.")
    else:
        text = (f"**{same} of {len(timing)} timing rows agree within noise**; B is slower in "
                f"{slower} and faster in {faster} (beyond {pct(t)} and outside the noise).")
    if len(host):
        h_same, h_faster, h_slower = counts(host)
        text += (f" A further {len(host)} rows are host-bound ({HOST_BOUND}: the GPU sat idle more "
                 f"than {result['host_bound_pct']:g}% of the call in either run, so the time follows "
                 f"the host's speed): {h_same} agree, B is slower in {h_slower} and faster in "
                 f"{h_faster}; they are marked and never fail the check.")
    timing = steady(timing)  # the largest differences: steady-state rows only
    differ = timing[timing["verdict"] != stats.SAME]
    if len(differ):
        return f"{text} The largest differences among steady-state rows: {largest(differ)}."
    if len(timing):
        return f"{text} No steady-state row differs beyond the noise; the largest ratios: {largest(timing)}."
    return text


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
          "the threshold; rows with one value (basis `one value`) on the threshold alone. "
          f"{HOST_BOUND} marks a host-bound row, which never fails the check. Counts "
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
        "basis": rows["basis"].values,
        "verdict": [f"{v} {HOST_BOUND}" if h else v for v, h in zip(rows["verdict"], rows["host_bound"])]})


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


def one_run_only(result: dict) -> list[str]:
    """The rows in one run only: a study (a results file) that the other run lacks altogether as
    one line (its cases and rows), the rest row by row."""
    only, study = result["only"], ["section", "study"]
    in_both = set(map(tuple, result["rows"][study].drop_duplicates().values))
    runs = only.groupby(study)["run"].nunique()
    whole = only[[key not in in_both and runs[key] == 1 for key in map(tuple, only[study].values)]]
    rest = only.drop(whole.index)
    out = []
    if len(whole):
        files = (whole.groupby([*study, "run"], sort=False)
                 .agg(cases=("case_id", "nunique"), rows=("metric", "size")).reset_index())
        out += ["Whole studies in one run only:", "", markdown(files), ""]
    if len(rest) or not len(whole):
        out += folded(f"{len(rest)} rows", markdown(rest)) if len(rest) > 20 else [markdown(rest), ""]
    return out


def render(result: dict, name_a: str, name_b: str, a: pd.DataFrame, b: pd.DataFrame,
           figure=None) -> str:
    """The page: its summary and headline numbers (with their chart, written to `figure` where
    given: a PNG beside the page), then, folded, the rows that disagree, the cases not ok, the
    rows in one run only and every row (one folded table a section)."""
    from pathlib import Path
    rows = result["rows"]
    kind_of = "hardware comparison" if result["hardware"] else "regression check"
    other_code = rows[at_other_code(rows)] if result["hardware"] else rows.iloc[:0]
    rows = rows.drop(other_code.index)
    top = headline(rows)
    out = [f"# `{name_b}` against `{name_a}` ({kind_of})", "", *summary(result, name_a, name_b, a, b), ""]
    drawn = False
    if len(top):
        drawn = figure is not None and chart(top, Path(figure), name_a, name_b)
        if drawn:
            out += [f"![Headline numbers: B's time over A's]({Path(figure).name})", ""]
        bound = top[top["host_bound"]]
        shown = top[~top["host_bound"]]
        out += ["Headline numbers, B's time over A's (below 1 B is faster): " + "; ".join(
            f"{r['headline']} {r['B time / A time']:.3f}" for _, r in shown.iterrows()) + "."]
        if len(bound):
            out += [f"Host-bound in a run ({HOST_BOUND}), left out: " + "; ".join(bound["headline"]) + "."]
        out += [""]
    if figure is not None and not drawn:  # no chart this time: none of an earlier page's stays beside it
        Path(figure).unlink(missing_ok=True)
    out += folded("How B/A and its verdict are computed", METHOD)
    disagree = rows[rows["verdict"].isin([stats.FASTER, stats.SLOWER, DIFFERS])]
    disagree = farthest_first(disagree)
    out += ["## Rows that disagree", "", *folded(f"{len(disagree)} rows, farthest from 1 first", markdown(view(disagree)))]
    not_ok = result["not_ok"].copy()
    for c in ("message_a", "message_b"):
        not_ok[c] = not_ok[c].map(lambda m: "" if pd.isna(m) else str(m)[:120])
    not_ok = not_ok.rename(columns={"status_a": "A status", "status_b": "B status",
                                    "message_a": "A message", "message_b": "B message"})
    changed = status_changed(result["not_ok"])
    out += ["## Cases not ok in a run", "", "Status changed between the runs:", "",
            markdown(not_ok[changed.values]), ""]
    out += folded(f"Not ok in both runs alike ({int((~changed).sum())} cases)", markdown(not_ok[~changed.values]))
    if result["hardware"]:
        out += ["## Rows at different code", "",
                f"Measured at commits whose code for their section differs between the runs (\"code changed\"): "
                "a difference in them may be the code's, not the hardware's, so none is judged here.", "",
                *folded(f"{len(other_code)} rows", markdown(view(other_code)))]
    out += ["## Rows in one run only", "", *one_run_only(result)]
    out += ["## Every row", ""]
    for section, group in view(rows).groupby(rows["section"].values, sort=False):
        out += folded(f"{section} ({len(group)} rows)", markdown(group))
    return "\n".join(out)
