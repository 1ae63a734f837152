"""Scaling across GPUs, checked on a CPU: every data-parallel variant trains to the same weights
as one process on the same global batch (Gloo, 2 processes), through the training step every
section runs (lmperf.train.step), with and without micro-batches; the CLI under torchrun writes
one CSV from rank 0, with a `skipped` "needs N GPUs" row for NCCL; the interval and parsing helpers."""
import faulthandler
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lmperf import hardware
from lmperf.bench.distributed import allreduce, comm, ddp
from lmperf.model import ModelConfig
from conftest import config_yaml

REPO = Path(__file__).resolve().parents[1]
CFG = ModelConfig(d_model=32, d_ff=64, n_layers=2, n_heads=2, vocab_size=256, context_length=16)
WORLD, STEPS, GLOBAL_BATCH = 2, 3, 4
# (variant, bucket_cap_mb, micro-batches a step): DDP with one bucket and with many (the tiny
# model's gradients are about 0.1 MB, so 0.01 MB buckets split them into several all-reduces that
# overlap backward); with 2 micro-batches each engine must reduce the sum once, after the last.
# Compiled: each block compiled before the engine wraps or shards it (as the full grid trains),
# DDP's with buckets below its first bucket's 1 MB, on which Dynamo's DDPOptimizer would fail.
CASES = [("per_param", None, 1, False), ("flat", None, 1, False), ("ddp", 25, 1, False), ("ddp", 0.01, 1, False),
         ("fsdp2", None, 1, False), ("zero", 25, 1, False), ("per_param", None, 2, False), ("ddp", 0.01, 2, False),
         ("fsdp2", None, 2, False), ("zero", 25, 2, False), ("ddp", 0.01, 1, True), ("fsdp2", None, 1, True)]
CASE_IDS = [f"{v}-{b}-x{k}" + ("-compiled" if c else "") for v, b, k, c in CASES]
# SGD with momentum, not AdamW: Adam divides by sqrt(v), so a weight whose gradient is pure
# rounding noise (about 1e-9) would move by up to lr in either direction and no tolerance could
# tell a wrong reduction from reordered sums. SGD passes a gradient error through linearly.
OPTIMIZER = (torch.optim.SGD, {"lr": 0.5, "momentum": 0.9})


def batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(CFG.vocab_size, (GLOBAL_BATCH, CFG.context_length + 1), generator=gen)
            for _ in range(STEPS)]


def _train_every_variant(rank: int, world: int, port: int, out: str) -> None:
    """One spawned rank: join the Gloo group through the fixture's TCP store on this machine (as
    torchrun's ranks do), train each variant, rank 0 saves the weights. Its stderr, and the
    Python stack of every thread should it die on a signal, go to rank<r>.log, which the fixture
    shows when a rank fails."""
    log = open(Path(out) / f"rank{rank}.log", "w")
    os.dup2(log.fileno(), 2)
    faulthandler.enable(log, all_threads=True)
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        for (variant, bucket, k, compiled), case_id in zip(CASES, CASE_IDS):
            state = ddp.train_steps(variant, CFG, rank, world, batches(), OPTIMIZER, bucket_cap_mb=bucket,
                                    micro_batches=k, compiled=compiled)
            if rank == 0:
                torch.save(state, Path(out) / f"{case_id}.pt")
    finally:
        dist.destroy_process_group()
    # The work is done and saved: leave without the interpreter's teardown, where Gloo's worker
    # threads can still hold tensors whose release needs the GIL being torn down, and the process
    # then dies on SIGABRT (pytorch/pytorch#179291) after a correct run.
    log.flush()
    os._exit(0)


def _where_it_died(log: str) -> str:
    """A rank log's fatal error and innermost frame (faulthandler's dump), or its last line: the
    failure in one line, for the test summary."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
    if fatal is None:
        return lines[-1] if lines else "(empty log)"
    frame = next((line for line in lines[fatal + 1:] if line.startswith("File ")), "")
    return f"{lines[fatal]} at {frame}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("weights")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # a free port, held here
    try:
        mp.spawn(_train_every_variant, args=(WORLD, store.port, str(out)), nprocs=WORLD)
    except Exception as exc:
        logs = {r: (out / f"rank{r}.log").read_text() for r in range(WORLD) if (out / f"rank{r}.log").exists()}
        raise AssertionError(f"the {WORLD} Gloo ranks did not finish: {exc}; "
                             + "; ".join(f"rank {r}: {_where_it_died(text)}" for r, text in logs.items())
                             + "".join(f"\n--- rank{r}.log ---\n{text[-3000:]}" for r, text in logs.items())) from exc
    return out


def test_single_process_reference_is_deterministic():
    a = ddp.train_steps("single", CFG, 0, 1, batches(), OPTIMIZER)
    b = ddp.train_steps("single", CFG, 0, 1, batches(), OPTIMIZER)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_two_processes_match_one_process_on_the_same_global_batch(trained, case_id):
    """Against one process, one batch a step: the reference every variant and micro-batching
    must reproduce."""
    reference = ddp.train_steps("single", CFG, 0, 1, batches(), OPTIMIZER)
    start = ddp.train_steps("single", CFG, 0, 1, [], OPTIMIZER)
    got = torch.load(trained / f"{case_id}.pt")
    assert got.keys() == reference.keys()
    for name, want in reference.items():
        # fp32; the only difference is the order of summation (two half-batch means averaged
        # against one full-batch mean, and the reduction's own order). Measured: at most 2.2e-8
        # absolute after 3 steps, on weights that moved by up to 0.12. atol 1e-6 is 45x the
        # measured error and 1e5x below the training's own change (asserted below), so a
        # missing, doubled or misplaced reduction fails (test_a_wrong_reduction_...).
        torch.testing.assert_close(got[name], want, rtol=1e-5, atol=1e-6, msg=name)
    moved = max((reference[k] - start[k]).abs().max().item() for k in reference)
    assert moved > 1e-2, "the reference did not train: the comparison would prove nothing"


def test_ddp_with_bf16_buckets_is_unsupported_on_a_cpu():
    """PyTorch's bf16_compress_hook needs NCCL: over Gloo the case is an `unsupported` row saying
    so, not an error from inside DDP's first backward."""
    from lmperf import failures
    with pytest.raises(failures.Unsupported, match="needs NCCL on GPUs"):
        ddp.build("ddp_bf16", CFG, "cpu", 2, 25, OPTIMIZER)


