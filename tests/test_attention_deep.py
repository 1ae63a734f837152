"""PyTorch attention's deep grid (bench/attention.py): dtypes in the case ids, N doubled past the
grid up to `oom_max_seq_len`, each line stopped at its first out-of-memory case, and the deep
target's job planned at depth deep only. On the CPU: the out-of-memory errors are raised by a
stand-in measurement."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from lmperf import stats, workflow
from lmperf.bench import attention, loop
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
        return [stats.summarize("forward_ms", "ms", [1.0])]

    cases = [c for c in attention.cases(SPEC) if c["impl"] == "eager"]
    df = loop.run_cases(section="attention", study="attention_deep", cases=cases, measure=attention.StopAtOom(measure),
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


@functools.cache
def run_cost():
    """tools/run_cost.py, the run-cost model, as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("lmperf_tools_run_cost", REPO / "tools" / "run_cost.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_cost_model_ends_each_line_where_the_memory_model_runs_out():
    """fp32 eager at batch 8: the memory model puts N = 32,768 over 79.2 GiB (three 32 GiB N x N
    tensors), so that case costs the out-of-memory allowance and the longer N nothing; bf16's
    line runs one N further."""
    rc = run_cost()
    spec = {"impls": ["eager"], "dtypes": ["fp32", "bf16"], "batch": 8, "head_dims": [64], "seq_lens": [8192, 16384],
            "oom_max_seq_len": 131072, "iters": 100, "min_iters": 10, "window_s": 1}
    passes = {("eager", 64, 8192): (7.5, 12.9)}
    costs = rc.Costs()
    walls = dict(zip([c["case_id"] for c in attention.cases(spec)], rc.attention_deep_walls(spec, passes, costs)))
    assert walls["eager-fp32-d64-n32768"] == costs.oom_case_s and walls["eager-fp32-d64-n65536"] == 0
    assert walls["eager-bf16-d64-n32768"] > walls["eager-bf16-d64-n16384"] > walls["eager-bf16-d64-n8192"] > 0
    assert walls["eager-bf16-d64-n65536"] == costs.oom_case_s and walls["eager-bf16-d64-n131072"] == 0
    # at 8,192 tokens: 4 untimed passes and the window's (1 s / 7.5 ms -> 134, at most 100) each way
    assert walls["eager-fp32-d64-n8192"] == pytest.approx((4 + 100) * 0.0075 + (4 + 78) * 0.0129)


@pytest.mark.skipif(not (REPO / "results" / "h100-80gb-hbm3").is_dir(), reason="no committed H100 results")
def test_the_deep_plan_estimates_the_deep_grids_from_measured_shapes():
    rc = run_cost()
    js = rc.plan([], "full", "deep", rc.Costs()).set_index("job")
    deep = js.loc[["attention/deep", *(f"flash_attention/bench/grid_deep_d{d}" for d in (16, 32, 64, 128))]]
    assert (deep["cases_s"] > 0).all() and deep["cases_s"].notna().all() and deep["apart"].all()
    assert deep.loc["attention/deep", "estimated"] == deep.loc["attention/deep", "cases"]
    assert deep.loc["flash_attention/bench/grid_deep_d32", "measured"] == 0  # no d32 in the standard grid
    assert 0 < deep.loc["flash_attention/bench/grid_deep_d64", "measured"] < deep.loc["flash_attention/bench/grid_deep_d64", "cases"]
    assert not js.loc[["attention/attention", "flash_attention/bench/grid_d64"], "apart"].any()


@pytest.mark.skipif(not (REPO / "results" / "h100-80gb-hbm3").is_dir(), reason="no committed H100 results")
def test_the_deep_target_is_planned_inside_its_45_minutes_and_the_standard_run_inside_its_30():
    """The budgets, estimated from the committed H100 rows before a run: the deep target's own
    jobs (its repeats included) at most 45 minutes, the standard run at most 30."""
    rc = run_cost()
    costs = rc.Costs()
    deep = rc.plan([], "full", "deep", costs)
    standard = rc.plan([], "full", "standard", costs)
    assert deep["apart"].any() and not standard["apart"].any()
    assert deep[deep["apart"]]["total_s"].sum() <= 45 * 60
    assert standard["total_s"].sum() + costs.render_s <= 30 * 60


def test_the_workers_warm_the_standard_grids_compiled_cases_and_no_case_past_the_memory_bound():
    config = render.load_config(REPO / "config/config.yaml", {})
    grid = config["attention"]["full"]
    standard = attention.cases({k: v for k, v in grid.items() if k != "deep"})
    assert all(attention.warms_in_workers(c) for c in standard if c["impl"] == "compiled")
    deep = attention.cases(grid["deep"])
    warmed = {(c["dtype"], c["seq_len"]) for c in deep if attention.warms_in_workers(c)}
    assert warmed and all(n <= 8192 for _, n in warmed) and not any(c["impl"] == "eager" for c in deep
                                                                       if attention.warms_in_workers(c))


def test_a_deep_grids_rows_count_in_the_deep_targets_wall_time_not_the_standard_runs():
    """The attention section's deep-grid rows (marked by report/rows.py) run with the deep target,
    after the standard run: its span ends with the standard rows, and theirs is the deep one's."""
    from lmperf.report import env as env_view
    job = lambda start, wall, **more: pd.DataFrame({"measured_at": [start], "study": ["s"], "case_id": ["x"],
                                                   "wall_s": [wall], "commit": ["abc"], **more})
    attention_rows = pd.concat([job("2026-11-23T10:10:00+00:00", 60.0),
                                job("2026-11-23T11:00:00+00:00", 300.0, deep_target=[True])], ignore_index=True)
    frames = {"ladder": job("2026-11-23T10:00:00+00:00", 60.0), "attention": attention_rows,
              "repeats": job("2026-11-23T11:10:00+00:00", 120.0)}
    assert env_view.run_minutes(frames) == 11.0                 # 10:00 to 10:11
    assert env_view.run_minutes(frames, deep=True) == 12.0      # 11:00 to 11:12


def test_the_rows_of_a_deep_file_are_marked_as_the_deep_targets(tmp_path):
    from lmperf.report import rows as rows_module
    folder = tmp_path / "attention"
    folder.mkdir()
    spec = {"impls": ["eager"], "dtypes": ["fp32"], "batch": 1, "head_dims": [8], "seq_lens": [16], "iters": 2}
    for name, case_id in (("attention", "eager-d8-n16"), ("deep", "eager-fp32-d8-n16")):
        pd.DataFrame({"case_id": [case_id], "metric": ["forward_ms"], "status": ["ok"]}).to_csv(folder / f"{name}.csv", index=False)
    deep = workflow.ResultFile(str(folder / "deep.csv"), "attention", "attention_deep", json.dumps(spec), deep=True)
    df = rows_module.load_section(tmp_path, "attention", {str(folder / "deep.csv"): deep})
    assert df.set_index("case_id")["deep_target"].eq(True).to_dict() == {"eager-d8-n16": False, "eager-fp32-d8-n16": True}


def test_a_model_size_not_measured_is_estimated_between_the_sizes_that_were():
    """log-log in the sizes' parameters between the nearest measured sizes of the same study and
    case; a case no size has is NaN (the plan then takes the mean of the others)."""
    import math
    rc = run_cost()
    walls = {"e2e/variants/small": {"small-ctx256-bf16-eager-train-warmup5": 2.0},
             "e2e/variants/2.7B": {"2.7B-ctx256-bf16-eager-train-warmup5": 8.0}}
    ids = ["medium-ctx256-bf16-eager-train-warmup5", "medium-ctx512-bf16-eager-train-warmup5"]
    found, same = rc.e2e_size_walls(None, "e2e/variants/medium", ids, walls, rc.Costs(), [])
    models = render.load_config(REPO / "config/config.yaml", {})["models"]
    p = {s: math.log(rc.model_parameters(models[s])) for s in ("small", "medium", "2.7B")}
    share = (p["medium"] - p["small"]) / (p["2.7B"] - p["small"])
    assert found[0] == pytest.approx(2.0 * 4.0 ** share) and 2.0 < found[0] < 8.0
    assert math.isnan(found[1]) and same == 0


def test_a_flashattention_row_written_under_an_older_id_reads_as_todays_case():
    """A FlashAttention bench row written before the ids named the harness a peer is timed under
    (SDPA-cuDNN under the leaderboard's) reads (providers.read_renamed: the report's, the claims'
    and the run plan's reader) as the case of today's id; a row whose provider is not registered
    here keeps its own id."""
    from lmperf import providers
    rows = pd.DataFrame([
        {"case_id": "model-sdpa_cudnn-bf16-causal-b4h32n1024d80", "group": "model", "provider": "sdpa_cudnn",
         "harness": "leaderboard", "dtype": "bf16", "causal": True, "batch": 4, "heads": 32, "kv_heads": 32,
         "seq_len": 1024, "head_dim": 80},
        {"case_id": "gqa-triton-bf16-causal-b2h32kv8n2048d128", "group": "gqa", "provider": "triton",
         "harness": "eager", "dtype": "bf16", "causal": True, "batch": 2, "heads": 32, "kv_heads": 8,
         "seq_len": 2048, "head_dim": 128},
        {"case_id": "model-someones_kernel-bf16-causal-b4h32n1024d80", "group": "model", "provider": "someones_kernel",
         "harness": "leaderboard", "dtype": "bf16", "causal": True, "batch": 4, "heads": 32, "kv_heads": 32,
         "seq_len": 1024, "head_dim": 80}])
    assert providers.read_renamed(rows)["case_id"].tolist() == [
        "model-sdpa_cudnn-leaderboard-bf16-causal-b4h32n1024d80", "gqa-triton-bf16-causal-b2h32kv8n2048d128",
        "model-someones_kernel-bf16-causal-b4h32n1024d80"]


def test_a_job_with_none_of_its_cases_measured_takes_its_groups_measured_cases():
    """A case no measurement gives: the mean case of its job as measured at other shapes, else of
    the jobs of its group at other head dims, else the median case of its section."""
    rc = run_cost()
    walls = {"flash_attention/bench/gqa_d128": {"a": 1.0, "b": 3.0},
             "flash_attention/bench/grid_d64": {"c": 0.1, "d": 0.1, "e": 0.2}}
    assert rc.case_walls("flash_attention/bench/gqa_d128", ["x", "y"], walls, {}) == ([2.0], 0)
    assert rc.case_walls("flash_attention/bench/gqa_d64", ["x"], walls, {}) == ([2.0], 0)
    assert rc.case_walls("flash_attention/bench/throughput_d128", ["x"], walls, {}) == ([0.2], 0)
    assert rc.case_walls("flash_attention/bench/gqa_d128", ["a", "x"], walls, {}) == ([1.0], 1)
