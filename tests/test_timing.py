"""bench/timing.py's host-bound test, `gpu_idle`: the GPU's busy time is the union of its work's
intervals in a profile, the idle share is measured against the wall time the case timed, and
every way it can fail is a reason beside an empty value, never a failed case. CUDA is faked
(profiler events of known intervals); on a CPU the value is empty."""
import collections
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from lmperf.bench import e2e, timing


def event(start_us, end_us, device="DeviceType.CUDA", **kw):
    return SimpleNamespace(device_type=device, time_range=SimpleNamespace(start=start_us, end=end_us), **kw)


def test_busy_time_is_the_union_of_the_gpu_work_per_call():
    events = [event(0, 1000), event(500, 1500),            # overlapping kernels: 1.5 ms once
              event(3000, 3500),                           # after a 1.5 ms gap
              event(0, 9000, "DeviceType.CPU"),            # host-side ops are not GPU work
              event(0, 9000, is_user_annotation=True),     # a named range spans idle time too
              event(0, 9000, activity_type="gpu_user_annotation")]
    assert timing.busy_ms(events, calls=1) == pytest.approx(2.0)
    assert timing.busy_ms(events, calls=2) == pytest.approx(1.0)
    with pytest.raises(RuntimeError, match="no GPU work"):
        timing.busy_ms([event(0, 10, "DeviceType.CPU")], calls=1)


def test_idle_share_is_against_the_timed_wall_time():
    assert timing.idle_pct(busy=2.5, wall_ms=10.0) == pytest.approx(75.0)
    assert timing.idle_pct(busy=10.2, wall_ms=10.0) == 0.0  # busy a little over the wall: noise


class FakeProfile:
    """torch.profiler.profile on a fake GPU: each call of the profiled function adds one 3 ms
    kernel and 1 ms of idle time."""
    calls = 0

    def __init__(self, activities):
        assert activities == [torch.profiler.ProfilerActivity.CUDA]

    def __enter__(self):
        FakeProfile.calls = 0
        return self

    def __exit__(self, *exc):
        return False

    def events(self):
        return [event(4000 * i, 4000 * i + 3000) for i in range(FakeProfile.calls)]


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)


def call():
    FakeProfile.calls += 1


def test_gpu_idle_profiles_a_few_calls_and_says_why_when_it_cannot(fake_gpu):
    assert timing.gpu_idle(call, wall_ms=4.0) == (pytest.approx(25.0), "")
    assert FakeProfile.calls == timing.IDLE_CALLS
    idle, why = timing.gpu_idle(lambda: None, wall_ms=4.0)  # no GPU work recorded
    assert math.isnan(idle) and "no GPU work" in why

    def fails():
        raise torch.OutOfMemoryError("CUDA out of memory")
    idle, why = timing.gpu_idle(fails, wall_ms=4.0)
    assert math.isnan(idle) and why.startswith("GPU idle share not measured: OutOfMemoryError")
    idle, why = timing.gpu_idle(call, wall_ms=float("nan"))
    assert math.isnan(idle) and "no wall time" in why


def test_without_cuda_the_idle_share_is_empty_not_made_up():
    if torch.cuda.is_available():
        pytest.skip("a CPU-only check")
    assert math.isnan(timing.gpu_idle(call, wall_ms=4.0)[0]) and timing.gpu_idle(call, wall_ms=4.0)[1] == ""


def test_every_row_of_an_e2e_case_carries_the_idle_share_of_its_median_step(monkeypatch):
    seen = {}

    def gpu_idle(fn, wall_ms):
        seen["wall_ms"], seen["phases"] = wall_ms, fn()  # fn is the timed step
        return 37.5, "a note"
    monkeypatch.setattr(timing, "gpu_idle", gpu_idle)
    spec = {"batch_size": 2, "timed_steps": 3, "grid": {"contexts": [8], "dtypes": ["fp32"], "compile": [False],
                                                        "modes": ["train"], "warmup": [0]}}
    case = e2e.study_cases(spec, "tiny")[0]
    rows = pd.DataFrame(e2e.measure(case, {"d_model": 32, "d_ff": 64, "n_layers": 1, "n_heads": 2}))
    assert (rows["gpu_idle_pct"] == 37.5).all()
    step = rows.set_index("metric").loc["step_ms"]
    assert seen["wall_ms"] == pytest.approx(step["median"], rel=1e-9)
    assert set(seen["phases"]) == {"forward", "backward", "optimizer"} and step["message"] == "a note"


