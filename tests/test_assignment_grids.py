"""The assignment's grids, written out here (not read from config/config.yaml): PyTorch attention,
FlashAttention-2 against its peers, and the end-to-end model sizes. `missing_cells` lists the
cells a results folder lacks; the fixture tests show it catches a missing cell and accepts a
whole grid (an out-of-memory row counts as a cell measured: it is the grid's answer there); the
deep target's configuration plans every cell; and every committed results folder measured at
depth deep holds every cell."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]

# PyTorch attention: head dims x sequence lengths, fp32 and bf16, eager and compiled, batch 8
ATTENTION_BATCH = 8
ATTENTION = {(impl, dtype, d, n)
             for impl in ("eager", "compiled") for dtype in ("fp32", "bf16")
             for d in (16, 32, 64, 128) for n in (256, 1024, 4096, 8192, 16384)}
# FlashAttention-2 against every peer: every power of two N from 128 to 65,536, batch 1, one head, causal
FLASH_PROVIDERS = ("triton", "torch_tiled", "plain", "plain_compiled", "sdpa_flash", "sdpa_cudnn", "flex")
FLASH = {(provider, dtype, d, n)
         for provider in FLASH_PROVIDERS for dtype in ("bf16", "fp32") for d in (16, 32, 64, 128)
         for n in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)}
# End to end: the assignment's five model sizes, each in the size table (the variants study)
E2E_SIZES = {"small", "medium", "large", "xl", "2.7B"}

MEASURED = {"ok", "oom"}           # a cell measured: timed, or the grid's out-of-memory answer
NAMED_SKIPS = {"skipped", "unsupported"}  # a FlashAttention cell a provider cannot run, with its reason


def _frames(folder: Path, pattern: str) -> pd.DataFrame:
    paths = sorted(folder.glob(pattern))
    frames = [pd.read_csv(p, low_memory=False) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def attention_cells(results: Path) -> set[tuple]:
    """The attention cells a results folder measured: (impl, dtype, d, N) at batch 8, ok or out of
    memory, or skipped past its line's first out-of-memory N (bench/attention.py's StopAtOom)."""
    df = _frames(results / "attention", "*.csv")
    if df.empty:
        return set()
    df = df.assign(dtype=df["dtype"].fillna("fp32") if "dtype" in df else "fp32")
    df = df[df["batch"] == ATTENTION_BATCH]
    cells = {(r.impl, r.dtype, int(r.head_dim), int(r.seq_len)) for r in df.itertuples() if r.status in MEASURED}
    oom = {}
    for r in df[df["status"] == "oom"].itertuples():
        key = (r.impl, r.dtype, int(r.head_dim))
        oom[key] = min(oom.get(key, r.seq_len), int(r.seq_len))
    cells |= {(r.impl, r.dtype, int(r.head_dim), int(r.seq_len)) for r in df[df["status"] == "skipped"].itertuples()
              if (r.impl, r.dtype, int(r.head_dim)) in oom and int(r.seq_len) > oom[(r.impl, r.dtype, int(r.head_dim))]}
    return cells


def flash_cells(results: Path) -> set[tuple]:
    """The FlashAttention grid cells a results folder holds: (provider, dtype, d, N) at batch 1,
    one head, causal, measured (ok, out of memory) or left out with its reason named."""
    df = _frames(results / "flash_attention" / "bench", "*.csv")
    if df.empty:
        return set()
    df = df[(df["batch"] == 1) & (df["heads"] == 1) & (df["causal"].astype(str).str.lower() == "true")]
    named = df["status"].isin(NAMED_SKIPS) & df["message"].fillna("").astype(str).str.strip().ne("")
    df = df[df["status"].isin(MEASURED) | named]
    return {(r.provider, r.dtype, int(r.head_dim), int(r.seq_len)) for r in df.itertuples()}


def e2e_sizes(results: Path) -> set[str]:
    """The model sizes of the size table (e2e/variants/<size>.csv) with a row measured."""
    return {p.stem for p in (results / "e2e" / "variants").glob("*.csv")
            if pd.read_csv(p, low_memory=False)["status"].isin(MEASURED).any()}


def missing_cells(results: Path) -> dict[str, list]:
    """{grid: its cells the results folder lacks, sorted}: attention, flash_attention, e2e."""
    return {"attention": sorted(ATTENTION - attention_cells(results)),
            "flash_attention": sorted(FLASH - flash_cells(results)),
            "e2e": sorted(E2E_SIZES - e2e_sizes(results))}


# --- fixtures: a whole grid written as the benchmarks write it ------------------------------------

def write_whole_grid(results: Path, oom_from: int = 16384) -> None:
    """Rows for every cell: attention's eager fp32 d128 line runs out of memory at `oom_from`
    (skipped after it); FlashAttention's cuDNN fp32 cells unsupported with the reason."""
    rows = []
    for impl, dtype, d, n in sorted(ATTENTION):
        status = "ok"
        if (impl, dtype, d) == ("eager", "fp32", 128) and n >= oom_from:
            status = "oom" if n == oom_from else "skipped"
        rows.append({"study": "attention_deep", "impl": impl, "dtype": dtype, "head_dim": d, "seq_len": n,
                     "batch": ATTENTION_BATCH, "metric": "forward_ms" if status == "ok" else "", "status": status,
                     "message": "" if status == "ok" else "out of memory"})
    (results / "attention").mkdir(parents=True)
    pd.DataFrame(rows).to_csv(results / "attention" / "deep.csv", index=False)
    rows = []
    for provider, dtype, d, n in sorted(FLASH):
        unsupported = provider == "sdpa_cudnn" and dtype == "fp32"
        rows.append({"group": "grid_deep", "provider": provider, "dtype": dtype, "head_dim": d, "seq_len": n,
                     "batch": 1, "heads": 1, "causal": True, "status": "unsupported" if unsupported else "ok",
                     "message": "sdpa_cudnn: fp16/bf16 only" if unsupported else ""})
    (results / "flash_attention" / "bench").mkdir(parents=True)
    pd.DataFrame(rows).to_csv(results / "flash_attention" / "bench" / "grid_deep_d16.csv", index=False)
    (results / "e2e" / "variants").mkdir(parents=True)
    for size in E2E_SIZES:
        pd.DataFrame([{"size": size, "status": "ok"}]).to_csv(results / "e2e" / "variants" / f"{size}.csv", index=False)


