"""The ladder (bench/ladder.py, bench/memory_fit.py, report/ladder.py): how its rungs are built,
the FLOP count it checks MFU with, the choices it makes by measured memory, and its bars."""
import contextlib
import math
import re

import pytest
import torch

from lmperf import failures, stats, train
from lmperf.bench import e2e, flop_count, ladder, memory_fit, profile
from lmperf.flops import closed_form_attention, flops_per_token
from lmperf.model import ModelConfig, TransformerLM

SPEC = {"batch_size": 2, "context": 32, "warmup": 1, "timed_steps": 2, "contexts": [64, 128],
        "checkpoint": {"context": 128, "every": [2, 1], "memory_budget": 0.9},
        "floors": {"gemm_size": 256, "copy_mib": 16}}
DIMS = {"d_model": 64, "d_ff": 128, "n_layers": 4, "n_heads": 4}
SETTINGS = [*ladder.BASE, "context", "batch_size"]


def changed(before: dict, after: dict) -> dict:
    return {k: after[k] for k in SETTINGS if before[k] != after[k]}


def test_each_rung_changes_one_thing_on_a_gpu():
    cases = ladder.cases(SPEC, "tiny", cuda=True)
    assert [c["name"] for c in cases] == ["floors", *(r[0] for r in ladder.RUNGS), "ctx64", "ctx128", "checkpoint"]
    assert len({c["case_id"] for c in cases}) == len(cases)
    rungs = cases[1:]
    assert changed({**ladder.BASE, "context": 32, "batch_size": 2}, rungs[0]) == {}
    steps = [changed(a, b) for a, b in zip(rungs, rungs[1:])]
    assert steps == [{"tf32": True}, {"dtype": "bf16"}, {"compile": True}, {"optimizer": "fused"},
                     {"attention": "sdpa"}, {"attention": "flash-triton"}, {"optimizer": "master"}, {"context": 64},
                     {"context": 128}, {}]  # the checkpointing rung: same context, k chosen when run
    assert rungs[-1]["checkpoint_candidates"] == "2,1" and all(not c["checkpoint_candidates"] for c in rungs[:-1])
    assignment = next(c for c in rungs if c["name"] == ladder.ASSIGNMENT_RUNG)
    assert (assignment["dtype"], assignment["compile"], assignment["optimizer"], assignment["attention"],
            assignment["context"], assignment["batch_size"]) == ("bf16", True, "foreach", "plain", 32, 2)


def test_without_cuda_a_rung_that_needs_it_is_kept_but_changes_nothing_after_it():
    cases = {c["name"]: c for c in ladder.cases(SPEC, "tiny", cuda=False)}
    assert cases["tf32"]["needs_cuda"] and cases["flash-triton"]["needs_cuda"] and cases["floors"]["needs_cuda"]
    assert all(not cases[n]["tf32"] for n in ("bf16", "compiled", "checkpoint"))
    assert cases["ctx64"]["attention"] == "sdpa"  # flash-triton was skipped: SDPA stays
    with pytest.raises(failures.NotRun, match="needs CUDA"):
        ladder.measure(cases["tf32"], DIMS, SPEC)


def fake_count(attention="plain", dtype="fp32", every=0, context=32):
    case = {**ladder.BASE, "attention": attention, "dtype": dtype, "checkpoint_every": every,
            "context": context, "batch_size": 2}
    return flop_count.count_step(case, DIMS, "cpu")


def closed(context=32):
    cfg = ModelConfig(**DIMS, context_length=context)
    return (flops_per_token(cfg, context, "train") * 2 * context,
            closed_form_attention(cfg, context, "train") * 2 * context)


def test_rungs_that_differ_only_in_what_the_count_leaves_out_share_one_count(monkeypatch):
    calls = []
    monkeypatch.setattr(flop_count, "count_flops", lambda case, dims, device: calls.append(case) or {"total": len(calls)})
    base = {**ladder.BASE, "context": 37, "batch_size": 3}  # a setting no other test counts (the cache is the process's)
    first = flop_count.count_step(base, DIMS, "cpu")
    assert flop_count.count_step({**base, "compile": True, "optimizer": "fused", "fused": "rmsnorm"}, DIMS, "cpu") == first
    assert flop_count.count_step({**base, "context": 41}, DIMS, "cpu") != first
    assert [c["context"] for c in calls] == [37, 41]


def test_flop_count_of_plain_attention_equals_the_closed_form():
    counted, (total, attention) = fake_count(), closed()
    assert counted == {"total": total, "attention": attention}


