"""The ladder's FP8 rung of our stack (bench/float8.py): its line beside the best bf16 rung of its
size, the ratio of their tokens/s (medians, same job) and its bar. The FP8 rung is none of the
peers and is never the best rung: the best rung is the best bf16 one, whose MFU bars stay
comparable. MFU stays against the bf16 peak, as every rung's; the dense fp8 peak is given beside
it where the GPU's is known (FP8_PEAK_TFLOPS: lmperf.hardware has none)."""
from __future__ import annotations

import math

import pandas as pd

from lmperf.report.format import bar, fmt

# Dense fp8 tensor-core peak TFLOP/s, keyed by a substring of the GPU's name: half the datasheets'
# "FP8 Tensor Core" figures, which are given with sparsity (NVIDIA H100 Tensor Core GPU datasheet:
# SXM 3,958, PCIe 3,026, NVL 3,341 TFLOPS; NVIDIA H200 datasheet: 3,958 TFLOPS).
FP8_PEAK_TFLOPS = {"H100 80GB HBM3": 1979.0, "H100 PCIe": 1513.0, "H100 NVL": 1670.5, "H200": 1979.0}
FP8_PEAK_SOURCE = ("half the datasheet's FP8 tensor-core figure with sparsity (NVIDIA H100 and H200 "
                   "datasheets)")


def how(recipe) -> str:
    """What a float8 recipe of the FP8 rung is, in words (bench/float8.py: `delayed` is ours)."""
    if recipe == "delayed":
        return "our delayed-scaling float8 training from kernels/float8_delayed.py"
    return f"torchao float8 training, {recipe} scaling"


def fp8_peak(gpu) -> float | None:
    for key, peak in FP8_PEAK_TFLOPS.items():
        if isinstance(gpu, str) and key in gpu:
            return peak
    return None


def is_fp8(df: pd.DataFrame) -> pd.Series:
    """Rows of our stack's FP8 rung: float8 matmuls (the `float8` column), not a peer."""
    if "float8" not in df:
        return pd.Series(False, index=df.index)
    peer = df["change"].astype(str).str.startswith("peer")
    return ~peer & df["float8"].fillna("none").astype(str).ne("none")


def _median(g: pd.DataFrame, metric: str) -> float:
    r = g[(g["metric"] == metric) & (g["status"] == "ok")]["median"]
    return float(r.iloc[0]) if len(r) else math.nan


def table(df: pd.DataFrame, best: dict) -> pd.DataFrame:
    """One row per FP8 rung: its step, tokens/s, MFU (bf16 peak; fp8 peak beside it) and J/token,
    and its tokens/s against the best bf16 rung of its size (`best`, report/ladder.py's), whose
    J/token is beside it (a column without a value, as in results measured before the energy
    meter, is left out)."""
    rows = []
    for case_id, g in df[is_fp8(df)].groupby("case_id", sort=False):
        first, b = g.iloc[0], best.get(g.iloc[0]["size"], {})
        tokens, tflops = _median(g, "tokens_per_s"), _median(g, "tflops")
        peak = fp8_peak(first.get("gpu"))
        best_tokens = b.get("tokens_per_s", math.nan)
        rows.append({"size": first["size"], "rung": int(first["rung"]), "recipe": first["float8"],
                     "context": int(first["context"]), "status": first["status"],
                     "step ms": _median(g, "step_ms"), "tokens/s": tokens,
                     "MFU % of bf16 peak": _median(g, "mfu_bf16_pct") if (g["metric"] == "mfu_bf16_pct").any()
                     else _median(g, "mfu_pct"),
                     "MFU % of fp8 peak": 100 * tflops / peak if peak else None,
                     "J/token": _median(g, "joules_per_token"),
                     "best bf16 rung": f"{b['rung']} ({b['step_ms']:.1f} ms)" if b else None,
                     "best bf16 tokens/s": best_tokens, "best bf16 J/token": b.get("joules_per_token", math.nan),
                     "tokens/s / best bf16 rung's": tokens / best_tokens if best_tokens else math.nan})
    out = pd.DataFrame(rows)
    return out.drop(columns=[c for c in ("MFU % of fp8 peak", "J/token", "best bf16 J/token")
                             if c in out and pd.to_numeric(out[c], errors="coerce").isna().all()])


def with_bar(bars: pd.DataFrame, fp8: pd.DataFrame, limits: dict) -> pd.DataFrame:
    """The section's bars, with the FP8 rung's (of the configured size) where it has one."""
    size, limit = limits.get("size"), limits.get("float8_vs_best_bf16")
    rows = fp8[fp8["size"] == size] if len(fp8) and limit else fp8.iloc[0:0]
    if not len(rows):
        return bars
    r = rows.iloc[0]
    x = r["tokens/s / best bf16 rung's"]
    row = bar(f"{size}: our FP8 rung ({r['recipe']}) tokens/s >= {fmt(limit)}x the best bf16 rung's (same job)",
              x, f"{fmt(x)}x (rung {r['rung']} against rung {r['best bf16 rung']})" if math.isfinite(x)
              else f"not measured ({r['status']})", bool(math.isfinite(x) and x >= limit))
    return pd.concat([bars, pd.DataFrame([row])], ignore_index=True)
