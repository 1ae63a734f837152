"""The snapshot -> timeline / largest-allocations conversion, on a snapshot recorded on a CPU
(tests/fixtures/memory_snapshot_{cpu,cuda}_forward.json.gz: a forward pass of a 2-layer model, made by
torch.profiler and torch's own converter to the snapshot format that
torch.cuda.memory._snapshot() also uses), and the memory benchmark end to end on a CPU."""
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from lmperf.bench import memory

# The same forward pass recorded on a CPU (torch.profiler) and, where present, on a GPU
# (torch.cuda.memory._record_memory_history; tools/record_memory_fixture.py).
FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("memory_snapshot_*_forward.json.gz"))


def test_both_snapshot_formats_are_covered():
    assert [f.name.split("_")[2] for f in FIXTURES] == ["cpu", "cuda"]


@pytest.fixture(scope="module", params=FIXTURES, ids=lambda f: f.name.split("_")[2])
def snapshot(request):
    with gzip.open(request.param, "rt") as f:
        return json.load(f)


def test_timeline_counts_every_alloc_until_its_free(snapshot):
    trace = memory.device_trace(snapshot)
    line = memory.timeline(trace)
    assert len(line) == len(trace)
    live = {}
    for event, active in zip(trace, line):  # an independent walk: live blocks by address
        if event["action"] == "alloc":
            live[event["addr"]] = event["size"]
        elif event["action"] == "free_completed":
            live.pop(event["addr"])
        assert active == sum(live.values())


def test_downsample_keeps_the_peak():
    xs = [0, 1, 2, 50, 2, 1] * 300
    ys = memory.downsample(xs, 100)
    assert len(ys) == 100 and max(ys) == 50
    assert memory.downsample([3, 1], 100) == [3, 1]


def test_largest_allocation_is_the_logits_made_by_the_lm_head(snapshot):
    trace = memory.device_trace(snapshot)
    top = memory.largest(trace, 3)
    logits = 2 * 16 * 10_000 * 4  # batch x context x vocab, fp32
    assert top[0]["bytes"] == logits
    assert "lmperf/model.py" in top[0]["made_by"] and "linear" in top[0]["made_by"]
    assert [t["bytes"] for t in top] == sorted((t["bytes"] for t in top), reverse=True)


def test_residual_stream_size_is_found_in_the_snapshot(snapshot):
    residual = 2 * 16 * 32 * 4  # batch x context x d_model, fp32
    sizes = [e["size"] for e in memory.device_trace(snapshot) if e["action"] == "alloc"]
    # every block adds to the residual stream twice; the embedding output is one more
    assert sizes.count(residual) >= 2 * 2 + 1


def test_benchmark_rows_on_a_cpu(tmp_path):
    spec = {"size": "tiny", "contexts": [16], "modes": ["train"], "dtypes": ["fp32"], "batch_size": 2,
            "model": {"d_model": 32, "d_ff": 64, "n_layers": 2, "n_heads": 2}}
    case = memory.cases(spec)[0]
    rows = pd.DataFrame(memory.measure(case, spec["model"], tmp_path / "html"))
    by = rows.set_index("metric")
    assert by.loc["peak_allocated_mib", "mean"] > 0
    assert by.loc["residual_stream_mib", "mean"] == 2 * 16 * 32 * 4 / 2**20
    timeline = [float(x) for x in by.loc["timeline_mib", "samples"].split(";")]
    assert max(timeline) == pytest.approx(by.loc["peak_allocated_mib", "mean"])
    assert (rows["metric"] == "allocation_mib").sum() == memory.TOP_ALLOCATIONS
    assert (tmp_path / "html" / f"{case['case_id']}.html").read_text().lstrip().startswith("<")


LADDER = Path(__file__).parents[1] / "results" / "h100-80gb-hbm3" / "ladder" / "2.7B.csv"


def test_each_contender_rung_stands_beside_ours_on_its_settings():
    """The memory section's contenders: each contender rung of the committed H100 ladder beside
    the last rung of ours with the same settings but the attention (rung 10: the fused kernels,
    master weights, not the peers' float8 or Liger rungs after it), its peak over ours."""
    from lmperf.report import memory as view
    ladder = pd.read_csv(LADDER)
    table = view.contender_rungs(ladder)
    assert table["contender"].tolist() == ["lmperf_kernels_triton", "lmperf_kernels_pytorch"]
    assert set(table["on the settings of"]) == {"rung 10 fused_swiglu (attention flash-triton)"}
    peak = lambda case: ladder[(ladder["case_id"] == case) & (ladder["metric"] == "peak_allocated_mib")]["median"].item()
    first = table.iloc[0]
    assert first["peak allocated (MiB)"] == peak("2.7B-rung14-contender_lmperf_kernels_triton")
    assert first["its peak (MiB)"] == peak("2.7B-rung10-fused_swiglu")
    assert first["peak, contender / that rung"] == pytest.approx(first["peak allocated (MiB)"] / first["its peak (MiB)"])


