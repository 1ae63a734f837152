"""A contender's attention checked against float64 in two halves that never share a process
(bench/contenders.py's `attention` study runs them):

- `outputs(case)` runs in the contender's own process (bench/isolation.py's child, which the
  contender's code is imported into): it builds the case's inputs from the seed the case carries,
  runs the contender's attention on them and sends back only what the contender returned (its
  output, the saved tensors the course's test could take for L, its gradients), as plain tensors
  serialised with torch.save, or the exception it raised and where. It computes no reference and
  no verdict.
- `judge(case, payload)` runs in the job's process, which never imports a contender's code: it
  rebuilds the same inputs from the seed (`inputs`), computes the float64 reference and plain
  PyTorch in the input dtype from them (kernels/attention_contract.judge) and writes the rows:
  status, errors, tolerances, verdicts. The reply is read as data alone (torch.load with
  weights_only: tensors, numbers, strings, lists and dicts), so nothing the contender's process
  sends can run code here, and nothing it sends is taken for a status or a verdict: an exception
  it reports can only make its case `skipped` (not implemented), `unsupported`, `failed` or `oom`.

So these cheats are impossible or caught: writing into the inputs (the reference comes from
inputs the contender never held); returning torch.empty in the hope of a freed reference, or
finding the reference among live objects (its process never computes one); a result channel
tampered with from inside its process (lmperf's row writer patched, a row printed, the check's
functions replaced: its process sends tensors, the verdict is computed here); a NaN or inf (an
output holding one is `wrong`, an L or a gradient holding one fails its check, whatever the
reference holds); a result cached for its inputs' storage (the `fresh` property).

What each case covers (attention_cases in bench/contenders.py makes them):
- values: out, L and dQ, dK, dV at one (shape, dtype, causal) against float64.
- gqa: the forward with K and V of fewer heads than Q, against float64 (an exception is
  `unsupported`: a contender without grouped-query attention is not wrong).
- compiles: torch.compile(fullgraph=True) of the forward at one small shape per kind (the
  spec's `compile_shape`: compiling a Python tile loop unrolls it, minutes at larger N), and
  whether the compiled output equals the eager one.
- deterministic: forward and backward 4 times on the same inputs, bitwise equal.
- fresh: called 3 times on the same tensors (as a timing loop calls it), their contents changed
  in place, called again: the output must follow the new contents (honest.stale_output's rule).
"""
from __future__ import annotations

import io

from lmperf import contenders as contenders_mod, csv_schema, dtypes, failures, guard, stats
from lmperf.bench import honest

RUNS = 4  # calls of the deterministic property
CALLS = 3  # calls on the same tensors before the fresh property changes their contents
# What an exception reported from the contender's process can make its case, by its kind
RAISED = {"not_implemented": "skipped", "unsupported": "unsupported", "oom": "oom", "failed": "failed",
          "not_a_function": "wrong"}


def not_run(case: dict) -> str | None:
    """Why the case is not run on this machine, or None (decided here, before the contender's
    process sees it)."""
    import torch
    if case["kind"] == "triton" and case["dtype"] == "bf16" and not torch.cuda.is_available():
        return "needs CUDA: Triton's interpreter computes bfloat16 dots wrongly"
    return None


def inputs(case: dict, seed: int) -> dict:
    """The case's tensors, built from `seed` on this machine's device: the same in every process
    of the same torch. q, k and v (for `gqa` K and V of fewer heads: shape [B, H, H_kv, N, D]);
    grad_out, the gradient fed to backward; for `fresh` the new contents q2, k2 and v2."""
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(int(seed))
    dims = [int(x) for x in case["shape"].split("x")]
    dtype = dtypes.torch_dtype(case["dtype"])
    make = lambda shape: torch.randn(tuple(shape), generator=gen, device=device, dtype=dtype)
    if case["check"] == "gqa":
        b, h, h_kv, n, d = dims
        t = {"q": make((b, h, n, d)), "k": make((b, h_kv, n, d)), "v": make((b, h_kv, n, d))}
    else:
        t = {name: make(dims) for name in ("q", "k", "v")}
    t["grad_out"] = make(t["q"].shape)
    if case["check"] == "fresh":
        t.update({f"{name}2": make(dims) for name in ("q", "k", "v")})
    return t


