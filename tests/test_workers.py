"""Worker processes of a benchmark job (bench/workers.py, bench/jobs.py): a check measured in
two workers writes the rows one process writes, keeps the journal's promises (a failure is a
row, a worker that dies is retried once and then a row, the parent's death resumes), and the
compile-cache warm-up leaves graphs that the job's own process then loads."""
import json
import multiprocessing
import os
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pandas as pd
import pytest

from lmperf import csv_schema, failures, stats
from lmperf.bench import jobs, loop, lrpe, workers

REPO = Path(__file__).resolve().parents[1]
# A small LRPE check: fp32 runs in Triton's interpreter, bf16 Triton is a `skipped` row on a CPU.
SPEC = {"impls": ["torch", "triton"], "dtypes": ["fp32", "bf16"], "extra_tokens": [0, 3], "batch": 1,
        "heads": 2, "grids": [{"shape": [9], "d": 8, "e": 8}, {"shape": [3, 2], "d": 8, "e": 4}]}
CASE_IDS = [c["case_id"] for c in lrpe.check_cases(SPEC)]


def check_cli(out: Path, *extra: str, fault: str = "") -> subprocess.CompletedProcess:
    """`python -m lmperf.bench.lrpe check` on SPEC, no errors accepted."""
    env = {k: v for k, v in os.environ.items() if k != failures.ACCEPT_ERRORS_ENV}
    cli = [sys.executable, "-m", "lmperf.bench.lrpe", "check", "--spec", json.dumps(SPEC), "--out", str(out),
           "--hw", "cpu", "--log", str(out.with_suffix(".log")), *extra]
    return subprocess.run(cli, env={**env, "PYTHONPATH": str(REPO / "src"), failures.FAULT_ENV: fault},
                          capture_output=True, text=True, timeout=600)


def same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """The same cases, metrics, statuses and verdicts in the same order (errors and their
    tolerances differ: every case draws fresh random inputs)."""
    columns = ["case_id", "metric", "status", "passed"]
    pd.testing.assert_frame_equal(a[columns].reset_index(drop=True), b[columns].reset_index(drop=True))