def test_a_rung_that_did_not_run_is_not_the_one_a_contender_runs_beside():
    """Without CUDA the rungs that need it are skipped and change nothing after them: a contender
    rung is set beside the last rung that ran with its settings (but the attention), and beside
    none where none ran with them."""
    from lmperf.report import memory as view
    ladder = pd.read_csv(LADDER)
    ladder.loc[ladder["case_id"] == "2.7B-rung10-fused_swiglu", "status"] = "skipped"
    assert view.contender_rungs(ladder)["on the settings of"].tolist() == ["no rung ran on them"] * 2
    ladder = pd.read_csv(LADDER)
    rival = ladder["case_id"] == "2.7B-rung14-contender_lmperf_kernels_triton"
    ladder.loc[rival, "fused"] = "none"  # as if rung 9 and 10 (the fused kernels) needed CUDA and were skipped
    ladder.loc[ladder["case_id"].isin(["2.7B-rung09-fused_rmsnorm", "2.7B-rung10-fused_swiglu"]), "status"] = "skipped"
    assert view.contender_rungs(ladder)["on the settings of"].iloc[0] == "rung 8 bf16_weights (attention flash-triton)"


def test_a_contender_rung_without_a_peak_says_why():
    """A contender whose rung did not run `ok` (here: judged wrong) shows its status, not a
    number; on a CPU, where the ladder records no peak, the line says no peak was recorded."""
    from lmperf.report import memory as view
    ladder = pd.read_csv(LADDER)
    rival = ladder["case_id"] == "2.7B-rung14-contender_lmperf_kernels_triton"
    ladder.loc[rival, "status"] = "wrong"
    lines = view.contenders_view(view.contender_rungs(ladder))["contender_lines"]
    assert lines[0]["peak"] == "wrong" and lines[0]["ratio"] is None
    cpu = pd.read_csv(LADDER)
    cpu = cpu[cpu["metric"] != "peak_allocated_mib"]
    lines = view.contenders_view(view.contender_rungs(cpu))["contender_lines"]
    assert [line["peak"] for line in lines] == ["no peak recorded"] * 2 and lines[0]["ratio"] is None
    assert view.contender_rungs(cpu)["its peak (MiB)"].tolist() == ["no peak recorded"] * 2


def test_without_contender_rungs_the_memory_section_has_no_contender_table():
    from lmperf.report import memory as view
    ladder = pd.read_csv(LADDER)
    assert view.contender_rungs(ladder[~ladder["name"].str.startswith("contender_")]).empty
    assert view.contender_rungs(pd.DataFrame()).empty


TINY = {"d_model": 32, "d_ff": 64, "n_layers": 2, "n_heads": 2}


def recorded(mode: str) -> tuple[list[dict], int]:
    """The trace of one recorded step of `mode` on a CPU (after a warm-up step, as `measure`), and
    the model's parameter bytes."""
    from lmperf import train
    case = {"size": "tiny", "context": 16, "mode": mode, "dtype": "fp32", "compile": False,
            "attention": "plain", "batch_size": 2}
    cfg, model, optimizer, inputs, targets, autocast = train.setup(case, TINY)
    step = memory.step_of(case, model, optimizer, inputs, targets, autocast)
    step()
    trace = memory.device_trace(memory.record_snapshot(step, cuda=False))
    assert all(p.grad is None for p in model.parameters())  # every mode ends with no gradient held
    return trace, sum(p.numel() * p.element_size() for p in model.parameters())


def allocated(trace: list[dict], category: str) -> int:
    return sum(e["size"] for e in trace if e["action"] == "alloc" and e.get("category") == category)


def test_forward_backward_allocates_the_gradients_and_no_optimizer_state():
    """fwd_bwd records forward and backward without the optimizer step: a gradient for every
    parameter, no optimizer state (a training step's has some), and a forward pass none of either."""
    fwd_bwd, parameter_bytes = recorded("fwd_bwd")
    assert allocated(fwd_bwd, "gradient") == parameter_bytes
    assert allocated(fwd_bwd, "optimizer_state") == 0
    step, _ = recorded("train")
    assert allocated(step, "gradient") == parameter_bytes and allocated(step, "optimizer_state") > 0
    forward, _ = recorded("forward")
    assert allocated(forward, "gradient") == allocated(forward, "optimizer_state") == 0


