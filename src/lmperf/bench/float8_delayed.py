"""Float8 training's kernels and layers (lmperf.kernels.float8_delayed) checked against float64
and PyTorch's fp8 rounding (`check`): the rows of the correctness table.

    python -m lmperf.bench.float8_delayed check --spec '{...}' --out results/cpu/float8_delayed/check.csv --hw cpu

Every case draws fresh inputs (its seed is in each row); `compiled` cases run the op or the
layer under torch.compile(fullgraph=True) (Inductor on a GPU, AOTAutograd on the CPU).
- `cast` (float8_cast of x in fp32, fp16 or bf16 to e4m3 and e5m2, scaled by a power of two, so
  that x * scale is exact and the float64 reference is PyTorch's cast of it): the elements of y
  and of its zero-padded transpose that differ from the reference, and |amax - max |x||; both
  must be 0. Variant `held`: values both formats hold once scaled and one past their range
  (runs in Triton's interpreter too); `random`: fresh normal values times 50 (needs CUDA: the
  interpreter rounds to fp8 wrongly where rounding carries into the exponent).
- `swiglu` (float8_swiglu: h = silu(a) * b) and `swiglu_backward` (float8_swiglu_backward: da
  and db from dh): variant `fp32`, the values written in float32 (before rounding) against
  float64 times the scale, with the house rule (attention_contract.tolerance: at most twice the
  error of the same computation in PyTorch in fp32, plus a floor); variant `fp8` (needs CUDA),
  the elements written in fp8 that differ from PyTorch's rounding of the fp32 values (0 allowed).
- `linear` (a Float8Linear) and `ffn` (a Float8SwiGLU: lmperf.model.SwiGLU converted), bf16,
  shape (B, N, d_in, d_out) or (B, N, d_model, d_ff): variant `float64` (needs CUDA), the worst
  relative error (Frobenius) of y, dx and each weight gradient against float64 over a first
  step (dynamic scales) and three delayed ones, within fp8's tolerance (TOLERANCE, 1.5 times for
  the FFN, whose product and its gradients are rounded once more); variant `wiring` (`ffn`,
  eager; runs anywhere): with its two product kernels replaced by the model's bf16 product and
  float8_cast, the Float8SwiGLU against the three lone Float8Linear layers on fixed delayed
  scales: the elements of y, dx, the gradients and the amaxes that differ (0 allowed).
"""
from __future__ import annotations

import contextlib
import itertools
import random

from lmperf.bench import common, jobs

NEEDS_GPU_ROUNDING = ("needs CUDA: Triton's interpreter rounds to fp8 wrongly where rounding carries into the "
                      "exponent (127.3 -> 64 in e4m3; triton-lang/triton#8322)")
# Relative error (Frobenius norm) against float64 of a layer with x and w in e4m3 and dy in e5m2
# (3 and 2 mantissa bits: rounding errors up to 2^-4 and 2^-3 of a value, averaged down by the
# matmul): measured about 0.04 for y and 0.06 for dx and dw on random normal data
# (tests/test_float8_delayed.py); the FFN rounds h and its gradients once more
TOLERANCE = {"y": 0.06, "dx": 0.09, "dw": 0.09}
FFN_FACTOR = 1.5
VARIANTS = {"cast": ("held", "random"), "swiglu": ("fp32", "fp8"), "swiglu_backward": ("fp32", "fp8"),
            "linear": ("float64",), "ffn": ("float64", "wiring")}
SHAPES = {"cast": "cast", "swiglu": "swiglu", "swiglu_backward": "swiglu", "linear": "layers", "ffn": "layers"}
DTYPES = {"cast": ("fp32", "fp16", "bf16"), "swiglu": ("fp32", "fp16", "bf16"),
          "swiglu_backward": ("fp32", "fp16", "bf16"), "linear": ("bf16",), "ffn": ("bf16",)}


