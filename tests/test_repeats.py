"""Repeats: a timing job's headline cases measured again in fresh processes (config `repeats`,
rules/repeats.smk, lmperf.workflow.repeat_files) and the report's "Across processes" section
(lmperf.report.repeats)."""
import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lmperf import compare, repeats as repeat_plan, workflow as wf
from lmperf.report import render, repeats
from lmperf.report.sections import Inputs

REPO = Path(__file__).resolve().parents[1]
RESULTS = "results/x"
JOB = {"job": "flash_attention/bench/headline_d64", "cases": ["headline-triton_compiled-*", "headline-sdpa_*"]}


def config_with(*jobs: dict, processes: int = 2) -> dict:
    config = copy.deepcopy(render.load_config(REPO / "config" / "config.yaml"))
    config["repeats"]["full"] = {"processes": processes, "jobs": list(jobs)}
    return config


def repeat_files(config: dict) -> list[wf.ResultFile]:
    return [f for f in wf.result_files(config, RESULTS, "full", []) if f.section == "repeats"]


def test_a_repeat_runs_the_selected_cases_of_its_job_in_each_of_its_processes():
    files = repeat_files(config_with(JOB, processes=3))
    assert [f.path for f in files] == [f"{RESULTS}/repeats/{JOB['job']}/run{k}.csv" for k in (1, 2, 3)]
    job = files[0].repeat_of
    assert job.path == f"{RESULTS}/{JOB['job']}.csv" and all(f.spec == job.spec for f in files)
    assert files[0].case_ids() == [c for c in job.case_ids() if c.startswith(("headline-triton_compiled-",
                                                                               "headline-sdpa_"))]
    # ours under the leaderboard's harness, SDPA's two backends as they are and under that harness
    assert sorted(files[0].case_ids()) == sorted(
        [f"headline-{p}-bf16-causal-b1h16n16384d64" for p in ("triton_compiled", "sdpa_flash", "sdpa_cudnn")]
        + [f"headline-{p}-leaderboard-bf16-causal-b1h16n16384d64" for p in ("sdpa_flash", "sdpa_cudnn")])
    assert repeat_plan.job_command(job) == "flash_attention bench"
    assert repeat_plan.by_run(files)[JOB["job"], "2"] == files[1]


def test_a_job_may_run_in_fewer_processes_than_the_scales():
    files = repeat_files(config_with(JOB, {"job": "lrpe/bench_1d", "processes": 2, "cases": ["1d-n32768-l0-*"]},
                                     processes=3))
    runs = sorted(repeat_plan.by_run(files))
    assert runs == [(JOB["job"], k) for k in "123"] + [("lrpe/bench_1d", k) for k in "12"]


def test_a_distributed_jobs_repeats_go_to_its_multi_gpu_folder():
    config = config_with({"job": "distributed/ddp_n2", "cases": ["*-ddp-b25-fused-compiled-n2"]})
    files = [f for f in wf.result_files(config, RESULTS, "full", ["results/x-x2"]) if f.section == "repeats"]
    assert [f.path for f in files] == [f"results/x-x2/repeats/distributed/ddp_n2/run{k}.csv" for k in (1, 2)]
    assert files[0].repeat_of.path == "results/x-x2/distributed/ddp_n2.csv"
    assert files[0].case_ids() == ["xl-ddp-b25-fused-compiled-n2"]
    assert set(repeat_plan.by_run(files)) == {("distributed/ddp_n2", "1"), ("distributed/ddp_n2", "2")}


@pytest.mark.parametrize("job, message", [
    ("flash_attention/check", "not a timing job"),   # a check times nothing
    ("lrpe/bench_9d", "not a timing job"),           # no such job in this configuration
])
def test_a_repeat_of_no_timing_job_is_named(job, message):
    with pytest.raises(ValueError, match=message) as err:
        repeat_files(config_with({"job": job, "cases": ["*"]}))
    assert job in str(err.value) and "flash_attention/bench/headline_d64" in str(err.value)


def test_a_case_pattern_that_selects_nothing_is_named_at_planning():
    files = repeat_files(config_with({**JOB, "cases": ["headline-sdpa_*", "headline-nope-*"]}))
    with pytest.raises(ValueError, match=r"repeats\.full: job .*headline_d64\.csv: .*'headline-nope-\*'"):
        repeat_plan.check(files, "full")


