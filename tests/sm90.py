"""Gluon kernels compiled for sm_90 (the H100) on any machine, launching nothing: a subprocess with
Triton's driver replaced by a stand-in for a Hopper GPU (Gluon compiles without one, and outside
Triton's interpreter), then each compiled kernel's resources as cuobjdump reads them from its
cubin (registers, stack, local and shared memory) and a count of some SASS instructions."""
import json
import os
import subprocess
import sys

PRELUDE = r'''
import json, os, re, subprocess, sys, tempfile
import torch, triton, triton.runtime
from triton.backends.compiler import GPUTarget


class Hopper:  # compile for an H100 (sm_90) whatever this machine has; launch nothing
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


triton.runtime.driver.set_active(Hopper())
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
OPS = ("STL", "LDL", "HGMMA", "USETMAXREG", "WARPGROUP.DEPBAR", "UTMALDG")


def resources(kern):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    res = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL|SHARED):(\d+)", usage)}
    for op in OPS:
        res[op] = len(re.findall(r"\b" + re.escape(op) + r"\b", sass))
    res["shared_bytes"] = kern.metadata.shared
    res.update(loop_spills(sass))
    return res


def loop_spills(sass):
    """Spill stores and loads inside the innermost loops that issue wgmma (the kernels' step loops,
    found by their backward branches; the wait loops' stubs after the last EXIT, which branch back
    into the code, are not loops), summed over those loops: what a spill costs at every step rather
    than once a program."""
    code = [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    last_exit = max(a for a, op in code if re.search(r"\bEXIT\b", op))
    loops = []
    for addr, op in code:
        target = re.search(r"\bBRA\b[^;]*?0x([0-9a-f]+)", op)
        if target is not None and int(target.group(1), 16) < addr <= last_exit:
            body = [o for a, o in code if int(target.group(1), 16) <= a <= addr]
            if any(re.search(r"\bHGMMA\b", o) for o in body):
                loops.append((int(target.group(1), 16), addr, body))
    out = {"LOOP_STL": 0, "LOOP_LDL": 0}
    for start, end, body in loops:
        if any(start <= s2 and e2 <= end and (s2, e2) != (start, end) for s2, e2, _ in loops):
            continue  # an outer loop: its inner step loop is counted
        for op_name in ("STL", "LDL"):
            out["LOOP_" + op_name] += sum(bool(re.search(r"\b" + op_name + r"\b", o)) for o in body)
    return out


out = {}
for spec in sys.argv[1:]:
    out[spec] = resources(compile_spec(*spec.split(":")))
print("RESULT " + json.dumps(out))
'''


# Specs that the newest Triton (envs/requirements-triton-newest.txt, `make test-triton-newest`)
# compiles with more register spills than the pinned one, enough to fail a resource test that the
# pinned one passes (spill stores, or every wgmma waited for): {release prefix: specs}. Known gaps
# of the kernels on that release, not passes: those tests are expected failures there.
SPILLS_WITH = {"3.9.": {"dkdv:128,1,1,bfloat16", "dkdv:128,1,1,float16", "fused:128,1,2,float16"}}


def expect_spills(request, spec: str) -> None:
    """Mark the running test an expected failure where this Triton is known to spill at `spec`
    (SPILLS_WITH); strict, so the test fails once the spill is gone and the entry with it."""
    import pytest
    import triton
    for release, specs in SPILLS_WITH.items():
        if triton.__version__.startswith(release) and spec in specs:
            request.applymarker(pytest.mark.xfail(strict=True, reason=(
                f"Triton {triton.__version__} spills more registers at {spec} than the pinned Triton, "
                "which passes this test")))


def compile_specs(compile_spec: str, specs: list, timeout: int = 900) -> dict:
    """{spec: resources} for each spec, compiled in one subprocess. `compile_spec` is Python source
    defining compile_spec(*parts) -> the compiled kernel, parts being the spec split at ":" (it may
    import lmperf; torch, triton, os and sys are imported)."""
    head, tail = PRELUDE.split("\nout = {}\n")
    script = head + "\n" + compile_spec + "\n\nout = {}\n" + tail
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script, *specs], capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])
