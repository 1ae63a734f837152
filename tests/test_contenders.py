"""Contenders (lmperf.contenders, lmperf.bench.contenders): a user's adapter module loaded, checked
and kept honest; someone else's misbehaving code is a row, and the job goes on."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lmperf import contenders, guard
from lmperf.bench import honest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def registries():
    """The providers' registry, the model's attention choices and the environment as they were,
    back after each test (registering a contender adds to all three)."""
    import os

    from lmperf import model, providers
    env = os.environ.pop(contenders.ENV, None)
    attention = dict(model.ATTENTION)
    with providers.kept():
        yield
    model.ATTENTION.clear()
    model.ATTENTION.update(attention)
    os.environ.pop(contenders.ENV, None)
    if env is not None:
        os.environ[contenders.ENV] = env


DATA = REPO / "tests" / "data" / "contenders"
EXAMPLES = REPO / "examples" / "contenders"


def test_a_path_names_a_contender_by_its_file():
    assert contenders.normalise("examples/contenders/plain_pytorch.py") == \
        {"plain_pytorch": "examples/contenders/plain_pytorch.py"}
    assert contenders.normalise("a/x.py,b/y.py") == {"x": "a/x.py", "y": "b/y.py"}
    assert contenders.normalise({}) == {} and contenders.normalise(None) == {}


@pytest.mark.parametrize("value, words", [
    ({"Bad-Name": "x.py"}, "Bad-Name"),
    ({"ok": {"get_dpp": "m:f"}}, "get_dpp"),
    ({"ok": 3}, "ok"),
    (["x.py"], "list"),
])
def test_a_malformed_entry_is_a_clear_error(value, words):
    with pytest.raises(contenders.ContenderError, match=words):
        contenders.normalise(value)


def test_a_module_that_does_not_import_is_named():
    with pytest.raises(contenders.ContenderError, match=r"broken_import\.py does not import: "
                                                        r"ModuleNotFoundError"):
        contenders.load_all(str(DATA / "broken_import.py"))
    with pytest.raises(contenders.ContenderError, match="does not exist"):
        contenders.load_all("no/such/file.py")


def test_partial_adapters_are_not_implemented_with_their_reason():
    partial = contenders.load("partial", str(DATA / "partial.py"))
    assert not partial.implements("ddp") and partial.implements("sharded_optimizer")
    with pytest.raises(contenders.NotImplementedByContender, match="defines no get_ddp"):
        partial.adapter("get_ddp")
    with pytest.raises(contenders.NotImplementedByContender, match="raised NotImplementedError"):
        contenders.attention_fn(partial, "triton")


def test_the_lmperf_kernels_example_is_our_kernel_over_the_assignments_contract():
    """CS336's contract: (batch, N, D) inputs, one saved fp32 tensor of shape (batch, N) (the
    logsumexp), within 1e-2 of the reference; (B, H, N, D) inputs pass as (B * H, N, D)."""
    import torch

    from lmperf.kernels.attention_contract import reference, saved_logsumexp
    ours = contenders.load("ours", str(EXAMPLES / "lmperf_kernels.py"))
    for kind in ("pytorch", "triton"):
        cls = contenders.attention_class(ours, kind)
        torch.manual_seed(0)
        q, k, v = (torch.randn(4, 128, 64, requires_grad=True) for _ in range(3))
        for causal in (False, True):
            out = cls.apply(q, k, v, causal)
            ref, lse = reference(q, k, v, causal)
            torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)
            torch.testing.assert_close(saved_logsumexp(out, q.shape[:-1]).double(), lse, rtol=1e-2, atol=1e-2)
        q4 = torch.randn(2, 3, 17, 16)
        out4 = contenders.attention_fn(ours, kind)(q4, q4, q4, True)
        torch.testing.assert_close(out4.double(), reference(q4, q4, q4, True)[0], rtol=1e-4, atol=1e-4)


def test_an_output_of_the_wrong_shape_dtype_or_with_nan_is_wrong():
    import torch
    q = torch.randn(2, 5, 8)
    guard.check_output(q.clone(), q)
    for bad, words in ((q[:, :4], "shape"), (q.double(), "dtype"), (q * float("nan"), "NaN"), ((q,), "tuple")):
        with pytest.raises(guard.Wrong, match=words):
            guard.check_output(bad, q)


def _bench(study: str, spec: dict, out: Path) -> pd.DataFrame:
    proc = subprocess.run([sys.executable, "-m", "lmperf.bench.contenders", study, "--spec", json.dumps(spec),
                           "--out", str(out), "--hw", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_csv(out)


@pytest.fixture(scope="module")
def attention_rows(tmp_path_factory):
    """One check over the example and every misbehaving fixture (each case in a child process, two
    children side by side: a hang or a crash in one leaves the other's cases as they are)."""
    spec = {"contenders": {"plain": str(EXAMPLES / "plain_pytorch.py"), "wrong": str(DATA / "wrong_attention.py"),
                           "caching": str(DATA / "caching_attention.py"), "bad": str(DATA / "misbehaving.py"),
                           "partial": str(DATA / "partial.py")},
            "kinds": ["pytorch", "triton"], "dtypes": ["fp32"], "causal": [True],
            "shapes": [[2, 13, 16], [2, 14, 16], [2, 15, 16], [2, 40, 32]], "gqa_shape": [1, 4, 1, 33, 32],
            "property_shape": [2, 2, 33, 32], "property_dtype": "fp32", "time_limit_s": 30, "workers": 2}
    rows = _bench("attention", spec, tmp_path_factory.mktemp("contenders") / "attention.csv")
    return rows.groupby("case_id", sort=False).agg(
        status=("status", "first"), passed=("passed", lambda s: bool(s.fillna(False).astype(bool).all())),
        message=("message", lambda s: str(s.fillna("").iloc[0])))


def test_a_right_contender_passes_every_check(attention_rows):
    plain = attention_rows.loc[[c for c in attention_rows.index if c.startswith("plain_pytorch")]]
    assert (plain["status"] == "ok").all() and plain["passed"].all(), plain
    assert "bitwise" in attention_rows.loc["plain_pytorch-deterministic-2x2x33x32", "message"]


def test_a_wrong_attention_fails_its_check_and_is_not_called_stale(attention_rows):
    values = attention_rows.loc[[c for c in attention_rows.index if c.startswith("wrong_pytorch-fp32")]]
    assert (values["status"] == "ok").all() and not values["passed"].any()
    assert attention_rows.loc["wrong_pytorch-fresh-2x2x33x32", "status"] == "ok"  # wrong, but not caching


def test_a_caching_contender_is_caught(attention_rows):
    fresh = attention_rows.loc["caching_pytorch-fresh-2x2x33x32"]
    assert fresh["status"] == "wrong" and "stale result" in fresh["message"]


def test_a_hang_a_crash_and_a_wrong_shape_are_rows_and_the_job_goes_on(attention_rows):
    rows = attention_rows
    assert rows.loc["bad_pytorch-fp32-causal-2x13x16", "status"] == "timeout"
    assert rows.loc["bad_pytorch-fp32-causal-2x14x16", "status"] == "crashed"
    assert "exited with code 9" in rows.loc["bad_pytorch-fp32-causal-2x14x16", "message"]
    wrong_shape = rows.loc["bad_pytorch-fp32-causal-2x15x16"]
    assert wrong_shape["status"] == "wrong" and "shape (2, 14, 16)" in wrong_shape["message"]
    assert rows.loc["bad_pytorch-fp32-causal-2x40x32", "status"] == "ok"  # the cases after them ran


def test_partial_adapters_give_skipped_rows_saying_not_implemented(attention_rows):
    partial = attention_rows.loc[[c for c in attention_rows.index if c.startswith("partial_")]]
    assert (partial["status"] == "skipped").all()
    assert partial["message"].str.startswith("not implemented").all()
    assert "raised NotImplementedError" in attention_rows.loc["partial_triton-fp32-causal-2x40x32", "message"]
    assert "defines no get_flashattention_autograd_function_pytorch" in \
        attention_rows.loc["partial_pytorch-fp32-causal-2x40x32", "message"]


@pytest.mark.slow
def test_a_contenders_ddp_and_sharded_optimizer_train_to_one_process_weights(tmp_path):
    spec = {"contenders": {"plain": str(EXAMPLES / "plain_pytorch.py"), "partial": str(DATA / "partial.py")},
            "procs": 2, "steps": 2, "time_limit_s": 300, "contracts": ["ddp", "fsdp", "sharded_optimizer"]}
    rows = _bench("distributed", spec, tmp_path / "distributed.csv").set_index("case_id")
    for case in ("plain-ddp-gloo", "plain-sharded_optimizer-gloo"):
        assert rows.loc[case, "status"] == "ok" and bool(rows.loc[case, "passed"]), rows.loc[case]
        assert rows.loc[case, "median"] <= 1e-5
    assert rows.loc["plain-fsdp-gloo", "status"] == "skipped"
    assert rows.loc["partial-ddp-gloo", "message"].startswith("not implemented")
    assert "raised NotImplementedError" in rows.loc["partial-sharded_optimizer-gloo", "message"]


def test_a_rank_that_leaves_early_is_the_cause_not_the_rank_whose_connection_it_broke():
    from lmperf.bench import contender_distributed
    gloo = ("failed", "RuntimeError: Gloo connectFullMesh failed ... remote worker crashing")
    left = ("skipped", "not implemented: an adapter of sharded_optimizer raised NotImplementedError")
    assert contender_distributed.first_cause({0: gloo, 1: left}) == (1, left)
    assert contender_distributed.first_cause({0: gloo, 1: gloo}) == (0, gloo)
    assert contender_distributed.first_cause({1: left, 0: ("wrong", "x")}) == (0, ("wrong", "x"))


def test_contenders_reach_every_benchmark_whose_contract_they_implement():
    """Named once in the config, they are cases of the FlashAttention bench (every group), the
    PyTorch-attention grid and the ladder (a rung each, not carried up), and result files of
    their own; without them nothing changes."""
    from lmperf import workflow as wf
    from lmperf.bench import attention, flash_attention, ladder
    from lmperf.planning import check_config  # noqa: F401 (the config below is the committed one)
    from lmperf.report.render import load_config
    config = load_config()
    plain = {**config, "contenders": str(EXAMPLES / "plain_pytorch.py")}
    fa = config["flash_attention"]["smoke"]
    job = next(iter(wf.fa_bench_jobs(fa, config["models"])))
    bare = json.loads(wf.fa_bench_spec(fa, config["models"], job, config))
    spec = json.loads(wf.fa_bench_spec(fa, config["models"], job, plain))
    assert "contenders" not in bare and spec["contenders"] == {"plain_pytorch": str(EXAMPLES / "plain_pytorch.py")}
    providers = {c["provider"] for c in flash_attention.bench_cases(spec)}
    assert {"plain_pytorch_triton", "plain_pytorch_pytorch"} <= providers
    impls = {c["impl"] for c in attention.cases(json.loads(wf.attention_spec(plain, config["attention"]["smoke"])))}
    assert {"eager", "compiled", "plain_pytorch_pytorch"} <= impls
    size = config["ladder"]["smoke"]["sizes"][0]
    rungs = ladder.cases(json.loads(wf.ladder_spec(plain, config["ladder"]["smoke"], size)), size, cuda=False)
    rival = [r for r in rungs if r["name"] == "contender_plain_pytorch_pytorch"]
    assert len(rival) == 1 and rival[0]["attention"] == "plain_pytorch_pytorch"
    assert all(r["attention"] != "plain_pytorch_pytorch" for r in rungs if r["rung"] > rival[0]["rung"])
    paths = [f.path for f in wf.result_files(plain, "results/x", "smoke", ["results/x"])]
    assert "results/x/contenders/attention.csv" in paths and "results/x/contenders/distributed.csv" in paths
    assert not [p for p in (f.path for f in wf.result_files(config, "results/x", "smoke", ["results/x"])) if "contenders" in p]


def test_a_contender_importing_a_missing_package_stops_planning_naming_it(tmp_path):
    """Planning finds a contender's code without importing it (only its own processes do), and
    stops before any job where that code imports a package neither it nor lmperf's environment
    has, naming the package."""
    from conftest import SMOKE, copy_repo, snakemake
    repo = copy_repo(tmp_path / "repo")
    proc = snakemake(repo, "-n", "--cores", "1", "report/report.md", *SMOKE,
                     f"contenders={DATA / 'broken_import.py'}", check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "a_module_that_does_not_exist" in out and "broken_import" in out
    assert not (repo / "results" / "cpu").exists()


def test_a_contender_rung_that_kills_its_process_is_a_row_and_the_ladder_goes_on(tmp_path):
    """The ladder runs a contender's rung in a process of its own (bench/isolation): a rung that
    takes its process down (as an illegal memory access takes the CUDA context) is `crashed`, and
    the rungs after it are measured in the job's process."""
    from lmperf import workflow as wf
    from lmperf.report.render import load_config
    config = load_config()
    config["contenders"] = {"crash": str(DATA / "crashing.py")}
    spec = wf.ladder_spec(config, config["ladder"]["smoke"], "tiny")
    out = tmp_path / "ladder.csv"
    proc = subprocess.run([sys.executable, "-m", "lmperf.bench.ladder", "--size", "tiny", "--spec", spec,
                           "--cases", "tiny-rung*-contender_crash_pytorch", "tiny-rung*-ours_float8_delayed",
                           "--out", str(out), "--hw", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pd.read_csv(out).drop_duplicates("case_id").set_index("case_id")
    crashed = rows.loc[[c for c in rows.index if c.endswith("contender_crash_pytorch")][0]]
    assert crashed["status"] == "crashed" and "exited with code 9" in crashed["message"]
    after = rows.loc[[c for c in rows.index if c.endswith("ours_float8_delayed")][0]]
    assert after["status"] == "skipped" and "needs CUDA" in after["message"]  # measured after the crash


def test_a_contenders_pytorch_attention_is_skipped_above_the_tiled_limit():
    """PyTorch attention's grid reaches 16,384 tokens, where a contender's Python tile loop takes
    minutes a case: above the spec's tiled_max_seq_len it is a `skipped` row saying so."""
    from lmperf.bench import attention
    from lmperf.failures import NotRun
    spec = {"impls": ["eager"], "batch": 2, "head_dims": [16], "seq_lens": [64, 4096], "iters": 5,
            "contenders": {"plain": str(EXAMPLES / "plain_pytorch.py")}}
    cases = {c["case_id"]: c for c in attention.cases(spec)}
    assert cases["plain_pytorch-d16-n64"]["tiled_max_seq_len"] == 1024
    with pytest.raises(NotRun, match=r"N > 1024 \(tiled_max_seq_len\)"):
        attention.measure(cases["plain_pytorch-d16-n4096"])


def test_a_contenders_host_bound_do_bench_time_gives_no_ratio():
    """The committed H100 grid: where the contender's or our do_bench time left the GPU idle
    more than the report's threshold (its Python wrapper's host time, not its kernel), the
    timing table marks it and takes no ratio; a GPU-bound row keeps its ratios."""
    from lmperf.report import contenders as report, render
    h100 = REPO / "results" / "h100-80gb-hbm3"
    fa = render.load_section(h100, "flash_attention")
    table = report.checks(render.load_section(h100, "contenders"))
    threshold = render.bars_from_config(REPO / "config" / "config.yaml")["host_bound_idle_pct"]
    times = report.timings(fa, table, threshold)
    mine = times[(times["contender"] == "lmperf_kernels_triton") & (times["group"] == "grid")]
    bound = mine[mine["timing"].str.contains("host-bound")]
    assert len(bound) and bound["vs ours"].isna().all() and bound["vs best peer"].isna().all()
    assert bound["ms"].notna().all() and bound["timing"].str.contains(report.HOST_BOUND).all()
    kept = mine[mine["vs ours"].notna()]  # the shapes whose GPU was busy on both sides
    assert len(kept) and not kept["timing"].str.contains("host-bound").any()
    unmarked = report.timings(fa, table)  # no threshold: every do_bench row keeps its ratio
    assert unmarked[unmarked["contender"] == "lmperf_kernels_triton"]["vs ours"].notna().sum() > kept.shape[0]


def test_the_example_contender_agrees_with_ours_row_by_row():
    """The committed H100 rows of the lmperf-kernels example (our Triton kernel through the
    assignment's adapter) judged against ours by lmperf.compare, as a rerun of ours: almost every
    timing row that is not host-bound agrees within noise; its PyTorch kind against our tiled
    PyTorch kernel, whose rows are all host-bound, is judged on none."""
    from lmperf.report import contenders as report, render
    h100 = REPO / "results" / "h100-80gb-hbm3"
    fa = render.load_section(h100, "flash_attention")
    threshold = render.bars_from_config(REPO / "config" / "config.yaml")["host_bound_idle_pct"]
    triton = report.agreement(fa, "lmperf_kernels_triton", threshold)
    assert triton["ours"] == "triton" and triton["rows"] >= 50 and triton["agree"] >= 0.9 * triton["rows"]
    assert "lmperf_kernels_triton" in triton["largest"]
    pytorch = report.agreement(fa, "lmperf_kernels_pytorch", threshold)
    assert pytorch["ours"] == "torch_tiled" and pytorch["host"] > 0
    # a contender 30% slower on every row is judged slower, not within noise
    slow = fa.copy()
    mine = slow["provider"].eq("lmperf_kernels_triton") & slow["metric"].astype(str).str.endswith("_ms")
    for c in ("median", "q20", "q80"):
        slow.loc[mine, c] = slow.loc[mine, c] * 1.3
    slow["samples"] = slow["samples"].astype(object)
    slow.loc[mine, "samples"] = None  # judged on the quantiles, as do_bench rows are
    worse = report.agreement(slow, "lmperf_kernels_triton", threshold)
    assert worse["agree"] < 0.5 * worse["rows"]
    assert report.agreement(fa, "nobody_triton", threshold) is None
    # the model group: ours' ids name the leaderboard's harness (not our own), the contender's need not;
    # its rows are judged by their case's fields
    model = report.agreement(fa[fa["group"] == "model"], "lmperf_kernels_triton", threshold)
    assert model is not None and model["rows"] + model["host"] >= 88


@pytest.mark.slow  # compiles plain attention in a worker and in the job (a minute of CPU)
def test_pytorch_attention_compiles_and_warms_a_contender_before_its_timed_loop(tmp_path):
    """With workers, the PyTorch-attention job compiles its compiled cases in a worker and a
    contender's cases in the contender's own process while it shares the device, then times
    them alone: the same cases and statuses as a job that compiles each in its timed run."""
    spec = json.dumps({"impls": ["eager", "compiled"], "batch": 2, "head_dims": [16], "seq_lens": [16, 32],
                       "iters": 3, "contenders": {"plain": str(EXAMPLES / "plain_pytorch.py")}})
    frames, logs = [], []
    for name, extra, env in (("alone", [], {}), ("warmed", ["--workers", "2"],
                                                 {"LMPERF_DEVICE_LOCK": str(tmp_path / "device.lock")})):
        out = tmp_path / f"{name}.csv"
        proc = subprocess.run([sys.executable, "-m", "lmperf.bench.attention", "--spec", spec, "--out", str(out),
                               "--hw", "cpu", *extra], cwd=REPO, capture_output=True, text=True, timeout=900,
                              env={**os.environ, "PYTHONPATH": str(REPO / "src"), **env,
                                   "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name / "inductor")})
        assert proc.returncode == 0, proc.stderr[-3000:]
        frames.append(pd.read_csv(out).drop_duplicates("case_id").set_index("case_id")["status"])
        logs.append(proc.stderr)
    assert frames[0].to_dict() == frames[1].to_dict()
    assert {s for c, s in frames[0].items() if "triton" not in c} == {"ok"}  # its Triton one needs CUDA
    assert "warming the compile caches: 2 cases in 1 worker processes" in logs[1]
    assert "compiling 4 cases in their own process" in logs[1]
    assert "warming" not in logs[0] and "their own process" not in logs[0]


def test_a_time_under_the_roofline_floor_is_impossible_not_a_speed_up():
    """1 x 16 x 16,384 x 64 causal bf16 forward: 5.5e11 FLOP at 989 TFLOP/s take at least 0.556 ms
    on an H100; 0.001 ms (a launch timed, the work elsewhere) is named impossible, 1.3 ms is not.
    An unknown GPU has no floor."""
    from lmperf.bench.flash_attention import attention_flops
    flops = attention_flops(1, 16, 16384, 64, True, "forward")
    io = 4 * 16 * 16384 * 64 * 2
    why = honest.impossible_time(0.001, flops, io, "NVIDIA H100 80GB HBM3")
    assert why and "roofline floor of 0.5559 ms" in why
    assert honest.impossible_time(1.3, flops, io, "NVIDIA H100 80GB HBM3") is None
    assert honest.impossible_time(0.001, flops, io, "Some GPU") is None


def test_work_the_callers_stream_never_waits_for_is_caught():
    """The harness's time of a call against the device's work a call on every stream (profiled
    on a GPU; given here): a launch timed while the work runs elsewhere is named, an honest call
    (its time at least its device work, more where the host sets it) passes."""
    why = honest.outside_stream(lambda: None, 0.001, busy=lambda call: 1.2)
    assert why and "outside the caller's stream" in why and "1.2 ms a call" in why
    assert honest.outside_stream(lambda: None, 0.036, busy=lambda call: 0.03) is None   # host-bound
    assert honest.outside_stream(lambda: None, 4.2, busy=lambda call: 4.0) is None


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA: a second CUDA stream")
def test_a_contender_on_a_side_stream_is_wrong_not_a_thousandfold_speed_up():
    """The cheat of issue reports from other tools that time users' kernels: the contender runs its
    work on a stream of its own; do_bench's events on the caller's stream see only the launch.
    Timed by the FlashAttention bench at the headline's shape (eager: under the leaderboard's
    torch.compile the stream switch does not trace, a `failed` row), its case is a `wrong` row
    naming why, never a time."""
    from lmperf.bench import flash_attention
    spec = {"groups": [{"name": "cheat", "providers": [], "dtypes": ["bf16"], "causal": [True],
                        "seq_lens": [16384], "heads": 16, "head_dims": [64], "batch": 1, "harness": "eager",
                        "timing_ms": [25, 100], "tiled_max_seq_len": 1024}],
            "contenders": {"side": str(DATA / "side_stream.py")}}
    case = next(c for c in flash_attention.bench_cases(spec) if c["provider"] == "side_triton")
    with pytest.raises(contenders.Wrong, match="outside the caller's stream|impossible time"):
        flash_attention.measure_bench(case)


def test_a_contender_no_longer_named_is_gone_from_this_machines_report(tmp_path):
    """Rows an earlier configuration left (a contender's check, its columns in a bench CSV) are
    not shown once the configuration names it no more, and its page goes with them; our rows and
    the peers' stay. Another machine's results rendered alone keep every contender's rows."""
    import shutil

    from lmperf.report import render
    results = tmp_path / "results" / "cpu"
    shutil.copytree(REPO / "tests" / "fixtures" / "contenders_contract" / "results" / "cpu", results)
    frames = {s: render.load_section(results, s) for s in ("contenders", "flash_attention")}
    kept = render.named_contenders_only(frames, {"narrow"})
    assert set(kept["contenders"]["contender"]) == {"narrow"}
    assert set(kept["flash_attention"]["provider"]) == {"triton", "sdpa_flash", "sdpa_cudnn", "narrow_pytorch"}
    assert set(render.named_contenders_only(frames, set())["flash_attention"]["provider"]) == \
        {"triton", "sdpa_flash", "sdpa_cudnn"}
    import pandas as pd
    unnamed = pd.concat([frames["flash_attention"], pd.DataFrame({"provider": [None], "status": ["ok"]})])
    assert len(render.named_contenders_only({"flash_attention": unnamed}, {"narrow"})["flash_attention"]) == \
        len(kept["flash_attention"]) + 1  # a row naming no implementation is no contender's

    out = tmp_path / "report" / "report.md"
    stale = out.parent / "contenders" / "someone_from_before.md"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier run's page\n")
    bars = render.bars_from_config(REPO / "config" / "config.yaml")
    render.render(results, REPO / "templates", out, out.parent / "figures", "smoke", bars, contenders_named={"narrow"})
    assert sorted(p.name for p in (out.parent / "contenders").glob("*.md")) == ["narrow.md"]
    render.render(results, REPO / "templates", out, out.parent / "figures", "smoke", bars)
    assert {"narrow.md", "caching.md"} <= {p.name for p in (out.parent / "contenders").glob("*.md")}