# The stop rule (timing.sample_until): synthetic samples of known spread


def median_ci_by_enumeration(n: int, confidence: float) -> int:
    """The largest k whose order-statistic interval (x_(k), x_(n+1-k)) covers the median with
    probability >= confidence, by summing binomial terms in floats (numpy-free reference)."""
    best = 0
    for k in range(1, n // 2 + 1):
        below = sum(math.comb(n, i) for i in range(k)) / 2**n
        if 1 - 2 * below >= confidence:
            best = k
    return best


@pytest.mark.parametrize("n", range(1, 41))
def test_the_median_interval_is_the_binomial_order_statistics(n):
    k = median_ci_by_enumeration(n, 0.99)
    assert timing.median_interval_ranks(n, 0.99) == ((k, n + 1 - k) if k else None)
    assert (timing.median_interval_ranks(n, 0.99) is None) == (n < 8)  # 8 samples before a 99% interval


def lognormal_steps(sigma: float, seed: int = 0):
    import numpy as np
    rng = np.random.default_rng(seed)
    return lambda: float(0.1 * rng.lognormal(0.0, sigma))


def test_tight_samples_stop_at_the_floor_of_the_interval():
    rule = timing.StopRule(ceiling=20, floor=5, relative=0.01)
    samples, stop = timing.sample_until(lognormal_steps(0.001), rule)
    assert len(samples) == 8 and stop == "median ±1% at 99%"
    xs = sorted(samples)  # the 99% interval of 8 samples: their extremes, within 1% of the median
    assert xs[-1] / statistics.median(xs) - 1 <= 0.01 and 1 - xs[0] / statistics.median(xs) <= 0.01


def test_noisy_samples_run_to_the_ceiling():
    rule = timing.StopRule(ceiling=30, floor=8, relative=0.01)
    samples, stop = timing.sample_until(lognormal_steps(0.2), rule)
    assert len(samples) == 30 and stop == "ceiling"


def test_never_before_the_floor_and_the_window_ends_slow_cases():
    steady = lambda: 1.0
    assert timing.sample_until(steady, timing.StopRule(ceiling=20, floor=12))[1] == "median ±1% at 99%"
    assert len(timing.sample_until(steady, timing.StopRule(ceiling=20, floor=12))[0]) == 12
    samples, stop = timing.sample_until(lognormal_steps(0.2), timing.StopRule(ceiling=20, floor=5, window=0.6))
    assert stop == "window" and 5 <= len(samples) < 20 and sum(samples[:-1]) < 0.6 <= sum(samples)
    assert len(timing.sample_until(lambda: 10.0, timing.StopRule(ceiling=20, floor=5, window=1.0,
                                                                relative=0.0))[0]) == 5
    assert timing.sample_until(steady, timing.StopRule(ceiling=3, floor=3))[1] == "ceiling"  # no 99% interval at 3


def test_without_median_within_a_case_takes_every_sample():
    rule = timing.StopRule.from_case({"timed_steps": 20})
    assert timing.sample_until(lambda: 1.0, rule) == ([1.0] * 20, "ceiling")
    rule = timing.StopRule.from_case({"timed_steps": 20, "min_timed_steps": 5, "median_within": 0.02})
    assert rule == timing.StopRule(ceiling=20, floor=5, relative=0.02) and rule.reason() == "median ±2% at 99%"


def test_every_row_of_an_e2e_case_says_why_its_timing_stopped():
    spec = {"batch_size": 2, "timed_steps": 3, "grid": {"contexts": [8], "dtypes": ["fp32"], "compile": [False],
                                                        "modes": ["train"], "warmup": [0]}}
    case = e2e.study_cases(spec, "tiny")[0]
    rows = pd.DataFrame(e2e.measure(case, {"d_model": 32, "d_ff": 64, "n_layers": 1, "n_heads": 2}))
    assert (rows["stop"] == "ceiling").all() and (rows["stop_after"] == 3).all()
    assert rows.set_index("metric").loc["step_ms", "n"] == 3


H100 = Path(__file__).resolve().parents[1] / "results" / "h100-80gb-hbm3"


STEPS_BEFORE_THE_RULE = Path(__file__).resolve().parents[1] / "tools" / "data" / "stop_rule" / "h100_steps.csv"


def step_samples(paths):
    """(case id, per-step ms in the order taken, the row) of every step-timed case in the CSVs at
    `paths`: the end-to-end studies and the ladder (step_ms and its phases), PyTorch attention (each way)."""
    for path in sorted(paths):
        df = pd.read_csv(path, low_memory=False)
        rows = df[(df["status"] == "ok") & df["metric"].isin(["step_ms", "forward_ms", "backward_ms"])]
        for _, row in rows.drop_duplicates(["case_id", "metric"]).iterrows():
            yield row["case_id"], [float(x) for x in row["samples"].split(";")], row


def rule_of(row) -> timing.StopRule:
    """The stop rule of a row's keys: the step-timed studies' or PyTorch attention's."""
    step = "timed_steps" if "timed_steps" in row and pd.notna(row["timed_steps"]) else "iters"
    floor = "min_timed_steps" if step == "timed_steps" else "min_iters"
    window = row["timed_window_s"] if step == "timed_steps" else row["window_s"]
    return timing.StopRule(ceiling=int(row[step]), floor=int(row[floor]),
                           window=float(window) if pd.notna(window) else None, relative=0.01)


def first_stop(ms: list[float], rule: timing.StopRule):
    """(samples taken, why) where the rule first stops on `ms` replayed in order; None if it never does."""
    return next(((i, why) for i in range(1, len(ms) + 1) if (why := timing.stop_reason([x / 1e3 for x in ms[:i]], rule))),
                None)


def test_the_stop_rule_on_h100_steps_taken_without_it_moves_no_median_beyond_its_spread():
    """Replayed on the steps an H100 run kept before the rule (every case its full 20 steps or
    its window; tools/data/stop_rule), in their order: where the rule stops a case early, its
    median moves from the median of all the case's steps by less than their 20%-80% spread (the
    ladder's SDPA rung: its first 8 steps within 1%, later ones up to 175 ms of 95)."""
    early = 0
    for case_id, ms, row in step_samples([STEPS_BEFORE_THE_RULE]):
        n, _ = first_stop(ms, rule_of(row)) or (len(ms), None)
        assert n >= min(len(ms), 5)
        if n < len(ms):
            early += 1
            q20, _, _, q80 = statistics.quantiles(ms, n=5, method="inclusive")
            now, then = statistics.median(ms[:n]), statistics.median(ms)
            assert abs(now - then) <= q80 - q20, (case_id, n, len(ms), now, then)
    assert early > 50


@pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 results")
def test_the_committed_h100_rows_stopped_where_the_rule_stops():
    """Every committed step-timed row that records its stop replays to it exactly: the rule on its
    kept steps first stops at the last of them, for the reason the row gives (the e2e studies and
    the ladder decide on the whole step, so their phases' rows are left out)."""
    replayed = collections.Counter()
    for case_id, ms, row in step_samples([*H100.glob("e2e/*/*.csv"), *H100.glob("ladder/*.csv"),
                                          *H100.glob("attention/*.csv")]):
        if "stop" not in row or pd.isna(row["stop"]) or (row["metric"] != "step_ms" and "timed_steps" in row):
            continue
        assert first_stop(ms, rule_of(row)) == (len(ms), row["stop"]), (case_id, row["metric"])
        replayed[row["stop"]] += 1
    assert set(replayed) == {"ceiling", "window", timing.StopRule(ceiling=1).reason()}, replayed


def test_the_full_grids_step_timed_cases_carry_the_configs_stop_rule():
    """config median_within reaches every step-timed case of the full grids through its job's spec."""
    import json
    from lmperf import specs
    from lmperf.bench import attention, ladder
    from lmperf.report.render import load_config
    config = load_config()
    e2e_full, ladder_full = config["e2e"]["full"], config["ladder"]["full"]
    study, size = specs.e2e_jobs(e2e_full)[0]
    cases = e2e.study_cases(json.loads(specs.e2e_spec(config, e2e_full, study, size)), size)
    size = ladder_full["sizes"][0]
    cases += ladder.cases(json.loads(specs.ladder_spec(config, ladder_full, size)), size, cuda=False)[:1]
    rules = [timing.StopRule.from_case(c) for c in cases]
    rules += [attention.stop_rule(c) for c in attention.cases(json.loads(specs.attention_spec(config, config["attention"]["full"])))]
    assert {r.relative for r in rules} == {e2e_full["median_within"]} == {0.01}
    assert all(max(r.floor, 8) < r.ceiling for r in rules)  # room for the rule between floor and ceiling


# --- kernels timed call by call (bench_calls) and by CUDA-graph replays (bench_graph) ----------

def test_a_kernel_timing_stops_once_its_median_is_known_and_checks_ever_more_rarely():
    checks = []

    def tight(k):
        checks.append(k)
        return [1.0 + 0.001 * (i % 3) for i in range(k)]
    q = timing.samples_until(tight, timing.StopRule(ceiling=5000, floor=10, relative=0.01))
    assert (q.n, q.stop) == (10, "median ±1% at 99%") and checks == [10]
    assert q.fields() == {"stop": "median ±1% at 99%", "stop_after": 10}
    checks.clear()
    rng = __import__("random").Random(0)
    noisy = lambda k: (checks.append(k), [rng.uniform(1.0, 2.0) for _ in range(k)])[1]
    q = timing.samples_until(noisy, timing.StopRule(ceiling=5000, floor=10, relative=0.001))
    assert (q.n, q.stop) == (5000, "ceiling") and sum(checks) == 5000
    assert len(checks) < 30  # a check sorts every sample: a quarter more each time, not every 10
    median, q20, q80 = q  # unpacked as do_bench_quantiles' (median, q20, q80)
    assert q20 <= median <= q80


def test_a_timing_never_takes_more_than_its_ceiling_even_below_the_floor():
    q = timing.samples_until(lambda k: [2.0] * k, timing.StopRule(ceiling=3, floor=3, relative=0.01))
    assert (q.n, q.stop, q.median) == (3, "ceiling", 2.0)


class FakeClock:
    """A device whose calls take known times: Event.record reads the clock, fn advances it."""

    def __init__(self):
        self.now, self.calls, self.flushes, self.syncs = 0.0, 0, 0, 0
        clock = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                self.t = clock.now

            def elapsed_time(self, other):
                return other.t - self.t
        self.Event = Event

    def get_device_interface(self):
        return SimpleNamespace(Event=self.Event, synchronize=self.sync)

    def sync(self):
        self.syncs += 1

    def get_empty_cache_for_benchmark(self):
        return "cache"

    def clear_cache(self, cache):
        self.flushes += 1


def test_calls_are_timed_as_do_bench_times_them_until_the_median_is_known(monkeypatch):
    import triton.runtime
    clock = FakeClock()
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=clock))
    x = torch.zeros(1, requires_grad=True)

    def fn():  # 0.5 ms a call
        assert x.grad is None or clock.calls < 16  # cleared before each timed call (as do_bench: not the warm-up)
        x.grad = torch.ones(1)
        clock.calls += 1
        clock.now += 0.5
    q = timing.bench_calls(fn, warmup_ms=5, rep_ms=100, median_within=0.01, grad_to_none=[x])
    assert q.median == pytest.approx(0.5) and (q.n, q.stop) == (10, "median ±1% at 99%")
    # one first call, 5 for the estimate, 10 filling the warm-up window, 10 timed (not do_bench's 200)
    assert clock.calls == 1 + 5 + 10 + 10 and clock.flushes == 5 + 10