# ---------------------------------------------------------------------------------------------
# In the contender's process: its outputs, nothing else

_FUNCTIONS: dict = {}  # (contender, kind) -> fn(q, k, v, is_causal), or the exception loading it raised


def _attention(case: dict):
    key = (case["contender"], case["kind"])
    if key not in _FUNCTIONS:
        try:
            _FUNCTIONS[key] = contenders_mod.attention_fn(contenders_mod.load(case["contender"], case["source"]),
                                                          case["kind"])
        except Exception as exc:  # the adapter's or its import's failure: every case of it says so
            _FUNCTIONS[key] = exc
    if isinstance(_FUNCTIONS[key], Exception):
        raise _FUNCTIONS[key]
    return _FUNCTIONS[key]


def _kind(exc: Exception) -> str:
    if isinstance(exc, contenders_mod.NotImplementedByContender):
        return "not_implemented"
    if isinstance(exc, guard.Wrong):
        return "not_a_function"
    if isinstance(exc, failures.Unsupported):
        return "unsupported"
    return "oom" if failures.is_oom(exc) else "failed"


def _describe(x) -> dict:
    """What a returned value is: its type and, for a tensor, shape, dtype and device."""
    import torch
    if not isinstance(x, torch.Tensor):
        return {"type": type(x).__name__}
    return {"type": "Tensor", "shape": list(x.shape), "dtype": str(x.dtype), "device": str(x.device)}


def _plain(x, like):
    """A plain CPU copy of tensor `x` where it has the shape of `like` (else None: its description
    says what it is)."""
    import torch
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(like.shape):
        return None
    return x.detach().to("cpu").clone().as_subclass(torch.Tensor)


def _put(reply: dict, name: str, x, like) -> bool:
    """Record returned value `x` as `name`; whether it is a tensor of `like`'s shape."""
    reply["described"][name] = _describe(x)
    reply["tensors"][name] = _plain(x, like)
    return reply["tensors"][name] is not None


def _run_values(fn, case, t, reply, stage):
    import torch
    from lmperf.kernels.attention_contract import logsumexp_candidates
    q, k, v = (t[n].requires_grad_() for n in ("q", "k", "v"))
    stage[0] = "forward"
    out = fn(q, k, v, case["causal"])
    if not _put(reply, "out", out, q):
        return
    lse_shape = q.shape[:-1]
    reply["tensors"]["lse"] = [c.detach().to("cpu").clone().as_subclass(torch.Tensor)
                               for c in logsumexp_candidates(out, lse_shape)]
    stage[0] = "backward"
    out.backward(t["grad_out"].to(out.dtype))
    for name, leaf in zip(("dq", "dk", "dv"), (q, k, v)):
        _put(reply, name, leaf.grad, leaf)


def _run_gqa(fn, case, t, reply, stage):
    stage[0] = "gqa"
    _put(reply, "out", fn(t["q"], t["k"], t["v"], case["causal"]), t["q"])


def _run_compiles(fn, case, t, reply, stage):
    import torch
    import torch._dynamo
    torch._dynamo.reset()  # compiled here from nothing, as a user's first call would
    stage[0] = "forward"
    if not _put(reply, "eager", fn(t["q"], t["k"], t["v"], case["causal"]), t["q"]):
        return
    stage[0] = "compile"
    backend = "inductor" if torch.cuda.is_available() else "aot_eager"
    try:
        compiled = torch.compile(fn, fullgraph=True, backend=backend)(t["q"], t["k"], t["v"], case["causal"])
    except Exception as exc:  # not compiling is the property's answer, not a failure of the case
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        reply["notes"]["compile_error"] = f"torch.compile(fullgraph=True): {type(exc).__name__}: {first}"
        return
    _put(reply, "compiled", compiled, t["q"])


