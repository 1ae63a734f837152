"""FlashAttention-2 (Triton) tile sweep on a GPU: the data behind the rule table in
src/lmperf/kernels/flash_attention_triton.py (fwd_config, bwd_config).

For each shape below and each kernel (forward, backward dQ, backward dK/dV) it times every
candidate config with triton.testing.do_bench (the kernel launch alone, median and 20/80%
quantiles) and replayed as a CUDA graph (graph_ms: the GPU's time alone, which is what counts
for the short shapes, whose launches take longer than their kernels), checks each candidate's
output against the rule table's, and times SDPA-flash and SDPA-cuDNN on the same shape for scale. Candidates are compiled first in parallel processes
(Triton's on-disk cache), so the timing loop only loads them. Every failure is a row.

    python tuning/flash_attention/fa_sweep.py --out DIR [--jobs 14] [--only headline,model_xl]

Writes DIR/fa_sweep.csv (one row per shape x kernel x config, or per peer) as it goes.
"""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

import torch

BF16, FP32 = torch.bfloat16, torch.float32
# name: (batch, heads, N, D, causal, dtype)
SHAPES = {
    "headline": (1, 16, 16384, 64, True, BF16),
    "throughput_causal": (4, 16, 8192, 128, True, BF16),
    "throughput_full": (4, 16, 8192, 128, False, BF16),
    "model_xl_1024": (4, 25, 1024, 64, True, BF16),
    "model_2.7B_1024": (4, 32, 1024, 80, True, BF16),
    "model_small_256": (4, 12, 256, 64, True, BF16),
    "model_2.7B_256": (4, 32, 256, 80, True, BF16),
    "model_2.7B_2048": (4, 32, 2048, 80, True, BF16),  # the ladder's best 2.7B rung (issue #15)
    "model_xl_2048": (4, 25, 2048, 64, True, BF16),  # the xl model's attention at 2,048 rows
    "d64_4096": (8, 16, 4096, 64, True, BF16),
    "grid_d64_4096": (1, 1, 4096, 64, True, BF16),
    "grid_d128_32768": (1, 1, 32768, 128, True, BF16),
    "grid_d16_16384": (1, 1, 16384, 16, True, BF16),
    "d256": (1, 8, 4096, 256, True, BF16),
    "fp32_d64_4096": (1, 1, 4096, 64, True, FP32),
    "fp32_d128_16384": (1, 1, 16384, 128, True, FP32),
    "fp32_d128_4096": (1, 1, 4096, 128, True, FP32),
    "fp32_d128_8192": (1, 1, 8192, 128, True, FP32),
    "fp32_d64_2048": (1, 1, 2048, 64, True, FP32),
    "grid_fp32_d128_4096": (1, 1, 4096, 128, True, FP32),
    # the grid's short single-head shapes (where the split rule, SPLIT 2-8, and the fused
    # backward apply), and the model group's smallest
    **{f"grid_{t}_d{d}_{n}": (1, 1, n, d, True, dt) for t, dt in (("bf16", BF16), ("fp32", FP32))
       for d in (16, 64, 128) for n in (128, 256, 512, 1024, 2048)},
    "model_medium_256": (4, 16, 256, 64, True, BF16),
    "assign_d64_1024": (16, 1, 1024, 64, True, BF16),  # the assignment's (16, 1,024, 64) harness shape
    # ... and more where a launch has 1-2 programs an SM (the split rule's boundary)
    "assign_d128_1024": (16, 1, 1024, 128, True, BF16),
    "b4_d64_4096": (4, 1, 4096, 64, True, BF16),
    # the model group's head dim 128 below 2,048 rows (the tile forward there: issue 73)
    "model_d128_1024": (4, 16, 1024, 128, True, BF16),
    "model_d128_1536": (4, 16, 1536, 128, True, BF16),
}
SPLITS = (1, 2, 4, 8)