def test_compare_leaves_the_repeats_out(tmp_path):
    """compare joins one row per case and metric: a repeat's rows are the job's cases again."""
    for path in ("lrpe/bench_1d.csv", "repeats/lrpe/bench_1d/run1.csv"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("case_id,status\nx,ok\n")
    assert compare.result_csvs(tmp_path) == [str(tmp_path / "lrpe/bench_1d.csv")]


# --- the report section ----------------------------------------------------------------------

CASE = "headline-triton_compiled-bf16-causal-b1h16n16384d64"


def rows(measured_at: str, median: float, q20: float, q80: float, status: str = "ok") -> list[dict]:
    base = {"section": "flash_attention", "study": "bench", "case_id": CASE, "measured_at": measured_at,
            "status": status}
    if status != "ok":
        return [{**base, "metric": "", "unit": "", "median": math.nan, "q20": math.nan, "q80": math.nan}]
    return [{**base, "metric": "fwd_bwd_ms", "unit": "ms", "median": median, "q20": q20, "q80": q80},
            {**base, "metric": "forward_ms", "unit": "ms", "median": median / 3, "q20": q20 / 3, "q80": q80 / 3}]


def view(job: list[dict], fresh: list[list[dict]]) -> dict:
    frames = {"flash_attention": pd.DataFrame(job), "repeats": pd.DataFrame([r for p in fresh for r in p])}
    return repeats.view(Inputs(results=Path(RESULTS), frames=frames, bars={}, out_dir=Path(".")))


def test_each_process_median_and_both_spreads():
    v = view(rows("2026-01-01T00:00:00", 5.0, 4.9, 5.1),
             [rows("2026-01-01T02:00:00", 5.5, 5.4, 5.6), rows("2026-01-01T01:00:00", 4.5, 4.45, 4.55)])
    assert v["available"] and v["processes"] == 3 and v["numbers"] == 1 == v["complete"]
    line = v["table"].iloc[0]
    assert line["metric"] == "fwd_bwd_ms"  # a headline metric; forward_ms is not one
    # the job's process first, then the fresh ones in the order they ran
    assert [line["the job's process"], line["fresh process 1"], line["fresh process 2"]] == [5.0, 4.5, 5.5]
    assert line["across processes: (max - min) / median %"] == pytest.approx(100 * (5.5 - 4.5) / 5.0)
    assert line["within one process: (q80 - q20) / median %, widest"] == pytest.approx(100 * 0.2 / 5.0)
    assert v["wider_across"] == 1 == v["comparable"] and v["widest"]["case"] == CASE


def test_a_process_where_the_case_did_not_run_ok_shows_its_status_and_adds_no_median():
    v = view(rows("2026-01-01T00:00:00", 5.0, 4.9, 5.1),
             [rows("2026-01-01T01:00:00", 0, 0, 0, status="oom"), rows("2026-01-01T02:00:00", 5.2, 5.1, 5.3)])
    line = v["table"].iloc[0]
    assert line["fresh process 1"] == "oom" and line["fresh process 2"] == 5.2
    assert line["across processes: (max - min) / median %"] == pytest.approx(100 * 0.2 / 5.1)
    assert v["complete"] == 0


def test_without_the_jobs_own_rows_the_fresh_processes_still_count():
    v = view([], [rows("2026-01-01T01:00:00", 5.0, 4.9, 5.1), rows("2026-01-01T02:00:00", 5.2, 5.1, 5.3)])
    line = v["table"].iloc[0]
    assert line["the job's process"] is None and line["_processes"] == 2


def test_a_metric_whose_gpu_sat_idle_in_a_process_is_marked_host_bound():
    fresh = [{**r, "gpu_idle_pct": 40.0} for r in rows("2026-01-01T01:00:00", 5.2, 5.1, 5.3)]
    frames = {"flash_attention": pd.DataFrame(rows("2026-01-01T00:00:00", 5.0, 4.9, 5.1)),
              "repeats": pd.DataFrame(fresh)}
    inputs = Inputs(results=Path(RESULTS), frames=frames, bars={"host_bound_idle_pct": 10}, out_dir=Path("."))
    v = repeats.view(inputs)
    assert v["table"]["metric"].tolist() == ["fwd_bwd_ms ‡"] and v["host_bound"]["n"] == 1
    inputs.bars["host_bound_idle_pct"] = 50
    assert repeats.view(inputs)["table"]["metric"].tolist() == ["fwd_bwd_ms"]


def test_a_sections_widest_spread_is_given_apart_for_the_numbers_not_host_bound():
    """Per section, the widest spread across processes of all its numbers, and of those whose GPU set the
    time: a host-bound case's wide spread (the host's) does not stand for the others'."""
    def case(case_id, medians, idle):
        return [{**r, "case_id": case_id, "gpu_idle_pct": idle}
                for i, m in enumerate(medians) for r in rows(f"2026-01-01T0{i}:00:00", m, m - 0.1, m + 0.1)]
    job = case("bound", [5.0], 40.0)[:2] + case("gpu", [5.0], 1.0)[:2] + case("steady", [5.0], 1.0)[:2]
    fresh = case("bound", [5.0, 7.0, 6.0], 40.0)[2:] + case("gpu", [5.0, 5.2, 5.1], 1.0)[2:] \
        + case("steady", [5.0, 5.05, 5.0], 1.0)[2:]
    frames = {"flash_attention": pd.DataFrame(job), "repeats": pd.DataFrame(fresh)}
    v = repeats.view(Inputs(results=Path(RESULTS), frames=frames, bars={"host_bound_idle_pct": 10}, out_dir=Path(".")))
    (fa,) = v["by_section"]
    assert fa["n"] == 3 and fa["host_bound"] == 1
    assert fa["max_pct"] == pytest.approx(100 * 2.0 / 6.0)  # the host-bound case's
    assert fa["max_not_host_bound_pct"] == pytest.approx(100 * 0.2 / 5.1)  # the widest of the other two
    frames["repeats"] = pd.DataFrame(case("bound", [5.0, 7.0, 6.0], 40.0)[2:])
    frames["flash_attention"] = pd.DataFrame(case("bound", [5.0], 40.0)[:2])
    (only_bound,) = repeats.view(Inputs(results=Path(RESULTS), frames=frames, bars={"host_bound_idle_pct": 10},
                                        out_dir=Path(".")))["by_section"]
    assert only_bound["host_bound"] == 1 and math.isnan(only_bound["max_not_host_bound_pct"])


def test_without_repeats_the_section_says_why():
    v = repeats.view(Inputs(results=Path(RESULTS), frames={"repeats": pd.DataFrame()}, bars={}, out_dir=Path(".")))
    assert not v["available"] and "repeats" in v["why"]


def test_planning_lists_the_cases_of_every_kind_of_job_without_torch_once_they_are_cached(tmp_path):
    """Snakemake lists the cases of every result file and repeat while it plans (the report rule's
    check of the results, rules/repeats.smk's patterns); the ladder's and e2e's case lists import
    torch (seconds at every `snakemake` call). In a second fresh process the lists come from the
    cache (workflow.listed_case_ids), the same ids, and torch is not imported."""
    code = f"""
import json, sys
from pathlib import Path
from lmperf import repeats, workflow as wf
from lmperf.report import render
wf.CASE_IDS_CACHE = Path({str(tmp_path)!r})
config = render.load_config({str(REPO / "config" / "config.yaml")!r})
jobs = [{{"job": "ladder/2.7B", "cases": ["2.7B-rung15-*"]}}, {json.dumps(JOB)},
        {{"job": "distributed/ddp_n2", "cases": ["*-ddp-b25-*n2"]}}]
config["repeats"]["full"] = {{"processes": 1, "jobs": jobs}}
config["ladder"]["full"]["sizes"] = ["2.7B"]
ids = {{}}
for scale in ("full", "smoke"):
    files = wf.result_files(config, "results/x", scale, ["results/x-x2"])
    repeats.check([f for f in files if f.section == "repeats"], scale)
    ids.update({{f.path: f.case_ids() for f in files}})
print(json.dumps([ids, sorted(m for m in ("torch", "triton") if m in sys.modules)]))
"""
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(json.loads(proc.stdout))
    (first, imported_first), (second, imported_second) = runs
    assert "torch" in imported_first and imported_second == [] and first == second
    assert len(first["results/x/ladder/2.7B.csv"]) > 10 and first["results/x/repeats/ladder/2.7B/run1.csv"] == [
        "2.7B-rung15-ctx2048"]


def test_the_cached_case_list_is_listed_again_when_the_job_or_its_code_changes(tmp_path, monkeypatch):
    from lmperf import sources

    monkeypatch.setattr(wf, "CASE_IDS_CACHE", tmp_path)
    listed = []
    real = wf.benchmark_case_ids
    monkeypatch.setattr(wf, "benchmark_case_ids", lambda *a: listed.append(a) or real(*a))
    spec = wf.fa_bench_spec(config_with()["flash_attention"]["full"], config_with()["models"], "headline_d64")
    job = ("flash_attention", "bench", spec, None)
    ids = wf.listed_case_ids(*job)
    assert ids == wf.listed_case_ids(*job) and len(listed) == 1 and ids  # the second from the cache
    wf.listed_case_ids("flash_attention", "bench", spec.replace("16384", "8192"), None)
    assert len(listed) == 2  # another spec
    monkeypatch.setattr(sources, "digest", lambda module: "an edited file")
    assert wf.listed_case_ids(*job) == ids and len(listed) == 3  # the same job, other code


def test_the_fresh_machine_rerun_is_judged_row_by_row(tmp_path):
    """results/<hw>-rerun beside results/<hw>: the section counts the timing rows that agree, the
    host-bound ones apart, and names the largest difference; no rerun folder, no paragraph."""
    from lmperf.report import rerun
    headline = REPO / "results" / "h100-80gb-hbm3" / "flash_attention" / "bench" / "headline_d64.csv"
    a, b = tmp_path / "results" / "h100", tmp_path / "results" / "h100-rerun"
    assert rerun.view(a, {}) is None
    df = pd.read_csv(headline)
    (a / "flash_attention").mkdir(parents=True)
    df.to_csv(a / "flash_attention" / "headline.csv", index=False)
    slow = df["case_id"].str.contains("sdpa_cudnn") & df["metric"].eq("fwd_bwd_ms")
    for c in ("median", "q20", "q80"):
        df.loc[slow, c] *= 1.5
    (b / "flash_attention").mkdir(parents=True)
    df.to_csv(b / "flash_attention" / "headline.csv", index=False)
    v = rerun.view(a, {"host_bound_idle_pct": 10})
    timed = df[(df["status"] == "ok") & df["metric"].notna()]
    timing = 6 * timed["provider"].nunique()  # the timed providers x forward, backward, fwd_bwd in ms and TFLOP/s
    assert len(timed) == timing
    assert v["gpu_rows"] + v["host_rows"] == timing and not v["hardware"]
    assert v["gpu_agree"] + v["host_agree"] == timing - 1
    assert "headline-sdpa_cudnn-bf16-causal-b1h16n16384d64` fwd_bwd_ms B/A 1.500 (slower)" in v["largest"]
    assert v["folder"] == "results/h100-rerun" and v["page"] == "compare/h100_vs_h100-rerun.md"


def test_the_full_scale_repeats_time_every_headline_comparison_in_three_fresh_processes():
    """The configuration's own repeats: each case in at least three processes (its job's and its
    repeats'), ours
    and its peers in one job, so that every process times both sides; the training rows' rungs
    by name."""
    from lmperf.bench import flash_attention

    config = render.load_config(REPO / "config" / "config.yaml")
    files = repeat_files(config)
    runs: dict[str, list] = {}
    for f in files:
        runs.setdefault(f.repeat_of.path, []).append(f)
    # the job's own process and its repeats: at least the processes a claim's band needs
    from lmperf.report import claims
    assert runs and all(1 + len(fs) >= claims.MIN_PROCESSES for fs in runs.values())
    assert all(f.case_ids() == fs[0].case_ids() for fs in runs.values() for f in fs)

    def cases(job: str) -> list[dict]:
        (f,) = [fs[0] for path, fs in runs.items() if path == f"{RESULTS}/{job}.csv"]
        ids = set(f.case_ids())
        return [c for c in flash_attention.bench_cases(json.loads(f.spec)) if c["case_id"] in ids]
    throughput = cases("flash_attention/bench/throughput_d128")
    assert {(c["provider"], c["causal"]) for c in throughput} >= {(p, causal) for p in ("triton", "sdpa_cudnn", "sdpa_flash")
                                                                    for causal in (False, True)}
    (ladder,) = [fs[0] for path, fs in runs.items() if path.endswith("/ladder/2.7B.csv")]
    names = {c.split("-", 2)[2] for c in ladder.case_ids()}
    assert {"compiled", "sdpa", "fused_rmsnorm", "ctx2048", "expandable_segments", "ours_float8_delayed"} <= names