def _run_deterministic(fn, case, t, reply, stage):
    runs = []
    for i in range(RUNS):
        leaves = [t[n].detach().clone().requires_grad_() for n in ("q", "k", "v")]
        stage[0] = "forward"
        out = fn(*leaves, case["causal"])
        if not _put(reply, f"out{i}", out, t["q"]):
            return
        stage[0] = "backward"
        out.backward(t["grad_out"].to(out.dtype))
        runs.append([reply["tensors"][f"out{i}"]] + [_plain(x.grad, x) for x in leaves])
    reply["tensors"]["runs"] = runs


def _run_fresh(fn, case, t, reply, stage):
    import torch
    q, k, v = t["q"], t["k"], t["v"]
    stage[0] = "forward"
    with torch.no_grad():
        for i in range(CALLS):  # as a timing loop calls it: the same tensors every time
            if not _put(reply, f"call{i}", fn(q, k, v, case["causal"]), q):
                return
        for x, new in ((q, t["q2"]), (k, t["k2"]), (v, t["v2"])):
            x.copy_(new)  # new contents, the same storage
        _put(reply, "same_storage", fn(q, k, v, case["causal"]), q)
        _put(reply, "fresh", fn(q.clone(), k.clone(), v.clone(), case["causal"]), q)


RUN = {"values": _run_values, "gqa": _run_gqa, "compiles": _run_compiles, "deterministic": _run_deterministic,
       "fresh": _run_fresh}
def outputs(case: dict) -> bytes:
    """In the contender's process: the case's inputs built from case['seed'], the contender's
    attention run on them, and what it returned or raised, serialised (torch.save) for `judge`.
    Never raises: an exception of the contender's is reported with the stage it came from. What
    the contender compiles (a backward the 2025 handout compiles with torch.compile) stays
    compiled from case to case, as in any long-lived process, under PyTorch's own recompile
    limit."""
    import torch
    reply = {"device": "", "stage": "load", "raised": None, "tensors": {}, "described": {}, "notes": {}}
    stage = ["load"]
    try:
        fn = _attention(case)
        t = inputs(case, case["seed"])
        reply["device"] = str(t["q"].device)
        RUN[case["check"]](fn, case, t, reply, stage)
    except Exception as exc:  # the contender's failure, reported as what it raised
        message = str(exc) if isinstance(exc, failures.NotRun) else failures.describe(exc)
        reply["raised"] = {"stage": stage[0], "kind": _kind(exc), "message": failures.bounded(message)}
    reply["stage"] = stage[0]
    buffer = io.BytesIO()
    torch.save(reply, buffer)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# In the job's process: the reference and the verdict


class Unreadable(ValueError):
    """A reply that is not what `outputs` sends."""