def check_cases(spec: dict) -> list[dict]:
    """impl x variant x dtype x shape (x fp8 format for the cast), eager on the spec's shapes and
    compiled on its `compiled` shapes (not the `wiring` variant, an eager comparison)."""
    compiled = spec.get("compiled", {})
    odd = [s for s in spec["layers"] + compiled.get("layers", []) if s[2] % 16 or s[3] % 16]
    if odd:
        raise ValueError(f"float8_delayed check layers shapes {odd}: d_in and d_out (the last two entries) must be "
                         "multiples of 16 (torch._scaled_mm's contract; other layers are not converted)")
    cases = []
    for impl, variants in VARIANTS.items():
        key = SHAPES[impl]
        for is_compiled, shapes in ((False, spec[key]), (True, compiled.get(key, []))):
            for variant, dtype, shape in itertools.product(variants, DTYPES[impl], shapes):
                if is_compiled and variant == "wiring":
                    continue
                for fp8 in (("e4m3", "e5m2") if impl == "cast" else ("",)):
                    case = {"impl": impl, "variant": variant, "dtype": dtype, "fp8": fp8, "compiled": is_compiled,
                            "shape": "x".join(map(str, shape))}
                    case["case_id"] = "-".join(filter(None, (impl, variant, fp8, dtype,
                                                             "compiled" if is_compiled else "eager", case["shape"])))
                    cases.append(case)
    return cases


def _compiled(fn, compiled: bool):
    """fn, or fn under torch.compile(fullgraph=True): Inductor on a GPU, AOTAutograd on the CPU."""
    import torch

    if not compiled:
        return fn
    import torch._dynamo
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="inductor" if torch.cuda.is_available() else "aot_eager")


def _shape(case: dict) -> tuple[int, ...]:
    return tuple(int(s) for s in case["shape"].split("x"))


def _row(metric: str, err: float, tol: float, torch_err: float | None = None) -> dict:
    return {"metric": metric, "max_abs_err": err, "torch_err": torch_err, "tolerance": tol,
            "passed": bool(err <= tol)}


def _fp8(name: str):
    from lmperf.kernels import float8_delayed as f8
    return {"e4m3": f8.E4M3, "e5m2": f8.E5M2}[name]


def check_cast(case: dict, device: str) -> list[dict]:
    import torch
    from lmperf.kernels import float8_delayed as f8

    m, k = _shape(case)
    dtype, fp8 = common.torch_dtype(case["dtype"]), _fp8(case["fp8"])
    if case["variant"] == "held":
        held = torch.tensor([0, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, -0.25, -0.5, -0.75, -1, -1.5, -2, -3, -4])
        x = held[torch.randint(0, len(held), (m, k + 5))].to(device)
        x[0, 0] = 6e4  # past both formats' range once scaled (and within fp16's): clamped to the largest value
    else:
        x = torch.randn(m, k + 5, device=device) * 50
    x = x.to(dtype)[:, :k]  # rows with a stride, as a view of the model's tensors may have
    scale = torch.tensor(2.0, device=device)
    y, yt, amax = _compiled(f8.float8_cast, case["compiled"])(x, scale, fp8)
    fmax = torch.finfo(fp8).max
    ref = (x.double() * 2.0).clamp(-fmax, fmax).to(fp8).float()
    wrong = int((y.float() != ref).sum()) + int((yt[:, :m].t().float() != ref).sum()) + int(yt[:, m:].float().any())
    amax_err = abs(float(amax) - float(x.double().abs().max()))
    return [_row("y_and_transpose_mismatches", wrong, 0), _row("amax_abs_err", amax_err, 0)]


def _swiglu_reference(g, a, b):
    """h, da, db of h = silu(a) * b for dh = g, in the inputs' dtype (fp32 here) or float64."""
    import torch
    s = torch.sigmoid(a)
    return a * s * b, g * b * s * (1 + a * (1 - s)), g * a * s


