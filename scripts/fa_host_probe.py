"""Where the host time of a small attention call goes (GPU only): for a few model-group and grid
shapes, each provider under the eager and the leaderboard harness (torch.compile around the op,
out.sum().backward()), this measures

- do_bench forward+backward, three times in a row (median ms each): how stable the number is;
- the wall time per iteration of a loop that synchronises only at its end (host-bound calls:
  the host time per call);
- the GPU kernel time per iteration (torch.profiler, the sum of device self time);
- a cProfile of 100 iterations (top functions by own time), one file per case;
- the launch cost of one Triton kernel through its JIT path, per call.

    python scripts/fa_host_probe.py --out DIR

Writes DIR/host_probe.csv, DIR/prof/*.txt and DIR/code/*.py (Inductor's generated code).
"""
from __future__ import annotations

import argparse
import cProfile
import csv
import io
import pstats
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

from lmperf.kernels import flash_attention_triton as fa

SHAPES = {"small_256": (4, 12, 256, 64), "2.7B_256": (4, 32, 256, 80), "xl_1024": (4, 25, 1024, 64),
          "grid_128": (1, 1, 128, 64)}
CASES = [("triton", "eager"), ("sdpa_flash", "eager"), ("triton", "leaderboard"),
         ("sdpa_flash", "leaderboard"), ("sdpa_cudnn", "leaderboard")]


def provider(name):
    from torch.nn.attention import SDPBackend
    if name == "triton":
        return lambda q, k, v: fa.FlashAttention2Triton.apply(q, k, v, True), None
    backend = SDPBackend.FLASH_ATTENTION if name == "sdpa_flash" else SDPBackend.CUDNN_ATTENTION
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), backend


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    (args.out / "prof").mkdir(parents=True, exist_ok=True)
    (args.out / "code").mkdir(parents=True, exist_ok=True)
    torch._functorch.config.donated_buffer = False
    rows = []
    for shape, (b, h, n, d) in SHAPES.items():
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn_like(q)
        for prov, harness in CASES:
            torch._dynamo.reset()
            fn, backend = provider(prov)
            if harness == "leaderboard":
                fn = torch.compile(fn, fullgraph=True, dynamic=False)

            def step():
                if backend is None:
                    out = fn(q, k, v)
                else:
                    from torch.nn.attention import sdpa_kernel
                    with sdpa_kernel(backend):
                        out = fn(q, k, v)
                if harness == "leaderboard":
                    out.sum().backward()
                else:
                    out.backward(dout)
            row = dict(shape=shape, provider=prov, harness=harness)
            try:
                if harness == "leaderboard" and shape in ("small_256", "2.7B_256"):
                    from torch._inductor.utils import run_and_get_code
                    _, codes = run_and_get_code(step)
                    (args.out / "code" / f"{shape}_{prov}.py").write_text("\n\n# ----\n\n".join(codes))
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
                for i in range(3):
                    row[f"do_bench_ms_{i}"] = triton.testing.do_bench(step, warmup=10, rep=100, grad_to_none=[q, k, v])
                t0 = time.perf_counter()
                for _ in range(200):
                    step()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                row["host_us_per_iter"] = (t1 - t0) / 200 * 1e6
                row["wall_us_per_iter"] = (t2 - t0) / 200 * 1e6
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                        torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(10):
                        step()
                    torch.cuda.synchronize()
                ka = prof.key_averages()
                row["gpu_us_per_iter"] = sum(e.self_device_time_total for e in ka) / 10
                row["kernels_per_iter"] = sum(e.count for e in ka if e.self_device_time_total > 0
                                              and e.device_type == torch.autograd.DeviceType.CUDA) / 10
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(100):
                    step()
                pr.disable()
                torch.cuda.synchronize()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35)
                s2 = io.StringIO()
                pstats.Stats(pr, stream=s2).sort_stats("cumulative").print_stats(45)
                (args.out / "prof" / f"{shape}_{prov}_{harness}.txt").write_text(
                    s.getvalue() + "\n\n" + s2.getvalue() + "\n\n"
                    + ka.table(sort_by="self_cpu_time_total", row_limit=30))
                row["status"] = "ok"
            except Exception as exc:  # a row, not a crash
                row["status"] = "error"
                row["message"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(row, flush=True)
            rows.append(row)
    # one Triton launch through the JIT path: host time per call
    q3, k3, v3 = (torch.randn(1, 16, 16, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o3, l3 = torch.empty_like(q3), torch.empty(1, 16, device="cuda", dtype=torch.float32)
    cfg = fa.fwd_config(16, 16, torch.bfloat16, True, 1)
    for _ in range(10):
        fa.launch_forward(q3, k3, v3, o3, l3, True, cfg)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        fa.launch_forward(q3, k3, v3, o3, l3, True, cfg)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    rows.append(dict(shape="launch_1x16x16", provider="triton", harness="jit_launch",
                     host_us_per_iter=(t1 - t0) / 2000 * 1e6, status="ok"))
    t0 = time.perf_counter()
    for _ in range(2000):
        torch.empty_like(o3)
    rows.append(dict(shape="empty_like", provider="torch", harness="alloc",
                     host_us_per_iter=(time.perf_counter() - t0) / 2000 * 1e6, status="ok"))
    print(rows[-2:], flush=True)
    fields = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("shape", "provider", "harness"), k))
    with open(args.out / "host_probe.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
