"""The model group's new CUDA-graph timing on a few shapes, every provider (GPU only): prints the
rows `bench.flash_attention.measure_bench` returns, one line each.

    python scripts/fa_model_gpu_probe.py
"""
from lmperf.bench import flash_attention as fab

for model, heads, d in (("xl", 25, 64), ("2.7B", 32, 80)):
    for provider in ("triton", "sdpa_flash", "sdpa_cudnn", "flex"):
        case = {"group": "model", "provider": provider, "harness": "leaderboard", "dtype": "bf16", "causal": True,
                "batch": 4, "heads": heads, "seq_len": 1024, "head_dim": d, "model": model, "timing_ms": "25/100",
                "tiled_max_seq_len": 1024, "gpu_time": True}
        try:
            rows = fab.measure_bench(case)
        except Exception as exc:
            print(model, provider, "FAILED", type(exc).__name__, str(exc)[:300], flush=True)
            continue
        for r in rows:
            if r["metric"].startswith("fwd_bwd"):
                print(model, provider, r["metric"], round(r["median"], 4), r["status"], r["message"][:200], flush=True)
