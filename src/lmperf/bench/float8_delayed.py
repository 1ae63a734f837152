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
  error of the same computation in PyTorch in fp32, plus a floor), or four units in the last
  place of the largest value where that is more (`_ulps`: at a few dozen elements PyTorch's own
  error can be 0); variant `fp8` (needs CUDA),
  the elements written in fp8 that differ from PyTorch's rounding of the fp32 values (0 allowed).
- `linear` (a Float8Linear) and `ffn` (a Float8SwiGLU: lmperf.model.SwiGLU converted), bf16,
  shape (B, N, d_in, d_out) or (B, N, d_model, d_ff): variant `float64` (needs CUDA), the
  relative error (Frobenius) of y, dx and each weight gradient against float64 over a first step
  (dynamic scales) and three delayed ones, each against the error of the same computation
  emulated in PyTorch (`fp8_emulated`: every operand the layer rounds to fp8 rounded by PyTorch's
  cast at the scale the layer used, the products in float64, the FFN's 16-bit intermediates
  rounded to bf16 as the layer writes them): at most 1.5 times it plus bf16's
  unit roundoff (the layer writes y and the gradients in bf16), at the step where the ratio is
  worst. fp8's error does not fall with the shape, but its spread does: a fixed tolerance that
  holds at the model's shapes fails on a layer of 16 features (y 0.097 against 0.09, H100,
  81c247bc74f6) where PyTorch's own rounding errs as much, and at 3 tokens a delayed scale can
  clamp a gradient whose amax doubled since the history's (delayed scaling's own error, which the
  emulation at the same scales shares); variant `wiring` (`ffn`,
  eager; runs anywhere): with its two product kernels replaced by the model's bf16 product and
  float8_cast, the Float8SwiGLU against the three lone Float8Linear layers on fixed delayed
  scales: the elements of y, dx, the gradients and the amaxes that differ (0 allowed).
"""
from __future__ import annotations

import contextlib
import itertools
import random

from lmperf import dtypes, failures, stats
from lmperf.bench import cli, jobs

NEEDS_GPU_ROUNDING = ("needs CUDA: Triton's interpreter rounds to fp8 wrongly where rounding carries into the "
                      "exponent (127.3 -> 64 in e4m3; triton-lang/triton#8322)")
# A layer's relative error (Frobenius norm) against float64 may be at most EMULATED_FACTOR times
# that of fp8_emulated (the same roundings to fp8 by PyTorch, exact products) plus BF16_ROUNDOFF
# (y and the gradients are written in bf16, and summed in fp32, not float64): at the model's
# shapes the H100 measured ratios of 1.00-1.04
EMULATED_FACTOR = 1.5
FP32_ULPS = 4  # the kernels' fp32 values may differ from PyTorch's by a few roundings (their own
#                sigmoid and operation order), whatever PyTorch's error at a shape
BF16_ROUNDOFF = 2.0 ** -8
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


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning: the correctness check, study `check`)."""
    return check_cases(spec)


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
    dtype, fp8 = dtypes.torch_dtype(case["dtype"]), _fp8(case["fp8"])
    if case["variant"] == "held":
        held = torch.tensor([0, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, -0.25, -0.5, -0.75, -1, -1.5, -2, -3, -4])
        x = held[torch.randint(0, len(held), (m, k + 5))].to(device)
        x[0, 0] = 6e4  # past both formats' range once scaled (and within fp16's): clamped to the largest value
    else:
        x = torch.randn(m, k + 5, device=device) * 50
    x = x.to(dtype)[:, :k]  # rows with a stride, as a view of the model's tensors may have
    scale = torch.tensor(2.0, device=device)
    y, yt, amax = _compiled(f8.float8_cast, case["compiled"])(x, scale, fp8)
    ref = (fp8_round(x.double(), fp8, 2.0) * 2.0).float()
    wrong = int((y.float() != ref).sum()) + int((yt[:, :m].t().float() != ref).sum()) + int(yt[:, m:].float().any())
    amax_err = abs(float(amax) - float(x.double().abs().max()))
    return [_row("y_and_transpose_mismatches", wrong, 0), _row("amax_abs_err", amax_err, 0)]