@pytest.mark.parametrize("attention, backward_matmuls", [("sdpa", 5), ("flash-triton", 7)])
def test_flop_count_of_fused_attention_counts_its_backward_recomputation(attention, backward_matmuls):
    # The closed form counts 2 attention matmuls forward and 4 backward; SDPA's formula counts 5
    # backward (it recomputes the scores), our kernels 7 (each backward kernel recomputes them).
    counted, (total, attention_closed) = fake_count(attention, "bf16"), closed()
    assert counted["attention"] == attention_closed * (2 + backward_matmuls) // 6
    assert counted["total"] - counted["attention"] == total - attention_closed


def test_flop_count_includes_checkpointing_recomputation():
    # every=2 on 4 blocks: blocks 0 and 2 run their forward again in backward, up to the last
    # tensor backward needs (torch's checkpoint stops early): all but the output projection w2.
    plain, ck = fake_count(context=64), fake_count(every=2, context=64)
    cfg = ModelConfig(**DIMS, context_length=64)
    tokens = 2 * 64
    block_forward = (flops_per_token(cfg, 64, "forward") - 2 * cfg.d_model * cfg.vocab_size) / cfg.n_layers * tokens
    w2 = 2 * cfg.d_ff * cfg.d_model * tokens
    assert ck["total"] - plain["total"] == 2 * (block_forward - w2)


def ladder_frame(size: str, metrics, spec: dict = SPEC):
    """The ladder job's tidy rows for `size`, each case with the values metrics(case) gives."""
    import pandas as pd
    return pd.DataFrame([{**case, "study": "ladder", "metric": m, "mean": v, "median": v, "status": "ok",
                          "attention_backend": case["attention"]}
                         for case in ladder.cases(spec, size, cuda=True) for m, v in metrics(case).items()])


def test_report_reads_the_bars_off_the_ladder_rows():
    from lmperf.report import ladder as report
    from lmperf.report.render import bars_from_config
    from tests.conftest import REPO

    bars = bars_from_config(REPO / "config" / "config.yaml")["ladder"]

    def metrics(case):
        if case["name"] == "floors":
            return {"copy_gb_per_s": 3000.0, "bf16_matmul_tflops": 700.0}
        r = case["rung"]
        return {"step_ms": 100.0, "tokens_per_s": 1000.0 * r, "mfu_pct": 5.0 * r, "forward_ms": 30.0,
                "backward_ms": 60.0, "optimizer_ms": 10.0, "optimizer_floor_ms": 8.0,
                "forward_floor_ms": 20.0, "backward_floor_ms": 40.0}
    view = report.ladder(ladder_frame(bars["size"], metrics), bars)
    best = view["best"][bars["size"]]
    assert best["rung"] == 11 and best["attention"] == "flash-triton"  # the last rung: highest MFU here
    assert best["vs_assignment"] == 11 / 4  # rung 4 is the assignment's setting
    table = view["bars"].set_index("bar")
    assert list(table["_value"]) == [55.0, 55.0, 2.75, 1.25]
    assert list(table["met"]) == [True, True, False, True]


def test_accumulation_rung_follows_its_context_and_changes_one_thing():
    spec = {**SPEC, "accumulate": {"context": 64, "micro_batches": 4}}
    cases = ladder.cases(spec, "tiny", cuda=True)
    names = [c["name"] for c in cases]
    assert names[names.index("ctx64") + 1] == "accumulate4"
    i = names.index("accumulate4")
    assert changed(cases[i - 1], cases[i]) == {"micro_batches": 4}
    assert "global batch 8" in cases[i]["change"]
    base = ladder.cases({**SPEC, "accumulate": {"context": 32, "micro_batches": 2}}, "tiny", cuda=True)
    assert [c["name"] for c in base][len(ladder.RUNGS) + 1] == "accumulate2"  # after the last RUNGS rung


def test_kernel_rows_split_a_profiled_step_into_matmul_and_attention():
    kernels = {"sm90_xmma_gemm_bf16bf16_bf16f32": (500.0, 4), "nvjet_tst_128x256": (100.0, 2),
               "_bwd_dkdv_kernel": (300.0, 1), "_fwd_kernel": (50.0, 1),
               "cudnn_generated_fort_native_sdpa_sm90_flash_fprop": (20.0, 1),
               "triton_poi_fused_add_mul_0": (30.0, 3)}
    rows = {r["metric"]: r["mean"] for r in profile.kernel_rows(kernels)}
    assert rows["step_kernel_ms"] == pytest.approx(1.0)
    assert rows["step_matmul_kernel_ms"] == pytest.approx(0.6)
    assert rows["step_attention_kernel_ms"] == pytest.approx(0.37)


