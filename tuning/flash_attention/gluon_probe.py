"""The Gluon FlashAttention forward (src/lmperf/kernels/flash_attention_gluon.py) on a Hopper GPU:
check against float64, then time it beside the tile-language kernel, SDPA-cuDNN and SDPA-flash
in the same process.

    python tuning/flash_attention/gluon_probe.py --out DIR [--skip-check] [--skip-bench]
        [--only thr_full,headline] [--variants plain,ws]

    python tuning/flash_attention/gluon_probe.py --out DIR --bwd [--skip-check] [--skip-bench]
        [--only headline,...] [--tag TAG]

    python tuning/flash_attention/gluon_probe.py --out DIR --harness [--only d128_2048]
        [--impls triton,sdpa_cudnn] [--modes leaderboard,compiled_dout,eager_dout] [--tag TAG]

With --harness, the benchmark's own forward + backward by kernel (DIR/gluon_harness{TAG}.csv):
each provider's GPU time a call and each kernel's, under the model group's harness and beside it.

With --bwd, the Gluon backward (src/lmperf/kernels/flash_attention_gluon_bwd.py) instead:
DIR/gluon_bwd_check.csv (dQ and Delta of the Gluon dQ kernel, then dK, dV of the dK/dV kernel,
against float64, NaN-poisoned, two runs the same bits) and DIR/gluon_bwd_bench.csv (the backward,
autograd.grad of one forward: ours all Gluon, ours with the Gluon dK/dV after the tile dQ, ours
all tile, SDPA-cuDNN, SDPA-flash; the dQ kernels alone, Gluon and tile, and the Gluon dK/dV kernel;
forward + backward; median and 20/80% quantiles of do_bench, and the kernels' GPU time per call
from the profiler). --sweep (dK/dV) and --dq-sweep (dQ): the kernel alone at other configs.
--determinism: each backward's bits run to run (DIR/gluon_bwd_determinism.csv).

Writes DIR/gluon_check.csv (one row per case: O's and L's max abs error against float64, plain
PyTorch's error in the same dtype, the contract's tolerance, passed; NaN-poisoned outputs, so an
unwritten element fails), DIR/gluon_bench.csv (one row per shape x implementation x config:
median and 20/80% quantiles of triton.testing.do_bench, TFLOP/s of the median; failures are
rows) and prints a short table last.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
import traceback
from pathlib import Path

import torch

BF16, FP16 = torch.bfloat16, torch.float16
# name: (batch, q heads, kv heads, N, D, causal)
SHAPES = {
    "thr_full": (4, 16, 16, 8192, 128, False),
    "thr_causal": (4, 16, 16, 8192, 128, True),
    "headline": (1, 16, 16, 16384, 64, True),
    "lb_b16": (16, 16, 16, 16384, 64, True),
    "gqa_4096": (4, 32, 8, 4096, 128, True),
    "gqa_2048": (4, 32, 8, 2048, 128, True),
    "d64_full": (4, 16, 16, 8192, 64, False),
    "d128_full_2048": (4, 16, 16, 2048, 128, False),
    "gqa_d64_1024": (8, 16, 4, 1024, 64, True),
    "d80_2048": (4, 32, 32, 2048, 80, True),  # the 2.7B model's attention (head dim 80)
    "d80_full": (4, 16, 16, 8192, 80, False),
    "d80_causal": (4, 16, 16, 8192, 80, True),
    "d128_2048": (8, 16, 16, 2048, 128, True),  # the model group's head-dim-128 shape
    "gqa_64q_8192": (1, 64, 8, 8192, 128, True),
    "xl_2048": (4, 25, 25, 2048, 64, True),  # the xl model's attention
    "d64_1024": (4, 16, 16, 1024, 64, True),  # the model group's 1,024-row shape at head dim 64
    "d128_1024": (4, 16, 16, 1024, 128, True),  # and at head dim 128
    "assign64": (16, 1, 1, 1024, 64, True),  # the assignment's (16, 1,024, D): one head a sequence
    "assign128": (16, 1, 1, 1024, 128, True),
}
# (variant, (BLOCK_M, BLOCK_N, num_warps, STAGES)) candidates by (D, causal); causal tiles square
CANDIDATES = {  # "pp_snake"/"pp_nosnake"/"pp_rev": pp with the causal schedule forced (else by head dim)
    (128, False): [("pp", (128, 128, 4, 3)), ("pp", (128, 128, 4, 2))],
    (128, True): [("pp", (128, 128, 4, 3)), ("pp_nosnake", (128, 128, 4, 3)), ("pp_snake", (128, 128, 4, 3)),
                  ("pp", (128, 128, 4, 2))],
    (64, False): [("plain", (128, 128, 8, 3)), ("pp", (128, 128, 4, 2))],
    (64, True): [("pp", (128, 128, 4, 3)), ("pp_nosnake", (128, 128, 4, 3)), ("pp_rev", (128, 128, 4, 3))],
    (80, False): [("pp", (128, 128, 4, 3)), ("pp", (128, 128, 4, 4)), ("pp", (128, 128, 4, 2))],
    (80, True): [("pp", (128, 128, 4, 3)), ("pp_nosnake", (128, 128, 4, 3)), ("pp", (128, 128, 4, 4))],
}


def make(b, h, hk, n, d, dtype, layout, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    def one(heads):
        if layout == "bnhd":  # a (B, H, N, D) view of (B, N, H, D) memory, as a model's projection
            return torch.randn(b, n, heads, d, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        return torch.randn(b, heads, n, d, device="cuda", dtype=dtype, generator=g)
    return one(h), one(hk), one(hk)


def check(variants, log, override=None, dims=(64, 128)) -> list[dict]:
    from lmperf.kernels import flash_attention_gluon as fg
    from lmperf.kernels.attention_contract import reference, tolerance
    rows = []
    cases = []
    for variant in variants:
        for d in dims:
            if d not in (64, 128) and not variant.startswith("pp"):
                continue  # other head dims: the ping-pong variant only
            for causal in (False, True):
                for n in (1, 17, 128, 1000, 4099):
                    cases += [(variant, d, causal, n, BF16, "bhnd", 2, 3, 3),
                              (variant, d, causal, n, BF16, "bnhd", 2, 4, 2),
                              (variant, d, causal, n, FP16, "bhnd", 1, 4, 1)]
                    if causal and n in (17, 1000):  # more than one group of 16 sequences
                        cases.append((variant, d, causal, n, BF16, "bhnd", 5, 8, 4))
    for i, (variant, d, causal, n, dtype, layout, b, h, hk) in enumerate(cases):
        row = dict(variant=variant, d=d, causal=causal, n=n, dtype=str(dtype).replace("torch.", ""),
                   layout=layout, b=b, h=h, hk=hk)
        try:
            q, k, v = make(b, h, hk, n, d, dtype, layout, seed=1000 + i)
            why = fg.unsupported(q, k, v, causal)
            if why:
                raise RuntimeError(f"refused: {why}")
            base = variant.split("_")[0]
            _knobs(fg, variant)
            cfg = override.get(d, fg.config(d, causal, base)) if override else fg.config(d, causal, base)
            q4 = q
            out = q.new_empty_strided((b, h, n, d), (n * h * d, d, h * d, 1)).fill_(float("nan"))
            lse = torch.full((b * h, n), float("nan"), device="cuda")
            fg.launch_forward(q, k, v, out, lse, causal, base, cfg)
            out2 = torch.full_like(out, float("nan"))
            lse2 = torch.full_like(lse, float("nan"))
            fg.launch_forward(q, k, v, out2, lse2, causal, base, cfg)
            torch.cuda.synchronize()
            ref_o, ref_l = reference(q4, k, v, causal)
            t_o, t_l = reference(q4, k, v, causal, dtype=dtype)
            err = lambda x, r: float((x.double() - r.double()).abs().max()) if torch.isfinite(x).all() else float("inf")
            o_err, o_terr = err(out, ref_o), err(t_o, ref_o)
            l_err, l_terr = err(lse.view(b, h, n), ref_l), err(t_l, ref_l)
            o_tol, l_tol = tolerance(o_terr, dtype), tolerance(l_terr, dtype)
            same = bool(torch.equal(out, out2) and torch.equal(lse, lse2))
            row.update(cfg=str(cfg), o_err=o_err, o_tol=o_tol, l_err=l_err, l_tol=l_tol, deterministic=same,
                       passed=bool(o_err <= o_tol and l_err <= l_tol and same), error="")
        except Exception as exc:  # noqa: BLE001 - a failure is a row
            row.update(passed=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            log.write(traceback.format_exc() + "\n")
        rows.append(row)
        if not row["passed"]:
            print("CHECK FAIL", row, flush=True)
    _knobs(fg, "")
    return rows


def compile_check(log) -> list[dict]:
    """torch.compile (fullgraph, Inductor) around FlashAttention2Triton.apply against eager mode,
    for each forced backend and two ways of making the gradient: the max abs difference of the
    output and of each gradient (0 = the same bits)."""
    import os
    import torch._dynamo
    from lmperf.kernels import flash_attention_triton as ft
    rows = []
    for backend in ("triton", "gluon"):
        for loss in ("sum", "float_sum"):
            for causal in (False, True):
                os.environ["LMPERF_FA_BACKEND"] = backend
                torch._dynamo.reset()
                row = dict(backend=backend, loss=loss, causal=causal)
                try:
                    apply = ft.FlashAttention2Triton.apply
                    compiled = torch.compile(apply, fullgraph=True)
                    g = torch.Generator(device="cuda").manual_seed(3)
                    q = torch.randn(2, 4, 700, 64, device="cuda", dtype=BF16, generator=g)
                    k, v = (torch.randn(2, 2, 700, 64, device="cuda", dtype=BF16, generator=g) for _ in range(2))
                    res = []
                    for fn in (compiled, apply):
                        xs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                        out = fn(*xs, causal)
                        (out.float().sum() if loss == "float_sum" else out.sum()).backward()
                        res.append([out] + [t.grad for t in xs])
                    for name, a, b in zip(("out", "dq", "dk", "dv"), *res):
                        row[name] = float((a.float() - b.float()).abs().max())
                    row["error"] = ""
                except Exception as exc:  # noqa: BLE001
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    log.write(traceback.format_exc() + "\n")
                finally:
                    os.environ.pop("LMPERF_FA_BACKEND", None)
                print("compile vs eager", row, flush=True)
                rows.append(row)
    return rows


def _knobs(fg, label: str) -> None:
    """A variant label's suffix sets the module's knobs: _snake/_nosnake/_rev the causal schedule
    (fg.SNAKE_CAUSAL 1, 0, 2), _regs240 the second consumer warpgroup's registers; none: the defaults."""
    from lmperf.kernels import flash_attention_triton as ft
    suffix = label.split("_")[-1]
    fg.SNAKE_CAUSAL = {"snake": 1, "nosnake": 0, "rev": 2}.get(suffix)
    fg.PP_REGS = 240 if suffix == "regs240" else 232
    ft.clear_plans()  # plans (LMPERF_FA_LAUNCH=plan) replay the knobs they were recorded under