def test_a_check_in_two_workers_writes_the_rows_of_one_process(tmp_path):
    one, two = tmp_path / "one.csv", tmp_path / "two.csv"
    for out, extra in ((one, ()), (two, ("--workers", "2"))):
        proc = check_cli(out, *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = pd.read_csv(one), pd.read_csv(two)
    same_rows(a, b)
    assert list(b.drop_duplicates("case_id")["case_id"]) == CASE_IDS
    assert "worker_wall_s" in b and b["worker_wall_s"].notna().all()
    assert not (tmp_path / ".journal").exists()


def test_in_workers_an_error_is_a_row_that_fails_the_job_and_a_rerun_measures_only_it(tmp_path):
    out, failing = tmp_path / "r.csv", CASE_IDS[3]
    proc = check_cli(out, "--workers", "2", fault=f"error@{failing}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    status = pd.read_csv(out).drop_duplicates("case_id").set_index("case_id")["status"]
    assert status[failing] == "error" and (status.drop(failing) != "error").all()
    proc = check_cli(out, "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming: {len(CASE_IDS) - 1} of {len(CASE_IDS)} cases" in proc.stderr
    assert set(pd.read_csv(out)["status"]) <= {"ok", "skipped"}


def test_in_workers_the_parents_death_loses_nothing_journalled_and_a_rerun_completes(tmp_path):
    """The parent dies (a crash of the job, as a serial job's) in case 5: the journal keeps the
    four before it, the rerun measures the rest in fresh workers."""
    out = tmp_path / "r.csv"
    proc = check_cli(out, "--workers", "2", fault=f"crash@{CASE_IDS[4]}")
    assert proc.returncode == 70 and not out.exists()
    proc = check_cli(out, "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming: 4 of {len(CASE_IDS)} cases" in proc.stderr
    assert list(pd.read_csv(out).drop_duplicates("case_id")["case_id"]) == CASE_IDS


def test_a_case_can_be_measured_alone_by_its_id(tmp_path):
    out = tmp_path / "r.csv"
    proc = check_cli(out, "--cases", "torch-fp32-*-l3-*", CASE_IDS[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids = list(pd.read_csv(out).drop_duplicates("case_id")["case_id"])
    assert ids == [c for c in CASE_IDS if c.startswith("torch-fp32-") and "-l3-" in c] + [CASE_IDS[-1]]
    proc = check_cli(out, "--cases", "no-such-case-*")
    assert proc.returncode != 0 and "no-such-case-*" in proc.stderr


# --- worker deaths, with measures of this module (workers import them by name) ---------------

def in_a_worker() -> bool:
    return multiprocessing.parent_process() is not None


def dies_in_workers(case: dict) -> list[dict]:
    """Kills its worker in case 'dies', and in case 'dies-once' the first time only (a marker
    file in the case's folder remembers)."""
    marker = Path(case["folder"]) / f"{case['case_id']}.died"
    if in_a_worker() and (case["case_id"] == "dies" or (case["case_id"] == "dies-once" and not marker.exists())):
        marker.touch()
        os._exit(3)
    return [stats.summarize("value", "count", [len(case["case_id"])])]


def run_in_workers(tmp_path: Path, ids: list[str], measure, n: int = 2) -> pd.DataFrame:
    cases = [{"case_id": i, "folder": str(tmp_path)} for i in ids]
    args = Namespace(out=tmp_path / "r.csv", hw="cpu", log=tmp_path / "r.log", workers=n, cases=None)
    try:
        jobs.run(section="test", study="workers", cases=cases, measure=measure, args=args, fingerprint={},
                 parallel=True)
    except SystemExit as stop:
        assert stop.code == 1  # an error row fails the job once the CSV is written
    return pd.read_csv(args.out).set_index("case_id")


def test_a_worker_that_dies_in_a_case_is_replaced_the_case_retried_once_then_an_error_row(tmp_path, monkeypatch):
    monkeypatch.delenv(failures.ACCEPT_ERRORS_ENV, raising=False)
    df = run_in_workers(tmp_path, ["a", "dies-once", "b", "dies", "c", "d"], dies_in_workers)
    assert df.loc["dies-once", "status"] == "ok", "a second try in a fresh worker"
    assert df.loc["dies", "status"] == "error"
    assert "worker process died in this case (exit code 3), 2 times" in df.loc["dies", "message"]
    assert (df.drop("dies")["status"] == "ok").all()
    assert df.loc["c", "median"] == 1
    log = (tmp_path / "r.log").read_text()
    assert "dies-once: the worker process died in this case (exit code 3); trying it once more" in log


def test_a_pool_stops_its_workers(tmp_path):
    with workers.Pool(dies_in_workers, 2, print) as pool:
        for i in ("a", "b"):
            pool.submit({"case_id": i, "folder": str(tmp_path)})
        procs = [p for p, _ in pool.busy.values()]
        while pool.busy:
            pool.collect()
    for p in procs:
        assert not p.is_alive()


def test_functions_that_workers_cannot_import_are_refused():
    with pytest.raises(ValueError, match="module-level"):
        workers.qualified_name(lambda case: [])


# --- the compile-cache warm-up ----------------------------------------------------------------

def compiled_attention(case: dict) -> list[dict]:
    """A training step of plain attention under torch.compile (Inductor's C++ backend on a CPU),
    at the case's sequence length; its compile time as a row."""
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    n = case["seq_len"]
    fn = torch.compile(lambda q, k: torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1).sum(), dynamic=False)
    q, k = (torch.randn(2, n, 16, requires_grad=True) for _ in range(2))
    t0 = time.perf_counter()
    fn(q, k).backward()
    return [stats.summarize("compile_s", "s", [time.perf_counter() - t0])]


# The job's side of the warm-up test, run in a fresh process as a benchmark job is: Inductor's
# graph cache keys on settings that an earlier test in pytest's process may have changed (a
# FlashAttention benchmark case turns off donated buffers, an SDPA leaderboard case the caches).
WARM_UP_JOB = """
import sys
from pathlib import Path

import torch._dynamo.utils

from lmperf import csv_schema, failures, stats
from lmperf.bench import loop, workers
from test_workers import compiled_attention

log = Path(sys.argv[1])
compiled_attention({"seq_len": 16})  # this process's first compile (imports, Inductor's set-up)
cold = compiled_attention({"seq_len": 24})[0]["median"]  # a length the warm-up does not see
cases = [{"case_id": f"n{n}", "seq_len": n} for n in (32, 48)]
progress = loop.Progress("test/warm", len(cases), log)
workers.warm_up(compiled_attention, cases[:1], 2, progress.say)  # one case: not warmed
assert "not warming the compile caches: 1 compiling case" in log.read_text()
workers.warm_up(compiled_attention, cases, 2, progress.say)  # two: one worker, not two
assert "warming the compile caches: 2 cases in 1 worker processes" in log.read_text()
progress.close()
counters = torch._dynamo.utils.counters
hits = counters["inductor"]["fxgraph_cache_hit"]
warm = compiled_attention(cases[0])[0]["median"]
assert counters["inductor"]["fxgraph_cache_hit"] > hits, "the worker's graph was not found in the cache"
assert warm < cold, (warm, cold)
assert "compile caches warm in" in log.read_text()
"""


@pytest.mark.slow  # compiles in a worker, then loads in a second process (half a minute of CPU)
def test_the_warm_up_leaves_graphs_that_the_jobs_own_process_loads(tmp_path):
    """Compiled in a worker, loaded from the cache by the job's own process: Inductor's graph
    cache hits, and the compile takes less time than a cold one."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")]),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    proc = subprocess.run([sys.executable, "-c", WARM_UP_JOB, str(tmp_path / "warm.log")], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def autotune_cache_setting(case: dict) -> list[dict]:
    import torch._inductor.config
    return [stats.summarize("autotune_local_cache", "value", [int(torch._inductor.config.autotune_local_cache)])]


@pytest.mark.parametrize("warming, cached", [(True, 0), (False, 1)])
def test_a_warming_worker_caches_no_launch_config_choice(warming, cached):
    """Inductor's choice among a kernel's launch configs is the timed process's, made on an idle
    GPU: a warm-up worker, timing them beside the other workers, keeps none."""
    with workers.Pool(autotune_cache_setting, 1, print, warming=warming) as pool:
        pool.submit({"case_id": "x"})
        [(_, rows, _)] = pool.collect()
    assert rows[0]["median"] == cached


def test_the_flashattention_check_in_two_workers_writes_the_rows_of_one_process(tmp_path):
    """The check's cases go to the workers as the module's own measure (a closure cannot be sent
    to a worker: a job that wrapped it failed before its first case)."""
    spec = {"impls": ["torch_tiled"], "dtypes": ["fp32"], "causal": [False, True],
            "shapes": [[1, 2, 17, 16], [1, 1, 9, 32]]}
    env = {k: v for k, v in os.environ.items() if k != failures.ACCEPT_ERRORS_ENV}
    frames = []
    for name, extra in (("one", ()), ("two", ("--workers", "2"))):
        out = tmp_path / f"{name}.csv"
        cli = [sys.executable, "-m", "lmperf.bench.flash_attention", "check", "--spec", json.dumps(spec),
               "--out", str(out), "--hw", "cpu", *extra]
        proc = subprocess.run(cli, env={**env, "PYTHONPATH": str(REPO / "src")}, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        frames.append(pd.read_csv(out))
    same_rows(*frames)
    assert frames[1]["worker_wall_s"].notna().all() and (frames[1]["status"] == "ok").all()


def test_a_warmed_job_prepares_the_cases_it_has_still_to_measure_before_it_has_the_device_alone(tmp_path, monkeypatch):
    from lmperf.bench import device
    order = []
    monkeypatch.setattr(device, "warming", lambda: True)
    monkeypatch.setattr(device, "alone", lambda say: order.append("alone") or 0.0)
    monkeypatch.setattr(loop, "run_cases", lambda *, cases, measure, **kw: [measure(c) for c in cases])
    cases = [{"case_id": i} for i in ("a", "b")]
    args = Namespace(out=tmp_path / "r.csv", hw="cpu", log=tmp_path / "r.log", workers=1, cases=None)

    def measure(case):
        order.append(case["case_id"])
        return [stats.summarize("value", "count", [1.0])]
    jobs.run(section="test", study="prepare", cases=cases, measure=measure, args=args, fingerprint={},
             prepare=lambda todo, say: order.append(("prepare", [c["case_id"] for c in todo])))
    assert order == [("prepare", ["a", "b"]), "alone", "a", "b"]


def test_a_warmed_job_prepares_beside_the_workers_warm_up_and_raises_what_preparing_raised(tmp_path, monkeypatch):
    """The preparation (a contender's compiles in its process, the ladder's FLOP counts) runs
    while the workers warm up, not after them: the warm-up here returns only once it has begun."""
    import threading

    from lmperf.bench import device
    monkeypatch.setattr(device, "warming", lambda: True)
    monkeypatch.setattr(device, "alone", lambda say: 0.0)
    monkeypatch.setattr(loop, "run_cases", lambda *, cases, measure, **kw: [measure(c) for c in cases])
    began = threading.Event()

    def warm_up(warm, cases, n, say):
        assert began.wait(60), "the preparation did not start beside the warm-up"
    monkeypatch.setattr(workers, "warm_up", warm_up)
    args = Namespace(out=tmp_path / "r.csv", hw="cpu", log=tmp_path / "r.log", workers=2, cases=None)
    run = lambda prepare: jobs.run(section="test", study="beside", cases=[{"case_id": "a"}],
                                   measure=lambda case: [], args=args, fingerprint={}, warm=lambda case: [],
                                   compiles=lambda case: True, prepare=prepare)
    assert run(lambda todo, say: began.set()) == [[]]

    def broken(todo, say):
        began.set()
        raise RuntimeError("the contender's process could not start")
    with pytest.raises(RuntimeError, match="could not start"):
        run(broken)


def test_an_isolated_process_compiles_its_cases_before_the_timed_loop_and_names_those_that_fail():
    from lmperf.bench import isolation
    sent, said = [], []

    class Child(isolation.Isolated):
        def __call__(self, case):
            sent.append(case)
            return [csv_schema.failure_row("timeout" if case["case_id"] == "b" else "ok", "no answer")]
    cases = [{"case_id": "a"}, {"case_id": "b"}]
    Child(lambda case: [], 10).warm(cases, said.append)
    assert [c["case_id"] for c in sent] == ["a", "b"] and all(c["warm_only"] for c in sent)
    assert "did not compile there" in said[-1] and "b (timeout" in said[-1]
    assert not any(c.get("warm_only") for c in cases)  # the timed loop's cases are left as they were


def _sleep_then_answer(case: dict) -> list[dict]:
    """A case that takes case["sleep_s"] to answer (run in an isolated child)."""
    import time
    time.sleep(case["sleep_s"])
    return [csv_schema.failure_row("ok", "")]


def test_a_case_that_has_not_answered_says_so_while_it_waits(capsys, monkeypatch):
    """Someone else's case that runs long (a hang, until its time limit) prints a line every
    PROGRESS_S (30 s), never minutes of silence; its answer still comes back."""
    from lmperf.bench import isolation
    monkeypatch.setattr(isolation, "PROGRESS_S", 0.5)
    with isolation.Isolated(_sleep_then_answer, 60) as isolated:
        isolated({"case_id": "warm", "sleep_s": 0})  # the child's start is not the case's wait
        capsys.readouterr()
        rows = isolated({"case_id": "slow-case", "sleep_s": 2.3})
    assert rows[0]["status"] == "ok"
    waits = [line for line in capsys.readouterr().err.splitlines() if "slow-case" in line and "still running" in line]
    assert 3 <= len(waits) <= 5


def _raises(case: dict) -> list[dict]:
    raise TypeError("empty_like(): argument 'input' (position 1) must be Tensor, not tuple")


def test_an_exception_in_a_contenders_process_is_a_failed_row_not_a_failed_job():
    """A contender's code that raises (a student's TypeError) ends its case as `failed`, which
    does not fail the job (only `error` does); each key has a process of its own."""
    from lmperf.bench import isolation
    with isolation.Separate(_raises, 60, key=lambda case: case["who"]) as separate:
        rows = separate({"case_id": "a", "who": "alice"}) + separate({"case_id": "b", "who": "bob"})
        assert len(separate.children) == 2
    assert [r["status"] for r in rows] == ["failed", "failed"] and "must be Tensor" in rows[0]["message"]


def _pid_or_exit(case: dict) -> list[dict]:
    """The child's process id; the child exits where the case says so (an isolated child)."""
    if case.get("exit"):
        os._exit(3)
    return [{**csv_schema.failure_row("ok", ""), "pid": os.getpid()}]


def test_ahead_keeps_a_group_in_one_child_and_a_crash_moves_the_rest_to_a_fresh_one():
    """Three groups of three cases in two children: a group's cases share their child (its
    compiles serve them all); a child that dies in a case makes that case `crashed`, and its
    lane's next cases run in a fresh child."""
    from lmperf.bench import isolation
    cases = [{"case_id": f"{g}{i}", "group": g, "exit": (g, i) == ("b", 1)} for g in "abc" for i in range(3)]
    with isolation.Ahead(_pid_or_exit, 60, 2, cases, group=lambda c: c["group"]) as ahead:
        rows = {c["case_id"]: ahead(c)[0] for c in cases}
        started = ahead.started
    pids = lambda g, idx=range(3): {rows[f"{g}{i}"].get("pid") for i in idx}
    assert len(pids("a")) == 1 and len(pids("c")) == 1 and pids("a") == pids("c")  # a and c: one lane
    assert rows["b1"]["status"] == "crashed" and "exited with code 3" in rows["b1"]["message"]
    assert rows["b2"]["status"] == "ok" and pids("b", [2]) != pids("b", [0]) and pids("b", [0]) != pids("a")
    assert started == 3


def _reply_bytes(case: dict) -> bytes:
    """A child's reply as bytes (an isolated child with a judge)."""
    if case.get("raise"):
        raise RuntimeError("no reply")
    return json.dumps({"pid": os.getpid(), "x": case["x"]}).encode()


def test_with_a_judge_the_child_sends_bytes_and_this_process_makes_the_rows():
    from lmperf.bench import isolation
    judged = []

    def judge(case, payload):
        judged.append((case["case_id"], os.getpid(), payload))
        return [{**csv_schema.failure_row("ok" if payload else "failed", ""), **(json.loads(payload) if payload else {})}]
    with isolation.Isolated(_reply_bytes, 60, judge=judge) as isolated:
        rows = isolated({"case_id": "a", "x": 2}) + isolated({"case_id": "b", "raise": True})
    assert rows[0]["x"] == 2 and rows[0]["pid"] != os.getpid()
    assert rows[1]["status"] == "failed" and judged[1][2] == b""  # what it raised: an empty reply, judged here
    assert [j[1] for j in judged] == [os.getpid()] * 2


def test_a_case_waiting_behind_others_in_its_childs_queue_says_so(capsys, monkeypatch):
    """The job's loop asks for a case that its child has not reached (it is measuring another of
    the same shape class first): a line every PROGRESS_S names what is being measured."""
    from lmperf.bench import isolation
    monkeypatch.setattr(isolation, "PROGRESS_S", 0.5)
    cases = [{"case_id": "first", "sleep_s": 2.3}, {"case_id": "second", "sleep_s": 0}]
    with isolation.Ahead(_sleep_then_answer, 60, 1, cases, group=lambda c: "one class") as ahead:
        assert ahead(cases[1])[0]["status"] == "ok" and ahead(cases[0])[0]["status"] == "ok"
    waits = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[second")]
    assert len(waits) >= 3 and sum("measuring first" in line for line in waits) >= 3
