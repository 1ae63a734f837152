"""What every attention implementation here accepts, and the float64 reference it is checked
against."""
from __future__ import annotations

import math

import torch

# Head dims: any multiple of 8 from 8 to 256 (both implementations).
HEAD_DIM_MIN, HEAD_DIM_MAX, HEAD_DIM_STEP = 8, 256, 8
HEAD_DIMS = tuple(range(HEAD_DIM_MIN, HEAD_DIM_MAX + 1, HEAD_DIM_STEP))
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError naming what is wrong with q, k, v of shape (..., H, N, D). k and v may
    have H_kv heads (dim -3) where H_kv divides q's H (grouped-query attention; multi-query at
    H_kv = 1); every other dim is q's."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., N, D); got {tuple(t.shape)}")
    grouped = q.dim() >= 3 and q.dim() == k.dim() and q.shape[-3] != k.shape[-3]
    if k.shape != v.shape or (q.shape != k.shape and not grouped) or \
            (grouped and (q.shape[:-3] != k.shape[:-3] or q.shape[-2:] != k.shape[-2:])):
        raise ValueError(f"q, k and v must have the same shape, but for k and v's head count (dim -3) "
                         f"in grouped-query attention; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if grouped and q.shape[-3] % k.shape[-3]:
        raise ValueError(f"q's {q.shape[-3]} heads are not a multiple of k and v's {k.shape[-3]} heads "
                         f"(dim -3): in grouped-query attention each K/V head serves H / H_kv query heads")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must have the same dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in DTYPES:
        raise ValueError(f"dtype {q.dtype} is not supported; use one of {[str(d) for d in DTYPES]}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head dimension D={q.shape[-1]} is not supported; use a multiple of "
                         f"{HEAD_DIM_STEP} from {HEAD_DIM_MIN} to {HEAD_DIM_MAX}")
    if q.shape[-2] < 1:
        raise ValueError("sequence length N must be at least 1")


def check_causal(is_causal) -> None:
    """is_causal must be a bool: a string such as "False" would otherwise count as true."""
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__} {is_causal!r}")