def flops(b, h, n, d, causal):
    f = 4.0 * b * h * n * n * d
    return f / 2 if causal else f


def bench(names, variants, log, out_csv=None, passes=1, graph=False) -> list[dict]:
    import torch.nn.functional as F
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from lmperf.kernels import flash_attention_gluon as fg
    from lmperf.kernels import flash_attention_triton as ft
    rows = []
    for pass_, name in [(p, nm) for p in range(passes) for nm in names]:
        b, h, hk, n, d, causal = SHAPES[name]
        q, k, v = make(b, h, hk, n, d, BF16, "bhnd", seed=7)
        fl = flops(b, h, n, d, causal)
        impls = [("triton_tile", "rule", lambda: ft.forward_with_lse(q, k, v, causal))]  # the tile kernel's op
        def gl_fn(vv, cc):
            def fn():
                _knobs(fg, vv)
                try:
                    return fg.forward(q, k, v, causal, vv.split("_")[0], cc)
                finally:
                    _knobs(fg, "")
            return fn
        for variant, cfg in CANDIDATES[(d, causal)]:
            if variant.split("_")[0] in variants:
                impls.append((f"gluon_{variant}", cfg, gl_fn(variant, cfg)))
        def auto():  # the dispatch as users call it (no grad): Gluon where its rule picks it
            with torch.no_grad():
                return ft.FlashAttention2Triton.apply(q, k, v, causal)
        impls.append(("dispatch_auto", f"gluon={fg.use_gluon(q, k, v, causal, 'auto')}", auto))
        outb = q.new_empty(q.shape)
        lseb = torch.empty((b * h, n), dtype=torch.float32, device="cuda")
        gqa = h != hk
        for label, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def fn(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            impls.append((label, "", fn))
        impls.append(("sdpa_cudnn_again", "", impls[-2][2]))
        ref = None
        for label, cfg, fn in impls:
            row = dict(shape=name, b=b, h=h, hk=hk, n=n, d=d, causal=causal, impl=label, cfg=str(cfg), pass_=pass_)
            try:
                o = fn()
                o = o[0] if isinstance(o, tuple) else o
                torch.cuda.synchronize()
                if ref is None:
                    ref = o.float()
                diff = float((o.float() - ref).abs().max())
                q20, q50, q80 = triton.testing.do_bench(fn, warmup=25, rep=200, quantiles=[0.2, 0.5, 0.8])
                row.update(ms_p20=q20, ms_median=q50, ms_p80=q80, tflops=fl / (q50 * 1e-3) / 1e12,
                           max_diff_vs_tile=diff, error="")
                if graph:  # GPU time: the calls replayed from a CUDA graph (no host in the loop)
                    row["graph_ms"] = triton.testing.do_bench_cudagraph(fn, rep=100)
                if label.startswith("gluon"):  # this config's compiled kernel
                    _knobs(fg, label)
                    kk = fg.launch_forward(q, k, v, outb, lseb, causal, label.split("_")[1], cfg)
                    _knobs(fg, "")
                    row["regs_spills"] = f"{getattr(kk, 'n_regs', '?')}/{getattr(kk, 'n_spills', '?')}"
            except Exception as exc:  # noqa: BLE001
                row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                log.write(traceback.format_exc() + "\n")
            rows.append(row)
            print(f"{name:11s} {label:17s} {str(cfg):20s} "
                  + (f"{row['ms_median']:.3f} ms {row['tflops']:.0f} TFLOP/s diff {row['max_diff_vs_tile']:.2e}"
                     if not row["error"] else row["error"][:200]), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
        if out_csv is not None:  # as it goes: a later hang keeps what was measured
            write(out_csv, rows)
    return rows


REP_MS = 100  # do_bench's time per implementation (ms)
BWD_SHAPES = {  # name: (batch, q heads, kv heads, N, D, causal)
    "headline": (1, 16, 16, 16384, 64, True),
    "thr_full": (4, 16, 16, 8192, 128, False),
    "thr_causal": (4, 16, 16, 8192, 128, True),
    "d128_full_2048": (4, 16, 16, 2048, 128, False),  # non-causal head dim 128 below the throughput shape
    "d128_full_4096": (4, 16, 16, 4096, 128, False),
    "gqa_8192": (2, 32, 8, 8192, 128, True),
    "gqa_4096": (4, 32, 8, 4096, 128, True),
    "d128_4096_32h": (4, 32, 32, 4096, 128, True),  # gqa_4096's work without grouped-query (its K/V heads = its Q heads)
    "d128_2048": (8, 16, 16, 2048, 128, True),
    "d64_full": (4, 16, 16, 8192, 64, False),
    "gqa_d64_1024": (8, 16, 4, 1024, 64, True),
    "gqa_d64_512": (8, 16, 4, 512, 64, True),
    "gqa_d64_2048": (8, 16, 4, 2048, 64, True),
    "gqa_2048": (4, 32, 8, 2048, 128, True),
    "gqa_64q_8192": (1, 64, 8, 8192, 128, True),
    "xl_2048": (4, 25, 25, 2048, 64, True),
    "d64_1024": (4, 16, 16, 1024, 64, True),  # the model group's 1,024-row shape at head dim 64
    "d128_1024": (4, 16, 16, 1024, 128, True),  # and at head dim 128
    "d128_1536": (4, 16, 16, 1536, 128, True),
    "assign64": (16, 1, 1, 1024, 64, True),  # the assignment's (16, 1,024, D): one head a sequence
    "assign128": (16, 1, 1, 1024, 128, True),
    "grid_d128_4096": (1, 1, 1, 4096, 128, True),  # the assignment's grid: one sequence (32 key tiles)
    "d80_2048": (4, 32, 32, 2048, 80, True),  # the 2.7B model's attention
    "d80_causal": (4, 16, 16, 8192, 80, True),
    "d80_full": (4, 16, 16, 8192, 80, False),
    "grid4096": (1, 1, 1, 4096, 128, True),  # the assignment's grid at 4,096 rows (one head)
    "grid8192": (1, 1, 1, 8192, 128, True),
    "grid16384": (1, 1, 1, 16384, 128, True),
    "grid4096_64": (1, 1, 1, 4096, 64, True),
    "grid16384_64": (1, 1, 1, 16384, 64, True),
    "grid2048": (1, 1, 1, 2048, 128, True),
    "grid32768": (1, 1, 1, 32768, 128, True),
    "grid65536": (1, 1, 1, 65536, 128, True),
    "grid65536_64": (1, 1, 1, 65536, 64, True),
    "h2_16384": (1, 2, 2, 16384, 128, True),  # a few sequences: between the grid's one and the model group's
    "h4_16384": (1, 4, 4, 16384, 128, True),
    "h8_8192": (1, 8, 8, 8192, 128, True),
    "h2_16384_64": (1, 2, 2, 16384, 64, True),
    "h4_16384_64": (1, 4, 4, 16384, 64, True),
    "h8_16384_64": (1, 8, 8, 16384, 64, True),
    "d80_grid4096": (1, 1, 1, 4096, 80, True),  # head dim 80 below 1,024 query tiles
    "d80_h4_16384": (1, 4, 4, 16384, 80, True),
    "d80_h8_8192": (1, 8, 8, 8192, 80, True),
    "d80_2x16_2048": (2, 16, 16, 2048, 80, True),
    "d64_4096": (8, 16, 16, 4096, 64, True),
    "d64_8192": (4, 16, 16, 8192, 64, True),
}


def _bwd_inputs(q, k, v, causal):
    """(O, L, dO, Delta) of the tile forward and the tile dQ kernel (which writes Delta)."""
    from lmperf.kernels import flash_attention_triton as ft
    nb, nh, n, d = q.shape
    out, lse = ft.forward_with_lse(q, k, v, causal)
    do = torch.randn_like(q)
    lse2 = lse.reshape(nb * nh, n).contiguous()
    delta = torch.empty_like(lse2)
    dq = torch.empty_like(q)
    cfg = ft.launch_bwd_config(n, d, q.dtype, causal, nb * nh, nh // k.shape[1])
    ft.launch_backward_dq(q, k, v, out, do, lse2, delta, dq, causal, cfg)
    return out, lse2, do, delta, cfg


def bwd_check(log, ns=(128, 384, 1152, 4096), dims=(64, 128), fused=False, schedule=None, fused_kw=None) -> list[dict]:
    """dQ (and Delta) of the Gluon dQ kernel, then dK, dV of the Gluon dK/dV kernel from that Delta
    (fused: dQ, dK, dV of the fused kernel at its schedule `schedule` (None: the launcher's; 2: causal
    cases only), three runs), against float64 (autograd of the float64
    reference), beside plain PyTorch in the same dtype; outputs NaN-poisoned before each run, the
    runs compared bit for bit."""
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    from lmperf.kernels import flash_attention_gluon_fused as gf
    from lmperf.kernels.attention_contract import reference, tolerance
    rows = []
    cases = []
    for d in dims:
        for causal in ((True,) if schedule == 2 else (False, True)):
            for n in ns:
                cases += [(d, causal, n, BF16, "bhnd", 2, 3, 3), (d, causal, n, BF16, "bnhd", 2, 8, 2),
                          (d, causal, n, FP16, "bhnd", 1, 4, 1)]
    for i, (d, causal, n, dtype, layout, b, h, hk) in enumerate(cases):
        row = dict(d=d, causal=causal, n=n, dtype=str(dtype).replace("torch.", ""), layout=layout, b=b, h=h, hk=hk,
                   schedule="" if schedule is None else schedule)
        try:
            q, k, v = make(b, h, hk, n, d, dtype, layout, seed=2000 + i)
            if (why := (gf if fused else gb).unsupported(q, k, v, causal)) is not None:
                raise RuntimeError(f"refused: {why}")
            out, lse, do, delta, _ = _bwd_inputs(q, k, v, causal)
            res = []
            for _ in range(3 if fused else 2):
                if fused:
                    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
                    gf.launch(q, k, v, out, do, lse, dq, dk, dv, causal, schedule=schedule, **(fused_kw or {}))
                    res.append((dq, dk, dv, delta))
                    continue
                dq = torch.full_like(q, float("nan"))
                delta_g = torch.full_like(delta, float("nan"))
                gb.launch_dq(q, k, v, out, do, lse, delta_g, dq, causal)
                dk = torch.full_like(k, float("nan"))
                dv = torch.full_like(v, float("nan"))
                gb.launch_dkdv(q, k, v, do, lse, delta_g, dk, dv, causal)
                res.append((dq, dk, dv, delta_g))
            torch.cuda.synchronize()
            grads = {}
            for name, dt in (("ref", torch.float64), ("torch", dtype)):
                xs = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
                o, _ = reference(*xs, causal, dtype=dt)
                o.backward(do.to(dt))
                grads[name] = (xs[0].grad, xs[1].grad, xs[2].grad)
            err = lambda x, r: float((x.double() - r.double()).abs().max()) if torch.isfinite(x).all() else float("inf")
            ok = True
            for j, qn in enumerate(("dq", "dk", "dv")):
                e, te = err(res[0][j], grads["ref"][j]), err(grads["torch"][j], grads["ref"][j])
                tol = tolerance(te, dtype)
                row.update({f"{qn}_err": e, f"{qn}_torch_err": te, f"{qn}_tol": tol})
                ok &= e <= tol
            want_delta = (out.double() * do.double()).sum(-1).reshape(delta.shape)
            row["delta_rel_err"] = err(res[0][3], want_delta) / float(want_delta.abs().max())
            ok &= row["delta_rel_err"] <= 1e-4
            same = all(torch.equal(a, b2) for r in res[1:] for a, b2 in zip(res[0], r))
            row.update(deterministic=same, passed=bool(ok and same), error="")
        except Exception as exc:  # noqa: BLE001 - a failure is a row
            row.update(passed=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            log.write(traceback.format_exc() + "\n")
        rows.append(row)
        if not row["passed"]:
            print("BWD CHECK FAIL", row, flush=True)
    return rows


def _gpu_ms(fn, reps=10, parts=None) -> float:
    """Kernel time per call (ms): the sum of the GPU kernels' durations under the profiler, / reps;
    parts (a dict): each kernel's name (its first 96 characters) to its us per call, added to."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]  # self: each kernel once
    if parts is not None:
        for e in events:
            parts[e.key[:96]] = parts.get(e.key[:96], 0.0) + e.self_device_time_total / reps
    return sum(e.self_device_time_total for e in events) / reps / 1e3


def bwd_bench(names, log, out_csv=None, tag="", only_impls=None) -> list[dict]:
    """The backward at each shape: autograd.grad of one forward (ours: all Gluon, Gluon dK/dV after
    the tile dQ, or all tile; SDPA-cuDNN; SDPA-flash), the two dQ kernels and the Gluon dK/dV kernel
    alone, and forward + backward (fb_: ours all Gluon or all tile, cuDNN, flash). tflops counts
    the work each does: the backward's five matmuls, the dQ kernel's three, dK/dV's four, forward +
    backward's seven."""
    import os
    import torch.nn.functional as F
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from lmperf.kernels import flash_attention_gluon as fg
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    from lmperf.kernels import flash_attention_gluon_fused as gf
    from lmperf.kernels import flash_attention_triton as ft
    default_schedule, launch = gf.default_schedule, gf.launch
    configs = dict(gf.CONFIGS)
    # the fused kernel's head-dim knobs as shipped, restored after every implementation that sets one
    dims_knobs = {knob: getattr(gf, knob) for knob in ("PERSISTENT_DIMS", "PEEL_DIMS", "DEFER_DIMS", "WHOLE_DIMS",
                                                        "TRIM_DIMS")}
    rows = []
    for name in names:
        b, h, hk, n, d, causal = BWD_SHAPES[name]
        fl = 2.5 * flops(b, h, n, d, causal)  # the backward's five matmuls (the forward's two x 2.5)
        q, k, v = make(b, h, hk, n, d, BF16, "bhnd", seed=11)
        xs = [t.detach().requires_grad_() for t in (q, k, v)]
        do = torch.randn_like(q)
        gqa = h != hk

        def sdpa(backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*xs, is_causal=causal, enable_gqa=gqa)

        def ours():
            return ft.FlashAttention2Triton.apply(*xs, causal)

        def grad_of(make_out, env=None):
            if env is not None:
                os.environ["LMPERF_FA_BWD_BACKEND"] = env
            out = make_out()
            return lambda: torch.autograd.grad(out, xs, do, retain_graph=True)

        def fwd_bwd(make_out, env=None):  # forward + backward, as a training step calls them
            if env is not None:
                os.environ["LMPERF_FA_BWD_BACKEND"] = env
            return lambda: torch.autograd.grad(make_out(), xs, do)

        def fwd_at(backend, setup):  # the forward's backend forced (LMPERF_FA_BACKEND; restored after)
            os.environ["LMPERF_FA_BACKEND"] = backend
            ft.clear_plans()
            return setup()

        def plain_compiled():  # the grid's peer, as the benchmark builds it (providers' plain_compiled)
            from lmperf import providers
            fn, _ = providers.get("plain_compiled").build({"causal": causal})
            return lambda: fn(*xs)

        def at_schedule(schedule, setup):  # the fused kernel at _turns' SCHEDULE `schedule` (restored after)
            gf.default_schedule = lambda *a: schedule
            ft.clear_plans()  # a plan replays the launches of the schedule it was made at
            return setup()

        def fwd_gluon_at(snake, setup):  # the Gluon forward forced, at causal schedule `snake` (restored after)
            os.environ["LMPERF_FA_BACKEND"] = "gluon"
            fg.SNAKE_CAUSAL = snake
            ft.clear_plans()
            return setup()

        def at_config(d, setup, **changes):  # the fused kernel's CONFIGS[d] with `changes` (restored after)
            stages, consumer_regs, block_m, writer_regs, writer_warps = configs[d]
            cfg = dict(stages=stages, consumer_regs=consumer_regs, block_m=block_m, writer_regs=writer_regs,
                       writer_warps=writer_warps)
            cfg.update(changes)
            gf.CONFIGS[d] = tuple(cfg.values())
            ft.clear_plans()
            return setup()

        def persistent_at(d, setup):  # the fused kernel persistent at head dim d, schedule 0 (restored after)
            gf.PERSISTENT_DIMS = (d,)
            gf.default_schedule = lambda *args: 0
            ft.clear_plans()
            return setup()

        def dims_at(knob, dims, setup):  # a head-dim knob of the fused kernel (PEEL_DIMS, DEFER_DIMS) at dims, restored
            setattr(gf, knob, dims)
            ft.clear_plans()
            return setup()

        def at_launch(kw, setup):  # the fused kernel's launch with keywords kw (restored after)
            gf.launch = lambda *a, **k: launch(*a, **(kw | k))
            ft.clear_plans()
            return setup()

        def deterministic(setup):  # PyTorch's deterministic algorithms on around each call (restored after)
            fn = setup()

            def call():
                torch.use_deterministic_algorithms(True)
                try:
                    return fn()
                finally:
                    torch.use_deterministic_algorithms(False)
            return call

        def head_at(whole, trim, setup):  # the causal kernel's WHOLE_DIMS and TRIM_DIMS both set (restored after)
            return dims_at("WHOLE_DIMS", (d,) if whole else (),
                           lambda: dims_at("TRIM_DIMS", (d,) if trim else (), setup))

        out_t, lse, do_, delta, cfg = _bwd_inputs(q, k, v, causal)
        dq_g, dq_t, delta_g, delta_t = torch.empty_like(q), torch.empty_like(q), torch.empty_like(delta), torch.empty_like(delta)
        dk_g, dv_g = torch.empty_like(k), torch.empty_like(v)
        impls = [
            ("ours_tile", lambda: grad_of(ours, "triton")),
            ("ours_gluon", lambda: grad_of(ours, "gluon")),
            ("ours_gluon_dkdv", lambda: grad_of(ours, "gluon-dkdv")),
            ("ours_gluon_fused", lambda: grad_of(ours, "gluon-fused")),
            ("ours_gluon_fused_peel", lambda: dims_at("PEEL_DIMS", (d,), lambda: grad_of(ours, "gluon-fused"))),
            ("ours_gluon_fused_defer", lambda: dims_at("DEFER_DIMS", (d,), lambda: grad_of(ours, "gluon-fused"))),
            ("ours_gluon_fused_nodefer", lambda: dims_at("DEFER_DIMS", (), lambda: grad_of(ours, "gluon-fused"))),
            ("sdpa_cudnn", lambda: grad_of(lambda: sdpa(SDPBackend.CUDNN_ATTENTION))),
            ("sdpa_flash", lambda: grad_of(lambda: sdpa(SDPBackend.FLASH_ATTENTION))),
            ("dq_gluon_alone", lambda: (lambda: gb.launch_dq(q, k, v, out_t, do_, lse, delta_g, dq_g, causal))),
            ("dq_tile_alone", lambda: (lambda: ft.launch_backward_dq(q, k, v, out_t, do_, lse, delta_t, dq_t,
                                                                     causal, cfg))),
            ("dkdv_gluon_alone", lambda: (lambda: gb.launch_dkdv(q, k, v, do_, lse, delta, dk_g, dv_g, causal))),
            ("fb_ours_auto", lambda: fwd_bwd(ours)),  # the default ("auto"): its kernels in the row
            ("fb_ours_gluon", lambda: fwd_bwd(ours, "gluon")),
            ("fb_ours_tile", lambda: fwd_bwd(ours, "triton")),
            ("fb_ours_gluon_fused", lambda: fwd_bwd(ours, "gluon-fused")),
            # the forward's backend forced as well: every kernel of one language
            ("fb_ours_all_tile", lambda: fwd_at("triton", lambda: fwd_bwd(ours, "triton"))),
            ("fb_ours_all_gluon", lambda: fwd_at("gluon", lambda: fwd_bwd(ours, "gluon"))),
            ("fb_plain_compiled", lambda: fwd_bwd(plain_compiled())),
            ("fw_ours_auto", lambda: ours),  # the forward alone, inputs requiring grad
            ("fw_ours_tile", lambda: fwd_at("triton", lambda: ours)),
            ("fw_ours_gluon", lambda: fwd_at("gluon", lambda: ours)),
            ("fw_sdpa_cudnn", lambda: lambda: sdpa(SDPBackend.CUDNN_ATTENTION)),
            ("fw_plain_compiled", plain_compiled),
            ("fb_sdpa_cudnn", lambda: fwd_bwd(lambda: sdpa(SDPBackend.CUDNN_ATTENTION))),
            ("fb_sdpa_flash", lambda: fwd_bwd(lambda: sdpa(SDPBackend.FLASH_ATTENTION))),
            *[(f"{fb}ours_gluon_fused_s{sch}", lambda sch=sch, f=(fwd_bwd if fb else grad_of):
               at_schedule(sch, lambda: f(ours, "gluon-fused"))) for fb in ("", "fb_") for sch in (0, 1, 2)],
            # the Gluon forward forced, odd rounds reversed (the backward as "auto" picks it)
            ("fb_ours_fwd_gluon_rev", lambda: fwd_gluon_at(2, lambda: fwd_bwd(ours))),
            # "auto" with the fused kernel's writer at 24 registers
            ("fb_ours_auto_w24", lambda: at_config(d, lambda: fwd_bwd(ours), writer_regs=24)),
            # "auto" with the fused kernel's writer the default partition (both consumers workers, 232 registers)
            ("fb_ours_auto_wd", lambda: at_config(d, lambda: fwd_bwd(ours), **gf.WRITER_FIRST)),
            ("fb_ours_auto_cf", lambda: at_config(d, lambda: fwd_bwd(ours), **gf.CONSUMER_FIRST)),
            ("fb_ours_auto_persist", lambda: persistent_at(d, lambda: fwd_bwd(ours))),
            # non-causal: first steps peeled; the dQ shares stored a step late; both
            ("fb_ours_auto_peel", lambda: dims_at("PEEL_DIMS", (d,), lambda: fwd_bwd(ours))),
            ("fb_ours_auto_defer", lambda: dims_at("DEFER_DIMS", (d,), lambda: fwd_bwd(ours))),
            ("fb_ours_auto_nodefer", lambda: dims_at("DEFER_DIMS", (), lambda: fwd_bwd(ours))),
            ("fb_ours_auto_peel_defer", lambda: dims_at("PEEL_DIMS", (d,),
                                                        lambda: dims_at("DEFER_DIMS", (d,), lambda: fwd_bwd(ours)))),
            # the causal kernel's head whole or in slices (WHOLE_DIMS) and its first step's all-masked half
            # skipped or not (TRIM_DIMS), both set whatever the shipped defaults: "auto", and the fused kernel
            # forced, with the head whole untrimmed, at grouped-query's schedules
            ("ours_auto", lambda: grad_of(ours)),
            *[(f"{fb}ours_auto_{name}", lambda whole=whole, trim=trim, f=(fwd_bwd if fb else grad_of):
               head_at(whole, trim, lambda: f(ours)))
              for fb in ("", "fb_") for name, whole, trim in (("slices", False, False), ("trim", False, True),
                                                              ("whole", True, False), ("whole_trim", True, True))],
            *[(f"{fb}ours_gluon_fused_whole", lambda f=(fwd_bwd if fb else grad_of):
               head_at(True, False, lambda: f(ours, "gluon-fused"))) for fb in ("", "fb_")],
            *[(f"{fb}ours_gluon_fused_s{sch}_whole", lambda sch=sch, f=(fwd_bwd if fb else grad_of):
               head_at(True, False, lambda: at_schedule(sch, lambda: f(ours, "gluon-fused"))))
              for fb in ("", "fb_") for sch in (0, 1, 2)],
            # causal at schedule 1, its last sequences key tile by key tile (TAIL_DIMS; launch's `tail`: 0 none)
            *[(f"{fb}ours_auto_tail{n}", lambda n=n, f=(fwd_bwd if fb else grad_of):
               at_launch(dict(tail=n), lambda: f(ours)))
              for fb in ("", "fb_") for n in (0, 4, 8, 12, 16, 24, 32, 48)],
            # what the fixed order of the dQ sums costs: the fused kernel's turns skipped (probe 1: its shares
            # added in L2 as they come, as atomic adds would be; timing only, the sums race), and the peers'
            # backward with PyTorch's deterministic algorithms on (SDPA-flash's deterministic backward; the
            # backward alone takes its forward before the mode is set, which for cuDNN is its usual backward
            # plus the mode's fills: the mode refuses cuDNN's attention, `--determinism`)
            *[(f"{fb}ours_auto_p1", lambda f=(fwd_bwd if fb else grad_of): at_launch(dict(probe=1), lambda: f(ours)))
              for fb in ("", "fb_")],
            *[(f"{fb}sdpa_{backend.name.split('_')[0].lower()}_det", lambda backend=backend, f=(fwd_bwd if fb else grad_of):
               deterministic(lambda: f(lambda: sdpa(backend))))
              for fb in ("", "fb_") for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION)],
            ("ours_gluon_again", lambda: grad_of(ours, "gluon")),
            ("sdpa_cudnn_again", lambda: grad_of(lambda: sdpa(SDPBackend.CUDNN_ATTENTION))),
        ]
        if only_impls:  # in the order asked for (what runs before in a process moves the times: NOTES step 58)
            by_label = dict(impls)
            impls = [(label, by_label[label]) for label in only_impls if label in by_label]
        ref = None
        for label, setup in impls:
            row = dict(shape=name, b=b, h=h, hk=hk, n=n, d=d, causal=causal, impl=label, tag=tag,
                       gpu=torch.cuda.get_device_name())
            try:
                if label == "fb_ours_auto":
                    row["kernels"] = ft.kernels(q, k, v, causal)
                fn = setup()
                g = fn()
                torch.cuda.synchronize()
                if isinstance(g, tuple):
                    if label == "ours_tile":
                        ref = [t.float() for t in g]
                    row["max_diff_vs_tile"] = "" if ref is None else max(float((a.float() - r).abs().max())
                                                                       for a, r in zip(g, ref))
                q20, q50, q80 = triton.testing.do_bench(fn, warmup=10, rep=REP_MS, quantiles=[0.2, 0.5, 0.8])
                work = {"dq": 0.6 * fl, "dk": 0.8 * fl, "fb": 1.4 * fl, "fw": 0.4 * fl}.get(label[:2], fl)  # 3U, 4U, 7U of 5U
                parts = {}
                row.update(ms_p20=q20, ms_median=q50, ms_p80=q80, gpu_ms=_gpu_ms(fn, 5, parts),
                           tflops=work / (q50 * 1e-3) / 1e12, error="",
                           gpu_us_by_kernel=";".join(f"{k.replace(';', ' ')}={us:.1f}" for k, us in
                                                     sorted(parts.items(), key=lambda kv: -kv[1])))
            except Exception as exc:  # noqa: BLE001
                row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                log.write(traceback.format_exc() + "\n")
            finally:
                os.environ.pop("LMPERF_FA_BWD_BACKEND", None)
                if os.environ.pop("LMPERF_FA_BACKEND", None) is not None or fg.SNAKE_CAUSAL is not None:
                    fg.SNAKE_CAUSAL = None
                    ft.clear_plans()
                if (gf.default_schedule is not default_schedule or gf.launch is not launch or gf.CONFIGS != configs
                        or any(getattr(gf, knob) != dims for knob, dims in dims_knobs.items())):
                    gf.default_schedule, gf.launch = default_schedule, launch
                    gf.CONFIGS.update(configs)
                    for knob, dims in dims_knobs.items():
                        setattr(gf, knob, dims)
                    ft.clear_plans()
            rows.append(row)
            print(f"{name:10s} {label:22s} " + (f"{row['ms_median']:.3f} ms (p20 {row['ms_p20']:.3f} p80 "
                  f"{row['ms_p80']:.3f}) gpu {row['gpu_ms']:.3f} ms" if not row["error"] else row["error"][:200]),
                  flush=True)
        del q, k, v, xs, do
        torch.cuda.empty_cache()
        if out_csv is not None:
            write(out_csv, rows)
    return rows


def fused_ladder(names, log, out_csv=None, tag="", configs=("",), probes=(0, 1, 2, "s0"), rounds=1) -> list[dict]:
    """The fused backward kernel alone against the two Gluon kernels (dQ then dK/dV) at each shape,
    do_bench's median: the fused kernel as shipped (probe 0), without its turns (1: the sums race,
    a bound on the writer's traffic), with its dQ shares dropped (2: a bound on the rest), and
    with _turns' schedule forced ("s0": the programs of all sequences interleaved, "s1": a sequence's
    key tiles together; "s1p1": schedule 1 at probe 1), in `rounds` interleaved rounds;
    configs: "STAGES,consumer regs,writer regs,writer warps" overrides ("" the table's; writer warps 4: the
    writer the default partition, both consumers workers)."""
    import triton.testing
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    from lmperf.kernels import flash_attention_gluon_fused as gf
    rows = []
    for name in names:
        b, h, hk, n, d, causal = BWD_SHAPES[name]
        fl = 2.5 * flops(b, h, n, d, causal)
        q, k, v = make(b, h, hk, n, d, BF16, "bhnd", seed=11)
        out, lse, do, delta, _ = _bwd_inputs(q, k, v, causal)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        impls = [("two_kernels", lambda: (gb.launch_dq(q, k, v, out, do, lse, delta, dq, causal),
                                          gb.launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal)))]
        for cfg in configs:
            keys = ("stages", "consumer_regs", "writer_regs", "writer_warps")
            kw = dict(zip(keys, map(int, cfg.split(",")))) if cfg else {}
            for probe in probes:
                if isinstance(probe, str):  # "sN": _turns' SCHEDULE N forced ("sNpM": at probe M)
                    sch, _, pr = probe[1:].partition("p")
                    impls.append((f"fused_p{pr or 0}_schedule{sch}{'_' + cfg if cfg else ''}",
                                  lambda kw=kw, sch=int(sch), pr=int(pr or 0): gf.launch(
                                      q, k, v, out, do, lse, dq, dk, dv, causal, schedule=sch, probe=pr, **kw)))
                    continue
                impls.append((f"fused_p{probe}{'_' + cfg if cfg else ''}",
                              lambda probe=probe, kw=kw: gf.launch(q, k, v, out, do, lse, dq, dk, dv, causal, probe=probe, **kw)))
        for round_, (label, fn) in [(r, i) for r in range(rounds) for i in impls]:
            row = dict(shape=name, b=b, h=h, hk=hk, n=n, d=d, causal=causal, impl=label, tag=tag, round=round_)
            try:
                fn()
                torch.cuda.synchronize()
                q20, q50, q80 = triton.testing.do_bench(fn, warmup=10, rep=REP_MS, quantiles=[0.2, 0.5, 0.8])
                row.update(ms_p20=q20, ms_median=q50, ms_p80=q80, tflops=fl / (q50 * 1e-3) / 1e12, error="")
            except Exception as exc:  # noqa: BLE001
                row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                log.write(traceback.format_exc() + "\n")
            rows.append(row)
            print(f"{name:10s} {label:28s} " + (f"{row['ms_median']:.3f} ms {row['tflops']:.0f} TFLOP/s"
                                                if not row["error"] else row["error"][:200]), flush=True)
        if out_csv is not None:
            write(out_csv, rows)
    return rows


def bwd_determinism(names, log, out_csv=None, tag="", runs=5) -> list[dict]:
    """Is each backward bitwise the same run to run? At each shape, dQ, dK and dV of `runs` backward
    passes of one forward (the same inputs, the same dO), as each implementation computes them: ours
    ("auto"), SDPA-cuDNN and SDPA-flash as SDPA calls them and with PyTorch's deterministic algorithms
    on. `distinct_*`: how many different bit patterns the runs gave (1: deterministic on these runs)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from lmperf.kernels import flash_attention_triton as ft
    rows = []
    for name in names:
        b, h, hk, n, d, causal = BWD_SHAPES[name]
        q, k, v = make(b, h, hk, n, d, BF16, "bhnd", seed=23)
        xs = [t.detach().requires_grad_() for t in (q, k, v)]
        do = torch.randn_like(q)
        impls = [("ours_auto", None, False), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION, False),
                 ("sdpa_cudnn_det", SDPBackend.CUDNN_ATTENTION, True),
                 ("sdpa_flash", SDPBackend.FLASH_ATTENTION, False),
                 ("sdpa_flash_det", SDPBackend.FLASH_ATTENTION, True)]
        for label, backend, det in impls:
            row = dict(shape=name, b=b, h=h, hk=hk, n=n, d=d, causal=causal, impl=label, runs=runs, tag=tag,
                       gpu=torch.cuda.get_device_name(), error="")
            try:
                torch.use_deterministic_algorithms(det)
                if backend is None:
                    out = ft.FlashAttention2Triton.apply(*xs, causal)
                else:
                    with sdpa_kernel(backend):
                        out = F.scaled_dot_product_attention(*xs, is_causal=causal, enable_gqa=h != hk)
                grads = [torch.autograd.grad(out, xs, do, retain_graph=True) for _ in range(runs)]
                torch.cuda.synchronize()
                for i, part in enumerate(("dq", "dk", "dv")):
                    patterns = []  # one tensor of each bit pattern seen
                    for g in grads:
                        if not any(torch.equal(g[i].view(torch.int16), p) for p in patterns):
                            patterns.append(g[i].view(torch.int16))
                    row[f"distinct_{part}"] = len(patterns)
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                log.write(traceback.format_exc() + "\n")
            finally:
                torch.use_deterministic_algorithms(False)
            rows.append(row)
            print(f"{name:12s} {label:16s} " + (row["error"][:200] if row["error"] else
                  " ".join(f"{p} {row[f'distinct_{p}']}" for p in ("dq", "dk", "dv"))), flush=True)
        del q, k, v, xs, do
        torch.cuda.empty_cache()
        if out_csv is not None:
            write(out_csv, rows)
    return rows


BWD_SWEEP = {64: [(3, 232, 64), (3, 240, 128), (3, 232, 128), (2, 240, 128), (4, 240, 128)],
             128: [(3, 232, 64), (2, 232, 64), (4, 232, 64), (3, 240, 64)],
             80: [(3, 240, 64), (4, 240, 64), (2, 240, 64)]}  # (STAGES, registers, BLOCK_M)


def bwd_sweep(names, log, out_csv=None, tag="") -> list[dict]:
    """The Gluon dK/dV kernel alone at each (STAGES, registers, BLOCK_M) of BWD_SWEEP, interleaved twice;
    each result compared with the table config's (the same bits expected: the order of the sums
    does not depend on the ring's depth)."""
    import triton.testing
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    rows = []
    for name in names:
        b, h, hk, n, d, causal = BWD_SHAPES[name]
        fl = 2 * flops(b, h, n, d, causal)
        q, k, v = make(b, h, hk, n, d, BF16, "bhnd", seed=13)
        out, lse, do, delta, _ = _bwd_inputs(q, k, v, causal)
        ref = None
        for round_ in range(2):
            for stages, regs, bm in BWD_SWEEP[d]:
                row = dict(shape=name, b=b, h=h, hk=hk, n=n, d=d, causal=causal, stages=stages, regs=regs, block_m=bm,
                           round=round_, tag=tag, gpu=torch.cuda.get_device_name())
                try:
                    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
                    fn = lambda: gb.launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal, stages, regs,  # noqa: E731
                                                block_m=bm)
                    kern = fn()
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = (dk.clone(), dv.clone())
                    same = bool(torch.equal(dk, ref[0]) and torch.equal(dv, ref[1]))
                    q20, q50, q80 = triton.testing.do_bench(fn, warmup=25, rep=300, quantiles=[0.2, 0.5, 0.8])
                    row.update(ms_p20=q20, ms_median=q50, ms_p80=q80, tflops=fl / (q50 * 1e-3) / 1e12,
                               same_bits_as_table=same, regs_spills=f"{kern.n_regs}/{kern.n_spills}", error="")
                except Exception as exc:  # noqa: BLE001
                    row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                    log.write(traceback.format_exc() + "\n")
                rows.append(row)
                print(f"{name:10s} stages {stages} regs {regs} block_m {bm} " + (
                    f"{row['ms_median']:.3f} ms {row['tflops']:.0f} TFLOP/s same {row['same_bits_as_table']}"
                    if not row["error"] else row["error"][:200]), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
        if out_csv is not None:
            write(out_csv, rows)
    return rows


DQ_SWEEP = {64: [(3, 240, 128), (3, 240, 64), (2, 240, 128)],
            128: [(3, 240, 64), (2, 240, 128), (2, 240, 64)]}  # (STAGES, registers, BLOCK_N)


def dq_sweep(names, log, out_csv=None, tag="") -> list[dict]:
    """The Gluon dQ kernel alone at each (STAGES, registers, BLOCK_N) of DQ_SWEEP, interleaved twice,
    beside the tile dQ kernel; each result compared with the table config's (the bits may differ
    with BLOCK_N: the order of the sums over keys changes; they must not with STAGES)."""
    import triton.testing
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    from lmperf.kernels import flash_attention_triton as ft
    rows = []
    for name in names:
        b, h, hk, n, d, causal = BWD_SHAPES[name]
        fl = 1.5 * flops(b, h, n, d, causal)
        q, k, v = make(b, h, hk, n, d, BF16, "bhnd", seed=17)
        out, lse, do, delta, cfg = _bwd_inputs(q, k, v, causal)
        ref = None
        for round_ in range(2):
            for stages, regs, bn in DQ_SWEEP[d] + [("tile", "", "")]:
                row = dict(shape=name, b=b, h=h, hk=hk, n=n, d=d, causal=causal, stages=stages, regs=regs,
                           block_n=bn, round=round_, tag=tag, gpu=torch.cuda.get_device_name())
                try:
                    dq, dl = torch.full_like(q, float("nan")), torch.full_like(delta, float("nan"))
                    if stages == "tile":
                        fn = lambda: ft.launch_backward_dq(q, k, v, out, do, lse, dl, dq, causal, cfg)  # noqa: E731
                    else:
                        fn = lambda: gb.launch_dq(q, k, v, out, do, lse, dl, dq, causal, stages, regs,  # noqa: E731
                                                  block_n=bn)
                    fn()
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = dq.clone()
                    q20, q50, q80 = triton.testing.do_bench(fn, warmup=10, rep=REP_MS, quantiles=[0.2, 0.5, 0.8])
                    row.update(ms_p20=q20, ms_median=q50, ms_p80=q80, tflops=fl / (q50 * 1e-3) / 1e12,
                               same_bits_as_table=bool(torch.equal(dq, ref)),
                               max_diff_vs_table=float((dq.float() - ref.float()).abs().max()), error="")
                except Exception as exc:  # noqa: BLE001
                    row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                    log.write(traceback.format_exc() + "\n")
                rows.append(row)
                print(f"{name:10s} dq stages {stages} regs {regs} block_n {bn} " + (
                    f"{row['ms_median']:.3f} ms {row['tflops']:.0f} TFLOP/s same {row['same_bits_as_table']}"
                    if not row["error"] else row["error"][:200]), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
        if out_csv is not None:
            write(out_csv, rows)
    return rows


def host_cost(names, log, out_csv=None) -> list[dict]:
    """Where a small backward's host time goes: the mean wall time per call of each piece of the
    Gluon backward's launch path (descriptors, the launchers, the ops, the whole backward), 200
    calls back to back and one synchronize, against the GPU time of the same calls (profiler)."""
    import os
    import time as _time
    from lmperf.kernels import flash_attention_gluon as fg
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    from lmperf.kernels import flash_attention_triton as ft
    rows = []
    for name in names:
        b, h, hk, n, d, causal = BWD_SHAPES[name]
        q, k, v = make(b, h, hk, n, d, BF16, "bhnd", seed=19)
        xs = [t.detach().requires_grad_() for t in (q, k, v)]
        out, lse, do, delta, cfg = _bwd_inputs(q, k, v, causal)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def grad_fn(env):
            def fn():
                os.environ["LMPERF_FA_BWD_BACKEND"] = env
                try:
                    o = ft.FlashAttention2Triton.apply(*xs, causal)
                    return torch.autograd.grad(o, xs, do)
                finally:
                    os.environ.pop("LMPERF_FA_BWD_BACKEND", None)
            return fn
        pieces = [
            ("head_desc_x4", lambda: [fg.head_desc(t, 64) for t in (q, do, k, v)]),
            ("unsupported", lambda: gb.unsupported(q, k, v, causal)),
            ("launch_dq", lambda: gb.launch_dq(q, k, v, out, do, lse, delta, dq, causal)),
            ("launch_dkdv", lambda: gb.launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal)),
            ("op_dq", lambda: gb.flash_attention_dq_gluon(q, k, v, out, do, lse, delta, dq, causal)),
            ("op_dkdv", lambda: gb.flash_attention_dkdv_gluon(q, k, v, do, lse, delta, dk, dv, causal)),
            ("tile_dq", lambda: ft.launch_backward_dq(q, k, v, out, do, lse, delta, dq, causal, cfg)),
            ("fwd_bwd_gluon", grad_fn("gluon")),
            ("fwd_bwd_tile", grad_fn("triton")),
        ]
        for label, fn in pieces:
            row = dict(shape=name, piece=label, gpu=torch.cuda.get_device_name())
            try:
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
                t0 = _time.perf_counter()
                for _ in range(200):
                    fn()
                host = (_time.perf_counter() - t0) / 200 * 1e3
                torch.cuda.synchronize()
                row.update(host_ms_per_call=host, gpu_ms=_gpu_ms(fn, 20), error="")
            except Exception as exc:  # noqa: BLE001
                row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                log.write(traceback.format_exc() + "\n")
            rows.append(row)
            print(f"{name:12s} {label:14s} " + (f"host {row['host_ms_per_call']:.4f} ms/call gpu {row['gpu_ms']:.4f} ms"
                                                 if not row["error"] else row["error"][:200]), flush=True)
        if out_csv is not None:
            write(out_csv, rows)
    return rows


HARNESS_MODES = ("leaderboard", "compiled_dout", "eager_dout")


def harness_parts(names, providers_, modes, log, out_csv=None, tag="", reps=20) -> list[dict]:
    """The benchmark's own forward + backward (lmperf.bench.flash_attention.setup_bench) by kernel:
    each provider's GPU time a call, each kernel's, under the profiler (`reps` calls after three
    warm ones), in `modes`: "leaderboard" (the model group's harness: torch.compile around the
    call, `.sum().backward()`, so dO the expanded ones of the sum), "compiled_dout" (compiled, the
    backward of a random dO) and "eager_dout" (the call as it is, a random dO: the probe's)."""
    from lmperf.bench import flash_attention as bench_fa

    rows = []
    for name in names:
        b, h, hk, n, d, causal = BWD_SHAPES.get(name) or SHAPES[name]
        for provider in providers_:
            for mode in modes:
                case = {"group": "probe", "provider": provider, "dtype": "bf16", "causal": causal, "batch": b,
                        "heads": h, "kv_heads": hk, "seq_len": n, "head_dim": d, "timing_ms": "25/100",
                        "tiled_max_seq_len": 512, "gpu_time": True,
                        "harness": "eager" if mode == "eager_dout" else "leaderboard"}
                row = {"tag": tag, "shape": name, "provider": provider, "mode": mode}
                try:
                    fn, context, fwd_bwd, (q, k, v, dout) = bench_fa.setup_bench(case)

                    def step():
                        for x in (q, k, v):
                            x.grad = None
                        with context():
                            if mode == "leaderboard":
                                fwd_bwd()
                            else:
                                fn(q, k, v).backward(dout)
                    for _ in range(3):
                        step()
                    parts = {}
                    row["gpu_ms"] = _gpu_ms(step, reps, parts)
                    rows.append(row)
                    for kernel, us in sorted(parts.items(), key=lambda kv: -kv[1]):
                        rows.append({**row, "gpu_ms": "", "kernel": kernel, "kernel_us": round(us, 2)})
                except Exception as exc:  # a failure is a row
                    traceback.print_exc(file=log)
                    rows.append({**row, "error": f"{type(exc).__name__}: {exc}"[:200]})
                print(f"harness {name} {provider:11s} {mode:13s} {row.get('gpu_ms', row.get('error'))}", flush=True)
                if out_csv:
                    write(out_csv, rows)
    return rows


def write(path: Path, rows: list[dict]) -> None:
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--compile-check", action="store_true", help="compiled against eager, then exit")
    ap.add_argument("--only", default=None, help="shapes (default: all of SHAPES, or of BWD_SHAPES with --bwd)")
    ap.add_argument("--variants", default="plain,ws,pp")
    ap.add_argument("--check-cfg", default="", help="D:BM,BN,warps,stages;... checked instead of the table's")
    ap.add_argument("--passes", type=int, default=1, help="times through the shapes (one process)")
    ap.add_argument("--bwd", action="store_true", help="the Gluon dK/dV backward instead of the forward")
    ap.add_argument("--tag", default="", help="a label for this process's bench rows (--bwd)")
    ap.add_argument("--sweep", action="store_true", help="--bwd: the dK/dV kernel's stages and registers")
    ap.add_argument("--check-n", default="128,384,1152,4096", help="--bwd: the check's sequence lengths")
    ap.add_argument("--host", action="store_true", help="--bwd: where a small backward's host time goes")
    ap.add_argument("--impls", default="", help="--bwd: only these implementations (labels of bwd_bench); --harness: "
                    "the providers (default triton,sdpa_cudnn)")
    ap.add_argument("--dq-sweep", action="store_true", help="--bwd: the dQ kernel's stages and key tiles")
    ap.add_argument("--fused", action="store_true", help="--bwd: the check runs the fused kernel")
    ap.add_argument("--schedule", type=int, default=None, help="--fused check: the kernel's schedule (_turns')")
    ap.add_argument("--fused-kw", default="", help="--fused check: the launcher's keywords, k=v,... (ints)")
    ap.add_argument("--ladder", action="store_true", help="--bwd: the fused kernel's ladder (fused_ladder)")
    ap.add_argument("--determinism", action="store_true",
                    help="--bwd: each backward's bits run to run (ours, SDPA-cuDNN and -flash, deterministic mode or not)")
    ap.add_argument("--fused-cfgs", default="", help="--ladder: configs, ';'-separated")
    ap.add_argument("--fused-probes", default="0,1,2,s0", help="--ladder: the writer's probes (sN: schedule N)")
    ap.add_argument("--dims", default="64,128", help="the check's head dims (forward: 80 in the ping-pong variant)")
    ap.add_argument("--graph", action="store_true", help="the forward bench: also each call's GPU time, from a CUDA graph")
    ap.add_argument("--harness", action="store_true",
                    help="the benchmark's forward + backward by kernel (harness_parts), each of --impls' providers")
    ap.add_argument("--modes", default=",".join(HARNESS_MODES), help="--harness: its modes")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import triton
    print(f"torch {torch.__version__} triton {triton.__version__} {torch.cuda.get_device_name()}", flush=True)
    variants = args.variants.split(",")
    if args.harness:
        with (args.out / "gluon_harness_traces.txt").open("a") as log:
            harness_parts((args.only or "d128_2048").split(","), (args.impls or "triton,sdpa_cudnn").split(","),
                          args.modes.split(","), log, args.out / f"gluon_harness{args.tag}.csv", args.tag)
        return 0
    if args.bwd:
        with (args.out / "gluon_bwd_traces.txt").open("a") as log:
            if not args.skip_check:
                rows = bwd_check(log, tuple(int(x) for x in args.check_n.split(",")),
                                 tuple(int(x) for x in args.dims.split(",")), fused=args.fused,
                                 schedule=args.schedule,
                                 fused_kw={k: int(v) for k, v in (kv.split("=") for kv in args.fused_kw.split(",") if kv)})
                write(args.out / f"gluon_bwd_check{args.tag}.csv", rows)
                print(f"bwd check: {sum(r['passed'] for r in rows)}/{len(rows)} passed", flush=True)
            if args.host:
                host_cost((args.only or "gqa_d64_1024").split(","), log, args.out / "gluon_bwd_host.csv")
                return 0
            if args.determinism:
                only = args.only.split(",") if args.only else ["d128_2048", "gqa_4096"]
                bwd_determinism(only, log, args.out / f"gluon_bwd_determinism{args.tag}.csv", args.tag)
                return 0
            if args.ladder:
                only = args.only.split(",") if args.only else ["headline", "thr_full", "thr_causal", "d128_2048"]
                probes = tuple(p if p.startswith("s") else int(p) for p in args.fused_probes.split(","))
                fused_ladder(only, log, args.out / f"gluon_fused_ladder{args.tag}.csv", args.tag,
                             tuple(args.fused_cfgs.split(";")) if args.fused_cfgs else ("",), probes, args.passes)
                return 0
            if args.dq_sweep:
                only = args.only.split(",") if args.only else ["headline", "thr_full", "thr_causal", "gqa_4096"]
                dq_sweep(only, log, args.out / f"gluon_dq_sweep{args.tag}.csv", args.tag)
                return 0
            if args.sweep:
                only = args.only.split(",") if args.only else ["headline", "thr_full", "thr_causal", "gqa_4096"]
                bwd_sweep(only, log, args.out / f"gluon_bwd_sweep{args.tag}.csv", args.tag)
                return 0
            if not args.skip_bench:
                only = args.only.split(",") if args.only else list(BWD_SHAPES)
                bwd_bench(only, log, args.out / f"gluon_bwd_bench{args.tag}.csv", args.tag,
                          args.impls.split(",") if args.impls else None)
        return 0
    with (args.out / "gluon_probe_traces.txt").open("w") as log:
        if args.compile_check:
            write(args.out / "gluon_compile_check.csv", compile_check(log))
            return 0
        if not args.skip_check:
            t0 = time.time()
            override = {}
            for item in filter(None, args.check_cfg.split(";")):
                dd, cc = item.split(":")
                override[int(dd)] = tuple(int(x) for x in cc.split(","))
            rows = check(variants, log, override, tuple(int(x) for x in args.dims.split(",")))
            write(args.out / "gluon_check.csv", rows)
            bad = [r for r in rows if not r["passed"]]
            print(f"check: {len(rows) - len(bad)}/{len(rows)} passed in {time.time() - t0:.0f} s", flush=True)
            for variant in variants:
                vr = [r for r in rows if r["variant"] == variant]
                print(f"  {variant}: {sum(r['passed'] for r in vr)}/{len(vr)} passed", flush=True)
        if not args.skip_bench:
            rows = bench((args.only or ",".join(SHAPES)).split(","), variants, log, args.out / "gluon_bench.csv", args.passes,
                         args.graph)
            write(args.out / "gluon_bench.csv", rows)
            print("\nshape       impl              cfg                  ms      TFLOP/s")
            for r in rows:
                if not r.get("error"):
                    print(f"{r['pass_']} {r['shape']:11s} {r['impl']:17s} {r['cfg']:20s} {r['ms_median']:.3f} {r['tflops']:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