def test_ladder_table_shows_gpu_busy_only_where_profiled():
    import pandas as pd
    from lmperf.report import ladder as report

    base = {"study": "ladder", "size": "tiny", "name": "compiled", "change": "x", "context": 8,
            "attention": "plain", "attention_backend": "plain matmuls", "optimizer": "foreach",
            "status": "ok", "case_id": "tiny-r4", "rung": 4, "batch_size": 2}
    rows = [{**base, "metric": "step_ms", "median": 100.0}]
    assert "GPU busy %" not in report.rungs(pd.DataFrame(rows)).columns
    rows += [{**base, "metric": "step_kernel_ms", "median": 25.0},
             {**base, "metric": "step_attention_kernel_ms", "median": 2.0}]
    table = report.rungs(pd.DataFrame(rows))
    assert table["GPU busy %"].iloc[0] == 25.0 and table["attention kernels ms"].iloc[0] == 2.0


def test_tokens_bar_says_when_its_reference_rung_waits_on_the_host():
    """The tokens/s bar's denominator is the assignment's rung; where a profiled step shows that
    rung below 95% GPU-busy, the bar's measured text says so (the ratio then moves with the host)."""
    from lmperf.report import ladder as report
    from lmperf.report.render import bars_from_config
    from tests.conftest import REPO

    bars = bars_from_config(REPO / "config" / "config.yaml")["ladder"]

    def tokens_bar(busy_kernel_ms):
        def metrics(case):
            m = {"step_ms": 100.0, "tokens_per_s": 1000.0 * case["rung"], "mfu_pct": 5.0}
            if case["name"] == "compiled" and busy_kernel_ms is not None:
                m["step_kernel_ms"] = busy_kernel_ms
            return {} if case["name"] == "floors" else m
        table = report.ladder(ladder_frame(bars["size"], metrics), bars)["bars"]
        return table[table["bar"].str.contains("tokens/s")]["measured"].iloc[0]

    assert "GPU-busy" not in tokens_bar(None)  # no profile (CPU): nothing to say
    assert "GPU-busy" not in tokens_bar(99.0)
    assert "reference rung 60" in tokens_bar(60.0)


def test_checkpointing_rung_times_the_next_candidate_when_its_timed_steps_run_out_of_memory(monkeypatch):
    """The trial's one-step peak chose k = 8; its timed steps ran out of memory: a row says so
    (the trials' rows kept), k = 4 is tried and timed. All candidates failing raises."""
    cfg = ModelConfig(**DIMS, vocab_size=97, context_length=16)
    model = TransformerLM(cfg)
    case = {"checkpoint_candidates": "8,4,2,1", "checkpoint_every": 0, "micro_batches": 1}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 2**30}))
    monkeypatch.setattr(memory_fit, "one_step_peak_mib", lambda *a: 1.0)
    timed_at = []

    def time_steps(c, *a, **k):
        timed_at.append(c["checkpoint_every"])
        if c["checkpoint_every"] > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 MiB")
        return [stats.summarize("step_ms", "ms", [1.0])]
    monkeypatch.setattr(e2e, "time_steps", time_steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    limit = 4
    chosen, rows = memory_fit.time_checkpointed(case, SPEC, cfg, model, opt, None, None, None)
    assert chosen["checkpoint_every"] == 4 and timed_at == [8, 4]
    assert [(r["metric"], r.get("checkpoint_every")) for r in rows] == [
        ("trial_peak_allocated_mib", 8), ("timed_steps_oom", 8), ("trial_peak_allocated_mib", 4),
        ("checkpoint_every", None), ("checkpointed_blocks", None), ("step_ms", None)]
    assert "out of memory at every 8" in rows[1]["message"]
    limit = 0
    with pytest.raises(torch.OutOfMemoryError,
                       match=r"none of \['at every 8', 'at every 4', 'at every 2', 'at every 1'\] fits under 922 MiB"):
        memory_fit.time_checkpointed(case, SPEC, cfg, model, opt, None, None, None)


def test_accumulating_rungs_choose_their_micro_batch_and_the_checkpointing_rung_does_not():
    spec = {**SPEC, "accumulate": {"context": 64, "micro_batches": 4, "micro_batch_sizes": [2, 1],
                                   "expandable_segments": True}}
    order = ladder.cases(spec, "tiny", cuda=True)
    names = [c["name"] for c in order]
    assert names[names.index("ctx64"):names.index("ctx64") + 3] == ["ctx64", "expandable_segments", "accumulate4"]
    i = names.index("expandable_segments")
    assert changed(order[i - 1], order[i]) == {"expandable_segments": True} and order[i]["needs_cuda"]
    assert changed(order[i], order[i + 1]) == {"micro_batches": 4} and order[-1]["expandable_segments"]
    cases = {c["name"]: c for c in order}
    assert cases["accumulate4"]["micro_batch_candidates"] == "2,1" and "largest of 2, 1" in cases["accumulate4"]["change"]
    assert cases["ctx128"]["micro_batch_candidates"] == "2,1" and cases["ctx128"]["micro_batches"] == 4
    assert cases["checkpoint"]["micro_batch_candidates"] == "" and cases["ctx64"]["micro_batch_candidates"] == ""
    with pytest.raises(ValueError, match=r"micro_batch_sizes \[3\]: each must divide the global batch 4 x 2 = 8"):
        ladder.cases({**SPEC, "accumulate": {"context": 64, "micro_batches": 4, "micro_batch_sizes": [3]}},
                     "tiny", cuda=True)


def test_micro_batch_is_the_largest_that_fits_its_trial_and_its_timed_steps(monkeypatch):
    """Global batch 4 x 4: micro-batches of 4 run out of memory in the trial, of 2 fit the trial
    but not the timed steps, of 1 are timed; every try is a row with its own batch."""
    cfg = ModelConfig(**DIMS, vocab_size=97, context_length=16)
    model = TransformerLM(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    case = {"batch_size": 4, "micro_batches": 4, "micro_batch_candidates": "4,2,1"}
    spec = {**SPEC, "accumulate": {"context": 32, "micro_batches": 4, "memory_budget": 0.5}}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 2**30}))
    monkeypatch.setattr(memory_fit, "one_step_peak_mib", lambda *a: {4: None, 8: 100.0, 16: 50.0}[a[-1]])
    timed_at = []

    def time_steps(c, *a, **k):
        timed_at.append(c["batch_size"])
        if c["batch_size"] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 MiB")
        return [stats.summarize("step_ms", "ms", [1.0])]
    monkeypatch.setattr(e2e, "time_steps", time_steps)
    chosen, rows = memory_fit.time_micro_batched(case, spec, cfg, model, opt, None, None, None)
    assert (chosen["batch_size"], chosen["micro_batches"]) == (1, 16) and timed_at == [2, 1]
    assert [(r["metric"], r.get("batch_size")) for r in rows] == [
        ("trial_peak_allocated_mib", 4), ("trial_peak_allocated_mib", 2), ("timed_steps_oom", 2),
        ("trial_peak_allocated_mib", 1), ("micro_batch_size", None), ("step_ms", None)]
    assert rows[0]["message"] == "oom" and "micro-batches of 2" in rows[2]["message"]
    # a trial peak over the budget (512 MiB) is not timed; none that fits raises
    monkeypatch.setattr(memory_fit, "one_step_peak_mib", lambda *a: 600.0)
    with pytest.raises(torch.OutOfMemoryError, match=r"none of \['in micro-batches of 4', 'in micro-batches of 2', "
                                                     r"'in micro-batches of 1'\] fits under 512 MiB"):
        memory_fit.time_micro_batched(case, spec, cfg, model, opt, None, None, None)


