"""The FP8 rung's convergence (results/<hw>/convergence/, bench/convergence.py): the held-out loss
of bf16 (the settings of the ladder rung the FP8 rung follows), of bf16 from other initial weights
(the noise), and of the FP8 rung's settings, all trained on the same text, at the same steps; and
whether the FP8 run's held-out loss stays within the tolerance of bf16's
(config/sections/convergence.yaml's `report.convergence`) at every step compared (those from
`compare_from` of the run on):

    |fp8 - bf16| <= max(noise_multiple x the largest |bf16_init1 - bf16| there, min_relative x bf16's last)

The first term is the noise: how far the held-out loss of the very same settings moves when only
the initial weights do, a difference no one would call a regression; the second keeps a pair of
bf16 runs that happen to agree closely from setting a bar no run could be sure to meet.

Rows measured before held-out losses (a synthetic token stream, a bf16 run on another draw of it
as the noise floor) are judged as they were then (`judge_last_steps`): the mean training loss
over each run's last `last_steps` steps,
|fp8 - bf16| <= max(noise_multiple x |bf16 on data seed 1 - bf16|, min_relative x bf16).
"""
from __future__ import annotations

import math

import pandas as pd

from lmperf.report import ladder_fp8
from lmperf.report.format import fmt, unavailable
from lmperf.report.plot import plt, save

DEFAULTS = {"compare_from": 0.5, "last_steps": 50, "noise_multiple": 2, "min_relative": 0.01}
HELDOUT = "heldout_loss"


def view(inputs) -> dict:
    df = inputs.rows("convergence")
    if df.empty:
        return unavailable("no convergence results (rule convergence_run has not run; at full scale the job joins "
                           "the ladder's FP8 rung with the next H100 run)")
    limits = {**DEFAULTS, **inputs.bars.get("convergence", {})}
    judged = judge_heldout(df, limits) if (df["metric"] == HELDOUT).any() else judge_last_steps(df, limits)
    return {"available": True, **judged}


def losses(df: pd.DataFrame, metric: str = "loss") -> dict[str, pd.Series]:
    """{run: its `metric` a step, indexed by step} of the runs that ran ok."""
    ok = df[(df["status"] == "ok") & (df["metric"] == metric)]
    return {run: g.set_index(g["step"].astype(int))["mean"].astype(float).sort_index()
            for run, g in ok.groupby("run", sort=False)}


