"""Can the eager path be captured in a CUDA graph, and where does the grid's eager time go (GPU only).

Each capture test runs in its own process (a failed capture poisons the process's CUDA
generator and leaks its memory pool): provider x dtype x variant, where the variant is

- `do_bench_cudagraph`: triton.testing.do_bench_cudagraph of forward + backward(dout), as the
  bench's `gpu_time` does;
- `warm3_global` / `warm3_thread_local`: three forward+backward on a side stream, then
  torch.cuda.graph(capture_error_mode=...) of one forward+backward, replayed and checked against
  an eager result;
- `forward_only`: do_bench_cudagraph of the forward under no_grad.

Then, in this process, the grid's fp32 D=64 N=4,096 causal case (1 x 1 heads): per-iteration host
time of forward and backward (no synchronisation inside the loop), the GPU's time (CUDA graph, if
it captures) and do_bench, for ours and torch.compile'd plain attention.

    python scripts/fa_capture_probe.py --out DIR     # DIR/capture.csv, DIR/host.csv, DIR/*.txt
"""
from __future__ import annotations

import argparse
import concurrent.futures
import csv
import subprocess
import sys
import time
import traceback
from pathlib import Path

PROVIDERS = ("triton", "plain_compiled", "sdpa")
VARIANTS = ("do_bench_cudagraph", "warm3_global", "warm3_thread_local", "forward_only")


def make(provider: str):
    import torch.nn.functional as F
    from lmperf.kernels import flash_attention_triton as fa
    if provider == "triton":
        return lambda q, k, v: fa.FlashAttention2Triton.apply(q, k, v, True)
    if provider == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    from lmperf.bench.flash_attention import _compiled_plain  # the bench's plain_compiled
    return lambda q, k, v: _compiled_plain()(q, k, v, True)


def one(provider: str, dtype_name: str, variant: str) -> str:
    """Runs in a child process; returns 'ok ...' or the failure's text."""
    import torch
    import triton.testing
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    shape = (1, 1, 4096, 64) if dtype_name == "fp32" else (4, 25, 1024, 64)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    fn = make(provider)

    def fwd_bwd():
        fn(q, k, v).backward(dout)
    if variant == "do_bench_cudagraph":
        ms = triton.testing.do_bench_cudagraph(fwd_bwd, rep=50, grad_to_none=[q, k, v], return_mode="median")
        return f"ok {ms:.4f} ms"
    if variant == "forward_only":
        with torch.no_grad():
            ms = triton.testing.do_bench_cudagraph(lambda: fn(q, k, v), rep=50, return_mode="median")
        return f"ok {ms:.4f} ms"
    mode = variant.split("_", 1)[1]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            for x in (q, k, v):
                x.grad = None
            fwd_bwd()
    torch.cuda.current_stream().wait_stream(s)
    ref = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode=mode):
        fwd_bwd()
    grads = [x.grad for x in (q, k, v)]
    for x in grads:
        x.zero_()
    g.replay()
    torch.cuda.synchronize()
    err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(grads, ref))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return f"ok {start.elapsed_time(end) / 20:.4f} ms, replay max diff {err:.3g}"


def host_timeline(out: Path) -> None:
    import torch
    import triton.testing
    rows = []
    shape = (1, 1, 4096, 64)
    for provider in ("triton", "plain_compiled"):
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(shape, device="cuda", generator=gen).requires_grad_() for _ in range(3))
        dout = torch.randn(shape, device="cuda", generator=gen)
        fn = make(provider)
        for _ in range(5):
            fn(q, k, v).backward(dout)
        torch.cuda.synchronize()
        t_fwd = t_bwd = 0.0
        iters = 200
        t0 = time.perf_counter()
        for _ in range(iters):
            for x in (q, k, v):
                x.grad = None
            a = time.perf_counter()
            o = fn(q, k, v)
            b = time.perf_counter()
            o.backward(dout)
            c = time.perf_counter()
            t_fwd += b - a
            t_bwd += c - b
        host_loop = (time.perf_counter() - t0) / iters * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / iters * 1e3
        bench = [triton.testing.do_bench(lambda: fn(q, k, v).backward(dout), grad_to_none=[q, k, v],
                                         return_mode="median") for _ in range(3)]
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])
        with prof:
            for _ in range(10):
                fn(q, k, v).backward(dout)
            torch.cuda.synchronize()
        gpu_us = sum(e.self_device_time_total for e in prof.key_averages()) / 10
        (out / f"profile_{provider}.txt").write_text(
            prof.key_averages().table(sort_by="self_device_time_total", row_limit=25))
        rows.append(dict(provider=provider, host_fwd_ms=t_fwd / iters * 1e3, host_bwd_ms=t_bwd / iters * 1e3,
                         host_loop_ms=host_loop, wall_per_iter_ms=wall, gpu_kernel_ms=gpu_us / 1e3,
                         do_bench_ms=" ".join(f"{x:.4f}" for x in bench)))
        print(rows[-1], flush=True)
    with open(out / "host.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--one", nargs=3, metavar=("PROVIDER", "DTYPE", "VARIANT"))
    ap.add_argument("--skip-host", action="store_true")
    ap.add_argument("--jobs", type=int, default=8)
    args = ap.parse_args(argv)
    if args.one:
        try:
            print("RESULT", one(*args.one), flush=True)
        except Exception as exc:  # the failure is the finding
            traceback.print_exc()
            print("RESULT", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    def child(job):  # processes in parallel: the finding is whether each captures (times are rough)
        provider, dtype, variant = job
        p = subprocess.run([sys.executable, __file__, "--one", provider, dtype, variant],
                           capture_output=True, text=True, timeout=300)
        result = next((line[7:] for line in p.stdout.splitlines() if line.startswith("RESULT ")),
                      f"no result (rc {p.returncode})")
        (args.out / f"capture_{provider}_{dtype}_{variant}.txt").write_text(p.stdout + p.stderr)
        row = dict(provider=provider, dtype=dtype, variant=variant, result=result)
        print(row, flush=True)
        return row
    jobs = [(p, d, v) for d in ("fp32", "bf16") for p in PROVIDERS for v in VARIANTS]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(child, jobs))
    with open(args.out / "capture.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    if not args.skip_host:
        host_timeline(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
