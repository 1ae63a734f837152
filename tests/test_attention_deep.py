"""PyTorch attention's deep grid (bench/attention.py): dtypes in the case ids, N doubled past the
grid up to `oom_max_seq_len`, each line stopped at its first out-of-memory case, and the deep
target's job planned at depth deep only. On the CPU: the out-of-memory errors are raised by a
stand-in measurement."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from lmperf import workflow
from lmperf.bench import attention, common
from lmperf.report import render

REPO = Path(__file__).resolve().parents[1]
SPEC = {"impls": ["eager", "compiled"], "dtypes": ["fp32", "bf16"], "batch": 2, "head_dims": [16, 32],
        "seq_lens": [32, 64], "oom_max_seq_len": 256, "iters": 3}


def test_the_lines_double_past_the_grid_up_to_the_bound():
    cases = attention.cases(SPEC)
    assert attention.seq_lens(SPEC) == [32, 64, 128, 256]
    assert len(cases) == 2 * 2 * 2 * 4
    ids = [c["case_id"] for c in cases]
    assert ids[:4] == ["eager-fp32-d16-n32", "eager-fp32-d16-n64", "eager-fp32-d16-n128", "eager-fp32-d16-n256"]
    assert len(set(ids)) == len(ids)
    assert {c["case_id"] for c in cases if c["past_grid"]} == {i for i in ids if i.endswith(("-n128", "-n256"))}
    assert attention.study(SPEC) == "attention_deep"


def test_a_grid_without_dtypes_keeps_its_case_ids_and_its_grid():
    spec = {k: v for k, v in SPEC.items() if k not in ("dtypes", "oom_max_seq_len")}
    cases = attention.cases(spec)
    assert [c["case_id"] for c in cases][:2] == ["eager-d16-n32", "eager-d16-n64"]
    assert {c["dtype"] for c in cases} == {"fp32"} and not any(c["past_grid"] or c["peak"] for c in cases)
    assert attention.study(spec) == "attention"


def test_each_line_stops_at_its_first_out_of_memory_case(tmp_path):
    """bf16 at d16 runs out of memory at N = 128: that case is an `oom` row, N = 256 of its line a
    `skipped` row naming it; the other lines run on."""
    measured = []

    def measure(case):
        measured.append(case["case_id"])
        if case["dtype"] == "bf16" and case["head_dim"] == 16 and case["seq_len"] >= 128:
            raise torch.OutOfMemoryError("CUDA out of memory (a stand-in)")
        return [common.summarize("forward_ms", "ms", [1.0])]

    cases = [c for c in attention.cases(SPEC) if c["impl"] == "eager"]
    df = common.run_cases(section="attention", study="attention_deep", cases=cases, measure=attention.StopAtOom(measure),
                          out_csv=tmp_path / "deep.csv", hw="cpu", log_path=None, fingerprint={"spec": SPEC})
    status = df.drop_duplicates("case_id").set_index("case_id")
    assert status.loc["eager-bf16-d16-n128", "status"] == "oom"
    assert status.loc["eager-bf16-d16-n256", "status"] == "skipped"
    assert "N = 128 ran out of memory" in status.loc["eager-bf16-d16-n256", "message"]
    assert "eager-bf16-d16-n256" not in measured
    assert (status.drop(["eager-bf16-d16-n128", "eager-bf16-d16-n256"])["status"] == "ok").all()


def test_the_memory_model_counts_the_squares_and_the_dtype():
    one = attention.predicted_peak_bytes("eager", 8, 1024, 64, 4)
    assert 3.5 * one < attention.predicted_peak_bytes("eager", 8, 2048, 64, 4) < 4 * one
    assert attention.predicted_peak_bytes("eager", 8, 1024, 64, 2) * 2 == one
    assert attention.predicted_peak_bytes("compiled", 8, 1024, 64, 4) < one


@pytest.mark.parametrize("depth", ["standard", "deep"])
def test_the_deep_grid_is_planned_at_depth_deep_only(depth):
    config = render.load_config(REPO / "config/config.yaml", {})
    files = workflow.run_files(workflow.result_files(config, "results/plan", "full", []), depth)
    rules = {f.rule for f in files}
    deep = [f for f in files if f.rule == "attention_deep" or "grid_deep" in f.path]
    assert ("attention_deep" in rules) == (depth == "deep") and bool(deep) == (depth == "deep")
    standard = next(f for f in files if f.rule == "attention")
    assert "deep" not in json.loads(standard.spec) and "dtypes" not in json.loads(standard.spec)


def test_a_run_of_the_deep_grid_on_the_cpu_writes_rows_of_both_dtypes(tmp_path):
    spec = {"impls": ["eager"], "dtypes": ["fp32", "bf16"], "batch": 1, "head_dims": [8], "seq_lens": [16],
            "oom_max_seq_len": 32, "iters": 2}
    attention.main(["--spec", json.dumps(spec), "--out", str(tmp_path / "deep.csv"), "--hw", "cpu"])
    df = pd.read_csv(tmp_path / "deep.csv")
    assert set(df["study"]) == {"attention_deep"} and set(df["status"]) == {"ok"}
    assert set(df["case_id"]) == {"eager-fp32-d8-n16", "eager-fp32-d8-n32", "eager-bf16-d8-n16", "eager-bf16-d8-n32"}
    predicted = df[df["metric"] == "predicted_peak_mib"].set_index("case_id")["mean"]
    assert predicted["eager-fp32-d8-n32"] == pytest.approx(2 * predicted["eager-bf16-d8-n32"])