def test_a_wrong_reduction_is_caught_by_the_same_tolerance():
    """Summing instead of averaging (world 2 -> gradients doubled) must fail the comparison."""
    reference = ddp.train_steps("single", CFG, 0, 1, batches(), OPTIMIZER)
    doubled = ddp.train_steps("single", CFG, 0, 1, batches(), (OPTIMIZER[0], {**OPTIMIZER[1], "lr": 1.0}))
    with pytest.raises(AssertionError):
        for name in reference:
            torch.testing.assert_close(doubled[name], reference[name], rtol=1e-5, atol=1e-6)


def test_bus_bandwidth_follows_nccl_tests():
    assert allreduce.bus_bandwidth(100.0, 2) == 100.0
    assert allreduce.bus_bandwidth(100.0, 4) == 150.0
    assert allreduce.bus_bandwidth(100.0, 8) == 175.0


def test_exposed_communication_is_what_no_compute_kernel_overlaps():
    kernels = [("gemm", 0, 10), ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5, 15),
               ("elementwise", 12, 13), ("ncclKernel_AllReduce", 20, 22), ("gemm", 21, 30)]
    got = comm.comm_exposure(kernels)
    assert got["comm_us"] == 12  # [5, 15) and [20, 22)
    assert got["compute_us"] == 10 + 1 + 9
    assert got["exposed_comm_us"] == 12 - 5 - 1 - 1  # hidden by [5,10), [12,13) and [21,22)
    assert comm.union([(3, 4), (0, 2), (1, 3)]) == [(0, 4)]