def test_a_noisy_call_stops_at_the_calls_of_do_benchs_window(monkeypatch):
    import triton.runtime
    clock = FakeClock()
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=clock))

    def fn():
        clock.calls += 1
        clock.now += (1.0, 1.5, 2.0)[clock.calls % 3]
    q = timing.bench_calls(fn, warmup_ms=1, rep_ms=30, median_within=0.001)
    assert q.stop == "ceiling" and q.n == 20  # rep / the estimate of 5 calls (1.5 ms): do_bench's count


def test_without_median_within_the_timing_is_do_benchs_own(monkeypatch):
    seen = {}
    monkeypatch.setattr(timing, "do_bench_quantiles", lambda fn, **kw: seen.setdefault("calls", kw) and (3.0, 2.0, 4.0))
    monkeypatch.setattr(timing, "do_bench_cudagraph_quantiles", lambda fn, **kw: (1.0, 0.5, 1.5))
    q = timing.bench_calls(lambda: None, warmup_ms=25, rep_ms=100, median_within=None)
    assert tuple(q) == (3.0, 2.0, 4.0) and q.fields() == {"stop": "", "stop_after": q.n} and math.isnan(q.n)
    assert seen["calls"] == {"warmup_ms": 25, "rep_ms": 100, "grad_to_none": None}
    assert tuple(timing.bench_graph(lambda: None, rep_ms=100, median_within=0)) == (1.0, 0.5, 1.5)