FWD = {  # (BLOCK_Q, BLOCK_K, warps, stages)
    "16bit": [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 8, 4), (128, 64, 8, 2),
              (64, 64, 4, 4), (64, 64, 4, 2), (128, 64, 4, 3), (64, 32, 4, 3),
              (32, 32, 4, 2), (64, 64, 4, 1),  # these two for short loops (the grid's N <= 1,024)
              (64, 128, 4, 2), (64, 128, 4, 3), (128, 128, 8, 2), (64, 64, 8, 3), (128, 32, 8, 3)],
    "d256": [(64, 32, 4, 2), (64, 32, 4, 3), (32, 32, 4, 2), (64, 64, 8, 2), (32, 32, 4, 3)],
    "fp32": [(32, 32, 4, 2), (32, 32, 4, 3), (32, 16, 4, 2), (32, 32, 2, 2), (64, 32, 4, 2), (16, 16, 2, 2),
             (64, 32, 8, 2), (64, 64, 8, 2), (32, 64, 4, 2), (16, 32, 2, 2), (16, 64, 4, 2)],
}
DQ = {  # (BLOCK_M2, BLOCK_N2, warps, stages)
    "16bit": [(64, 32, 4, 3), (128, 128, 8, 2), (64, 32, 4, 4), (64, 32, 4, 2), (64, 64, 4, 3),
              (64, 64, 4, 2), (32, 32, 4, 3), (128, 64, 8, 2), (128, 32, 8, 3),
              (32, 32, 4, 2), (64, 64, 4, 1)],
    "d256": [(32, 32, 4, 2), (32, 32, 4, 3), (32, 16, 4, 2), (64, 32, 4, 2), (64, 64, 8, 1)],
    "fp32": [(32, 32, 4, 2), (32, 32, 4, 3), (32, 16, 4, 2), (32, 32, 2, 2), (64, 32, 4, 2), (16, 16, 2, 2),
             (64, 32, 8, 2), (64, 64, 8, 2), (32, 64, 4, 2), (16, 32, 2, 2), (16, 64, 4, 2)],
}
DKDV = {  # (BLOCK_M, BLOCK_N, warps, stages)
    "16bit": [(32, 128, 4, 3), (64, 64, 4, 2), (32, 128, 4, 4), (32, 128, 4, 2), (16, 128, 4, 3),
              (32, 64, 4, 3), (64, 64, 4, 3), (32, 64, 4, 4), (64, 128, 8, 2),
              (32, 32, 4, 2), (64, 64, 4, 1), (32, 64, 4, 2)],
    "d256": [(32, 32, 4, 2), (32, 32, 4, 3), (16, 32, 4, 2), (32, 64, 4, 2), (32, 64, 8, 1)],
    "fp32": [(32, 32, 4, 2), (32, 32, 4, 3), (16, 32, 4, 2), (32, 32, 2, 2), (32, 64, 4, 2), (16, 16, 2, 2),
             (64, 32, 4, 2), (64, 32, 8, 2), (64, 64, 8, 2), (16, 64, 4, 2), (16, 32, 2, 2), (64, 16, 4, 2)],
}
BWD = {  # the whole backward: ((BLOCK_M2, BLOCK_N2), (BLOCK_M, BLOCK_N)) for dQ and dK/dV, then stages
    "16bit": ([((64, 64), (64, 64)), ((32, 32), (32, 32)), ((64, 32), (32, 64)), ((32, 64), (64, 32))], (2, 3)),
    "d256": ([((64, 32), (32, 32)), ((32, 32), (32, 32))], (2,)),
    "fp32": ([((32, 32), (32, 32)), ((16, 16), (16, 16)), ((32, 16), (16, 32)), ((16, 32), (32, 16))], (2,)),
}
KERNELS = ("fwd", "dq", "dkdv")
KEYS = {"fwd": ("BLOCK_Q", "BLOCK_K"), "dq": ("BLOCK_M2", "BLOCK_N2"), "dkdv": ("BLOCK_M", "BLOCK_N")}
TABLES = {"fwd": FWD, "dq": DQ, "dkdv": DKDV}
FIELDS = ["shape", "batch", "heads", "seq_len", "head_dim", "causal", "dtype", "kernel", "config",
          "is_rule", "ms", "q20_ms", "q80_ms", "graph_ms", "max_abs_diff", "status", "message", "gpu", "torch",
          "triton", "commit"]


def family(d: int, dtype) -> str:
    return "fp32" if dtype == FP32 else ("d256" if d > 128 else "16bit")