TOPO = """\x1b[4mGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tNV18\tSYS\t0-63\t0\t\tN/A
GPU1\tNV18\t X \tSYS\t0-63\t0\t\tN/A
NIC0\tSYS\tSYS\t X \t\t\t\t

Legend:
  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""
NVLINK = "GPU 0: NVIDIA H200 (UUID: GPU-x)\n\t Link 0: 26.562 GB/s\n\t Link 1: 26.562 GB/s\n\t Link 2: <inactive>\n"


def test_link_from_nvidia_smi_text():
    assert hardware.topo_link(TOPO) == "NV18"
    assert hardware.topo_link(TOPO.replace("NV18", "PIX")) == "PIX"
    assert hardware.topo_link("GPU0\n GPU0\t X \n") is None  # one GPU: no pair
    assert hardware.nvlink_speeds(NVLINK) == [26.562, 26.562]


def test_grids_are_data():
    spec = {"sizes": ["tiny"], "variants": ["per_param", "ddp", "fsdp2", "zero"],
            "bucket_caps_mb": [1, 25], "batch_per_gpu": 2, "context": 16, "dtype": "fp32",
            "warmup": 1, "timed_steps": 2, "profiled_steps": 1}
    two = [c["case_id"] for c in ddp.cases(spec, 2)]
    assert two == ["tiny-per_param-n2", "tiny-ddp-b1-n2", "tiny-ddp-b25-n2", "tiny-fsdp2-n2", "tiny-zero-n2"]
    one = ddp.cases(spec, 1)
    assert [c["variant"] for c in one] == ["single"] and one[0]["global_batch"] == 2
    assert ddp.cases(spec, 2)[0]["global_batch"] == 4  # same per-GPU batch, twice the global one
    short = {**spec, "memory_context": 8}
    assert [c["case_id"] for c in ddp.cases(short, 2)][5:] == ["tiny-ddp-b25-ctx8-n2", "tiny-fsdp2-ctx8-n2"]
    assert [(c["variant"], c["context"], c["purpose"]) for c in ddp.cases(short, 1)] == [
        ("single", 16, "scaling"), ("single", 8, "memory")]
    accumulated = ddp.cases({**spec, "micro_batches": 3, "optimizer": "fused"}, 2)
    assert accumulated[0]["case_id"] == "tiny-per_param-x3-fused-n2" and accumulated[0]["global_batch"] == 12
    compiled = ddp.cases({**spec, "optimizer": "fused", "compile": True}, 1)
    assert compiled[0]["case_id"] == "tiny-single-fused-compiled-n1" and compiled[0]["compile"] is True
    assert all(c["compile"] is False for c in ddp.cases(spec, 2))
    acc = {**spec, "accumulate": {"micro_batches": 4, "bucket_caps_mb": [25]}}
    assert [(c["case_id"], c["micro_batches"], c["global_batch"], c["purpose"]) for c in ddp.cases(acc, 2)][5:] == [
        ("tiny-ddp-b25-x4-n2", 4, 16, "accumulate")]
    assert [c["case_id"] for c in ddp.cases(acc, 1)] == ["tiny-single-n1", "tiny-single-x4-n1"]
    with pytest.raises(ValueError, match="the grid's own"):
        ddp.cases({**acc, "micro_batches": 4}, 2)
    bf16 = [c["case_id"] for c in ddp.cases({**spec, "variants": ["ddp", "ddp_bf16"]}, 2)]
    assert bf16 == ["tiny-ddp-b1-n2", "tiny-ddp-b25-n2", "tiny-ddp_bf16-b1-n2", "tiny-ddp_bf16-b25-n2"]
    ar = allreduce.cases({"backends": {"nccl": [1], "gloo": [1, 10]}, "warmup": 1, "iters": 2}, 2)
    assert [c["case_id"] for c in ar] == ["link-n2", "nccl-1MB-n2", "gloo-1MB-n2", "gloo-10MB-n2"]


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", "-m", "lmperf.bench.distributed", *args],
                          env=env, capture_output=True, text=True, timeout=240)


def test_allreduce_cli_under_torchrun_writes_one_csv_from_rank_0(tmp_path):
    out = tmp_path / "distributed" / "allreduce_n2.csv"
    spec = {"backends": {"nccl": [1], "gloo": [1]}, "warmup": 1, "iters": 3}
    proc = torchrun(2, "allreduce", "--spec", json.dumps(spec), "--out", str(out), "--hw", "cpu",
                    "--progress-log", str(tmp_path / "allreduce.log"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(out)
    assert list(df["study"].unique()) == ["allreduce"]
    status = df.drop_duplicates("case_id").set_index("case_id")["status"]
    assert status["gloo-1MB-n2"] == "ok"
    nccl = df[df["case_id"] == "nccl-1MB-n2"].iloc[0]
    assert nccl["status"] == "skipped" and nccl["message"].startswith("needs 2 GPUs")
    assert df[df["case_id"] == "link-n2"]["status"].iloc[0] == "skipped"  # no GPU link on a CPU
    gloo = df[df["case_id"] == "gloo-1MB-n2"].set_index("metric")
    assert gloo.loc["busbw_gbps", "mean"] == pytest.approx(gloo.loc["algbw_gbps", "mean"])  # n = 2
    assert gloo.loc["time_ms", "n"] == 3
    assert [p.name for p in out.parent.iterdir()] == ["allreduce_n2.csv"]  # no journal, no rank CSVs
    assert "case 3/3" in (tmp_path / "allreduce.log").read_text()


@pytest.mark.slow
def test_ddp_cli_under_torchrun_measures_every_variant(tmp_path):
    out = tmp_path / "ddp_n2.csv"
    spec = {"sizes": ["tiny"], "models": {"tiny": {"d_model": 32, "d_ff": 64, "n_layers": 2, "n_heads": 2}},
            "variants": ["per_param", "flat", "ddp", "fsdp2", "zero"], "bucket_caps_mb": [1],
            "batch_per_gpu": 2, "context": 16, "dtype": "fp32", "warmup": 1, "timed_steps": 2,
            "profiled_steps": 1}
    proc = torchrun(2, "ddp", "--spec", json.dumps(spec), "--out", str(out), "--hw", "cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(out)
    assert (df["status"] == "ok").all(), df[df["status"] != "ok"][["case_id", "message"]]
    flat = df[df["case_id"] == "tiny-flat-n2"].set_index("metric")
    assert {"forward_ms", "backward_ms", "allreduce_ms", "optimizer_ms", "step_ms", "tokens_per_s",
            "param_mib", "grad_mib", "optimizer_state_mib"} <= set(flat.index)
    fsdp = df[df["case_id"] == "tiny-fsdp2-n2"].set_index("metric")
    ddp = df[df["case_id"] == "tiny-ddp-b1-n2"].set_index("metric")
    # FSDP2 holds half the parameters and optimizer state per rank; ZeRO half the state
    assert fsdp.loc["param_mib", "mean"] == pytest.approx(ddp.loc["param_mib", "mean"] / 2, rel=0.05)
    zero = df[df["case_id"] == "tiny-zero-n2"].set_index("metric")
    assert zero.loc["optimizer_state_mib", "max"] < 0.75 * ddp.loc["optimizer_state_mib", "mean"]


# ---------------------------------------------------------------------------------------------
# The report section, from rows shaped like a 2-GPU run's


def _rows(study: str, case: dict, metrics: dict) -> list[dict]:
    base = {"section": "distributed", "study": study, "hw": "h200-x2", "gpu": "NVIDIA H200",
            "torch": "2.11.0", "commit": "abc", "status": "ok", "message": ""}
    return [{**base, **case, "metric": m, "mean": v, "median": v, "std": 0.0, "max": v}
            for m, v in metrics.items()]


def gpu_rows() -> list[dict]:
    rows = _rows("allreduce", {"case_id": "link-n2", "kind": "link"}, {"link_peak_driver_gbps": 478.0})
    for mb, busbw in ((1, 40.0), (1000, 380.0)):
        rows += _rows("allreduce", {"case_id": f"nccl-{mb}MB-n2", "kind": "allreduce", "backend": "nccl",
                                    "world_size": 2, "size_mb": mb},
                      {"time_ms": mb / busbw, "algbw_gbps": busbw, "busbw_gbps": busbw})
    ddp = lambda v, n, b, step, exposed, peak, context=1024: _rows(
        "ddp", {"case_id": f"xl-{v}-b{b}-c{context}-n{n}", "size": "xl", "variant": v, "bucket_cap_mb": b,
                "world_size": n, "global_batch": 4 * n, "context": context,
                "purpose": "scaling" if context == 1024 else "memory"},
        {"step_ms": step, "tokens_per_s": 4 * n * 256 / step * 1e3, "exposed_comm_ms": exposed,
         "comm_ms": 20.0, "peak_allocated_mib": peak, "param_mib": 1.0, "grad_mib": 1.0,
         "optimizer_state_mib": 1.0, "activations_mib": peak - 3})
    rows += ddp("single", 1, None, 100.0, float("nan"), 50_000.0)
    rows += ddp("ddp", 2, 1, 120.0, 15.0, 60_000.0) + ddp("ddp", 2, 25, 105.0, 5.0, 60_000.0)
    rows += ddp("fsdp2", 2, None, 115.0, 8.0, 30_000.0)
    return rows


def gpu_frame(memory_context: bool = False, accumulate: bool = False) -> pd.DataFrame:
    rows = gpu_rows()
    if accumulate:  # 8 micro-batches a step: one GPU 800 ms, DDP on 2 GPUs 820 ms (1.95x)
        for v, n, b, step in (("single", 1, None, 800.0), ("ddp", 2, 100, 820.0)):
            rows += _rows("ddp", {"case_id": f"xl-{v}-x8-n{n}", "size": "xl", "variant": v, "bucket_cap_mb": b,
                                  "world_size": n, "global_batch": 32 * n, "micro_batches": 8, "context": 1024,
                                  "purpose": "accumulate"},
                          {"step_ms": step, "tokens_per_s": 32 * n * 1024 / step * 1e3, "exposed_comm_ms": 4.0,
                           "comm_ms": 20.0, "peak_allocated_mib": 60_000.0})
    if memory_context:  # at 256 tokens a GPU: FSDP2 0.8x DDP's peak (over the bar of 0.6x)
        rows += _rows("ddp", {"case_id": "xl-ddp-b25-ctx256-n2", "size": "xl", "variant": "ddp", "bucket_cap_mb": 25,
                              "world_size": 2, "global_batch": 8, "context": 256, "purpose": "memory"},
                      {"step_ms": 50.0, "tokens_per_s": 1.0, "peak_allocated_mib": 20_000.0})
        rows += _rows("ddp", {"case_id": "xl-fsdp2-ctx256-n2", "size": "xl", "variant": "fsdp2",
                              "world_size": 2, "global_batch": 8, "context": 256, "purpose": "memory"},
                      {"step_ms": 60.0, "tokens_per_s": 1.0, "peak_allocated_mib": 16_000.0})
    df = pd.DataFrame(rows)
    df.loc[len(df)] = {**df.iloc[-1].to_dict(), "case_id": "xl-ddp-b1-n4", "world_size": 4,
                       "metric": "", "mean": float("nan"), "status": "skipped",
                       "message": "needs 4 GPUs (this machine has 2)"}
    return df


def _inputs(df: pd.DataFrame, tmp_path: Path):
    from lmperf.report import render
    from lmperf.report.sections import Inputs
    return Inputs(results=tmp_path, frames={"distributed": df}, out_dir=tmp_path,
                  bars=render.bars_from_config(REPO / "config" / "config.yaml"))


def test_report_view_reads_the_bars_off_the_rows(tmp_path):
    from lmperf.report import distributed as R

    inputs = _inputs(gpu_frame(), tmp_path)
    assert set(inputs.bars["distributed"]) == {"busbw_fraction_of_link", "ddp_speedup",
                                               "exposed_comm_fraction", "fsdp2_memory_vs_ddp"}
    view = R.view(inputs)
    got = view["bars"].set_index("bar")
    busbw = got.filter(like="NCCL", axis=0).iloc[0]
    assert busbw["_value"] == pytest.approx(380 / 478)
    speedup = got.filter(like="tokens/s", axis=0).iloc[0]
    assert "25 MB buckets (best)" in speedup.name  # the faster bucket, not the first
    assert speedup["_value"] == pytest.approx(2 * 100 / 105)
    exposed = got.filter(like="exposed", axis=0).iloc[0]
    assert exposed["_value"] == pytest.approx(5 / 105)
    memory = got.filter(like="FSDP2", axis=0).iloc[0]
    assert memory["_value"] == pytest.approx(0.5)
    assert got["met"].tolist() == [True] * 4 + ["not measured"]  # no machine of 4 GPUs here
    assert got.index[-1] == "xl: DDP (best) on 4 GPUs >= 3.6x one GPU's tokens/s"
    assert view["link_peak"]["gbps"] == 478.0 and view["folders"] == ["h200-x2"]
    ar = view["allreduce"].set_index("size (MB)")
    assert ar.loc[1000, "busbw (GB/s)"] == 380.0 and ar.loc[1, "time (ms, median)"] == pytest.approx(1 / 40)
    (xl,) = view["sizes"]
    steps = xl["steps"].set_index("variant")
    assert steps.loc["DDP, 25 MB buckets", "step (ms)"].center == 105.0
    assert steps.loc["DDP, 25 MB buckets", "scaling efficiency"] == pytest.approx(100 / 105)
    assert steps.loc["FSDP2", "exposed share (%)"] == pytest.approx(100 * 8 / 115)
    assert xl["memory"].set_index("variant").loc["FSDP2", "peak allocated"] == 30_000.0
    assert view["not_run"].to_dict("records") == [{"case": "xl-ddp-b1-n4", "study": "ddp", "status": "skipped",
                                                   "message": "needs 4 GPUs (this machine has 2)"}]
    paths = {"dist_busbw": tmp_path / "busbw.png", "dist_step_vs_gpus": tmp_path / "step.png"}
    R.figures(inputs, paths)
    assert all(p.stat().st_size > 1000 for p in paths.values())


def cpu_frame() -> pd.DataFrame:
    """The rows of a CPU's Gloo run (results/cpu/distributed/): no GPU named, two processes."""
    df = pd.DataFrame(gpu_rows())
    df = df[df["case_id"] != "link-n2"].assign(hw="cpu", gpu="none")
    df["backend"] = df["backend"].replace("nccl", "gloo")
    df["case_id"] = df["case_id"].str.replace("nccl", "gloo")
    return df.reset_index(drop=True)


