"""LRPE under torch.compile on a GPU (issue #13): for each impl, dtype and grid, compile
`lrpe_cosine_md` in one graph (fullgraph=True, static and dynamic shapes), run forward and
backward, and check that the compiled output and dx equal the eager ones bit for bit (the same
kernels run), that Inductor's code holds our two Triton kernels (it compiled them itself rather
than calling an opaque op), and time eager against compiled (do_bench median, ms).

    PYTHONPATH=src python scripts/lrpe_compile_check.py

Prints one line per case and exits non-zero if any check fails. Not part of the report.
"""
import sys

import torch
import triton.testing
from torch._inductor.utils import run_and_get_code

from lmperf import lrpe_cosine_md

# (batch, heads, grid shape, extra tokens, d, e)
CASES = [(4, 8, (4096,), 0, 64, 64), (2, 4, (32, 32), 10, 64, 32), (12, 12, (16, 16, 16), 10, 128, 64)]


def main() -> int:
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 2
    failures = 0
    for impl in ("triton", "triton_cache"):
        for dtype in (torch.bfloat16, torch.float32):
            for b, h, shape, l, d, e in CASES:
                for dynamic in (False, True):
                    n = l + torch.Size(shape).numel()
                    gen = torch.Generator(device="cuda").manual_seed(0)
                    x = torch.randn(b, h, n, d, device="cuda", generator=gen).to(dtype).requires_grad_()
                    theta = torch.rand(h, e, device="cuda", generator=gen)
                    grad = torch.randn(b, h, n, 2 * d, device="cuda", generator=gen).to(dtype)

                    def call(x):
                        return lrpe_cosine_md(x, theta, shape, l, impl)

                    out = call(x)
                    dx = torch.autograd.grad(out, x, grad)[0]
                    torch._dynamo.reset()
                    compiled = torch.compile(call, fullgraph=True, dynamic=dynamic)
                    try:
                        (c_out, c_dx), code = run_and_get_code(
                            lambda: (lambda o: (o, torch.autograd.grad(o, x, grad)[0]))(compiled(x)))
                    except Exception as exc:  # noqa: BLE001 - a failure is a line, then the next case
                        failures += 1
                        print(f"FAIL {impl} {dtype} {shape} dynamic={dynamic}: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:300]}")
                        continue
                    code = "\n".join(code)
                    same = torch.equal(out, c_out) and torch.equal(dx, c_dx)
                    kernels = "_lrpe_fwd_kernel" in code and "_lrpe_bwd_kernel" in code
                    bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median")
                    eager_ms, compiled_ms = bench(lambda: call(x)), bench(lambda: compiled(x))
                    ok = same and kernels
                    failures += not ok
                    print(f"{'ok  ' if ok else 'FAIL'} {impl} {str(dtype)[6:]} b{b} h{h} {shape} l{l} d{d} "
                          f"dynamic={dynamic}: equal to eager {same}, kernels in Inductor's code {kernels}, "
                          f"forward ms eager {eager_ms:.4f} compiled {compiled_ms:.4f}")
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
