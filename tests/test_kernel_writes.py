"""torch.compile must know which arguments each of our Triton kernels writes. Dynamo runs
Triton's front end over a kernel launched inside a compiled graph to find the tensors it stores
to; where that analysis fails it warns ("Encountered an exception in identify_mutated_tensors")
and takes every argument as written, so Inductor copies inputs it need not copy. Seen in the
ladder's log on the H100 (an exception at 15:78 and 16:78 of some kernel); this test shows it is
none of ours: each of our kernels, at the launches the ops make, is analysed without error, and
what it writes is exactly its outputs.

The analysis needs Triton's compiler front end (not its interpreter) and a GPU target; it runs
in a process without TRITON_INTERPRET, the target set to an sm_90 GPU (the H100's), launching
nothing: each op's launcher is called with CPU tensors and `wrap_triton` replaced by a recorder.
"""
import json
import os
import subprocess
import sys

import pytest

PROBE = r'''
import json, sys, torch
import triton.runtime
from triton.backends.compiler import GPUTarget


class Hopper:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


triton.runtime.driver.set_active(Hopper())
from torch._higher_order_ops import triton_kernel_wrap as tkw


def writes(kernel, kwargs):
    if hasattr(tkw, "identify_accessed_tensors"):  # torch >= 2.12
        return sorted(d.name for d in tkw.identify_accessed_tensors(kernel, kwargs, {}).read_writes.writes)
    return sorted(tkw.identify_mutated_tensors(kernel, kwargs, {}))


found = []


class Recorder:
    """wrap_triton's stand-in: kernel[grid](*args, **kwargs) analyses instead of launching."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            named = dict(zip(self.kernel.arg_names, args), **kwargs)
            try:
                found.append([self.kernel.fn.__name__, writes(self.kernel, named), None])
            except Exception as exc:  # the failure Dynamo would only warn about
                found.append([self.kernel.fn.__name__, None, repr(exc)[:300]])
        return launch


import importlib
mods = {m: importlib.import_module(f"lmperf.kernels.{m}")
        for m in ("rmsnorm", "rope", "swiglu", "float8_delayed", "lrpe", "flash_attention_triton")}
for m in mods.values():
    m.wrap_triton = Recorder
    for name in ("check_device",):
        if hasattr(m, name):
            setattr(m, name, lambda *a, **k: None)
    if hasattr(m, "multiprocessors"):
        m.multiprocessors = lambda device: 132
rn, rp, sw, f8, lr, fa = mods.values()
bf = torch.bfloat16
x, w = torch.randn(4, 8, 64, dtype=bf), torch.ones(64, dtype=bf)
rn.rmsnorm_forward(x, w, 1e-5, bf)
rn.add_rmsnorm_forward(x, x, w, 1e-5, bf)
rn.rmsnorm_backward(x, None, x, w, torch.ones(4, 8), bf, False, bf)
rn.rmsnorm_backward(x, x, x, w, torch.ones(4, 8), bf, True, torch.float32)
q, cs = torch.randn(2, 4, 16, 64, dtype=bf), torch.randn(16, 32)
rp.rope_op(q, q, cs, cs, False)
a, s = torch.randn(8, 64, dtype=bf), torch.tensor(2.0)
sw.silu_mul_forward(a, a)
sw.silu_mul_backward(a, a, a)
f8.float8_cast(a, s, torch.float8_e4m3fn)
f8.float8_swiglu(a, a, s, torch.float8_e4m3fn)
f8.float8_swiglu_backward(a, a, a, s, s, torch.float8_e5m2)
xl, theta = torch.randn(2, 2, 12, 16, dtype=bf), torch.rand(2, 4)
lr._grid = lambda *args: (1, 1, 1)
out, angles = lr._launch_forward(Recorder(lr._lrpe_fwd_kernel), xl, theta, [3, 4], 0, True)
lr._launch_forward(Recorder(lr._lrpe_fwd_kernel), xl, theta, [3, 4], 0, False)
lr._launch_backward(Recorder(lr._lrpe_bwd_kernel), torch.randn(2, 2, 12, 32, dtype=bf), theta, angles, [3, 4], 0)
for shape, causal in (((4, 32, 2048, 80), True), ((1, 16, 16384, 64), True), ((4, 16, 8192, 128), False),
                      ((2, 4, 300, 64), True), ((1, 1, 16384, 64), False)):
    qf = torch.randn(*shape, dtype=bf)
    fa._forward(qf, qf, qf, causal, Recorder)
    fa._backward_kernels(qf, qf, qf, qf, torch.randn(*shape[:-1]), qf, causal, Recorder)
json.dump(found, sys.stdout)
'''

# What each launch writes, in the order the probe launches them: the outputs, nothing else
WANT = [
    ("_rmsnorm_forward_kernel", ["RSTD", "Y"]),
    ("_rmsnorm_forward_kernel", ["H", "RSTD", "Y"]),
    ("_rmsnorm_backward_kernel", ["DW_PARTS", "DX"]),
    ("_rmsnorm_backward_kernel", ["DDELTA", "DW_PARTS", "DX"]),
    ("_rope_kernel", ["KO", "QO"]),
    ("_silu_mul_forward_kernel", ["C"]),
    ("_silu_mul_backward_kernel", ["DA", "DB"]),
    ("_cast_kernel", ["AMAX", "Y", "YT"]),
    ("_swiglu_kernel", ["AMAX", "H", "HT"]),
    ("_swiglu_backward_kernel", ["AMAX_A", "AMAX_B", "DA", "DAT", "DB", "DBT"]),
]


@pytest.fixture(scope="module")
def analysed():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_kernel_is_analysed_without_error(analysed):
    failed = [(name, err) for name, _, err in analysed if err]
    assert not failed, failed
    assert {name for name, _, _ in analysed} >= {"_lrpe_fwd_kernel", "_lrpe_bwd_kernel", "_fwd_kernel",
                                                 "_bwd_dq_kernel", "_bwd_dkdv_kernel", "_bwd_fused_kernel",
                                                 "_fwd_combine_kernel"}


def test_each_kernel_writes_its_outputs_only(analysed):
    assert [(n, w) for n, w, _ in analysed[:len(WANT)]] == [(n, w) for n, w in WANT]
    rest = {}
    for name, written, _ in analysed[len(WANT):]:
        rest.setdefault(name, set()).add(tuple(written or ()))
    assert rest["_lrpe_fwd_kernel"] == {("ANGLES", "OUT"), ("OUT",)}  # the angle table only when cached
    assert rest["_lrpe_bwd_kernel"] == {("DX",)}
    assert rest["_fwd_kernel"] == {("L", "O")}  # at 1 x 1 x 16,384 split: O and L are the partials' buffers
    assert rest["_fwd_combine_kernel"] == {("L", "O")}
    assert rest["_bwd_dq_kernel"] == {("DQ", "Delta")}
    assert rest["_bwd_dkdv_kernel"] == {("DK", "DV")}
    assert rest["_bwd_fused_kernel"] == {("DK", "DQ", "DV")}