def test_a_cpu_run_counts_processes_where_a_gpu_run_counts_gpus(tmp_path):
    """A CPU's Gloo run names its ranks processes in the bars, the tables, the section's answers
    and the summary's rows; a GPU run's say GPUs."""
    from lmperf.report import distributed as R, summary

    cpu, gpu = R.view(_inputs(cpu_frame(), tmp_path)), R.view(_inputs(gpu_frame(), tmp_path))
    assert cpu["gpu"] == "the CPU (Gloo)" and cpu["words"]["each"] == "a process"
    assert gpu["words"] == {"unit": "GPUs", "one": "one GPU", "each": "a GPU", "noun": "GPU"}
    assert cpu["words"]["unit"] == "processes" and cpu["words"]["noun"] == "process"
    # the section's heading (its anchor in the report's links) counts what the run counts
    import jinja2
    from lmperf.report import format as fmt
    heading = jinja2.Environment().from_string(
        (REPO / "templates" / "distributed.md.j2").read_text().splitlines()[0])
    assert fmt.anchor(heading.render(distributed=cpu)) == "scaling-across-processes"
    assert fmt.anchor(heading.render(distributed=gpu)) == "scaling-across-gpus"
    assert fmt.anchor(heading.render(distributed={"available": False})) == "scaling-across-gpus"
    (answer,) = cpu["answers"]
    assert (answer["gpus"], answer["unit"], answer["one"], answer["machine"]) == (2, "processes", "one process", "cpu")
    assert (gpu["answers"][0]["unit"], gpu["answers"][0]["one"]) == ("GPUs", "one GPU")
    bars = cpu["bars"]["bar"].tolist()
    assert "xl, DDP, 25 MB buckets (best) on 2 processes (cpu): tokens/s >= 1.85x one process's" in bars
    assert not [b for b in bars if "GPU" in b], bars
    assert "xl, DDP, 25 MB buckets (best) on 2 GPUs (h200-x2): tokens/s >= 1.85x one GPU's" in gpu["bars"]["bar"].tolist()
    (xl,) = cpu["sizes"]
    assert "processes" in xl["steps"] and "GPUs" not in xl["steps"] and "processes" in xl["memory"]
    assert xl["steps"].set_index("variant").loc["one process", "processes"] == 1
    assert "one GPU" in gpu["sizes"][0]["steps"]["variant"].tolist()
    (row,) = summary.scaling(cpu)["counts"]
    assert (row["gpus"], row["unit"], row["one"], row["each"]) == (2, "processes", "one process", "a process")
    assert summary.scaling(gpu)["counts"][0]["unit"] == "GPUs"


