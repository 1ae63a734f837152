import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lmperf.bench import common, e2e

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


def run_cli(out: Path, fault: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), common.FAULT_ENV: fault}
    return subprocess.run([sys.executable, "-m", "lmperf.bench.e2e", *args(out)], env=env,
                          capture_output=True, text=True, timeout=300)


def test_grid_is_the_product_of_the_lists():
    assert [c["case_id"] for c in e2e.study_cases(SPEC, "tiny")] == CASE_IDS


def test_tiny_model_run_writes_tidy_rows(tmp_path):
    out = tmp_path / "r.csv"
    e2e.main(args(out, "--log", str(tmp_path / "r.log")))
    df = pd.read_csv(out)
    assert list(df.drop_duplicates("case_id")["case_id"]) == CASE_IDS
    assert (df["status"] == "ok").all()
    for col in ("hw", "gpu", "torch", "triton", "python", "commit", "unit", "samples"):
        assert col in df.columns
    train = df[df["case_id"] == CASE_IDS[1]].set_index("metric")
    assert {"forward_ms", "backward_ms", "optimizer_ms", "step_ms", "tokens_per_s"} <= set(train.index)
    # The step is the sum of its phases, step by step.
    phases = [list(map(float, train.loc[m, "samples"].split(";")))
              for m in ("forward_ms", "backward_ms", "optimizer_ms")]
    steps = list(map(float, train.loc["step_ms", "samples"].split(";")))
    assert len(steps) == SPEC["timed_steps"]
    assert steps == pytest.approx([sum(p) for p in zip(*phases)], rel=1e-4)
    assert train.loc["tokens_per_s", "mean"] > 0
    forward_only = set(df[df["case_id"] == CASE_IDS[0]]["metric"])
    assert "forward_ms" in forward_only and "backward_ms" not in forward_only
    assert "case 4/4" in (tmp_path / "r.log").read_text()
    assert not (tmp_path / ".journal").exists(), "the journal is removed once the CSV is written"


def test_oom_and_exception_become_rows_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv(common.FAULT_ENV, f"oom@{CASE_IDS[1]},error@{CASE_IDS[2]}")
    out = tmp_path / "r.csv"
    e2e.main(args(out))
    status = pd.read_csv(out).drop_duplicates("case_id").set_index("case_id")
    assert status.loc[CASE_IDS[1], "status"] == "oom"
    assert "out of memory" in status.loc[CASE_IDS[1], "message"]
    assert status.loc[CASE_IDS[2], "status"] == "error"
    assert "RuntimeError: injected error" in status.loc[CASE_IDS[2], "message"]
    assert status.loc[CASE_IDS[0], "status"] == status.loc[CASE_IDS[3], "status"] == "ok"


def test_real_exception_inside_measure_is_classified(tmp_path, monkeypatch):
    def broken(case, dims):
        raise ValueError("shape mismatch somewhere")
    monkeypatch.setattr(e2e, "measure", broken)
    out = tmp_path / "r.csv"
    e2e.main(args(out))
    df = pd.read_csv(out)
    assert (df["status"] == "error").all() and len(df) == len(CASE_IDS)
    assert df["message"].str.startswith("ValueError: shape mismatch").all()


def test_crash_loses_nothing_and_a_rerun_completes_the_rest(tmp_path):
    out = tmp_path / "r.csv"
    crashed = run_cli(out, fault=f"crash@{CASE_IDS[2]}")
    assert crashed.returncode == 70, crashed.stderr
    assert not out.exists(), "no partial CSV after a crash"
    journal = tmp_path / ".journal" / "r.csv.jsonl"
    done = [json.loads(line)["case_id"] for line in journal.read_text().splitlines()
            if json.loads(line)["event"] == "done"]
    assert done == CASE_IDS[:2]
    first_rows = [json.loads(line) for line in journal.read_text().splitlines()
                  if json.loads(line)["event"] == "done"][0]["rows"]

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
    rerun = run_cli(out, fault=f"crash@{CASE_IDS[3]}")  # would crash again if retried
    assert rerun.returncode == 0, rerun.stderr
    status = pd.read_csv(out).drop_duplicates("case_id").set_index("case_id")["status"]
    assert status[CASE_IDS[3]] == "error"
    assert (status[CASE_IDS[:3]] == "ok").all()


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
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cli = [sys.executable, "-m", "lmperf.bench.e2e", *args(out)]
    cli[cli.index("--spec") + 1] = json.dumps(other)
    proc = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "resuming" not in proc.stderr
    assert set(pd.read_csv(out)["n"][pd.read_csv(out)["metric"] == "step_ms"]) == {2}


def test_csv_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "x.csv"
    common.write_csv_atomic(pd.DataFrame({"a": [1]}), path)
    broken = pd.DataFrame({"a": [2]})
    monkeypatch.setattr(pd.DataFrame, "to_csv", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        common.write_csv_atomic(broken, path)
    assert path.read_text().splitlines() == ["a", "1"], "the old file survives a failed write"
    assert [p.name for p in tmp_path.iterdir()] == ["x.csv"], "no temporary file is left behind"


@pytest.mark.parametrize("exc, status", [
    (RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"), "oom"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory"), "oom"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "error"),
    (KeyError("x"), "error"),
])
def test_classify_failure(exc, status):
    assert common.classify_failure(exc)[0] == status


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