def decode(payload: bytes) -> dict:
    """The reply of the contender's process as data (torch.load with weights_only: nothing in it
    can run code here); Unreadable where it is not a reply of `outputs`'s form."""
    import torch
    if not payload:
        raise Unreadable("the contender's process sent no reply")
    try:
        reply = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as exc:
        raise Unreadable(f"the contender's process sent a reply that is not plain data: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
    fields = {"device": str, "stage": str, "tensors": dict, "described": dict, "notes": dict}
    if not isinstance(reply, dict) or any(not isinstance(reply.get(k), t) for k, t in fields.items()) \
            or not (reply.get("raised") is None or isinstance(reply["raised"], dict)):
        raise Unreadable("the contender's process sent a reply of another form than the check's")
    return reply


def _wrong(message: str) -> list[dict]:
    return [csv_schema.failure_row("wrong", message)]


def _raised_rows(raised: dict, unsupported_as: str | None = None) -> list[dict]:
    """The row of an exception the contender's process reported: its kind decides among
    skipped, unsupported, failed and oom (and wrong for an adapter that returned no autograd
    Function), never ok."""
    kind, message = str(raised.get("kind")), str(raised.get("message", ""))[:failures.MESSAGE_LIMIT]
    status = RAISED.get(kind, "failed")
    if status == "skipped" and not message.startswith("not implemented"):
        message = f"not implemented: {message}"
    if unsupported_as is not None and status == "failed":
        status, message = "unsupported", f"{unsupported_as}: {message}"
    return [csv_schema.failure_row(status, message)]


def _tensor(reply: dict, name: str, like, what: str, device: str, finite: bool = True):
    """The returned tensor `name`, on `like`'s device; guard.Wrong naming what is wrong with it
    (not a tensor, its shape, dtype or device, NaN or inf where `finite`)."""
    import torch
    x = reply["tensors"].get(name)
    seen = reply["described"].get(name) or {}
    if x is None or not isinstance(x, torch.Tensor):
        if seen.get("type") == "Tensor":
            problems = [f"shape {tuple(seen.get('shape', ()))} (expected {tuple(like.shape)})"]
            if seen.get("dtype") != str(like.dtype):
                problems.append(f"dtype {seen.get('dtype')} (expected {like.dtype})")
            raise guard.Wrong(f"{what} has " + ", ".join(problems))
        raise guard.Wrong(f"{what} is a {seen.get('type', 'nothing')}, not a tensor")
    problems = []
    if tuple(x.shape) != tuple(like.shape):
        problems.append(f"shape {tuple(x.shape)} (expected {tuple(like.shape)})")
    if x.dtype != like.dtype:
        problems.append(f"dtype {x.dtype} (expected {like.dtype})")
    if seen.get("device") != device:
        problems.append(f"device {seen.get('device')} (expected {device})")
    if problems:
        raise guard.Wrong(f"{what} has " + ", ".join(problems))
    x = x.to(like.device)
    if finite and not bool(torch.isfinite(x).all()):
        raise guard.Wrong(f"{what} holds NaN or inf")
    return x


def _property_row(prop: str, holds: bool, message: str = "") -> dict:
    row = stats.summarize(prop, "bool", [float(holds)])
    row.update(passed=bool(holds), message=message)
    return row


def _judge_values(case, t, reply, device):
    from lmperf.kernels.attention_contract import judge as compare_rows, one_logsumexp
    raised = reply["raised"]
    if raised is not None and raised.get("stage") != "backward":
        return _raised_rows(raised)
    q = t["q"]
    out = _tensor(reply, "out", q, "output", device)
    lse_shape = q.shape[:-1]
    found = [c for c in reply["tensors"].get("lse") or [] if hasattr(c, "shape") and tuple(c.shape) == tuple(lse_shape)
             and c.is_floating_point()]
    try:
        lse = one_logsumexp(found, lse_shape).to(q.device)
    except AssertionError as exc:
        raise guard.Wrong(str(exc)) from None
    if raised is not None:
        return _raised_rows(raised)
    grads = {}
    for name, like in (("dq", q), ("dk", t["k"]), ("dv", t["v"])):
        if reply["described"].get(name, {}).get("type") == "NoneType":
            raise guard.Wrong(f"no gradient for {name[1]}: its backward returned None")
        grads[name] = _tensor(reply, name, like, f"gradient {name}", device, finite=False)
    compared = compare_rows({"out": out, "lse": lse, **grads}, q, t["k"], t["v"], case["causal"], t["grad_out"])
    lse_dtype = next(r["saved_dtype"] for r in compared if r["quantity"] == "lse")
    rows = []
    for r in compared:
        row = stats.summarize(f"{r['quantity']}_max_abs_err", "abs", [r["max_abs_err"]])
        row.update(torch_err=r["torch_err"], tolerance=r["tolerance"], passed=r["passed"],
                   course_ratio=r["course_ratio"], course_passed=r["course_passed"], lse_dtype=lse_dtype)
        rows.append(row)
    return rows


def _judge_gqa(case, t, reply, device):
    import torch
    from lmperf.kernels.attention_contract import reference, tolerance
    raised = reply["raised"]
    if raised is not None:
        return _raised_rows(raised, unsupported_as="does not take fewer K/V heads than Q heads"
                            if raised.get("stage") == "gqa" else None)
    q, k, v = t["q"], t["k"], t["v"]
    out = _tensor(reply, "out", q, "output", device)
    ref, _ = reference(q, k, v, case["causal"], dtype=torch.float64)
    torch_out, _ = reference(q, k, v, case["causal"], dtype=q.dtype)
    err = float((out.double() - ref).abs().max())
    tol = tolerance(float((torch_out.double() - ref).abs().max()), q.dtype)
    return [_property_row("gqa", err <= tol, f"forward error {err:.3g}, tolerance {tol:.3g}")]


def _judge_compiles(case, t, reply, device):
    import torch
    if reply["raised"] is not None:
        return _raised_rows(reply["raised"])
    eager = _tensor(reply, "eager", t["q"], "output", device)
    if "compile_error" in reply["notes"]:
        return [_property_row("compiles", False, str(reply["notes"]["compile_error"])[:400])]
    compiled = _tensor(reply, "compiled", t["q"], "compiled output", device)
    if torch.equal(compiled, eager):
        return [_property_row("compiles", True, "compiled equals eager bitwise")]
    err = float((compiled.double() - eager.double()).abs().max())
    return [_property_row("compiles", True, f"compiled differs from eager by up to {err:.3g}")]


def _judge_deterministic(case, t, reply, device):
    import torch
    if reply["raised"] is not None:
        return _raised_rows(reply["raised"])
    runs = []
    for i in range(RUNS):
        out = _tensor(reply, f"out{i}", t["q"], "output", device)
        got = (reply["tensors"].get("runs") or [])[i:i + 1]
        if not got or len(got[0]) != 4 or any(g is None for g in got[0][1:]):
            raise guard.Wrong("a gradient is missing: its backward returned None")
        runs.append([out] + [g.to(out.device) for g in got[0][1:]])
    same = all(all(torch.equal(a, b) for a, b in zip(runs[0], run)) for run in runs[1:])
    return [_property_row("deterministic", same, f"forward and backward bitwise equal over {RUNS} runs" if same
                          else "forward or backward differ between runs on the same inputs")]


def _judge_fresh(case, t, reply, device):
    import torch
    if reply["raised"] is not None:
        return _raised_rows(reply["raised"])
    for i in range(CALLS):
        _tensor(reply, f"call{i}", t["q"], "output", device)
    fresh = _tensor(reply, "fresh", t["q"], "output", device)
    same_storage = _tensor(reply, "same_storage", t["q"], "output", device, finite=False)
    err = float((same_storage.double() - fresh.double()).abs().max())
    scale = max(1.0, float(fresh.double().abs().max()))
    tol = honest.stale_tolerance(t["q"].dtype) * scale
    if not err <= tol:  # NaN included
        raise guard.Wrong(honest.stale_message(err, tol))
    return [_property_row("fresh", True, "the output follows the inputs' contents in the same storage")]


JUDGE = {"values": _judge_values, "gqa": _judge_gqa, "compiles": _judge_compiles,
         "deterministic": _judge_deterministic, "fresh": _judge_fresh}


def judge(case: dict, payload: bytes) -> list[dict]:
    """In the job's process: the case's rows from the contender's reply (`outputs`), against
    float64 computed here from inputs rebuilt from case['seed']. A reply that cannot be read is a
    `failed` row; a returned value against the contract a `wrong` row."""
    try:
        reply = decode(payload)
    except Unreadable as exc:
        rows = [csv_schema.failure_row("failed", str(exc))]
    else:
        t = inputs(case, case["seed"])
        try:
            rows = JUDGE[case["check"]](case, t, reply, str(t["q"].device))
        except guard.Wrong as exc:
            rows = _wrong(str(exc))
    return [{**row, "seed": case["seed"]} for row in rows]
