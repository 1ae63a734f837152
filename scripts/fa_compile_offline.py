"""Compile the FlashAttention kernels for sm_90 without a GPU and print each config's resource
use (shared memory, local-memory bytes in the PTX, whether wgmma is used): a free first filter
before a GPU sweep (a config over the 227 KiB of shared memory cannot launch).

    python scripts/fa_compile_offline.py            # the rule table's configs
"""
from __future__ import annotations

import itertools
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lmperf.kernels import flash_attention_triton as fa

TARGET = GPUTarget("cuda", 90, 32)
PTR = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}


def compile_kernel_named(kernel, dtype, d, causal, cfg, ptrs):
    t = PTR[dtype]
    sig = {}
    constexprs = {**fa._scales(d), "IS_CAUSAL": causal, "DOT_PRECISION": fa._dot_precision(dtype),
                  **{k: v for k, v in cfg.items() if k.isupper()}}
    if "SM_SCALE" in kernel.arg_names:
        constexprs["SM_SCALE"] = 1.0 / d ** 0.5
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ptrs:
            sig[name] = t if ptrs[name] == "in" else "*fp32"
        else:
            sig[name] = "i32"
    src = ASTSource(kernel, sig, constexprs)
    k = triton.compile(src, target=TARGET, options={"num_warps": cfg["num_warps"],
                                                     "num_stages": cfg["num_stages"]})
    asm = k.asm.get("ptx", "")
    return {"shared_kib": k.metadata.shared / 1024, "local_bytes": _local(asm),
            "wgmma": "wgmma" in asm}


def _local(ptx: str) -> int:
    import re
    m = re.findall(r"\.local \.align \d+ \.b8 \w+\[(\d+)\]", ptx)
    return sum(int(x) for x in m)


KERNELS = {
    "fwd": (fa._fwd_kernel, {"Q": "in", "K": "in", "V": "in", "O": "in", "L": "f32"}),
    "dq": (fa._bwd_dq_kernel, {"Q": "in", "K": "in", "V": "in", "O": "in", "DO": "in", "L": "f32",
                                "Delta": "f32", "DQ": "in"}),
    "dkdv": (fa._bwd_dkdv_kernel, {"Q": "in", "K": "in", "V": "in", "DO": "in", "L": "f32",
                                    "Delta": "f32", "DK": "in", "DV": "in"}),
}


def main():
    rows = []
    for dtype, d, causal in itertools.product([torch.bfloat16, torch.float32], [8, 64, 80, 128, 256], [True, False]):
        f = fa.fwd_config(4096, d, dtype, causal, 16)
        b = fa.bwd_config(4096, d, dtype, causal, 16)
        for name, cfg in (("fwd", f), ("dq", b["dq"]), ("dkdv", b["dkdv"])):
            kernel, ptrs = KERNELS[name]
            try:
                info = compile_kernel_named(kernel, dtype, d, causal, cfg, ptrs)
                status = "ok"
            except Exception as exc:  # noqa: BLE001 - a row per failure
                info, status = {}, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            rows.append((str(dtype)[6:], d, causal, name, cfg, status, info))
            print(rows[-1], flush=True)
    return 0 if all(r[5] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
