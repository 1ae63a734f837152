"""The FP8 rung's convergence (results/<hw>/convergence/, bench/convergence.py): the loss of every
step of bf16 (the settings of the ladder rung the FP8 rung follows), of bf16 on another draw of the
same stream (the noise floor), and of the FP8 rung's settings; their mean loss over the last
steps, and whether the FP8 run's is within the tolerance of bf16's (config/config.yaml's
`report.convergence`):

    |fp8 - bf16| <= max(noise_multiple x |bf16 on data seed 1 - bf16|, min_relative x bf16)

each the mean loss over a run's last `last_steps` steps (all of them where a run has fewer). The
first term is the noise floor: how far the loss of the same settings moves when only the order of
the batches does, a difference no one would call a regression; the second keeps a pair of bf16 runs
that happen to agree closely from setting a bar no run could be sure to meet."""
from __future__ import annotations

import math

import pandas as pd

from lmperf.report import ladder_fp8
from lmperf.report.format import fmt, unavailable
from lmperf.report.plot import plt, save

DEFAULTS = {"last_steps": 50, "noise_multiple": 2, "min_relative": 0.01}


def view(inputs) -> dict:
    df = inputs.rows("convergence")
    if df.empty:
        return unavailable("no convergence results (rule convergence_run has not run; at full scale the job joins "
                           "the ladder's FP8 rung with the next H100 run)")
    return {"available": True, **judge(df, {**DEFAULTS, **inputs.bars.get("convergence", {})})}


def losses(df: pd.DataFrame) -> dict[str, pd.Series]:
    """{run: its loss a step, indexed by step} of the runs that ran ok."""
    ok = df[(df["status"] == "ok") & (df["metric"] == "loss")]
    return {run: g.set_index(g["step"].astype(int))["mean"].astype(float).sort_index()
            for run, g in ok.groupby("run", sort=False)}


def judge(df: pd.DataFrame, limits: dict) -> dict:
    """The runs' table, the tolerance and the verdict on the FP8 run (`passed`: True, False, or
    None where it was not judged, with `why`)."""
    curves, cases = losses(df), df.drop_duplicates("case_id")
    first = cases.iloc[0]
    steps = min((len(c) for c in curves.values()), default=0)
    n = min(int(limits["last_steps"]), steps) if steps else int(limits["last_steps"])
    last = {run: float(c.iloc[-n:].mean()) for run, c in curves.items()}
    fp8_runs = cases[cases["float8"].astype(str) != "none"]
    fp8 = fp8_runs.iloc[0] if len(fp8_runs) else None
    ref, noise = last.get("bf16", math.nan), last.get("bf16_seed1", math.nan)
    rows = []
    for _, c in cases.iterrows():
        curve = curves.get(c["run"])
        rows.append({"run": c["run"], "float8": c["float8"], "data seed": int(c["data_seed"]),
                     "status": c["status"], "steps": len(curve) if curve is not None else 0,
                     "first loss": float(curve.iloc[0]) if curve is not None else None,
                     f"mean loss, last {n} steps": last.get(c["run"]),
                     "minus bf16's": last[c["run"]] - ref if c["run"] in last else None,
                     "message": c["message"] if c["status"] != "ok" else ""})
    noise_delta = abs(noise - ref)
    tolerance = max(limits["noise_multiple"] * noise_delta, limits["min_relative"] * ref)
    out = {"table": pd.DataFrame(rows), "last_steps": n, "size": first["size"], "rung": first["rung"],
           "context": int(first["context"]), "batch": int(first["batch_size"]),
           "entropy": float(first["stream_entropy"]), "noise_delta": noise_delta, "tolerance": tolerance,
           "limits": limits, "ref": ref, "ref_first": float(curves["bf16"].iloc[0]) if "bf16" in curves else math.nan,
           "passed": None, "why": "", "delta": math.nan, "fp8_run": fp8["run"] if fp8 is not None else "float8",
           "fp8_how": ladder_fp8.how(fp8["float8"]) if fp8 is not None else "float8 training"}
    if fp8 is None or fp8["status"] != "ok":
        out["why"] = ("no FP8 run in the results" if fp8 is None else
                      f"the FP8 run is `{fp8['status']}` ({fp8['message']})")
    elif not (math.isfinite(ref) and math.isfinite(noise_delta)):
        out["why"] = "a bf16 run did not finish: no reference or no noise floor"
    else:
        delta = last[fp8["run"]] - ref
        out["delta"] = delta
        out["passed"] = bool(math.isfinite(delta) and abs(delta) <= tolerance)
        if not math.isfinite(delta):
            out["why"] = "the FP8 run's loss is not finite (it diverged)"
    out["verdict"] = ("not judged: " + out["why"] if out["passed"] is None else
                      f"{'**pass**' if out['passed'] else '**FAIL**'}: |{fmt(out['delta'], 4)}| "
                      f"{'<=' if out['passed'] else '>'} {fmt(tolerance, 4)} nats")
    return out


def figures(inputs, paths: dict) -> dict[str, str]:
    """The loss of every step, one line a run that ran ok."""
    df = inputs.rows("convergence")
    curves = losses(df) if not df.empty else {}
    if not curves:
        return {"convergence": "no convergence run ran ok here"}
    fig, ax = plt.subplots(figsize=(9, 4))
    for run, curve in curves.items():
        ax.plot(curve.index, curve.values, label=run, linewidth=1.2, linestyle="--" if run == "bf16_seed1" else "-")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss (nats a token)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("The FP8 rung's loss against bf16's: same initial weights, same token stream")
    save(fig, paths["convergence"])
    return {}