def test_memory_context_gives_its_own_fsdp2_bar_beside_the_scaling_contexts(tmp_path):
    from lmperf.report import distributed as R

    view = R.view(_inputs(gpu_frame(memory_context=True), tmp_path))
    memory = view["bars"][view["bars"]["bar"].str.contains("FSDP2")]
    # tokens a GPU: its sequences a step x the context (the fixture's 4 a GPU)
    assert list(memory["bar"].str.extract(r"2 GPUs \(h200-x2\), (.*) tokens a GPU")[0]) == ["4 x 1,024 = 4,096", "4 x 256 = 1,024"]
    assert list(memory["_value"]) == [pytest.approx(0.5), pytest.approx(0.8)] and list(memory["met"]) == [True, False]
    (xl,) = view["sizes"]
    assert (xl["tokens"], xl["memory_tokens"]) == ("4 x 1,024 = 4,096", "4 x 256 = 1,024")
    assert "DDP, 25 MB buckets" in set(xl["steps"]["variant"]) and len(xl["steps"]) == 4  # no memory case
    assert xl["short"].set_index("variant")["peak allocated"].to_dict() == {"DDP, 25 MB buckets": 20_000.0,
                                                                           "FSDP2": 16_000.0}
    speedup = view["bars"][view["bars"]["bar"].str.contains("tokens/s")]["_value"].iloc[0]
    assert speedup == pytest.approx(2 * 100 / 105)  # against the one-GPU job of the scaling context


def test_ddp_with_more_micro_batches_a_step_gets_its_own_bar_against_one_gpu_at_the_same_step(tmp_path):
    """DDP with 8 micro-batches a step (one all-reduce) against the one-GPU job of the same step,
    beside the scaling grid's bar; its table and the summary's row say the recipe."""
    from lmperf.report import distributed as R
    from lmperf.report import summary

    view = R.view(_inputs(gpu_frame(accumulate=True), tmp_path))
    speedups = view["bars"][view["bars"]["bar"].str.contains("tokens/s >=")].set_index("bar")
    acc = speedups.filter(like="8 micro-batches", axis=0)
    assert list(acc.index) == ["xl, DDP, 100 MB buckets, 8 micro-batches a step (32 x 1,024 = 32,768 tokens a GPU, "
                               "one all-reduce) on 2 GPUs (h200-x2): tokens/s >= 1.85x one GPU's at the same step"]
    assert acc["_value"].iloc[0] == pytest.approx(2 * 800 / 820) and acc["met"].iloc[0] is True
    grid = speedups.filter(like="(best) on 2 GPUs", axis=0)["_value"].iloc[0]
    assert grid == pytest.approx(2 * 100 / 105)  # the scaling grid's, against its own one-GPU job
    (xl,) = view["sizes"]
    assert xl["micro_batches"] == 8 and xl["accumulate_tokens"] == "32 x 1,024 = 32,768"
    assert list(xl["accumulated"]["variant"]) == ["one GPU", "DDP, 100 MB buckets"]
    assert len(xl["steps"]) == 4  # the scaling grid's table without them
    (two,) = summary.scaling({**view, "available": True})["counts"]
    assert two["accumulated"]["micro_batches"] == 8 and two["accumulated"]["speedup"]["min"] == pytest.approx(1600 / 820)