def test_flashattention_and_lrpe_cases_carry_the_groups_median_within():
    from lmperf.bench import flash_attention, lrpe
    group = {"name": "g", "batch": 1, "heads": 1, "head_dims": [16], "causal": [True], "dtypes": ["fp32"],
             "seq_lens": [64], "providers": ["triton"], "timing_ms": [5, 20], "tiled_max_seq_len": 64,
             "median_within": 0.02}
    assert flash_attention.bench_cases({"groups": [group]})[0]["median_within"] == 0.02
    spec = {"dims": 1, "d": 16, "sizes": [8], "extra_tokens": [0], "providers": ["triton"], "batch": 1, "heads": 1,
            "dtype": "fp32", "timing_ms": [5, 20], "copy_timing_ms": [5, 20], "kernel_calls": 2, "median_within": 0.03}
    assert lrpe.bench_cases(spec)[0]["median_within"] == 0.03


def counting_readings(monkeypatch):
    """energy.reading faked: each call a reading whose SM clock counts the calls (1, 2, ...)."""
    calls = []

    def reading():
        calls.append(len(calls) + 1)
        return {"sm_clock_mhz": 1_000.0 + len(calls), "mem_clock_mhz": 2_619.0, "power_w": 300.0 + len(calls),
                "temp_c": 50.0}
    monkeypatch.setattr(timing.energy, "reading", reading)
    return calls