def repeat_kv(q: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """k or v with its H_kv heads (dim -3) repeated to q's H, each H / H_kv times in a row (query
    head h reads K/V head h // (H / H_kv)); t itself when the head counts agree. A copy: for
    references, not for kernels."""
    if t.dim() < 3 or t.shape[-3] == q.shape[-3]:
        return t
    return t.repeat_interleave(q.shape[-3] // t.shape[-3], dim=-3)


def reference(q, k, v, is_causal: bool, dtype=torch.float64):
    """(output, logsumexp) of softmax(q k^T / sqrt(D)) v computed in `dtype` (float64 for the
    reference; the inputs' own dtype for 'plain PyTorch attention in the same dtype'). k and v
    may have fewer heads than q (grouped-query attention): repeated here, so that autograd sums
    their gradients over each group."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    k, v = repeat_kv(q, k), repeat_kv(q, v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores.float() if dtype != torch.float64 else scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


# An error floor per dtype (about one unit in the last place at 1.0), so that "twice the error of
# plain PyTorch attention" stays meaningful where PyTorch happens to be exact.
ERROR_FLOOR = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def tolerance(torch_error: float, dtype: torch.dtype) -> float:
    """flash-attention's rule: the kernel's error may be at most twice the error of plain PyTorch
    attention run in the same dtype (both measured against float64), plus a small floor."""
    return 2 * torch_error + ERROR_FLOOR[dtype]


def logsumexp_candidates(out, shape) -> list[torch.Tensor]:
    """What the course's test could take for the logsumexp an implementation saved for backward:
    the float tensors of shape `shape` (q.shape[:-1]) among out.grad_fn.saved_tensors, in any
    float dtype (an L kept in bf16 passes the course's test; whether it is fp32 is a property of
    lmperf's wider contract). Under torch.compile the saved tensors are the compiled graph's, where
    L may be kept flattened: where none has the shape, the float tensors of that many elements,
    reshaped. [] for an output with no grad_fn (nothing saved)."""
    saved = getattr(getattr(out, "grad_fn", None), "saved_tensors", None) or ()
    saved = [t for t in saved if isinstance(t, torch.Tensor) and t.is_floating_point()]
    found = [t for t in saved if tuple(t.shape) == tuple(shape)]
    if not found:
        found = [t.reshape(shape) for t in saved if t.numel() == math.prod(shape)]
    return found


def one_logsumexp(found: list[torch.Tensor], shape) -> torch.Tensor:
    """The course test's rule: exactly one candidate (logsumexp_candidates) is L; AssertionError
    otherwise."""
    if len(found) != 1:
        raise AssertionError(f"expected one saved tensor of shape {tuple(shape)} (the logsumexp L, in "
                             f"any float dtype, as the course's test finds it); found {len(found)}")
    return found[0]


def saved_logsumexp(out: torch.Tensor, shape) -> torch.Tensor:
    """The logsumexp an implementation saved for backward, as the course's test finds it (the one
    tensor of shape q.shape[:-1] among out.grad_fn.saved_tensors: logsumexp_candidates,
    one_logsumexp)."""
    return one_logsumexp(logsumexp_candidates(out, shape), shape)


# The course's contract (Stanford CS336 assignment 2): what its tests check and its handout
# promises. Its test_attention.py checks O, L, dQ, dK and dV with torch.testing.assert_close at
# rtol = atol = 1e-2 on (4, 128, 64) inputs; the handout lets a kernel assume power-of-two head
# dims of at least 16 and N a multiple of its tile. COURSE_TILE: N a multiple of 128 is a multiple
# of every power-of-two tile up to 128 (and is the course test's N).
COURSE_RTOL = COURSE_ATOL = 1e-2
COURSE_HEAD_DIM_MIN = 16
COURSE_TILE = 128


def course_reasons(head_dim: int, seq_len: int) -> list[str]:
    """Why a shape lies outside the course's contract ([] when inside): "awkward_n" (N not a
    multiple of COURSE_TILE), "head_dim" (not a power of two of at least 16)."""
    reasons = []
    if seq_len % COURSE_TILE:
        reasons.append("awkward_n")
    if head_dim < COURSE_HEAD_DIM_MIN or head_dim & (head_dim - 1):
        reasons.append("head_dim")
    return reasons


def course_ratio(x: torch.Tensor, ref: torch.Tensor) -> float:
    """The course test's error as a share of its tolerance: max |x - ref| / (atol + rtol |ref|)
    (torch.testing.assert_close passes at <= 1); inf where x holds NaN or inf."""
    if not bool(torch.isfinite(x).all()):
        return float("inf")
    x, ref = x.double(), ref.double()
    return float(((x - ref).abs() / (COURSE_ATOL + COURSE_RTOL * ref.abs())).max())


QUANTITIES = ("out", "lse", "dq", "dk", "dv")


def run_impl(impl_forward, q, k, v, is_causal: bool, grad_out) -> dict:
    """One implementation's quantities on copies of q, k and v (what it does to them stays with
    the copies): {out, lse (the saved L), dq, dk, dv}, detached."""
    qkv = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = impl_forward(*qkv, is_causal)
    lse = saved_logsumexp(out, q.shape[:-1])
    out.backward(grad_out.to(out.dtype))
    return {"out": out.detach(), "lse": lse.detach(), **{g: t.grad for g, t in zip(("dq", "dk", "dv"), qkv)}}


def judge(impl: dict, q, k, v, is_causal: bool, grad_out) -> list[dict]:
    """Rows of `impl`'s quantities (run_impl's, or the same received from another process)
    against float64 computed here from q, k and v, beside plain PyTorch in the input dtype: one
    dict per quantity (out, lse, dq, dk, dv) with max abs error, PyTorch's error, tolerance, passed
    (flash-attention's rule), course_ratio and course_passed (the course test's rtol = atol = 1e-2,
    never stricter than plain PyTorch in the same dtype: passed by either rule), saved_dtype (the
    dtype the implementation returned or saved it in: L's is the course's free choice). A NaN or
    inf anywhere in `impl` fails its quantity, whatever the reference holds."""
    dtype = q.dtype
    results = {"impl": impl}
    for name, dt in (("ref", torch.float64), ("torch", dtype)):
        qkv = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        out, lse = reference(*qkv, is_causal, dtype=dt)
        out.backward(grad_out.to(out.dtype))
        results[name] = {"out": out.detach(), "lse": lse.detach(),
                         **{g: t.grad for g, t in zip(("dq", "dk", "dv"), qkv)}}
    rows = []
    for quantity in QUANTITIES:
        ref = results["ref"][quantity].double()
        err = lambda x: float((x.double() - ref).abs().max()) if torch.isfinite(x).all() else float("inf")
        impl_err, torch_err = err(impl[quantity]), err(results["torch"][quantity])
        tol = tolerance(torch_err, dtype)
        ratio = course_ratio(impl[quantity], ref)
        rows.append({"quantity": quantity, "max_abs_err": impl_err, "torch_err": torch_err,
                     "tolerance": tol, "passed": bool(impl_err <= tol), "course_ratio": ratio,
                     "course_passed": bool(ratio <= 1 or impl_err <= tol),
                     "saved_dtype": str(impl[quantity].dtype).removeprefix("torch.")})
    return rows


def compare(impl_forward, q, k, v, is_causal: bool, grad_out=None) -> list[dict]:
    """Errors of one implementation against float64, beside plain PyTorch in the input dtype
    (judge's rows). impl_forward(q, k, v, is_causal) -> output (differentiable), run on copies of
    q, k and v before any reference exists (run_impl); the references are computed afterwards
    from the untouched q, k and v."""
    grad_out = torch.randn_like(q) if grad_out is None else grad_out
    return judge(run_impl(impl_forward, q, k, v, is_causal, grad_out), q, k, v, is_causal, grad_out)