def test_a_whole_grid_has_no_missing_cell_and_an_oom_row_counts(tmp_path):
    write_whole_grid(tmp_path)
    assert missing_cells(tmp_path) == {"attention": [], "flash_attention": [], "e2e": []}


def test_a_missing_cell_is_listed(tmp_path):
    write_whole_grid(tmp_path)
    deep = pd.read_csv(tmp_path / "attention" / "deep.csv")
    gone = (deep["impl"] == "compiled") & (deep["dtype"] == "bf16") & (deep["head_dim"] == 32) & (deep["seq_len"] == 4096)
    deep[~gone].to_csv(tmp_path / "attention" / "deep.csv", index=False)
    fa = tmp_path / "flash_attention" / "bench" / "grid_deep_d16.csv"
    rows = pd.read_csv(fa)
    errored = (rows["provider"] == "flex") & (rows["dtype"] == "fp32") & (rows["head_dim"] == 64) & (rows["seq_len"] == 128)
    rows.loc[errored, "status"] = "error"  # an error is no cell measured
    unnamed = (rows["provider"] == "plain") & (rows["head_dim"] == 16) & (rows["seq_len"] == 65536) & (rows["dtype"] == "bf16")
    rows.loc[unnamed, ["status", "message"]] = ["skipped", ""]  # a skip without its reason is none either
    rows.to_csv(fa, index=False)
    (tmp_path / "e2e" / "variants" / "xl.csv").unlink()
    assert missing_cells(tmp_path) == {"attention": [("compiled", "bf16", 32, 4096)],
                                       "flash_attention": [("flex", "fp32", 64, 128), ("plain", "bf16", 16, 65536)],
                                       "e2e": ["xl"]}


def test_a_skip_not_past_an_out_of_memory_case_is_a_missing_cell(tmp_path):
    write_whole_grid(tmp_path)
    deep = pd.read_csv(tmp_path / "attention" / "deep.csv")
    deep.loc[deep["status"] == "oom", "status"] = "skipped"
    deep.to_csv(tmp_path / "attention" / "deep.csv", index=False)
    assert missing_cells(tmp_path)["attention"] == [("eager", "fp32", 128, 16384)]


# --- the deep target's configuration plans every cell (planning only: on a CPU) --------------------

@pytest.fixture(scope="module")
def deep_plan():
    from lmperf import workflow
    from lmperf.report import render
    config = render.load_config(REPO / "config" / "config.yaml", {})
    files = workflow.run_files(workflow.result_files(config, "results/plan", "full", []), "deep")
    return files


def test_the_deep_target_plans_every_attention_cell(deep_plan):
    from lmperf.bench import attention
    cases = [c for f in deep_plan if f.section == "attention" for c in attention.cases(json.loads(f.spec))]
    planned = {(c["impl"], c["dtype"], c["head_dim"], c["seq_len"]) for c in cases if c["batch"] == ATTENTION_BATCH}
    assert ATTENTION <= planned, sorted(ATTENTION - planned)


def test_the_deep_target_plans_every_flashattention_cell(deep_plan):
    from lmperf.bench import flash_attention
    cases = [c for f in deep_plan if f.rule == "flash_attention_bench"
             for c in flash_attention.job_cases("bench", json.loads(f.spec))]
    planned = {(c["provider"], c["dtype"], c["head_dim"], c["seq_len"]) for c in cases
               if c["batch"] == 1 and c["heads"] == 1 and c["causal"] is True}
    assert FLASH <= planned, sorted(FLASH - planned)[:10]


def test_the_deep_target_plans_every_model_size(deep_plan):
    planned = {f.arg for f in deep_plan if f.section == "e2e" and f.study == "variants"}
    assert E2E_SIZES <= planned, sorted(E2E_SIZES - planned)


# --- the committed results measured at depth deep --------------------------------------------------

def deep_folders() -> list[Path]:
    """Committed results folders of a full-scale run at depth deep: those holding the deep
    target's PyTorch attention grid (attention/deep.csv, written by it alone)."""
    return sorted(p.parent.parent for p in (REPO / "results").glob("*/attention/deep.csv"))


@pytest.mark.parametrize("folder", deep_folders() or [None], ids=lambda p: p.name if p else "none")
def test_every_committed_deep_run_holds_every_cell(folder):
    if folder is None:
        pytest.skip("no committed results folder was measured at depth deep yet (no results/*/attention/deep.csv): "
                    "the grids are checked once a deep run's results are committed")
    assert missing_cells(folder) == {"attention": [], "flash_attention": [], "e2e": []}