def _swiglu_reference(g, a, b):
    """h, da, db of h = silu(a) * b for dh = g, in the inputs' dtype (fp32 here) or float64."""
    import torch
    s = torch.sigmoid(a)
    return a * s * b, g * b * s * (1 + a * (1 - s)), g * a * s


def _ulps(want) -> float:
    """FP32_ULPS units in the last place of fp32 at the largest |value| of `want`, the least
    tolerance of a check: the house rule's fp32 floor (1e-5) is for values about 1 and is below one
    such unit past 84, and at a few dozen elements PyTorch's own error can be 0 by chance (H100: a
    5 x 7 case failed against 2 * 0 + 1e-5)."""
    return FP32_ULPS * 2.0 ** -23 * float(want.abs().max())


def check_swiglu(case: dict, device: str) -> list[dict]:
    import torch
    from lmperf.kernels import float8_delayed as f8
    from lmperf.kernels.attention_contract import tolerance

    m, k = _shape(case)
    dtype = dtypes.torch_dtype(case["dtype"])
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
            tol = max(tolerance(torch_err, torch.float32), _ulps(want))
            rows.append(_row(f"{name}_max_abs_err", err, tol, torch_err))
            layout = int((yt[:, :m].t() != y).sum()) + int(yt[:, m:].any())
            rows.append(_row(f"{name}_transpose_mismatches", layout, 0))
            amax_err = float(abs(amax.double() - ref64[i].abs().max()))
            amax_tol = max(tolerance(float((ref32[i].double() - ref64[i]).abs().max()), torch.float32), _ulps(ref64[i]))
            rows.append(_row(f"{name}_amax_abs_err", amax_err, amax_tol))
        return rows
    for fp8_name in ("e4m3", "e5m2"):
        fp8 = _fp8(fp8_name)
        for name, (y, yt, amax), (ye, yte, amaxe) in zip(names, run(fp8), exact):
            wrong = int((y.double() != fp8_round(ye.double(), fp8, 1.0)).sum())
            wrong += int((yt.double() != fp8_round(yte.double(), fp8, 1.0)).sum()) + int(amax != amaxe)
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


def fp8_round(t, fmt, scale: float | None = None):
    """t rounded to the fp8 format `fmt` by PyTorch's cast at `scale` (values past the format's
    range clamped to its largest), or at a dynamic tensorwise scale (fp8_max / (amax * HEADROOM),
    as a layer's first step) where None, back in float64."""
    import torch
    from lmperf.kernels import float8_delayed as f8

    fmax, s = torch.finfo(fmt).max, scale
    if s is None:
        amax = float(t.abs().max())
        s = fmax / (amax * f8.HEADROOM) if amax > 0 else 1.0
    return (t * s).float().clamp(-fmax, fmax).to(fmt).double() / s


def bf16_round(t):
    """A float64 tensor rounded to bf16, back in float64."""
    import torch
    return t.to(torch.bfloat16).double()


