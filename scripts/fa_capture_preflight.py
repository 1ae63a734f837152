"""Before a grid run with CUDA-graph timing: measure a few grid cases through the bench itself
(bench.flash_attention.measure_bench, in one process, in this order) and exit 1 if any
forward+backward capture failed (GPU only).

    python scripts/fa_capture_preflight.py
"""
import sys

from lmperf.bench import flash_attention as bench

CASES = [("triton", "bf16", 128), ("plain_compiled", "bf16", 128), ("triton", "fp32", 4096),
         ("plain_compiled", "fp32", 4096)]


def main() -> int:
    bad = 0
    for provider, dtype, n in CASES:
        case = dict(group="grid", provider=provider, harness="eager", dtype=dtype, causal=True, batch=1, heads=1,
                    seq_len=n, head_dim=64, model="", timing_ms="10/40", tiled_max_seq_len=1024, gpu_time=True)
        rows = {r["metric"]: r for r in bench.measure_bench(case)}
        gpu = rows.get("fwd_bwd_gpu_ms", {"status": "missing", "message": ""})
        print(provider, dtype, n, f"do_bench {rows['fwd_bwd_ms']['median']:.4f} ms;",
              f"CUDA graph {gpu.get('median', float('nan')):.4f} ms" if gpu["status"] == "ok" else
              f"CUDA graph {gpu['status']}: {gpu['message'][:200]}", flush=True)
        bad += gpu["status"] != "ok"
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