def test_each_gpu_count_says_older_code_by_its_own_machine_folder(monkeypatch):
    """A report reading a 2-GPU folder measured at this code beside a 4-GPU folder of older code
    marks the 4-GPU row alone (freshness of each answer's machine folder)."""
    from lmperf.report import distributed as R
    from lmperf.report import freshness, summary

    monkeypatch.setattr(freshness, "section_state",
                        lambda rows: {"state": "changed" if (rows["commit"] == "old").any() else "same"})
    rows = pd.DataFrame({"hw": ["h200-x2", "h200-x4"], "commit": ["new", "old"]})
    found = R.with_code([{"machine": "h200-x2", "gpus": 2, "size": "xl", "speedup": 1.8, "fsdp": []},
                         {"machine": "h200-x4", "gpus": 4, "size": "xl", "speedup": 3.4, "fsdp": []}], rows)
    assert [a["older"] for a in found] == [False, True]
    view = {"available": True, "answers": found, "code": {"state": "changed"}}
    assert [c["older"] for c in summary.scaling(view)["counts"]] == [False, True]


def test_a_file_of_older_code_without_the_cases_its_job_has_promised_since_is_shown_as_measured(tmp_path):
    from lmperf.report import validate
    csv = tmp_path / "ddp_n2.csv"
    pd.DataFrame(_rows("ddp", {"case_id": "xl-ddp-b25-n2"}, {"step_ms": 1.0})).to_csv(csv, index=False)
    promised = ["xl-ddp-b25-n2", "xl-ddp-b100-x8-n2"]
    assert "holds 1 of the 2 cases its job promises" in validate.problem(csv, promised, earlier_grid=True)
    assert validate.problem(csv, promised, earlier_grid=True, older_code=True) is None


def test_report_view_without_results_says_so(tmp_path):
    from lmperf.report import distributed as R

    view = R.view(_inputs(pd.DataFrame(), tmp_path))
    assert view == {"available": False, "why": "no multi-GPU results of this machine yet "
                                               "(tools/distributed_gpu.sh on a machine with 2+ GPUs)",
                    "others": []}


def test_report_of_a_machine_reads_its_multi_gpu_folders(tmp_path):
    """results/h200's report reads results/h200-x2 and -x4 (not h200-nvl-x2); the CPU's its own."""
    from lmperf.report import render
    from lmperf.report.sections import result_dirs

    df = gpu_frame()
    for folder in ("h200-x4", "h200-x2", "h200-nvl-x2", "cpu"):
        (tmp_path / folder / "distributed").mkdir(parents=True)
        df.assign(hw=folder).to_csv(tmp_path / folder / "distributed" / "allreduce_n2.csv", index=False)
    (tmp_path / "h200").mkdir()
    assert result_dirs(tmp_path / "h200", "distributed") == [
        tmp_path / "h200" / "distributed", tmp_path / "h200-x2" / "distributed", tmp_path / "h200-x4" / "distributed"]
    assert result_dirs(tmp_path / "h200", "e2e") == [tmp_path / "h200" / "e2e"]
    assert sorted(render.load_section(tmp_path / "h200", "distributed")["hw"].unique()) == ["h200-x2", "h200-x4"]
    assert set(render.load_section(tmp_path / "cpu", "distributed")["hw"]) == {"cpu"}