def fp8_emulated(weights: list, x, gy, ffn: bool, scales: list | None = None) -> list:
    """y, dx and the weight gradients (in `weights`' order: [w] or [w1, w3, w2]) of a Float8Linear
    or a Float8SwiGLU on float64 x, gy and weights, with every operand the layer rounds to fp8
    rounded by PyTorch (x, the weights and h in e4m3; gy and the SwiGLU's da and db in e5m2) and
    everything else in float64, but for the Float8SwiGLU's 16-bit intermediates, rounded to bf16 as
    the layer writes them (its products a = x w1 and b = x w3, and dh = gy w2): at 3 tokens one
    e5m2 rounding of da that dh's bf16 rounding flips can double dw1's error (H200, 9887cd0ef04d:
    0.136 against 0.066 without them, 0.136 with). `scales`: each layer's (input, weight,
    gradient) scales, in `weights`' order, as the layer's State holds them on a delayed step (x
    takes w1's, h w2's, gy w2's, da w1's and db w3's); None: every tensor scaled dynamically, as on
    the first step."""
    import torch
    from lmperf.kernels import float8_delayed as f8

    e4, e5 = f8.E4M3, f8.E5M2
    s = scales or [(None, None, None)] * len(weights)
    lead = x.shape[:-1]
    x2, g2 = x.reshape(-1, x.shape[-1]), gy.reshape(-1, gy.shape[-1])
    if not ffn:
        xq, wq, gq = fp8_round(x2, e4, s[0][0]), fp8_round(weights[0], e4, s[0][1]), fp8_round(g2, e5, s[0][2])
        return [(xq @ wq.T).reshape(*lead, -1), (gq @ wq).reshape(x.shape), gq.T @ xq]
    (s1, s3, s2), xq, gq = s, fp8_round(x2, e4, s[0][0]), fp8_round(g2, e5, s[2][2])
    w1, w3, w2 = (fp8_round(w, e4, si[1]) for w, si in zip(weights, s))
    a, b = bf16_round(xq @ w1.T), bf16_round(xq @ w3.T)
    sig = torch.sigmoid(a)
    hq = fp8_round(a * sig * b, e4, s2[0])
    dh = bf16_round(gq @ w2)
    daq = fp8_round(dh * b * sig * (1 + a * (1 - sig)), e5, s1[2])
    dbq = fp8_round(dh * a * sig, e5, s3[2])
    return [(hq @ w2.T).reshape(*lead, -1), (daq @ w1 + dbq @ w3).reshape(x.shape), daq.T @ xq, dbq.T @ xq,
            gq.T @ hq]


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
    worst = {}  # quantity -> (ratio, error, emulated error), at the step where the ratio is worst
    for _ in range(4):  # the first step scales dynamically, the next three from the history
        state.update()
        x = torch.randn(bsz, n, d, device=device, dtype=torch.bfloat16) * 3
        gy = torch.randn(bsz, n, f if not ffn else d, device=device, dtype=torch.bfloat16) * 1e-4
        # the scales this step's layers use: their State's after a step, dynamic on the first
        scales = ([model.get_submodule(w.rpartition(".")[0]).fp8_scales.tolist() for w in weights]
                  if state.delayed else None)
        got, want = _step(run, x, gy, weights), _step(ref, x.double(), gy.double(), weights)
        emulated = fp8_emulated([ref.get_parameter(w).detach() for w in weights], x.double(), gy.double(), ffn,
                                scales)
        for q, g_, e_, w_ in zip(("y", "dx", *(["dw"] * len(weights))), got, emulated, want):
            err = float((g_.double() - w_).norm() / w_.norm())
            emu = float((e_ - w_).norm() / w_.norm())
            if q not in worst or err / emu > worst[q][0]:
                worst[q] = (err / emu, err, emu)
    return [_row(f"{q}_rel_err", err, EMULATED_FACTOR * emu + BF16_ROUNDOFF, emu)
            for q, (_, err, emu) in worst.items()]


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
        raise failures.NotRun(NEEDS_GPU_ROUNDING)
    seed = random.randrange(2**31)  # fresh inputs every run; the seed is kept to reproduce them
    torch.manual_seed(seed)
    check = {"cast": check_cast, "swiglu": check_swiglu, "swiglu_backward": check_swiglu, "linear": check_layers,
             "ffn": check_layers}[case["impl"]]
    rows = []
    for r in check(case, "cuda" if cuda else "cpu"):
        unit = "count" if r["metric"].endswith("_mismatches") or r["metric"] == "mismatches_against_the_lone_layers" \
            else "rel" if r["metric"].endswith("_rel_err") else "abs"
        row = stats.summarize(r["metric"], unit, [r["max_abs_err"]])
        row.update(torch_err=r["torch_err"], tolerance=r["tolerance"], passed=r["passed"], seed=seed)
        rows.append(row)
    return rows


def main(argv=None):
    args = cli.bench_args(__doc__, argv, studies=("check",), options=jobs.options)
    jobs.run(section="float8_delayed", study=args.study, cases=check_cases(args.spec), measure=measure_check,
             args=args, fingerprint={"spec": args.spec}, parallel=True)  # --workers: cases side by side


if __name__ == "__main__":
    main()
