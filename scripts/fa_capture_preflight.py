"""Before a grid run with CUDA-graph timing: measure a few of the grid's own cases (the grid
group of config/config.yaml, cut to short and long sequences at D = 64, through
bench.flash_attention's bench_cases and measure_bench, in one process, in this order) and exit 1
if any forward+backward capture failed (GPU only).

    python scripts/fa_capture_preflight.py
"""
import sys
from pathlib import Path

import yaml

from lmperf.bench import flash_attention as bench

CONFIG = Path(__file__).resolve().parents[1] / "config" / "config.yaml"


def grid_cases() -> list[dict]:
    groups = yaml.safe_load(CONFIG.read_text())["flash_attention"]["full"]["bench"]["groups"]
    grid = next(g for g in groups if g["name"] == "grid")
    cut = {**grid, "seq_lens": [128, 4096], "head_dims": [64], "dtypes": ["bf16", "fp32"],
           "providers": [p for p in grid["providers"] if p in ("triton", "plain_compiled")]}
    return [c for c in bench.bench_cases({"groups": [cut]}) if c["gpu_time"]]


def main() -> int:
    bad = 0
    for case in grid_cases():
        rows = {r["metric"]: r for r in bench.measure_bench(case)}
        gpu = rows.get("fwd_bwd_gpu_ms", {"status": "missing", "message": ""})
        print(case["case_id"], f"do_bench {rows['fwd_bwd_ms']['median']:.4f} ms;",
              f"CUDA graph {gpu.get('median', float('nan')):.4f} ms" if gpu["status"] == "ok" else
              f"CUDA graph {gpu['status']}: {gpu['message'][:200]}", flush=True)
        bad += gpu["status"] != "ok"
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