def bwd_candidates(name: str) -> list[dict]:
    """Whole-backward configs for one shape, the rule table's first: each tile pair of BWD at
    each stage count and split (1, 2, 4, 8 where every share keeps a tile), fused and not."""
    from lmperf.kernels import flash_attention_triton as fa
    b, h, n, d, causal, dtype = SHAPES[name]
    rule = fa.bwd_config(n, d, dtype, causal, b * h)
    out = [rule, {**rule, "fused": not rule["fused"]}]
    pairs, stages = BWD[family(d, dtype)]
    for (m2, n2), (m, nk) in pairs:
        for st in stages:
            dq = fa.fit_tiles(dict(BLOCK_M2=m2, BLOCK_N2=n2, num_warps=4, num_stages=st), n, "BLOCK_M2", "BLOCK_N2")
            kv = fa.fit_tiles(dict(BLOCK_M=m, BLOCK_N=nk, num_warps=4, num_stages=st), n, "BLOCK_N", "BLOCK_M")
            kv["HEADS_FASTEST"] = causal
            for split in SPLITS:
                if split > 1 and (fa.cdiv(n, dq["BLOCK_N2"]) < 2 * split or fa.cdiv(n, kv["BLOCK_M"]) < 2 * split):
                    continue
                for fused in (False, True):
                    cfg = {"dq": {**dq, "SPLIT": split}, "dkdv": {**kv, "SPLIT": split}, "fused": fused}
                    if cfg not in out:
                        out.append(cfg)
    return out


def describe(cfg: dict) -> str:
    if "fused" in cfg:
        return f"fused={int(cfg['fused'])} " + " ".join(f"{name}[{describe(cfg[name])}]" for name in ("dq", "dkdv"))
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def candidates(name: str, kernel: str) -> list[dict]:
    """The kernel's candidate configs for one shape, the rule table's own first."""
    from lmperf.kernels import flash_attention_triton as fa
    if kernel == "bwd":
        return bwd_candidates(name)
    b, h, n, d, causal, dtype = SHAPES[name]
    rule = (fa.fwd_config(n, d, dtype, causal, b * h) if kernel == "fwd"
            else fa.bwd_config(n, d, dtype, causal, b * h)[kernel])
    first, second = KEYS[kernel]  # the table's tuple order
    outer, inner = (second, first) if kernel == "dkdv" else (first, second)  # dK/dV: keys outer
    out = [rule]
    for x, y, w, s in TABLES[kernel][family(d, dtype)]:
        cfg = fa.fit_tiles({first: x, second: y, "num_warps": w, "num_stages": s}, n, outer, inner)
        if kernel == "dkdv":
            cfg["HEADS_FASTEST"] = causal
        cfg["SPLIT"] = rule["SPLIT"]  # each tile with the rule's split ...
        if cfg not in out:
            out.append(cfg)
    programs = b * h * fa.cdiv(n, rule[outer])
    if programs < 2 * fa.SM_COUNT_H100:  # ... and, where the split rule applies, the rule's tile at every split
        out += [c2 for split in SPLITS if (c2 := {**rule, "SPLIT": split}) not in out]
    if fa.d_tiles(d)[1]:  # a head dim held as two column tiles (80 = 64 + 16): each candidate
        out += [{**c, "D_TILES": "pad"} for c in out]  # also as one tile padded to a power of two
    return out


def _padded(fn):
    """fn with the head dim held as one padded tile (fa.d_tiles patched while it runs: the launch
    functions read it at every call, captures included)."""
    from lmperf.kernels import flash_attention_triton as fa

    def run():
        two_tiles = fa.d_tiles
        fa.d_tiles = lambda d: (fa.d_pad(d), 0)
        try:
            return fn()
        finally:
            fa.d_tiles = two_tiles
    return run