def test_a_micro_batch_known_not_to_fit_is_not_tried_again_and_the_trial_warms_up(monkeypatch):
    """accumulate4 at context 32: micro-batches of 4 run out of memory, of 2 fit. The next rung, the
    same settings at context 64: 4 and 2 (2 x 64 tokens, as many as 4 x 32) are rows saying which
    rung showed it, without a trial; 1 is tried and timed. A fitting trial's two steps (the
    optimizer's state, then the peak) are two of the timed steps' three warm-up steps."""
    cfg = ModelConfig(**DIMS, vocab_size=97, context_length=16)
    model = TransformerLM(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    spec = {**SPEC, "accumulate": {"context": 32, "micro_batches": 4, "memory_budget": 0.5}}
    monkeypatch.setattr(memory_fit, "DID_NOT_FIT", [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 2**30}))
    tried, timed = [], []
    monkeypatch.setattr(memory_fit, "one_step_peak_mib",
                        lambda *a: (tried.append(16 // a[-1]), None if a[-1] == 4 else 100.0)[1])  # a[-1]: micro-batches
    monkeypatch.setattr(e2e, "time_steps", lambda c, *a, **k: (timed.append((c["batch_size"], c["warmup"], k)),
                                                               [stats.summarize("step_ms", "ms", [1.0])])[1])
    base = {"batch_size": 4, "micro_batches": 4, "micro_batch_candidates": "4,2,1", "warmup": 3,
            "dtype": "bf16", "compile": True}
    first = {**base, "context": 32, "name": "accumulate4", "rung": 20}
    chosen, _ = memory_fit.time_micro_batched(first, spec, cfg, model, opt, None, None, None, idle=False)
    assert chosen["batch_size"] == 2 and tried == [4, 2]
    assert timed == [(2, 1, {"idle": False})]  # SGD without momentum has no state: 2 trial steps
    tried.clear()
    chosen, rows = memory_fit.time_micro_batched({**first, "context": 64, "name": "ctx64", "rung": 21}, spec, cfg,
                                                 model, opt, None, None, None)
    assert chosen["batch_size"] == 1 and tried == [1]
    assert [(r["batch_size"], r["message"][:40]) for r in rows[:2]] == [
        (4, "not tried: 4 x 64 tokens a micro-batch n"), (2, "not tried: 2 x 64 tokens a micro-batch n")]
    assert "4 x 32 that did not fit in rung accumulate4" in rows[1]["message"]
    # other settings, or a shorter context: tried as before
    assert memory_fit.known_not_to_fit({**first, "context": 64, "dtype": "fp32"}, 2) == ""
    assert memory_fit.known_not_to_fit({**first, "context": 16}, 4) == ""
    assert memory_fit.known_not_to_fit({**first, "context": 32}, 4).startswith("not tried")


def test_a_rungs_gpu_idle_share_comes_from_its_profiled_step():
    rows = [stats.summarize("step_ms", "ms", [10.0, 10.0, 10.0]), stats.summarize("forward_ms", "ms", [4.0])]
    assert profile.idle_share(rows, 7.5) == pytest.approx(25.0)
    assert profile.idle_share(rows, 10.2) == 0.0   # busy a little over the wall: noise
    assert math.isnan(profile.idle_share(rows, math.nan)) and math.isnan(profile.idle_share(rows[1:], 5.0))


def test_ladder_table_shows_the_timed_steps_batch_not_a_trials():
    import pandas as pd
    from lmperf.report import ladder as report

    rows = pd.DataFrame([
        {"metric": "trial_peak_allocated_mib", "batch_size": 4, "micro_batches": 4},
        {"metric": "step_ms", "batch_size": 2, "micro_batches": 8}])
    assert report.timed_batch(rows) == (2, 8) and report.batch_text(rows) == "16 = 8 x 2"
    assert report.batch_text(rows.iloc[:1].assign(micro_batches=1)) == "4"


def test_trial_peak_is_measured_with_the_optimizers_state_in_memory(monkeypatch):
    """AdamW creates its moments at its first step: a trial on a fresh optimizer takes one step
    first and measures the second; once the state exists, one measured step."""
    cfg = ModelConfig(**DIMS, vocab_size=97, context_length=16)
    model = TransformerLM(cfg)
    opt = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(cfg.vocab_size, (2, 17))
    events = []
    step = train.step
    monkeypatch.setattr(train, "step", lambda *a: (events.append(("step", len(opt.state))), step(*a))[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: events.append(("reset", len(opt.state))))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 2**20)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    args = (model, opt, tokens[:, :-1], tokens[:, 1:], contextlib.nullcontext())
    assert memory_fit.one_step_peak_mib(*args) == 1.0
    n = len(list(model.parameters()))
    assert events == [("step", 0), ("reset", n), ("step", n)]
    events.clear()
    assert memory_fit.one_step_peak_mib(*args) == 1.0 and events == [("reset", n), ("step", n)]


def test_optimizer_floor_counts_what_each_optimizer_moves():
    """28 bytes a parameter; MasterWeightAdamW 26 for each nn.Linear weight (bf16 weight, int16
    remainder, bf16 gradient, two fp32 moments: all read, all but the gradient written)."""
    from lmperf.model import count_parameters

    cfg = ModelConfig(**DIMS, context_length=32)
    total = count_parameters(cfg)
    d, f, layers = DIMS["d_model"], DIMS["d_ff"], DIMS["n_layers"]
    linear = layers * (4 * d * d + 3 * d * f) + d * cfg.vocab_size  # q k v o, w1 w2 w3, lm_head
    assert ladder.optimizer_bytes(cfg, "fused") == ladder.optimizer_bytes(cfg, "foreach") == 28 * total
    assert ladder.optimizer_bytes(cfg, "master") == 26 * linear + 28 * (total - linear)


def test_a_host_bound_reference_rung_claims_no_speed_up():
    """The reference rung's step left the GPU idle above report.host_bound_idle_pct: its GPU idle %
    is marked in the table, and the tokens/s bar states the ratio but does not claim it."""
    from lmperf.report import ladder as report
    from lmperf.report.render import bars_from_config
    from tests.conftest import REPO

    bars = bars_from_config(REPO / "config" / "config.yaml")
    limits = bars["ladder"]

    def metrics(case):
        return {} if case["name"] == "floors" else {"step_ms": 100.0, "tokens_per_s": 1000.0 * case["rung"]}
    df = ladder_frame(limits["size"], metrics)
    df["gpu_idle_pct"] = [40.0 if name == "compiled" else 3.0 for name in df["name"]]
    view = report.ladder(df, limits, bars["host_bound_idle_pct"])
    best = view["best"][limits["size"]]
    assert best["host_bound"] == ["reference rung 40.0% GPU idle"]
    tokens = view["bars"][view["bars"]["bar"].str.contains("tokens/s")].iloc[0]
    assert tokens["measured"] == "2.75x (host-bound: reference rung 40.0% GPU idle; not claimed)"
    assert not tokens["met"]
    idle = view["rungs"].set_index("_name")["GPU idle %"]
    assert idle["compiled"] == "40.0 ‡" and idle["sdpa"] == 3.0


def test_fused_rungs_follow_bf16_weights_ours_one_a_rung_and_the_peers_beside_them():
    spec = {**SPEC, "fused": ["rope", "liger", "rmsnorm", "swiglu"], "float8": ["tensorwise", "rowwise"]}
    cases = ladder.cases(spec, "tiny", cuda=True)
    names = [c["name"] for c in cases]
    i = names.index("bf16_weights")
    assert names[i + 1:i + 8] == ["fused_rmsnorm", "fused_swiglu", "fused_rope", "liger", "float8_tensorwise",
                                  "float8_rowwise", "ctx64"]
    assert [changed(a, b) for a, b in zip(cases[i:i + 3], cases[i + 1:i + 4])] == [
        {"fused": "rmsnorm"}, {"fused": "rmsnorm+swiglu"}, {"fused": "rmsnorm+swiglu+rope"}]
    ours = cases[i + 3]
    assert changed(ours, cases[i + 4]) == {"fused": "liger"}  # a peer: ours swapped for Liger's
    for peer, recipe in ((cases[i + 5], "tensorwise"), (cases[i + 6], "rowwise")):
        assert changed(ours, peer) == {"float8": recipe}
    assert changed(ours, cases[i + 7]) == {"context": 64}  # the next rung builds on ours, not a peer
    assert all(c["fused"] == "rmsnorm+swiglu+rope" and c["float8"] == "none" for c in cases[i + 7:])
    assert all(c["needs_cuda"] for c in cases[i + 1:i + 7])
    assert [c["name"] for c in ladder.cases({**SPEC, "fused": ["liger"]}, "tiny", cuda=True)][i + 1] == "liger"
    assert names == [c["name"] for c in ladder.cases(spec, "tiny", cuda=False)]  # the same ids without CUDA
    with pytest.raises(ValueError, match=r"ladder fused \['nope'\]"):
        ladder.cases({**SPEC, "fused": ["nope"]}, "tiny", cuda=True)


def test_without_cuda_the_fused_rung_is_not_carried_and_a_missing_peer_says_what_it_needs():
    import importlib.util

    cases = {c["name"]: c for c in ladder.cases({**SPEC, "fused": ["rmsnorm", "liger"], "float8": ["rowwise"]},
                                                "tiny", cuda=False)}
    assert cases["ctx64"]["fused"] == "none"
    with pytest.raises(failures.NotRun, match="needs CUDA"):
        ladder.measure(cases["fused_rmsnorm"], DIMS, SPEC)
    for name, package in (("liger", "liger_kernel"), ("float8_rowwise", "torchao")):
        if importlib.util.find_spec(package) is None:
            with pytest.raises(failures.NotRun, match=r"needs [a-z-]+ \(pip wheel; tools/wheelhouse.sh\)"):
                ladder.measure(cases[name], DIMS, SPEC)


def test_a_fused_rung_patches_the_model_it_times(monkeypatch):
    """A fused rung's measure runs our kernels so far (here RMSNorm and RoPE) in the model it
    times (here on the CPU, in Triton's interpreter: fp32, eager, the model's attention)."""
    from lmperf.kernels import fused

    spec = {**SPEC, "fused": ["rmsnorm", "rope"]}
    case = next(c for c in ladder.cases(spec, "tiny", cuda=False) if c["name"] == "fused_rope")
    case = {**case, "needs_cuda": False, "dtype": "fp32", "compile": False, "optimizer": "foreach",
            "attention": "plain", "warmup": 0, "timed_steps": 2}
    patched = []
    apply = fused.apply
    monkeypatch.setattr(fused, "apply", lambda model, *a: patched.append(a) or apply(model, *a))
    timed = []
    time_steps = e2e.time_steps
    monkeypatch.setattr(e2e, "time_steps", lambda c, cfg, model, *a, **k: timed.append(type(model).__name__)
                        or time_steps(c, cfg, model, *a))
    rows = ladder.measure(case, DIMS, SPEC)
    assert patched == [("ours", ["rmsnorm", "rope"])] and timed == ["FusedTransformerLM"]
    assert any(r["metric"] == "step_ms" and r["status"] == "ok" for r in rows)


def test_the_best_rung_is_one_of_ours_never_a_faster_peer():
    """Liger-Kernel's and torchao's float8 rungs are measured beside ours and shown; the best rung
    (and the bars read off it) is chosen among our stack's rungs."""
    from lmperf.report import ladder as report
    from lmperf.report.render import bars_from_config
    from tests.conftest import REPO

    limits = bars_from_config(REPO / "config" / "config.yaml")["ladder"]
    spec = {**SPEC, "fused": ["rmsnorm", "liger"], "float8": ["tensorwise"]}
    cases = ladder.cases(spec, limits["size"], cuda=True)

    def metrics(case):  # the peers the fastest by far, ours faster rung by rung
        fast = 10**6 if case["name"] in ladder.PEERS else 1000.0 * case["rung"]
        return {} if case["name"] == "floors" else {"step_ms": 100.0, "tokens_per_s": fast}
    df = ladder_frame(limits["size"], metrics, spec)
    view = report.ladder(df, limits)
    best = view["best"][limits["size"]]
    names = {c["rung"]: c["name"] for c in cases}
    assert names[best["rung"]] not in ladder.PEERS and best["rung"] == max(
        c["rung"] for c in cases if c["name"] not in ladder.PEERS)
    assert {"liger", "float8_tensorwise"} <= set(view["rungs"]["_name"])  # still shown


def energy_case(base: dict, joules: float, power: float = 690.0, limit: float = 700.0, clock: float = 1_755.0,
                message: str = "") -> list[dict]:
    """The energy rows bench/e2e.py's time_steps writes for a rung on a GPU (one value each)."""
    values = {"joules_per_token": joules, "mean_power_w": power, "power_limit_w": limit, "mean_sm_clock_mhz": clock}
    return [{**base, "metric": m, "median": v, "mean": v, "message": message if m == "joules_per_token" else ""}
            for m, v in values.items()]


def test_ladder_table_shows_energy_per_token_where_measured():
    """J/token beside tokens/s and MFU: the rung's value where measured, "not measured" where its
    joules row is empty (why: the note), an empty cell where the rung has no joules row (older
    results, a CPU run); no column at all where no rung has one. The floors are no rung."""
    import pandas as pd
    from lmperf.report import ladder as report

    base = {"study": "ladder", "size": "tiny", "name": "compiled", "change": "x", "context": 8,
            "attention": "plain", "attention_backend": "plain matmuls", "optimizer": "foreach",
            "status": "ok", "case_id": "tiny-r4", "rung": 4, "batch_size": 2, "warmup": 1, "timed_steps": 2,
            "dtype": "bf16"}
    fused = {**base, "name": "fused", "case_id": "tiny-r5", "rung": 5, "optimizer": "fused"}
    old = {**base, "name": "sdpa", "case_id": "tiny-r6", "rung": 6}
    floors = {**base, "name": "floors", "case_id": "tiny-r0", "rung": 0}
    rows = [{**case, "metric": m, "median": v, "mean": v} for case in (base, fused, old)
            for m, v in (("step_ms", 100.0), ("tokens_per_s", 1000.0 * case["rung"]))]
    assert "J/token" not in report.rungs(pd.DataFrame(rows)).columns
    why = "energy not measured: NVMLError: Not Supported"
    rows += [*energy_case(base, 0.0417), *energy_case(fused, math.nan, message=why),
             *energy_case(floors, 9.0), {**floors, "metric": "copy_gb_per_s", "median": 3000.0}]
    table = report.rungs(pd.DataFrame(rows)).set_index("rung")
    columns = list(table.columns)
    assert columns.index("tokens/s") < columns.index("J/token") < columns.index("peak MiB")
    assert table.loc[4, "J/token"] == 0.0417 and table.loc[5, "J/token"] == "not measured"
    assert pd.isna(table.loc[6, "J/token"]) and 0 not in table.index
    view = report.ladder(pd.DataFrame(rows), {})
    assert view["best"]["tiny"]["rung"] == 6 and math.isnan(view["best"]["tiny"]["joules_per_token"])
    assert view["power"]["n"] == 1 and view["power"]["why_not"] == [{"message": why, "n": 1}]
    assert [c["case"] for c in view["power"]["near"]] == ["tiny rung 4 (compiled)", "tiny rung 5 (fused)"]


@pytest.mark.parametrize("with_energy", [False, True])
def test_ladder_section_renders_the_committed_rungs_with_or_without_energy(tmp_path, with_energy):
    """The committed ladder CSV without its energy rows (as one written before the ladder measured
    energy) renders without a J/token column and says so; with energy rows added to one rung, that
    rung's row has its value and the others' cells are empty."""
    import shutil

    import pandas as pd
    from lmperf.report import render
    from lmperf.report.energy import ENERGY_METRICS
    from lmperf.report.sections import SECTIONS
    from tests.conftest import REPO

    results = tmp_path / "results" / "h100-80gb-hbm3"
    shutil.copytree(REPO / "results" / "h100-80gb-hbm3" / "ladder", results / "ladder")
    csv = results / "ladder" / "2.7B.csv"
    df = pd.read_csv(csv)
    df = df[~df["metric"].isin(ENERGY_METRICS)]  # as ladder CSVs written before the energy meter
    if with_energy:
        rung = df[(df["rung"] == 4) & (df["metric"] == "step_ms")].iloc[0].to_dict()
        extra = [{**rung, "metric": r["metric"], "unit": "", **{k: r["median"] for k in ("mean", "median", "q20", "q80",
                                                                                          "min", "max")},
                  "std": math.nan, "n": 1, "samples": str(r["median"]), "message": ""} for r in energy_case({}, 0.0765)]
        df = pd.concat([df, pd.DataFrame(extra)], ignore_index=True)
    df.to_csv(csv, index=False)
    bars = render.bars_from_config(REPO / "config" / "config.yaml")
    text = render.render(results, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "full", bars,
                         sections=[s for s in SECTIONS if s.name == "ladder"], template="ladder.md.j2")
    block = text.split("<summary>The ladder, rung by rung</summary>", 1)[1].split("</details>", 1)[0]
    table = [line for line in block.splitlines() if line.startswith("|")]
    header, rows = table[0], table[2:]
    if not with_energy:
        assert "J/token" not in text.split("<details>")[0] + header and "No rung here has its energy per token" in text
        return
    assert "J/token" in header and "whole GPU board" in text
    cells = lambda line: [c.strip() for c in line.strip("|").split("|")]
    column = cells(header).index("J/token")
    assert cells(header)[column - 1].startswith("MFU %")  # beside tokens/s and MFU
    values = {tuple(cells(line)[:2]): cells(line)[column] for line in rows}
    assert values.pop(("2.7B", "4")) == "0.0765" and set(values.values()) == {""}
    assert "2.7B rung 4 (compiled) (690 W, 1,755 MHz)" in block


def test_the_rungs_warmed_in_workers_are_those_whose_compiled_shapes_are_known_before_they_run():
    cases = {c["name"]: c for c in ladder.cases({**SPEC, "models": {"tiny": DIMS}}, "tiny", cuda=True)}
    warmed = [name for name, c in cases.items() if ladder.compiles(c)]
    assert warmed[:4] == ["compiled", "fused_adamw", "sdpa", "flash-triton"] and "bf16" not in warmed
    assert "checkpoint" not in warmed and "floors" not in warmed
    assert all({k: cases[n][k] for k in DIMS} == DIMS for n in warmed)  # warm builds the model from the case


def test_warm_runs_a_rung_on_its_model_cut_to_two_blocks(monkeypatch):
    case = {c["name"]: c for c in ladder.cases({**SPEC, "models": {"tiny": DIMS}}, "tiny", cuda=False)}["compiled"]
    built = []
    setup = ladder.train.setup
    monkeypatch.setattr(ladder.train, "setup", lambda case, dims: built.append(dims) or setup(case, dims))
    rows = ladder.warm(case)
    assert rows[0]["status"] == "ok" and built == [{**DIMS, "n_layers": ladder.WARM_LAYERS}]


def test_a_ladder_counts_its_flops_and_warms_a_contenders_rungs_before_its_timed_loop(monkeypatch):
    """Beside the workers' warm-up: the FLOP counts of our rungs known before they run (not the
    floors, nor the rungs whose micro-batch or checkpointing measured memory chooses), and the
    contender's rungs sent to its own process with the model's dims and the spec."""
    counted, sent, said = [], [], []
    monkeypatch.setattr(flop_count, "count_step", lambda case, dims, device: counted.append(case["name"]))

    class Child:
        def warm(self, cases, say):
            sent.extend(cases)
    rungs = [{"name": "floors", "attention": "plain", "checkpoint_candidates": ""},
             {"name": "bf16", "attention": "plain", "checkpoint_candidates": ""},
             {"name": "contender_x_triton", "attention": "x_triton", "checkpoint_candidates": ""},
             {"name": "accumulate4", "attention": "sdpa", "checkpoint_candidates": "", "micro_batch_candidates": "4,2"},
             {"name": "checkpoint", "attention": "sdpa", "checkpoint_candidates": "8,4"}]
    ladder.prepare(rungs, said.append, Child(), DIMS, SPEC, {"x_triton"})
    assert counted == ["bf16"] and len(said) == 1 and said[0].startswith("counted the FLOPs of 1 rungs in")
    assert [(c["name"], c["_dims"], c["_spec"]) for c in sent] == [("contender_x_triton", DIMS, SPEC)]


def test_a_contenders_rung_warmed_in_its_process_compiles_and_counts_and_times_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr(ladder, "warm", lambda case: calls.append(("warm", case["name"])) or [{"status": "ok"}])
    monkeypatch.setattr(ladder, "count_ahead", lambda cases, dims: calls.append(("count", cases[0]["name"])))
    monkeypatch.setattr(ladder, "measure", lambda *a: calls.append("measure"))
    rung = {"name": "contender_x", "compile": True, "checkpoint_candidates": "", "_dims": DIMS, "_spec": SPEC}
    assert ladder.measure_isolated({**rung, "warm_only": True}) == [{"status": "ok"}]
    assert calls == [("warm", "contender_x"), ("count", "contender_x")]
