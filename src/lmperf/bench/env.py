"""The environment the results were measured in: one row per fact (GPU, driver, CUDA, ...).

    python -m lmperf.bench.env --out results/cpu/env/env.csv --hw cpu --scale smoke
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pandas as pd

from lmperf import csv_schema, provenance
from lmperf.bench import cli, loop


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.splitlines()[0].strip()
    except (subprocess.SubprocessError, OSError, IndexError):
        return "none"


def gpu_clocks() -> str:
    """The clocks policy the rows ran under: lmperf locks no clock (the GPU boosts as its driver
    lets it), so this names the application clock set on the device against its default and the SM
    clock's maximum, in MHz, as nvidia-smi reports them ('none' without one)."""
    query = "clocks.applications.graphics,clocks.default_applications.graphics,clocks.max.sm"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        app, default, peak = (v.strip() for v in out.splitlines()[0].split(","))
    except (subprocess.SubprocessError, OSError, IndexError, ValueError):
        return "none"
    return (f"not locked by lmperf (GPU boost); application clock {app} MHz (default {default}), "
            f"SM clock max {peak} MHz")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as /proc/cpuinfo gives it ('AMD EPYC 7763 64-Core Processor'), else
    platform.processor() or the architecture where there is no such file (macOS, Windows)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int | None:
    """The CPU cores this process may run on (its affinity: what a container or a scheduler lent
    the run, fewer than the machine's where it is shared); None where the OS does not say."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def facts(hw: str, scale: str) -> dict:
    import torch
    prov = provenance.provenance(hw)
    cuda = torch.cuda.is_available()
    props = torch.cuda.get_device_properties(0) if cuda else None
    return {
        "hw": hw,
        "scale": scale,
        "gpu": prov["gpu"],
        "gpu_memory_gib": f"{props.total_memory / 2**30:.1f}" if props else "none",
        "gpu_multiprocessors": str(props.multi_processor_count) if props else "none",
        "driver": driver_version(),
        "cuda": prov["cuda"],
        "cudnn": str(torch.backends.cudnn.version()) if cuda and torch.backends.cudnn.is_available() else "none",
        "clocks": gpu_clocks(),
        "torch": prov["torch"],
        "triton": prov["triton"],
        "python": prov["python"],
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_cores": str(os.cpu_count() or "?"),
        "cpu_cores_usable": str(usable_cores() or "?"),
        "cpu_threads": str(torch.get_num_threads()),
        "os": platform.platform(),
        "commit": prov["commit"],
        "measured_at": prov["measured_at"],
    }


def main(argv=None):
    scale = lambda p: p.add_argument("--scale", required=True, choices=["smoke", "quick", "full"])
    args = cli.bench_args(__doc__, argv, spec=False, options=scale, shares_device=True)
    df = pd.DataFrame([{"key": k, "value": v} for k, v in facts(args.hw, args.scale).items()])
    csv_schema.write_csv_atomic(df, args.out)
    loop.Progress("env", 1, args.log).say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