def inputs(name: str, seed: int = 0):
    b, h, n, d, causal, dtype = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(b * h, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    return q, k, v, do


def runner(name: str, kernel: str, cfg: dict, t):
    """fn() that launches `kernel` with `cfg` on the prepared tensors t, and the output to check."""
    from lmperf.kernels import flash_attention_triton as fa
    b, h, n, d, causal, dtype = SHAPES[name]
    q, k, v, do, out, lse, delta, dq, dk, dv = t
    cfg = dict(cfg)
    wrap = _padded if cfg.pop("D_TILES", "") == "pad" else (lambda fn: fn)
    full = {"dq": cfg, "dkdv": cfg}
    if kernel == "fwd":
        o2, l2 = torch.empty_like(out), torch.empty_like(lse)
        return wrap(lambda: fa.launch_forward(q, k, v, o2, l2, causal, cfg)), o2
    if kernel == "bwd":  # all of it: one launch or two kernels (Delta's buffer included), the sums
        dq2, dk2, dv2 = torch.empty_like(dq), torch.empty_like(dk), torch.empty_like(dv)
        return (lambda: fa.launch_backward(q, k, v, out, do, lse, dq2, dk2, dv2, causal, cfg)), (dq2, dk2, dv2)
    # a split launch allocates its fp32 partials and merges them: part of the timed cost
    if kernel == "dq":
        dq2, delta2 = torch.empty_like(dq), torch.empty_like(delta)
        return wrap(lambda: fa.launch_backward_dq(q, k, v, out, do, lse, delta2, dq2, causal, full)), dq2
    dk2, dv2 = torch.empty_like(dk), torch.empty_like(dv)
    return wrap(lambda: fa.launch_backward_dkdv(q, k, v, do, lse, delta, dk2, dv2, causal, full)), dk2


def prepare(name: str, run_rule: bool = True):
    """Inputs, and the rule table's forward and backward outputs on them (random stand-ins
    when not run_rule: enough to compile the candidates)."""
    from lmperf.kernels import flash_attention_triton as fa
    b, h, n, d, causal, dtype = SHAPES[name]
    q, k, v, do = inputs(name)
    out, lse = torch.empty_like(q), torch.empty(b * h, n, device="cuda", dtype=torch.float32)
    if not run_rule:
        out.normal_(), lse.normal_()
        return q, k, v, do, out, lse, torch.zeros_like(lse), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fa.launch_forward(q, k, v, out, lse, causal, fa.fwd_config(n, d, dtype, causal, b * h))
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    cfg = fa.bwd_config(n, d, dtype, causal, b * h)
    fa.launch_backward_dq(q, k, v, out, do, lse, delta, dq, causal, cfg)  # two kernels: Delta for dK/dV's sweep
    fa.launch_backward_dkdv(q, k, v, do, lse, delta, dk, dv, causal, cfg)
    torch.cuda.synchronize()
    return q, k, v, do, out, lse, delta, dq, dk, dv


def jobs(names, kernels=KERNELS):
    return [(name, kernel, cfg) for name in names for kernel in kernels for cfg in candidates(name, kernel)]


def compile_shard(names, shard: int, n_shards: int, kernels=KERNELS) -> None:
    """Compile (by launching once) every n_shards-th candidate; errors are left to the timing."""
    prepared = {}
    for i, (name, kernel, cfg) in enumerate(jobs(names, kernels)):
        if i % n_shards != shard:
            continue
        try:
            if name not in prepared:
                prepared = {name: prepare(name, run_rule=False)}
            fn, _ = runner(name, kernel, cfg, prepared[name])
            fn()
        except Exception:  # noqa: BLE001 - the timing pass records it
            pass
    torch.cuda.synchronize()


def peers(name: str):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, h, n, d, causal, dtype = SHAPES[name]
    if dtype == FP32:
        return
    q, k, v, do = (t.view(b, h, n, d) for t in inputs(name, seed=1))
    for label, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))

        def fwd():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)

        def fwd_bwd():
            fwd().backward(do)
        yield f"{label}:fwd", fwd
        yield f"{label}:fwd_bwd", fwd_bwd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=14, help="parallel compile processes (0: none)")
    ap.add_argument("--only", default="", help="comma-separated shape names")
    ap.add_argument("--kernels", default=",".join(KERNELS),
                    help="comma-separated, of fwd, dq, dkdv and bwd (the whole backward, GPU time only)")
    ap.add_argument("--compile-shard", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = [s for s in args.only.split(",") if s] or list(SHAPES)
    kernels = tuple(k for k in args.kernels.split(",") if k)
    if bad := set(kernels) - {*KERNELS, "bwd"}:
        ap.error(f"unknown kernels {sorted(bad)}: choose from fwd, dq, dkdv, bwd")
    if args.compile_shard:
        i, n = (int(x) for x in args.compile_shard.split("/"))
        compile_shard(names, i, n, kernels)
        return 0

    import triton
    import triton.testing
    from lmperf.provenance import git_commit
    t0 = time.time()
    if args.jobs:
        procs = [subprocess.Popen([sys.executable, __file__, "--out", str(args.out), "--only", ",".join(names),
                                   "--kernels", args.kernels, "--compile-shard", f"{i}/{args.jobs}"])
                 for i in range(args.jobs)]
        for p in procs:
            p.wait()
        print(f"compiled {len(jobs(names, kernels))} candidates in {time.time() - t0:.0f} s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "fa_sweep.csv"
    prov = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "commit": git_commit()}
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for name in names:
            b, h, n, d, causal, dtype = SHAPES[name]
            base = dict(shape=name, batch=b, heads=h, seq_len=n, head_dim=d, causal=causal,
                        dtype=str(dtype).removeprefix("torch."), **prov)
            try:
                t = prepare(name)
            except Exception as exc:  # noqa: BLE001
                w.writerow({**base, "kernel": "all", "status": "error", "message": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            ref = {"fwd": (t[4],), "dq": (t[7],), "dkdv": (t[8],), "bwd": t[7:10]}
            for kernel in kernels:
                for j, cfg in enumerate(candidates(name, kernel)):
                    row = {**base, "kernel": kernel, "config": describe(cfg), "is_rule": j == 0}
                    try:
                        fn, out = runner(name, kernel, cfg, t)
                        out = out if isinstance(out, tuple) else (out,)
                        for o in out:
                            o.fill_(float("nan"))
                        fn()
                        torch.cuda.synchronize()
                        row["max_abs_diff"] = max(float((o.float() - r.float()).abs().max())
                                                  for o, r in zip(out, ref[kernel]))
                        if kernel != "bwd":  # the whole backward: its GPU time only
                            q20, q50, q80 = triton.testing.do_bench(fn, warmup=10, rep=50, quantiles=[0.2, 0.5, 0.8])
                            row.update(ms=q50, q20_ms=q20, q80_ms=q80)
                        row.update(status="ok", graph_ms=graph_time(fn))
                    except Exception as exc:  # noqa: BLE001 - a row per failure
                        row.update(status="oom" if "out of memory" in str(exc).lower() else "error",
                                   message=f"{type(exc).__name__}: {exc}"[:300])
                        torch.cuda.empty_cache()
                    w.writerow(row)
                    f.flush()
            del t
            for label, fn in (peers(name) if set(kernels) & set(KERNELS) else ()):
                row = {**base, "kernel": label, "config": "", "is_rule": False}
                try:
                    q20, q50, q80 = triton.testing.do_bench(fn, warmup=10, rep=50, quantiles=[0.2, 0.5, 0.8])
                    row.update(ms=q50, q20_ms=q20, q80_ms=q80, status="ok", graph_ms=graph_time(fn))
                except Exception as exc:  # noqa: BLE001
                    row.update(status="error", message=f"{type(exc).__name__}: {exc}"[:300])
                w.writerow(row)
                f.flush()
            print(f"{name}: done at {time.time() - t0:.0f} s", flush=True)
            torch.cuda.empty_cache()
    summarize(path)
    return 0


_GRAPHS = {"ok": True}


def graph_time(fn) -> float:
    """GPU time (ms) of fn replayed as a CUDA graph: the short shapes' kernels take less than
    do_bench's host floor. NaN once a capture has failed (a failed capture spoils the process's
    later ones)."""
    import triton.testing
    if not _GRAPHS["ok"]:
        return float("nan")
    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))
    except Exception as exc:  # noqa: BLE001
        _GRAPHS["ok"] = False
        print(f"CUDA-graph timing off from here: {type(exc).__name__}: {exc}"[:300], flush=True)
        return float("nan")


def summarize(path: Path) -> None:
    """Best config per shape and kernel against the rule table's, and the peers."""
    import pandas as pd
    df = pd.read_csv(path)
    ok = df[df.status == "ok"]
    for name, g in ok.groupby("shape", sort=False):
        parts = []
        for kernel in (*KERNELS, "bwd"):
            k = g[g.kernel == kernel]
            col = "graph_ms" if kernel == "bwd" else "ms"
            if k.empty or k[col].isna().all():
                continue
            best = k.loc[k[col].idxmin()]
            rule = k[k.is_rule]
            rule_ms = float(rule[col].iloc[0]) if len(rule) else float("nan")
            parts.append(f"{kernel} rule {rule_ms:.4f} best {best[col]:.4f} [{best.config}]")
        peers_ = "; ".join(f"{r.kernel} {r.ms:.3f}" for r in g[g.kernel.str.contains(':')].itertuples())
        print(f"{name}: " + " | ".join(parts) + f" || {peers_}")
    bad = df[df.status != "ok"]
    print(f"{len(bad)} failed rows: " + "; ".join(f"{r.shape}/{r.kernel}/{r.config}: {str(r.message)[:80]}"
                                                  for r in bad.head(10).itertuples()))


if __name__ == "__main__":
    sys.exit(main())