def test_a_case_records_the_clocks_before_its_first_timed_work_and_after_its_last(monkeypatch):
    calls = counting_readings(monkeypatch)
    during = []
    take = lambda: during.append(len(calls)) or 1.0  # how many readings had been taken when a sample ran
    with timing.recording() as clocks:
        timing.sample_until(take, timing.StopRule(ceiling=3))  # reading 1 before, 2 after
        timing.sample_until(take, timing.StopRule(ceiling=2))  # no reading before (the case's first is kept), 3 after
    assert during == [1, 1, 1, 2, 2], "no reading inside the timed work"
    assert clocks["sm_clock_mhz_start"] == 1_001 and clocks["sm_clock_mhz_end"] == 1_003
    assert clocks["power_w_start"] == 301 and clocks["power_w_end"] == 303
    assert set(clocks) == set(timing.CLOCK_COLUMNS)


def test_a_window_inside_another_reads_nothing_and_a_case_that_timed_nothing_is_empty(monkeypatch):
    calls = counting_readings(monkeypatch)
    with timing.recording() as clocks:
        with timing.window():
            timing.samples_until(lambda k: [1.0] * k, timing.StopRule(ceiling=4, floor=4))
    assert len(calls) == 2 and clocks["sm_clock_mhz_end"] == 1_002
    with timing.recording() as nothing:  # a correctness check: no window
        pass
    assert all(math.isnan(v) for v in nothing.values()) and len(calls) == 2


def test_a_case_that_raises_in_its_timed_work_keeps_its_start(monkeypatch):
    counting_readings(monkeypatch)

    def take():
        raise RuntimeError("out of memory")
    with pytest.raises(RuntimeError), timing.recording() as clocks:
        timing.sample_until(take, timing.StopRule(ceiling=3))
    assert clocks["sm_clock_mhz_start"] == 1_001 and math.isnan(clocks["sm_clock_mhz_end"])
    with timing.recording() as after:  # the next case starts afresh
        timing.sample_until(lambda: 1.0, timing.StopRule(ceiling=1))
    assert after["sm_clock_mhz_start"] == 1_002
