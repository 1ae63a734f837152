"""Compile the LRPE kernels to PTX for sm_90 without a GPU (Triton's CUDA backend runs on any
machine), to check that an edit leaves the compiled code alone (notes/lrpe.md):

    env -u TRITON_INTERPRET python scripts/lrpe_ptx.py SRC OUT_DIR CACHE M DTYPE WIDE
    # e.g. SRC=src (this tree) and SRC=/tmp/old/src (git archive of another commit), then diff

Writes OUT_DIR/<kernel>.ptx with debug sections and parameter numbers left out. Pointers and
strides are marked 16-divisible, as Triton specialises them at a real launch; grid axes past M
are the constant 1 (the padding of kernels.lrpe._axes_args).
"""
import inspect
import re
import sys

sys.path.insert(0, sys.argv[1])
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from lmperf.kernels import lrpe  # noqa: E402

out, cache, m, dtype, wide = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
CONSTS = {"M": m, "CACHE": cache, "BLOCK_N": 16, "BLOCK_D": 128, "WIDE": wide}
for name in ("_lrpe_fwd_kernel", "_lrpe_bwd_kernel"):
    fn = getattr(lrpe, name)
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(inspect.signature(fn.fn).parameters):
        if p in CONSTS:
            consts[p] = CONSTS[p]
        elif p in ("X", "OUT", "DO", "DX"):
            sig[p], attrs[(i,)] = "*" + dtype, [["tt.divisibility", 16]]
        elif p in ("ANGLES", "theta_ptr"):
            sig[p], attrs[(i,)] = "*fp32", [["tt.divisibility", 16]]
        elif p in ("dims", "strides"):  # kernels before the ops: the grid as tuple arguments
            sig[p] = ("i32",) * m
        elif re.fullmatch(r"[DS][0-7]", p) and int(p[1]) >= m:
            consts[p] = 1
        else:
            sig[p] = "i32"
            if p.startswith("stride"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    sig.update({p: "constexpr" for p in consts})
    ptx = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": lrpe.NUM_WARPS}).asm["ptx"]
    ptx = ptx.split("\t.section\t.debug")[0]
    lines = [line for line in ptx.splitlines() if not line.strip().startswith((".loc", ".file", "//"))]
    with open(f"{out}/{name}.ptx", "w") as f:
        f.write(re.sub(r"_param_\d+", "_param_N", "\n".join(lines)) + "\n")
    print(name, len(lines), "lines")