def check_swiglu(case: dict, device: str) -> list[dict]:
    import torch
    from lmperf.kernels import float8_delayed as f8
    from lmperf.kernels.attention_contract import tolerance

    m, k = _shape(case)
    dtype = common.torch_dtype(case["dtype"])
    a, b, g = ((torch.randn(m, k, device=device) * 4).to(dtype) for _ in range(3))
    sa, sb = torch.tensor(0.5, device=device), torch.tensor(8.0, device=device)
    backward = case["impl"] == "swiglu_backward"
    names, scales = (("da", "db"), (sa, sb)) if backward else (("h",), (sa,))

    def run(out_dtype):
        if backward:
            fn = _compiled(f8.float8_swiglu_backward, case["compiled"])
            out = fn(g, a, b, sa, sb, out_dtype)
            return [out[:3], out[3:]]
        return [_compiled(f8.float8_swiglu, case["compiled"])(a, b, sa, out_dtype)]

    exact = run(torch.float32)
    rows = []
    if case["variant"] == "fp32":
        ref64 = _swiglu_reference(g.double(), a.double(), b.double())
        ref32 = _swiglu_reference(g.float(), a.float(), b.float())
        for name, (y, yt, amax), s in zip(names, exact, scales):
            i = ("h", "da", "db").index(name)
            want = ref64[i] * float(s)
            err = float((y.double() - want).abs().max())
            torch_err = float((ref32[i].double() * float(s) - want).abs().max())
            tol = tolerance(torch_err, torch.float32)
            rows.append(_row(f"{name}_max_abs_err", err, tol, torch_err))
            layout = int((yt[:, :m].t() != y).sum()) + int(yt[:, m:].any())
            rows.append(_row(f"{name}_transpose_mismatches", layout, 0))
            amax_err = float(abs(amax.double() - ref64[i].abs().max()))
            rows.append(_row(f"{name}_amax_abs_err", amax_err, tolerance(float((ref32[i].double() - ref64[i]).abs().max()),
                                                                         torch.float32)))
        return rows
    for fp8_name in ("e4m3", "e5m2"):
        fp8 = _fp8(fp8_name)
        fmax = torch.finfo(fp8).max
        for name, (y, yt, amax), (ye, yte, amaxe) in zip(names, run(fp8), exact):
            wrong = int((y.float() != ye.clamp(-fmax, fmax).to(fp8).float()).sum())
            wrong += int((yt.float() != yte.clamp(-fmax, fmax).to(fp8).float()).sum()) + int(amax != amaxe)
            rows.append(_row(f"{name}_{fp8_name}_mismatches", wrong, 0))
    return rows


def _fused_and_alone(d: int, f: int, device: str):
    """A bf16 lmperf.model.SwiGLU converted to a Float8SwiGLU, and a copy converted with its three
    layers alone; each with its State."""
    import copy

    import torch
    from lmperf.kernels import float8_delayed as f8
    from lmperf.model import SwiGLU

    fused = SwiGLU(d, f).to(device, torch.bfloat16)
    alone = copy.deepcopy(fused)
    return (fused, f8.convert(fused, skip=(), hook=False), alone,
            f8.convert(alone, skip=(), hook=False, swiglu=False))


def _step(model, x, gy, weights: list[str]) -> list:
    x = x.detach().requires_grad_()
    y = model(x)
    y.backward(gy)
    out = [y.detach(), x.grad, *(model.get_parameter(w).grad for w in weights)]
    for p in model.parameters():
        p.grad = None
    return out


def check_layers(case: dict, device: str) -> list[dict]:
    import copy

    import torch
    import torch.nn as nn
    from lmperf.kernels import float8_delayed as f8

    bsz, n, d, f = _shape(case)
    ffn = case["impl"] == "ffn"
    if case["variant"] == "wiring":
        return _wiring(bsz, n, d, f, device)
    if ffn:
        from lmperf.model import SwiGLU
        model, weights = SwiGLU(d, f).to(device, torch.bfloat16), ["w1.weight", "w3.weight", "w2.weight"]
    else:
        model, weights = nn.Sequential(nn.Linear(d, f, bias=False)).to(device, torch.bfloat16), ["0.weight"]
    ref = copy.deepcopy(model).double()  # the module as it was, in float64
    state = f8.convert(model, skip=(), hook=False)
    run = _compiled(model, case["compiled"])
    worst = {}
    for _ in range(4):  # the first step scales dynamically, the next three from the history
        state.update()
        x = torch.randn(bsz, n, d, device=device, dtype=torch.bfloat16) * 3
        gy = torch.randn(bsz, n, f if not ffn else d, device=device, dtype=torch.bfloat16) * 1e-4
        got, want = _step(run, x, gy, weights), _step(ref, x.double(), gy.double(), weights)
        for q, g_, w_ in zip(("y", "dx", *(["dw"] * len(weights))), got, want):
            err = float((g_.double() - w_).norm() / w_.norm())
            worst[q] = max(worst.get(q, 0.0), err)
    factor = FFN_FACTOR if ffn else 1.0
    return [_row(f"{q}_rel_err", err, factor * TOLERANCE[q]) for q, err in worst.items()]


