"""How the training step grows with the context (the end-to-end context study, report/e2e.py):
the step time at a long context over that at a short one, per model size and dtype, from medians,
with the pairs it cannot claim (a host-bound step) and those that did not run at one end."""
from __future__ import annotations

import pandas as pd

from lmperf.report.format import ratio_range


def context_growth(df: pd.DataFrame, lo: int, hi: int) -> dict:
    """The step time at context `hi` over that at `lo`, per (size, dtype), from the medians:
    {short, long, factor, n/min/max/mean over the pairs with neither step host-bound,
    "pairs": those pairs' names and ratios, "host_bound": the pairs with a host-bound step (a
    ratio of the host's speed, not taken), "failed": the pairs whose step did not run at one end,
    with its status}."""
    # a case's step row where it ran; its first row (its status) where it did not
    cases = pd.concat([df[df["metric"] == "step_ms"], df[df["status"] != "ok"]]).drop_duplicates("case_id")
    out = {"short": lo, "long": hi, "factor": hi // lo, "pairs": [], "host_bound": [], "failed": []}
    ratios = []
    for (size, dtype), g in cases.groupby(["size", "dtype"], sort=False):
        ends = {c: g[g["context"] == c] for c in (lo, hi)}
        name = f"{size}, {dtype}"
        if any(e.empty for e in ends.values()):
            continue
        bad = [(c, e["status"].iloc[0]) for c, e in ends.items() if e["status"].iloc[0] != "ok"]
        if bad:
            out["failed"] += [{"pair": name, "size": size, "dtype": dtype, "context": int(c), "status": st} for c, st in bad]
        elif not all(e["claimable"].iloc[0] if "claimable" in e else True for e in ends.values()):
            out["host_bound"].append(name)
        else:
            r = float(ends[hi]["median"].iloc[0] / ends[lo]["median"].iloc[0])
            ratios.append(r)
            out["pairs"].append({"pair": name, "ratio": r})
    return {**out, **ratio_range(pd.Series(ratios, dtype=float))}