def test_an_unknown_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="backward"):
        memory.step_of({"mode": "backward"}, None, None, None, None, None)


def test_each_mode_is_a_case_and_its_snapshot_picture_is_written_under_1_mb(tmp_path):
    """The three modes' rows, each case's PNG beside its HTML page, at most MAX_PNG_BYTES; the
    forward+backward peak lies above the forward pass's (the gradients and the activations
    backward needs)."""
    spec = {"size": "tiny", "contexts": [16], "modes": list(memory.MODES), "dtypes": ["fp32"], "batch_size": 2,
            "model": TINY}
    peaks = {}
    for case in memory.cases(spec):
        rows = pd.DataFrame(memory.measure(case, spec["model"], tmp_path / "html", tmp_path / "png"))
        peaks[case["mode"]] = rows.set_index("metric").loc["peak_allocated_mib", "mean"]
        png = tmp_path / "png" / f"{case['case_id']}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert 0 < png.stat().st_size <= memory.MAX_PNG_BYTES
    assert set(peaks) == {"forward", "fwd_bwd", "train"}
    assert peaks["fwd_bwd"] > peaks["forward"]


def test_the_stacked_bands_add_up_to_the_active_memory(snapshot):
    """The picture's bands: the bottom ones and every large allocation's band stack to the
    timeline's active bytes at each sampled event; each band is its allocation's size while it
    lives and nothing otherwise; the peak's event is among the samples."""
    import numpy as np
    trace = memory.device_trace(snapshot)
    active = np.array(memory.timeline(trace), dtype=float)
    allocs, freed_before = memory.allocations(trace)
    largest = sorted(a["size"] for a in allocs)[-10:]
    baseline = freed_before[-1]  # none recorded: what the step frees of the memory before it
    for points in (len(trace), 50):  # every event, then a sample of them
        t, before, small, edges = memory.stacked_bands(trace, baseline=0, bands=10, points=points)
        top = edges[-1][1]
        assert np.allclose(top, active[t] + baseline)
        assert int(active.argmax()) in set(t)
        assert (small >= 0).all() and (before >= 0).all()
        for lo, hi, _ in edges:
            assert set(np.unique(hi - lo)) <= {0.0, float(max(hi - lo))}
    t, before, small, edges = memory.stacked_bands(trace, baseline=0, bands=10, points=len(trace))
    assert sorted(max(hi - lo) for lo, hi, _ in edges) == largest


H100_MEMORY = Path(__file__).parents[1] / "results" / "h100-80gb-hbm3" / "memory" / "memory.csv"


def test_the_section_shows_each_snapshot_picture_the_run_wrote_and_the_forward_backward_peaks(tmp_path, snapshot):
    """The memory view on the committed H100 rows plus forward+backward ones (a copy of the forward
    rows under mode fwd_bwd): its peaks per mode include fwd_bwd's, and `pictures` lists exactly
    the cases whose PNG is in the results folder, each by a path that resolves from the report's
    folder."""
    from lmperf.report import memory as view
    from lmperf.report.sections import Inputs
    rows = pd.read_csv(H100_MEMORY)
    extra = rows[rows["mode"] == "forward"].assign(mode="fwd_bwd")
    extra["case_id"] = extra["case_id"].str.replace("-forward-", "-fwd_bwd-")
    rows = pd.concat([rows, extra], ignore_index=True)
    results, out = tmp_path / "results" / "h100", tmp_path / "report"
    drawn = ["2.7B-ctx128-fwd_bwd-fp32", "2.7B-ctx512-train-bf16"]
    for case in drawn:
        memory.timeline_png(memory.device_trace(snapshot), 0, results / "memory" / "snapshots" / f"{case}.png", case)
    v = view.view(Inputs(results=results, frames={"memory": rows}, bars={}, out_dir=out))
    assert [p["case"] for p in v["pictures"]] == [c for c in dict.fromkeys(rows["case_id"]) if c in drawn]
    for pic in v["pictures"]:
        assert (out / pic["path"]).resolve() == (results / "memory" / "snapshots" / f"{pic['case']}.png").resolve()
    peak = rows[(rows["metric"] == "peak_allocated_mib") & (rows["mode"] == "fwd_bwd")]["mean"]
    assert v["peaks"]["fwd_bwd"]["n"] == len(peak) == 6
    assert v["peaks"]["fwd_bwd"]["max"] == peak.max()
    none = view.view(Inputs(results=tmp_path / "elsewhere", frames={"memory": rows}, bars={}, out_dir=out))
    assert none["pictures"] == []