@pytest.mark.slow
def test_gpu_script_runs_every_job_and_renders_the_section_on_a_cpu(tmp_path):
    """tools/distributed_gpu.sh at smoke scale on a CPU: every job of the section's plan, CSVs
    under results/cpu/distributed/, and the section rendered alone (about a minute on 2 cores)."""
    from conftest import copy_repo, workflow_env
    repo = copy_repo(tmp_path / "lmperf")
    proc = subprocess.run(["bash", "tools/distributed_gpu.sh", "--scale", "smoke", "--limit", "400"],
                          cwd=repo, env=workflow_env(repo), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    csvs = sorted(p.name for p in (repo / "results" / "cpu" / "distributed").glob("*.csv"))
    assert csvs == ["allreduce_n2.csv", "ddp_n1.csv", "ddp_n2.csv"]
    text = (repo / "report" / "distributed" / "cpu" / "distributed.md").read_text()
    assert text.startswith("## Scaling across processes") and "needs 2 GPUs" in text  # the CPU says processes
    again = subprocess.run(["bash", "tools/distributed_gpu.sh", "--scale", "smoke"], cwd=repo,
                           env=workflow_env(repo), capture_output=True, text=True, timeout=300)
    assert again.stdout.count("exists, skipped") == 3


def test_workflow_helpers_name_jobs_specs_and_bad_sizes():
    from lmperf import hardware, planning, workflow
    config = config_yaml()
    smoke = config["distributed"]["smoke"]
    from lmperf.report import render
    files = workflow.result_files(render.load_config(REPO / "config" / "config.yaml"), "results/cpu", "smoke",
                                  ["results/cpu"])
    assert [f.path for f in files if f.section == "distributed"] == [
        "results/cpu/distributed/allreduce_n2.csv", "results/cpu/distributed/ddp_n1.csv",
        "results/cpu/distributed/ddp_n2.csv"]
    spec = json.loads(workflow.distributed_spec(config, smoke, "ddp"))
    assert "procs" not in spec and spec["models"] == {"tiny": config["models"]["tiny"]}
    assert hardware.machine_slug("NVIDIA H200", 2) == "h200-x2" and hardware.machine_slug(None, 0) == "cpu"
    config["distributed"]["full"]["ddp"]["sizes"] = ["xl", "huge"]
    with pytest.raises(ValueError, match=r"distributed.full.ddp.sizes names \['huge'\]"):
        planning.check_distributed_config(config)


def test_a_report_without_multi_gpu_results_names_other_machines_results(tmp_path):
    """results/h100's report reads no h200 folder, but says where it is and where it renders."""
    from lmperf.report.distributed import elsewhere

    (tmp_path / "h100").mkdir()
    assert elsewhere(tmp_path / "h100") == ""
    (tmp_path / "h200-x2" / "distributed").mkdir(parents=True)
    (tmp_path / "h200-x4").mkdir()  # no distributed folder: not named
    text = elsewhere(tmp_path / "h100")
    assert "h200-x2" in text and "report/distributed/h200-x2/distributed.md" in text and "h200-x4" not in text


def test_master_weight_adamw_runs_on_one_process_only():
    """MasterWeightAdamW keeps its gradients' sums to itself: a data-parallel variant with it is an
    `unsupported` row, not a silently unreduced step; one process builds it."""
    from lmperf import failures

    with pytest.raises(failures.Unsupported, match="no engine here reduces"):
        ddp.build("ddp", CFG, "cpu", 2, 25, "master")
    model, optimizer, reduce = ddp.build("single", CFG, "cpu", 1, None, "master")
    assert type(optimizer).__name__ == "MasterWeightAdamW" and reduce is None
    # before its first step: the 16-bit remainders of the fp32 masters; after it, the moments too
    assert [t.dtype for t in ddp.optimizer_state_tensors(optimizer)] == [torch.int16]
    from lmperf import train
    tokens = batches()[0]
    train.step(model, optimizer, tokens[:, :-1], tokens[:, 1:], train.autocast("bf16", "cpu"))
    state = ddp.optimizer_state_tensors(optimizer)
    linear = sum(w.numel() for w in optimizer.weights)
    others = sum(p.numel() for p in model.parameters()) - linear
    assert sum(t.numel() * t.element_size() for t in state) >= linear * (4 + 4 + 2) + others * 8


def test_each_gpu_count_is_read_from_its_own_machine_against_that_machines_one_gpu_job(tmp_path):
    """With results/<gpu>-x2 and -x4 both read (each with its own one-GPU job): 2 GPUs from the
    2-GPU machine, 4 from the 4-GPU one, each speedup against the one-GPU step of its machine;
    the best bucket of each count; FSDP2's bar at 4 GPUs takes that count's thresholds."""
    from lmperf.report import distributed as R
    from lmperf.report import summary

    def machine(hw, runs):
        out = []
        for v, n, b, step, peak in runs:
            out += _rows("ddp", {"case_id": f"xl-{v}-b{b}-n{n}", "hw": hw, "size": "xl", "variant": v,
                                 "bucket_cap_mb": b, "world_size": n, "global_batch": 4 * n, "context": 1024,
                                 "purpose": "scaling"},
                         {"step_ms": step, "tokens_per_s": 4 * n * 1024 / step * 1e3, "exposed_comm_ms": 1.0,
                          "comm_ms": 20.0, "peak_allocated_mib": peak, "param_mib": 1.0, "grad_mib": 1.0,
                          "optimizer_state_mib": 1.0, "activations_mib": peak - 3})
        return out

    rows = machine("h100-x2", [("single", 1, None, 100.0, 50.0), ("ddp", 2, 25, 106.0, 60.0)])
    rows += machine("h100-x4", [("single", 1, None, 110.0, 50.0), ("ddp", 2, 25, 120.0, 60.0),
                                ("ddp", 4, 25, 125.0, 60.0), ("ddp", 4, 100, 115.0, 60.0),
                                ("fsdp2", 4, None, 140.0, 24.0)])
    view = R.view(_inputs(pd.DataFrame(rows), tmp_path))
    got = view["bars"].set_index("bar")["_value"]
    assert got["xl, DDP, 25 MB buckets (best) on 2 GPUs (h100-x2): tokens/s >= 1.85x one GPU's"] == pytest.approx(2 * 100 / 106)
    assert got["xl, DDP, 100 MB buckets (best) on 4 GPUs (h100-x4): tokens/s >= 3.6x one GPU's"] == pytest.approx(4 * 110 / 115)
    assert got["xl: FSDP2 peak memory per rank <= 0.45x DDP's (4 GPUs (h100-x4), 4 x 1,024 = 4,096 tokens a GPU)"] == pytest.approx(0.4)
    assert [(a["gpus"], a["machine"]) for a in view["answers"]] == [(2, "h100-x2"), (4, "h100-x4")]
    assert "machine" in view["sizes"][0]["steps"]  # rows of two machines: each says which
    s = summary.scaling(view)
    assert [(c["gpus"], c["machine"], c["speedup"]["min"]) for c in s["counts"]] == [
        (2, "h100-x2", pytest.approx(2 * 100 / 106)), (4, "h100-x4", pytest.approx(4 * 110 / 115))]


def test_a_speedup_over_a_one_gpu_job_that_ran_slow_is_not_judged(tmp_path):
    """DDP's forward does not communicate: a one-GPU forward much slower than the ranks' says the
    baseline ran slow (a noisy machine gave a 2-GPU job 2.31x), and the speedup is not judged."""
    from lmperf.report import distributed as R

    df = gpu_frame()
    for case_id, forward in (("xl-single-bNone-c1024-n1", 80.0), ("xl-ddp-b1-c1024-n2", 60.0), ("xl-ddp-b25-c1024-n2", 60.0)):
        row = df[(df["case_id"] == case_id) & (df["metric"] == "step_ms")].iloc[0].to_dict()
        df.loc[len(df)] = {**row, "metric": "forward_ms", "mean": forward, "median": forward, "max": forward}
    view = R.view(_inputs(df, tmp_path))
    speedup = view["bars"].set_index("bar").filter(like="tokens/s >= 1.85x", axis=0).iloc[0]
    assert speedup["met"] == "not judged"
    assert "not judged" in speedup["measured"] and "80.0 ms" in speedup["measured"]
    (answer,) = R.answers(R.ddp_frame(df))
    assert "ran slow" in answer["slow_baseline"]
    # within 5% of the baseline's forward: judged as before
    df.loc[df["metric"] == "forward_ms", ["mean", "median", "max"]] = 80.0
    speedup = R.view(_inputs(df, tmp_path))["bars"].set_index("bar").filter(like="tokens/s >= 1.85x", axis=0).iloc[0]
    assert speedup["met"] == True  # noqa: E712 (a numpy bool)


def test_a_speedup_from_host_bound_steps_is_marked_and_not_judged(tmp_path):
    """Rank 0's GPU idle share of a step (the step less its profiled kernel time: compute and
    the communication nothing overlaps): where the one-GPU step or the best DDP step leaves the
    GPU idle more than the report's threshold, the speedup is the host's: the table marks the
    steps, the bar and the answer say so and do not judge it; with the GPU busy it is judged."""
    from lmperf.report import distributed as R, summary

    def with_busy(share: float) -> pd.DataFrame:
        df = gpu_frame()
        steps = df[(df["metric"] == "step_ms") & (df["status"] == "ok")]
        for metric, value in (("compute_ms", steps["median"] * share), ("exposed_comm_ms", steps["median"] * 0)):
            if metric in set(df["metric"]):
                df = df[df["metric"] != metric]
            df = pd.concat([df, steps.assign(metric=metric, mean=value, median=value, max=value)], ignore_index=True)
        return df

    idle = with_busy(0.5)  # the GPU idle half of every step
    view = R.view(_inputs(idle, tmp_path))
    speedup = view["bars"].set_index("bar").filter(like="tokens/s >= 1.85x", axis=0).iloc[0]
    assert speedup["met"] == "not judged" and "host-bound" in speedup["measured"] and "50" in speedup["measured"]
    (answer,) = view["answers"]
    assert "host-bound" in answer["host_bound"] and not answer["slow_baseline"]
    assert summary.scaling(view)["counts"][0]["host_bound"]
    steps = view["sizes"][0]["steps"]
    assert all(str(v).endswith(R.HOST_BOUND) for v in steps["GPU idle %"])
    assert view["sizes"][0]["host_bound"]["n"] == len(steps)

    busy = R.view(_inputs(with_busy(1.0), tmp_path))
    speedup = busy["bars"].set_index("bar").filter(like="tokens/s >= 1.85x", axis=0).iloc[0]
    assert speedup["met"] in (True, False) and not busy["answers"][0]["host_bound"]
    assert busy["sizes"][0]["host_bound"]["n"] == 0


@pytest.mark.slow
def test_a_contenders_variant_that_raises_is_a_failed_row_after_every_one_of_ours(tmp_path):
    """The timed study runs every variant in one set of ranks: ours first, then each contender's
    together (no row of ours where a contender's code was imported), and what a contender's code
    raises is its `failed` row; the job goes on and ends well."""
    raises = tmp_path / "raises.py"
    raises.write_text("def get_ddp(module):\n    raise RuntimeError('my DDP is not ready')\n\n\n"
                      "def ddp_on_after_backward(model, optimizer):\n    pass\n")
    out = tmp_path / "ddp_n2.csv"
    spec = {"sizes": ["tiny"], "models": {"tiny": {"d_model": 32, "d_ff": 64, "n_layers": 2, "n_heads": 2}},
            "variants": ["flat"], "bucket_caps_mb": [1], "batch_per_gpu": 2, "context": 16, "dtype": "fp32",
            "warmup": 1, "timed_steps": 2, "profiled_steps": 1,
            "contenders": {"raises": str(raises), "plain": str(REPO / "examples" / "contenders" / "plain_pytorch.py")}}
    proc = torchrun(2, "ddp", "--spec", json.dumps(spec), "--out", str(out), "--hw", "cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pd.read_csv(out).drop_duplicates("case_id")
    order = list(rows["case_id"])
    assert order[0] == "tiny-flat-n2" and all("plain" in c or "raises" in c for c in order[1:])
    status = rows.set_index("case_id")["status"]
    assert status["tiny-flat-n2"] == "ok" and status["tiny-plain-ddp-n2"] == "ok"
    failed = rows.set_index("case_id").loc["tiny-raises-ddp-n2"]
    assert failed["status"] == "failed" and "my DDP is not ready" in failed["message"]