def judge_heldout(df: pd.DataFrame, limits: dict) -> dict:
    """The runs' table, the held-out loss at each step measured, the tolerance and the verdict on
    the FP8 run (`passed`: True, False, or None where it was not judged, with `why`)."""
    curves, train_curves, cases = losses(df, HELDOUT), losses(df), df.drop_duplicates("case_id")
    bf16_runs = cases[cases["float8"].astype(str) == "none"]
    ref_case = bf16_runs[bf16_runs["init_seed"].astype(int) == 0].iloc[0] if len(bf16_runs) else None
    noise_case = bf16_runs[bf16_runs["init_seed"].astype(int) != 0]
    noise_case = noise_case.iloc[0] if len(noise_case) else None
    fp8_runs = cases[cases["float8"].astype(str) != "none"]
    fp8 = fp8_runs.iloc[0] if len(fp8_runs) else None
    first = cases.iloc[0]
    ref = curves.get(ref_case["run"]) if ref_case is not None else None
    noise = curves.get(noise_case["run"]) if noise_case is not None else None
    steps = int(first["steps"])
    rows = []
    for _, c in cases.iterrows():
        curve, trained = curves.get(c["run"]), train_curves.get(c["run"])
        rows.append({"run": c["run"], "rung": c["rung"], "float8": c["float8"], "init seed": int(c["init_seed"]),
                     "status": c["status"], "steps": len(trained) if trained is not None else 0,
                     "first held-out loss": float(curve.iloc[0]) if curve is not None else None,
                     "last held-out loss": float(curve.iloc[-1]) if curve is not None else None,
                     "minus bf16's": (float(curve.iloc[-1] - ref.iloc[-1])
                                      if curve is not None and ref is not None else None),
                     "message": c["message"] if c["status"] != "ok" else ""})
    fp8_curve = curves.get(fp8["run"]) if fp8 is not None else None
    at_steps = pd.DataFrame({run: curve for run, curve in curves.items()})
    at_steps.index.name = "step"
    compared = [s for s in at_steps.index if s >= limits["compare_from"] * steps]
    out = {"heldout": True, "table": pd.DataFrame(rows), "size": first["size"], "context": int(first["context"]),
           "batch": int(first["batch_size"]), "steps": steps, "text": first["text"], "heldout_share": float(first["heldout"]),
           "eval_batches": int(first["eval_batches"]), "eval_every": int(first["eval_every"]), "limits": limits,
           "ref_run": ref_case["run"] if ref_case is not None else "bf16",
           "noise_run": noise_case["run"] if noise_case is not None else "bf16_init1",
           "rung": ref_case["rung"] if ref_case is not None else "", "fp8_rung": fp8["rung"] if fp8 is not None else "",
           "fp8_run": fp8["run"] if fp8 is not None else "float8",
           "fp8_how": ladder_fp8.how(fp8["float8"]) if fp8 is not None else "float8 training",
           "compared": compared, "passed": None, "why": "", "delta": math.nan, "noise_delta": math.nan,
           "tolerance": math.nan, "ref": float(ref.iloc[-1]) if ref is not None else math.nan,
           "ref_first": float(ref.iloc[0]) if ref is not None else math.nan}
    if ref is not None and noise is not None and compared:
        spread = (noise - ref).abs().reindex(compared)
        out["noise_delta"] = float(spread.max())
        out["tolerance"] = max(limits["noise_multiple"] * out["noise_delta"], limits["min_relative"] * out["ref"])
    if fp8 is None or fp8["status"] != "ok" or fp8_curve is None:
        out["why"] = ("no FP8 run in the results" if fp8 is None else
                      f"the FP8 run is `{fp8['status']}` ({fp8['message']})" if fp8["status"] != "ok" else
                      "the FP8 run has no held-out loss")
    elif ref is None or noise is None or not compared or not math.isfinite(out["tolerance"]):
        out["why"] = "a bf16 run did not finish: no reference or no noise"
    else:
        delta = (fp8_curve - ref).reindex(compared)
        worst = delta.abs().idxmax() if delta.notna().all() else delta.index[delta.isna()][0]
        out["delta"], out["worst_step"] = float(delta[worst]), int(worst)
        out["passed"] = bool(delta.notna().all() and math.isfinite(out["delta"]) and (delta.abs() <= out["tolerance"]).all())
        if not (delta.notna().all() and math.isfinite(out["delta"])):
            out["why"] = "the FP8 run's held-out loss is not finite (it diverged)"
    if fp8_curve is not None and ref is not None:
        at_steps["|fp8 - bf16|"] = (fp8_curve - ref).abs()
    if noise is not None and ref is not None:
        at_steps[f"|{out['noise_run']} - bf16|"] = (noise - ref).abs()
    at_steps["compared"] = ["yes" if s in compared else "" for s in at_steps.index]
    out["at_steps"] = at_steps.reset_index()
    out["verdict"] = ("not judged: " + out["why"] if out["passed"] is None else
                      f"{'**pass**' if out['passed'] else '**FAIL**'}: the largest |fp8 − bf16| "
                      f"{fmt(abs(out['delta']), 4)} nats at step {out['worst_step']} "
                      f"{'<=' if out['passed'] else '>'} {fmt(out['tolerance'], 4)} nats")
    return out


def judge_last_steps(df: pd.DataFrame, limits: dict) -> dict:
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
    out = {"heldout": False, "table": pd.DataFrame(rows), "last_steps": n, "size": first["size"], "rung": first["rung"],
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
    heldout = losses(df, HELDOUT)
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (run, curve) in enumerate(curves.items()):
        if not heldout:  # rows of the synthetic stream: the training loss alone, as drawn then
            ax.plot(curve.index, curve.values, label=run, linewidth=1.2, linestyle="--" if run == "bf16_seed1" else "-")
            continue
        color = f"C{i}"
        ax.plot(curve.index, curve.values, color=color, linewidth=0.8, alpha=0.35, label=f"{run}: training loss")
        if run in heldout:
            ax.plot(heldout[run].index, heldout[run].values, color=color, marker="o", linewidth=1.5,
                    label=f"{run}: held-out loss")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss (nats a token)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("The FP8 rung's held-out loss against bf16's: same text, same batches" if heldout else
                 "The FP8 rung's loss against bf16's: same initial weights, same token stream")
    save(fig, paths["convergence"])
    return {}
