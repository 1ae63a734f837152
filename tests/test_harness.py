"""The benchmark harness (bench/loop.py's run_cases, its journal and failure rows) through the
e2e benchmark on a tiny model: real subprocesses where the case is a process event (a crash, an
interrupt, an error that fails the job), faults injected with LMPERF_INJECT_FAULT."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmperf import csv_schema, failures, stats
from lmperf.bench import e2e, loop, timing

SPEC = {"batch_size": 2, "timed_steps": 3, "attention": "plain",
        "models": {"tiny": {"d_model": 32, "d_ff": 64, "n_layers": 1, "n_heads": 2}},
        "grid": {"contexts": [8], "dtypes": ["fp32", "bf16"], "compile": [False],
                 "modes": ["forward", "train"], "warmup": [1]}}
CASE_IDS = ["tiny-ctx8-fp32-eager-forward-warmup1", "tiny-ctx8-fp32-eager-train-warmup1",
            "tiny-ctx8-bf16-eager-forward-warmup1", "tiny-ctx8-bf16-eager-train-warmup1"]
REPO = Path(__file__).resolve().parents[1]


def args(out: Path, *extra: str) -> list[str]:
    return ["--study", "variants", "--size", "tiny", "--spec", json.dumps(SPEC), "--out", str(out),
            "--hw", "cpu", *extra]


def run_cli(out: Path, fault: str = "", env: dict | None = None, spec: dict = SPEC,
            src: Path = REPO / "src") -> subprocess.CompletedProcess:
    """`python -m lmperf.bench.e2e` on the tiny grid, lmperf from `src`, no errors accepted."""
    base = {k: v for k, v in os.environ.items() if k != failures.ACCEPT_ERRORS_ENV}
    cli = [sys.executable, "-m", "lmperf.bench.e2e", *args(out)]
    cli[cli.index("--spec") + 1] = json.dumps(spec)
    return subprocess.run(cli, env={**base, "PYTHONPATH": str(src), failures.FAULT_ENV: fault, **(env or {})},
                          capture_output=True, text=True, timeout=600)


def journal_events(out: Path) -> list[dict]:
    path = out.parent / ".journal" / (out.name + ".jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def statuses(out: Path) -> pd.Series:
    return pd.read_csv(out).drop_duplicates("case_id").set_index("case_id")["status"]


def test_grid_is_the_product_of_the_lists():
    assert [c["case_id"] for c in e2e.study_cases(SPEC, "tiny")] == CASE_IDS


def test_tiny_model_run_writes_tidy_rows(tmp_path):
    out = tmp_path / "r.csv"
    e2e.main(args(out, "--log", str(tmp_path / "r.log")))
    df = pd.read_csv(out)
    assert list(df.drop_duplicates("case_id")["case_id"]) == CASE_IDS
    assert (df["status"] == "ok").all()
    for col in ("hw", "gpu", "torch", "triton", "python", "commit", "unit", "samples", "gpu_idle_pct"):
        assert col in df.columns
    assert df["gpu_idle_pct"].isna().all()  # a CPU has no GPU to sit idle: empty, not 0
    assert df[csv_schema.CLOCK_COLUMNS].isna().all().all()  # nor clocks, power or temperature to read
    metric_end = list(df.columns).index("message")
    assert list(df.columns)[metric_end + 1:metric_end + 1 + len(csv_schema.CLOCK_COLUMNS)] == csv_schema.CLOCK_COLUMNS
    train = df[df["case_id"] == CASE_IDS[1]].set_index("metric")
    assert {"forward_ms", "backward_ms", "optimizer_ms", "step_ms", "tokens_per_s"} <= set(train.index)
    # The step is the sum of its phases, step by step.
    phases = [list(map(float, train.loc[m, "samples"].split(";")))
              for m in ("forward_ms", "backward_ms", "optimizer_ms")]
    steps = list(map(float, train.loc["step_ms", "samples"].split(";")))
    assert len(steps) == SPEC["timed_steps"]
    assert steps == pytest.approx([sum(p) for p in zip(*phases)], rel=1e-4)
    assert train.loc["tokens_per_s", "mean"] > 0
    # Every row with samples states their median and 20/80% quantiles.
    sampled = df[df["n"] > 0]
    assert sampled[["median", "q20", "q80"]].notna().all().all()
    assert (sampled["q20"] <= sampled["median"]).all() and (sampled["median"] <= sampled["q80"]).all()
    forward_only = set(df[df["case_id"] == CASE_IDS[0]]["metric"])
    assert "forward_ms" in forward_only and "backward_ms" not in forward_only
    assert "case 4/4" in (tmp_path / "r.log").read_text()
    assert not (tmp_path / ".journal").exists(), "the journal is removed once the CSV is written"
    assert (out.stat().st_mode & 0o777) == 0o666 & ~current_umask()


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_result_csv_gets_mode_0644(tmp_path):
    before = os.umask(0o022)
    try:
        csv_schema.write_csv_atomic(pd.DataFrame({"a": [1]}), tmp_path / "x.csv")
    finally:
        os.umask(before)
    assert oct((tmp_path / "x.csv").stat().st_mode & 0o777) == oct(0o644)


@pytest.mark.parametrize("samples", [[3.0], [5.0, 1.0], [4.0, 1.0, 9.0, 2.0, 7.0],
                                     list(np.random.default_rng(0).lognormal(size=23))])
def test_summary_quantiles_are_numpys_linear_ones(samples):
    row = stats.summarize("step_ms", "ms", [*samples, float("nan")])
    assert row["median"] == pytest.approx(np.quantile(samples, 0.5))
    assert row["q20"] == pytest.approx(np.quantile(samples, 0.2))
    assert row["q80"] == pytest.approx(np.quantile(samples, 0.8))
    assert row["n"] == len(samples) + 1  # the NaN sample is counted, not summarised


def test_a_rate_is_the_work_over_the_median_step_not_a_median_of_rates():
    step_ms = [100.0, 200.0, 400.0, 500.0]  # an even count: the two differ
    row = stats.summarize_rate("tokens_per_s", "tokens/s", 1000.0, step_ms)
    assert row["median"] == pytest.approx(1000.0 / 0.3)  # tokens / the median step (300 ms)
    assert row["median"] != pytest.approx(np.median([1000.0 / (s / 1e3) for s in step_ms]))
    assert row["q20"] == pytest.approx(1000.0 / (np.quantile(step_ms, 0.8) / 1e3))  # the slow steps' rate
    assert row["q80"] == pytest.approx(1000.0 / (np.quantile(step_ms, 0.2) / 1e3))
    assert row["samples"] == "10000;5000;2500;2000" and row["n"] == 4  # per-step rates kept


@pytest.mark.parametrize("step_s, steps", [(0.1, 20), (0.99, 20), (1.5, 14), (3.0, 7), (10.0, 5)])
def test_timed_steps_fill_the_window_and_no_fewer_than_the_fewest(step_s, steps):
    """20 steps where a step takes under a second (a 20 s window), fewer for slower steps, never
    under min_timed_steps; without a window, every timed step."""
    spec = {"timed_steps": 20, "min_timed_steps": 5, "timed_window_s": 20}
    case = e2e.timing_keys(spec)
    timed, stop = e2e.run_timed(lambda: {"forward": step_s / 2, "backward": step_s / 2}, case)
    assert len(timed) == steps and stop == ("ceiling" if steps == 20 else "window")
    case = e2e.timing_keys({"timed_steps": 20})
    assert case == {"timed_steps": 20, "min_timed_steps": 20, "timed_window_s": None, "median_within": None}
    assert e2e.run_timed(lambda: {"forward": step_s}, case)[1] == "ceiling"
    assert len(e2e.run_timed(lambda: {"forward": step_s}, case)[0]) == 20


def test_steady_steps_stop_once_the_median_is_known():
    """With median_within, steady steps stop at the 8 a 99% interval of the median needs, even
    short ones that the window would let run to the ceiling; the row says why."""
    case = e2e.timing_keys({"timed_steps": 20, "min_timed_steps": 5, "timed_window_s": 20,
                            "median_within": 0.01})
    steps = iter([0.100, 0.1008, 0.0992, 0.100, 0.1005, 0.0995, 0.100, 0.100, 0.5, 0.5])
    timed, stop = e2e.run_timed(lambda: {"forward": next(steps)}, case)
    assert len(timed) == 8 and stop == "median ±1% at 99%"


def test_oom_and_exception_become_rows_and_an_error_fails_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv(failures.FAULT_ENV, f"oom@{CASE_IDS[1]},error@{CASE_IDS[2]}")
    monkeypatch.delenv(failures.ACCEPT_ERRORS_ENV, raising=False)
    out = tmp_path / "r.csv"
    with pytest.raises(SystemExit) as stop:
        e2e.main(args(out))
    assert stop.value.code == 1, "an error row fails the job, after the CSV is written"
    status = pd.read_csv(out).drop_duplicates("case_id").set_index("case_id")
    assert status.loc[CASE_IDS[1], "status"] == "oom"
    assert "out of memory" in status.loc[CASE_IDS[1], "message"]
    assert status.loc[CASE_IDS[2], "status"] == "error"
    assert "RuntimeError: injected error" in status.loc[CASE_IDS[2], "message"]
    assert status.loc[CASE_IDS[0], "status"] == status.loc[CASE_IDS[3], "status"] == "ok"
    done = [ev["case_id"] for ev in journal_events(out) if ev["event"] == "done"]
    assert done == [CASE_IDS[0], CASE_IDS[1], CASE_IDS[3]], "the journal keeps all but the error"


def test_real_exception_inside_measure_is_classified(tmp_path, monkeypatch):
    def broken(case, dims):
        raise ValueError("shape mismatch somewhere")
    monkeypatch.setattr(e2e, "measure", broken)
    monkeypatch.delenv(failures.ACCEPT_ERRORS_ENV, raising=False)
    out = tmp_path / "r.csv"
    with pytest.raises(SystemExit):
        e2e.main(args(out))
    df = pd.read_csv(out)
    assert (df["status"] == "error").all() and len(df) == len(CASE_IDS)
    assert df["message"].str.startswith("ValueError: shape mismatch").all()


def test_an_error_exits_non_zero_and_a_rerun_measures_only_it(tmp_path):
    out = tmp_path / "r.csv"
    failed = run_cli(out, fault=f"error@{CASE_IDS[2]}")
    assert failed.returncode == 1, failed.stderr
    assert statuses(out)[CASE_IDS[2]] == "error"
    assert "1 of 4 cases ended in error" in failed.stderr and "accept_errors" in failed.stderr
    first = pd.read_csv(out).drop_duplicates("case_id").set_index("case_id")["measured_at"]
    out.unlink()  # as Snakemake does with the outputs of a failed job

    rerun = run_cli(out)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming: 3 of 4" in rerun.stderr
    assert (statuses(out) == "ok").all()
    again = pd.read_csv(out).drop_duplicates("case_id").set_index("case_id")["measured_at"]
    kept = [c for c in CASE_IDS if c != CASE_IDS[2]]
    assert (again[kept] == first[kept]).all(), "the other cases were reused, not measured again"
    assert not (tmp_path / ".journal").exists()


def test_accepted_errors_end_the_job_normally(tmp_path):
    out = tmp_path / "r.csv"
    proc = run_cli(out, fault=f"error@{CASE_IDS[2]}",
                   env={failures.ACCEPT_ERRORS_ENV: '["*-compiled-*", "tiny-*-bf16-eager-forward-*"]'})
    assert proc.returncode == 0, proc.stderr
    assert statuses(out)[CASE_IDS[2]] == "error", "an accepted error is still its row"
    assert not (tmp_path / ".journal").exists()


@pytest.mark.parametrize("value, accepted", [("", False), ("false", False), ("true", True),
                                             ('["*-compiled-*"]', False), ('["tiny-*-forward-*"]', True)])
def test_accept_errors_values(monkeypatch, value, accepted):
    monkeypatch.setenv(failures.ACCEPT_ERRORS_ENV, value)
    assert failures.is_accepted(CASE_IDS[2], failures.accepted_errors()) == accepted


@pytest.mark.parametrize("value", ["yes please", '{"a": 1}', "[1]"])
def test_a_malformed_accept_errors_value_is_named(monkeypatch, value):
    monkeypatch.setenv(failures.ACCEPT_ERRORS_ENV, value)
    with pytest.raises(SystemExit, match=re.escape(f"LMPERF_ACCEPT_ERRORS={value!r}: expected JSON true, false")):
        failures.accepted_errors()


def test_crash_loses_nothing_and_a_rerun_completes_the_rest(tmp_path):
    out = tmp_path / "r.csv"
    crashed = run_cli(out, fault=f"crash@{CASE_IDS[2]}")
    assert crashed.returncode == 70, crashed.stderr
    assert not out.exists(), "no partial CSV after a crash"
    journal = tmp_path / ".journal" / "r.csv.jsonl"
    done = [ev for ev in journal_events(out) if ev["event"] == "done"]
    assert [ev["case_id"] for ev in done] == CASE_IDS[:2]
    first_rows = done[0]["rows"]

    rerun = run_cli(out)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming: 2 of 4" in rerun.stderr
    df = pd.read_csv(out)
    assert (df.drop_duplicates("case_id")["status"] == "ok").all()
    # The journalled case was reused, not measured again.
    reused = df[df["case_id"] == CASE_IDS[0]]
    assert set(reused["measured_at"]) == {first_rows[0]["measured_at"]}
    assert not journal.exists()


def test_a_case_that_kills_the_process_twice_is_recorded_not_retried(tmp_path):
    out = tmp_path / "r.csv"
    for _ in range(2):
        assert run_cli(out, fault=f"crash@{CASE_IDS[3]}").returncode == 70
    for _ in range(2):  # it would crash again (exit 70) if it were retried
        rerun = run_cli(out, fault=f"crash@{CASE_IDS[3]}")
        assert rerun.returncode == 1, rerun.stderr  # an error row: the job fails, and says why
        status = statuses(out)
        assert status[CASE_IDS[3]] == "error"
        assert (status[CASE_IDS[:3]] == "ok").all()
        assert "died in this case on two earlier attempts" in pd.read_csv(out).set_index("case_id").loc[CASE_IDS[3], "message"]


def test_interrupts_are_retried_not_counted_as_deaths(tmp_path):
    """Ctrl-C, then SIGTERM, then a crash in the same case: each interrupt exits 128 + the signal
    and is journalled as an interruption; with one death the rerun still measures the case (two
    deaths would make it an error row)."""
    out = tmp_path / "r.csv"
    for kind, signum in (("interrupt", signal.SIGINT), ("terminate", signal.SIGTERM)):
        stopped = run_cli(out, fault=f"{kind}@{CASE_IDS[2]}")
        assert stopped.returncode == 128 + signum, stopped.stderr
        assert f"interrupted by {signal.Signals(signum).name} in case {CASE_IDS[2]}" in stopped.stderr
        assert not out.exists()
    events = journal_events(out)
    assert [ev["signal"] for ev in events if ev["event"] == "interrupted"] == ["SIGINT", "SIGTERM"]
    assert [ev["case_id"] for ev in events if ev["event"] == "done"] == CASE_IDS[:2]
    assert run_cli(out, fault=f"crash@{CASE_IDS[2]}").returncode == 70
    rerun = run_cli(out)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming: 2 of 4" in rerun.stderr
    assert (statuses(out) == "ok").all()


def test_a_line_cut_short_by_a_crash_is_dropped_and_the_rest_reused(tmp_path):
    out = tmp_path / "r.csv"
    assert run_cli(out, fault=f"crash@{CASE_IDS[2]}").returncode == 70
    journal = tmp_path / ".journal" / "r.csv.jsonl"
    with open(journal, "a") as f:
        f.write('{"event": "done", "case_id": "half a li')  # as if killed mid-write
    rerun = run_cli(out)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming: 2 of 4" in rerun.stderr
    assert (pd.read_csv(out).drop_duplicates("case_id")["status"] == "ok").all()


def test_journal_of_another_grid_is_discarded(tmp_path):
    out = tmp_path / "r.csv"
    assert run_cli(out, fault=f"crash@{CASE_IDS[1]}").returncode == 70
    other = json.loads(json.dumps(SPEC))
    other["timed_steps"] = 2
    proc = run_cli(out, spec=other)
    assert proc.returncode == 0 and "resuming" not in proc.stderr
    assert "starting over" in proc.stderr and "another grid or library version" in proc.stderr
    assert set(pd.read_csv(out)["n"][pd.read_csv(out)["metric"] == "step_ms"]) == {2}


def copy_src(dest: Path) -> Path:
    import shutil
    shutil.copytree(REPO / "src", dest, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


@pytest.mark.parametrize("edited, resumes", [("lmperf/model.py", False),
                                             ("lmperf/report/format.py", True)])
def test_a_resume_onto_other_code_starts_over(tmp_path, edited, resumes):
    """Interrupted after 2 of 4 cases, a module edited, rerun: an edit to code the benchmark can
    run (the model) starts the job over and says so; an edit elsewhere (the report) resumes."""
    src = copy_src(tmp_path / "src")
    out = tmp_path / "r.csv"
    assert run_cli(out, fault=f"crash@{CASE_IDS[2]}", src=src).returncode == 70
    (src / edited).write_text((src / edited).read_text() + "\n# edited\n")
    rerun = run_cli(out, src=src)
    assert rerun.returncode == 0, rerun.stderr
    assert ("resuming: 2 of 4" in rerun.stderr) == resumes
    assert ("starting over" in rerun.stderr and "ran other code" in rerun.stderr) == (not resumes)
    assert (statuses(out) == "ok").all()


def test_csv_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "x.csv"
    csv_schema.write_csv_atomic(pd.DataFrame({"a": [1]}), path)
    broken = pd.DataFrame({"a": [2]})
    monkeypatch.setattr(pd.DataFrame, "to_csv", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        csv_schema.write_csv_atomic(broken, path)
    assert path.read_text().splitlines() == ["a", "1"], "the old file survives a failed write"
    assert [p.name for p in tmp_path.iterdir()] == ["x.csv"], "no temporary file is left behind"


def chained(outer: Exception, cause: Exception) -> Exception:
    """`outer` as raised from `cause` (its __cause__ set, as `raise outer from cause` does)."""
    try:
        try:
            raise cause
        except Exception as e:
            raise outer from e
    except Exception as e:
        return e


@pytest.mark.parametrize("exc, status", [
    (RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"), "oom"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory"), "oom"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "error"),
    (KeyError("x"), "error"),
    (chained(RuntimeError("backend='inductor' raised:"), RuntimeError("CUDA out of memory")), "oom"),
    (failures.Unsupported("fp16/bf16 only"), "unsupported"),
])
def test_classify_failure(exc, status):
    assert failures.classify_failure(exc)[0] == status


def compile_failure(cause: Exception) -> Exception:
    """What torch.compile raises when Inductor fails: BackendCompilerFailed, its message quoting
    the cause on its second line and ending in advice, raised from the cause."""
    from torch._dynamo.exc import BackendCompilerFailed

    def inductor():
        pass
    outer = BackendCompilerFailed(inductor, cause, None)
    outer.args = (outer.args[0] + "\n\nSet TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please "
                  "do this especially if you're reporting a bug to PyTorch). For even more developer "
                  'context, set TORCH_LOGS="+dynamo"',)
    return chained(outer, cause)


def test_a_failure_row_keeps_the_cause_of_a_compile_failure():
    cause = ImportError("/tmp/torchinductor_u/ab/cabcdef.so: file too short")
    status, message = failures.classify_failure(compile_failure(cause))
    assert status == "error"
    assert message.startswith("BackendCompilerFailed: backend='inductor' raised: ImportError")
    assert message.endswith("cabcdef.so: file too short")
    assert "TORCHDYNAMO_VERBOSE" not in message
    assert failures.is_compile_failure(compile_failure(cause))
    assert not failures.is_compile_failure(RuntimeError("CUDA error: an illegal memory access"))


def test_a_long_message_keeps_its_head_and_its_end():
    output = "\n".join(f"x.cpp:{i}: note: candidate {'-' * 60}" for i in range(200))
    cause = RuntimeError(f"C++ compile error\n\nOutput:\n{output}\nx.cpp:9: error: 'at::vec' has not been declared")
    message = failures.classify_failure(compile_failure(cause))[1]
    assert len(message) <= failures.MESSAGE_LIMIT
    assert message.startswith("BackendCompilerFailed: backend='inductor' raised: RuntimeError: C++ compile error")
    assert message.endswith("x.cpp:9: error: 'at::vec' has not been declared")


@pytest.mark.slow  # three compiles on a CPU: half a minute
def test_a_compile_cache_cut_short_by_an_interrupt_is_retried_in_a_fresh_one(tmp_path):
    """What Ctrl-C during torch.compile leaves behind: compiled libraries of 0 bytes in the compile
    cache, which fail every later compile that reads them. The case is tried once more in a fresh
    cache, and its row is a measurement, not an error."""
    spec = json.loads(json.dumps(SPEC))
    spec["grid"].update(dtypes=["fp32"], compile=[True], modes=["forward"])
    caches = {var: str(tmp_path / "cache" / sub) for var, sub in failures.COMPILE_CACHE_VARS.items()}
    first = run_cli(tmp_path / "first.csv", spec=spec, env=caches)
    assert first.returncode == 0, first.stderr
    libraries = list((tmp_path / "cache").rglob("*.so"))
    assert libraries, "the compiled case left no library in its cache"
    for library in libraries:
        library.write_bytes(b"")
    rerun = run_cli(tmp_path / "rerun.csv", spec=spec, env=caches)
    assert rerun.returncode == 0, rerun.stderr
    assert "compile failed (BackendCompilerFailed" in rerun.stderr, "the cut-short cache did not fail"
    assert "ok in a fresh compile cache" in rerun.stderr
    assert (statuses(tmp_path / "rerun.csv") == "ok").all()


def test_versions_other_than_planned_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="planned with torch 0.0.1"):
        e2e.main(args(tmp_path / "r.csv", "--expect-torch", "0.0.1"))


def test_gpu_results_folder_without_cuda_is_refused(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this check is about machines without CUDA")
    a = args(tmp_path / "r.csv")
    a[a.index("--hw") + 1] = "h100-80gb-hbm3"
    with pytest.raises(SystemExit, match="sees no CUDA device"):
        e2e.main(a)


def test_unknown_size_is_a_clear_error(tmp_path, capsys):
    a = args(tmp_path / "r.csv")
    a[a.index("--size") + 1] = "huge"
    with pytest.raises(SystemExit):
        e2e.main(a)
    assert "--size 'huge' is not among" in capsys.readouterr().err


def test_every_row_of_a_timed_case_carries_its_clocks_and_a_row_measured_elsewhere_keeps_its_own(tmp_path, monkeypatch):
    readings = iter([{"sm_clock_mhz": 1_980.0, "mem_clock_mhz": 2_619.0, "power_w": 410.0, "temp_c": 41.0},
                     {"sm_clock_mhz": 1_755.0, "mem_clock_mhz": 2_619.0, "power_w": 700.0, "temp_c": 63.0}])
    monkeypatch.setattr(timing.energy, "reading", lambda: next(readings))
    elsewhere = dict.fromkeys(csv_schema.CLOCK_COLUMNS, 1_000.0)  # a row from a contender's process

    def measure(case):
        if case["case_id"] == "check":
            return [stats.summarize("max_abs_error", "", [0.0])]
        if case["case_id"] == "isolated":
            return [{**stats.summarize("ms", "ms", [1.0]), **elsewhere}]
        samples, _ = timing.sample_until(lambda: 0.001, timing.StopRule(ceiling=3))
        return [stats.summarize("step_ms", "ms", samples), stats.summarize("tokens_per_s", "tokens/s", [1.0])]
    monkeypatch.setattr(loop, "code_identity", lambda measure, commit: {"commit": commit})
    out = tmp_path / "r.csv"
    loop.run_cases(section="s", study="t", cases=[{"case_id": c} for c in ("timed", "check", "isolated")],
                     measure=measure, out_csv=out, hw="cpu", log_path=None, fingerprint={})
    df = pd.read_csv(out).set_index("metric")
    for metric in ("step_ms", "tokens_per_s"):  # both rows of the timed case
        row = df.loc[metric]
        assert (row["sm_clock_mhz_start"], row["sm_clock_mhz_end"]) == (1_980, 1_755)
        assert (row["power_w_start"], row["power_w_end"], row["temp_c_start"], row["temp_c_end"]) == (410, 700, 41, 63)
    assert df.loc["max_abs_error", csv_schema.CLOCK_COLUMNS].isna().all()  # timed nothing
    assert (df.loc["ms", csv_schema.CLOCK_COLUMNS] == 1_000).all()