@contextlib.contextmanager
def model_product():
    """Within: float8_delayed's two SwiGLU product kernels replaced by what three lone
    Float8Linear layers compute around the model's product: silu(a) * b in bf16 (PyTorch's
    rounding), and its gradients by autograd, each cast by float8_cast. A Float8SwiGLU then gives
    the lone layers' results bitwise, which checks its wiring apart from the kernels' values."""
    import torch
    import torch.nn.functional as F
    from lmperf.kernels import float8_delayed as f8

    def swiglu(a, b, scale, fp8):
        return f8.float8_cast(F.silu(a) * b, scale, fp8)

    def swiglu_backward(g, a, b, s_a, s_b, fp8):
        a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
        with torch.enable_grad():
            da, db = torch.autograd.grad(F.silu(a) * b, (a, b), g)
        return (*f8.float8_cast(da, s_a, fp8), *f8.float8_cast(db, s_b, fp8))
    kernels = f8.float8_swiglu, f8.float8_swiglu_backward
    f8.float8_swiglu, f8.float8_swiglu_backward = swiglu, swiglu_backward
    try:
        yield
    finally:
        f8.float8_swiglu, f8.float8_swiglu_backward = kernels


# delayed scales of w1, w3 and w2 (rows: input, weight, output gradient) that keep the wiring
# check's values in range: x to e4m3 near its top, weights and gradients scaled up
WIRING_SCALES = [[4.0, 2048.0, 2.0**20], [4.0, 1024.0, 2.0**21], [64.0, 4096.0, 2.0**19]]


def _wiring(bsz: int, n: int, d: int, f: int, device: str) -> list[dict]:
    """The Float8SwiGLU under model_product() against the lone layers, on fixed delayed scales:
    mismatching elements of y, dx, the gradients and the amaxes."""
    import torch

    fused, sf, alone, sa = _fused_and_alone(d, f, device)
    for state in (sf, sa):
        state.delayed = True
        state.scales.copy_(torch.tensor(WIRING_SCALES))
    weights = ["w1.weight", "w3.weight", "w2.weight"]
    wrong = 0
    with model_product():
        for _ in range(2):
            x = torch.randn(bsz, n, d, device=device, dtype=torch.bfloat16) * 3
            gy = torch.randn(bsz, n, d, device=device, dtype=torch.bfloat16) * 1e-4
            for got, want in zip(_step(fused, x, gy, weights), _step(alone, x, gy, weights)):
                wrong += int((got != want).sum())
            for lf, la in zip(sf.layers, sa.layers):
                wrong += int((lf.fp8_slot.grad != la.fp8_slot.grad).sum())
                lf.fp8_slot.grad = la.fp8_slot.grad = None
    return [_row("mismatches_against_the_lone_layers", wrong, 0)]


def measure_check(case: dict) -> list[dict]:
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and case["variant"] in ("random", "fp8", "float64"):
        raise common.NotRun(NEEDS_GPU_ROUNDING)
    seed = random.randrange(2**31)  # fresh inputs every run; the seed is kept to reproduce them
    torch.manual_seed(seed)
    check = {"cast": check_cast, "swiglu": check_swiglu, "swiglu_backward": check_swiglu, "linear": check_layers,
             "ffn": check_layers}[case["impl"]]
    rows = []
    for r in check(case, "cuda" if cuda else "cpu"):
        unit = "count" if r["metric"].endswith("_mismatches") or r["metric"] == "mismatches_against_the_lone_layers" \
            else "rel" if r["metric"].endswith("_rel_err") else "abs"
        row = common.summarize(r["metric"], unit, [r["max_abs_err"]])
        row.update(torch_err=r["torch_err"], tolerance=r["tolerance"], passed=r["passed"], seed=seed)
        rows.append(row)
    return rows


def main(argv=None):
    args = common.bench_args(__doc__, argv, studies=("check",), options=jobs.options)
    jobs.run(section="float8_delayed", study=args.study, cases=check_cases(args.spec), measure=measure_check,
             args=args, fingerprint={"spec": args.spec}, parallel=True)  # --workers: cases side by side


if __name__ == "__main__":
    main()
