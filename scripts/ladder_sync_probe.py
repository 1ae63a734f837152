"""Does timing a training step phase by phase cost the step time, or is the GPU at its power
limit? One ladder rung (default: the 2.7B's rung 9, context 2,048, batch 4, bf16, compiled,
fused AdamW, our FlashAttention-2) timed three ways in one process, in turns (ABC ABC ABC), while
a thread samples the GPU's SM clock, power and clock-event reasons through NVML (notes for #15):

- phase_sync: the e2e harness (bench/e2e.py): the device synchronized after forward, backward
  and optimizer, each phase on the wall clock (the published ladder's step time);
- step_sync: one synchronization a step, wall clock;
- free: steps back to back, one synchronization after the last (a training loop's rate).

If phase_sync is slower than step_sync by the idle time the profiler shows, removing the syncs
(branch e2e-event-phases) pays; if the three agree while the SM clock drops under load, the step
is bound by power, and only less work (fewer bytes, fewer kernels) makes it faster.

    python scripts/ladder_sync_probe.py --out DIR [--size 2.7B --context 2048 --batch 4 --steps 5 --turns 3]

Writes DIR/ladder_sync_probe_<size>_<context>.csv: one row per mode and turn (step ms, median
and mean; SM clock, power and the clock-event reasons seen while it ran) with provenance.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
from pathlib import Path

import pandas as pd
import torch

from ladder_kernels import add_rung_arguments, setup_rung  # this folder's: the same rung, set up the same way
from lmperf import hardware
from lmperf import train
from lmperf.bench import common, e2e, timing


class Sampler:
    """NVML samples (time, SM MHz, watts, clock-event reasons bitmask) every `period` s."""

    def __init__(self, period: float = 0.02):
        try:
            import pynvml
        except ImportError:
            raise SystemExit("ladder_sync_probe: needs pynvml (nvidia-ml-py) to sample clocks and power")
        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self.reasons = reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self.period, self.samples, self.stop = period, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        nv, h = self.nvml, self.handle
        while not self.stop.is_set():
            self.samples.append((time.time(), nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                                 nv.nvmlDeviceGetPowerUsage(h) / 1e3, self.reasons(h)))
            time.sleep(self.period)

    def between(self, t0: float, t1: float) -> dict:
        xs = [s for s in self.samples if t0 <= s[0] <= t1]
        if not xs:
            return {"samples": 0}
        reasons = 0
        for s in xs:
            reasons |= s[3]
        return {"samples": len(xs), "sm_mhz_mean": statistics.fmean(s[1] for s in xs),
                "sm_mhz_min": min(s[1] for s in xs), "power_w_mean": statistics.fmean(s[2] for s in xs),
                "power_w_max": max(s[2] for s in xs), "clock_event_reasons": hex(reasons)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rung_arguments(ap)
    ap.add_argument("--steps", type=int, default=5, help="steps per mode and turn")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ladder_sync_probe: needs CUDA (it measures the GPU's clocks and power)")
    case, cfg, model, optimizer, inputs, targets, autocast = setup_rung(args)
    sync = timing.synchronizer()
    nothing = lambda phase: contextlib.nullcontext()

    def phase_sync() -> list[float]:  # the harness itself: its step_ms row's per-step samples
        rows = e2e.time_steps({**case, "warmup": 0, "timed_steps": args.steps}, cfg, model, optimizer, inputs,
                              targets, autocast)
        step = next(r for r in rows if r["metric"] == "step_ms")
        return [float(x) for x in step["samples"].split(";")]

    def step_sync() -> list[float]:
        out = []
        for _ in range(args.steps):
            sync()
            t0 = time.perf_counter()
            train.step(model, optimizer, inputs, targets, autocast, nothing)
            sync()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    def free() -> list[float]:
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            train.step(model, optimizer, inputs, targets, autocast, nothing)
        sync()
        return [(time.perf_counter() - t0) * 1e3 / args.steps]

    modes = {"phase_sync": phase_sync, "step_sync": step_sync, "free": free}
    for _ in range(3):  # warm-up: compile, allocator, clocks
        train.step(model, optimizer, inputs, targets, autocast, nothing)
    sync()
    sampler = Sampler()
    sampler.thread.start()
    prov = common.provenance(hardware.hw_slug(hardware.gpu_name()))
    rows = []
    for turn in range(args.turns):
        for mode, run in modes.items():
            t0 = time.time()
            ms = run()
            t1 = time.time()
            row = {"size": args.size, "context": args.context, "batch": args.batch, "mode": mode, "turn": turn,
                   "steps": args.steps, "step_ms_median": statistics.median(ms), "step_ms_mean": statistics.fmean(ms),
                   **sampler.between(t0, t1), **prov}
            rows.append(row)
            print(f"turn {turn} {mode:10s} {row['step_ms_median']:8.2f} ms  SM {row.get('sm_mhz_mean', 0):6.0f} MHz"
                  f" (min {row.get('sm_mhz_min', 0)})  {row.get('power_w_mean', 0):5.0f} W"
                  f" (max {row.get('power_w_max', 0):.0f})  reasons {row.get('clock_event_reasons', '')}", flush=True)
    sampler.stop.set()
    path = args.out / f"ladder_sync_probe_{args.size}_{args.context}.csv"
    common.write_csv_atomic(pd.DataFrame(rows), path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
