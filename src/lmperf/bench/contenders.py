"""Contenders checked against float64 before anything of theirs is timed (lmperf.contenders).

    python -m lmperf.bench.contenders attention --spec '{"contenders": {...}, ...}' --out .../attention.csv --hw cpu
    python -m lmperf.bench.contenders distributed --spec '{"contenders": {...}, ...}' --out .../distributed.csv --hw cpu

`attention`: each attention adapter (`<name>_triton`, `<name>_pytorch`) as CS336 passes it
((batch, N, D) inputs), first on the course's contract (`course`: the handout's shapes, power-of-two
head dims of at least 16 and N a multiple of 128, in the timed dtypes; tier "course"), then on
lmperf's wider one (awkward N, head dims 8 to 256, fp16; tier "wider", each case saying why it lies
outside the course: `outside`), causal and not: out, L (the one saved tensor of shape (batch, N),
in any float dtype, as the course's test finds it) and dQ, dK, dV against float64, each row with
the course test's error (rtol = atol = 1e-2: `course_ratio`, `course_passed`), flash-attention's
tolerance (at most twice plain PyTorch's error in the same dtype: `passed`) and L's dtype. Then its
properties, one case each: grouped-query (K and V with fewer heads, (B, H, N, D) inputs), compiles
(torch.compile fullgraph, the same result as eager), deterministic (forward and backward bitwise
equal over repeats) and fresh (a result follows its inputs when their contents change in the same
storage: an implementation that caches is caught). The report judges them (report/contenders.py).

`distributed`: each distributed adapter (DDP, FSDP, sharded optimizer) trains a small model for a
few steps in 2 processes over Gloo; its weights must equal one process's training on the whole
batch (the assignment's correctness).

Every case runs in a child process of its own contender's, with a time limit (bench/isolation.py;
two contenders never share an interpreter, so that packages of one name cannot collide): one that
hangs, kills its process, runs out of memory or returns the wrong shape, dtype, device or NaN is
a row (`timeout`, `crashed`, `oom`, `wrong`) and the job goes on. An adapter that is missing or
raises NotImplementedError is a `skipped` row saying "not implemented".
"""
from __future__ import annotations

import os
import random

from lmperf import contenders as contenders_mod
from lmperf.bench import common, failures, honest, isolation, jobs

PROPERTIES = ("gqa", "compiles", "deterministic", "fresh")


# ---------------------------------------------------------------------------------------------
# Cases


def attention_cases(spec: dict) -> list[dict]:
    """contender x kind x (the course's contract: course.dtypes x causal x course.shapes; then
    lmperf's wider contract: dtype x causal x shape; then each property). A values case carries
    its tier ("course" or "wider"), its head dim, N and whether N is a multiple of the course's
    tile (`aligned`, `tile`), and for a wider case why it lies outside the course (`outside`:
    awkward_n, head_dim, dtype): the report's shape classes and properties are read from them."""
    from lmperf.kernels.attention_contract import COURSE_TILE, course_reasons

    course = spec.get("course") or {}
    course_dtypes = list(course.get("dtypes", spec["dtypes"]))
    for shape in course.get("shapes", []):
        if course_reasons(shape[-1], shape[-2]):
            raise contenders_mod.ContenderError(
                f"contenders_check course shape {shape}: outside the course's contract "
                f"({', '.join(course_reasons(shape[-1], shape[-2]))}): power-of-two head dims of at "
                f"least 16, N a multiple of {COURSE_TILE}")
    grids = [("course", course_dtypes, course.get("shapes", [])), ("wider", spec["dtypes"], spec["shapes"])]
    cases = []
    for name, source in contenders_mod.normalise(spec["contenders"]).items():
        for kind in spec.get("kinds", list(contenders_mod.ATTENTION)):
            base = {"contender": name, "source": source, "kind": kind, "provider": f"{name}_{kind}"}
            seen = set()
            for tier, dtypes, shapes in grids:
                for dtype in dtypes:
                    for causal in spec["causal"]:
                        for shape in shapes:
                            shape_id = "x".join(map(str, shape))
                            case_id = f"{name}_{kind}-{dtype}-{'causal' if causal else 'full'}-{shape_id}"
                            if case_id in seen:  # listed in both tiers: the course's
                                continue
                            seen.add(case_id)
                            outside = course_reasons(shape[-1], shape[-2]) + \
                                (["dtype"] if dtype not in course_dtypes else [])
                            cases.append({**base, "check": "values", "dtype": dtype, "causal": causal,
                                          "shape": shape_id, "case_id": case_id,
                                          "tier": tier,
                                          "outside": ",".join(outside), "head_dim": shape[-1],
                                          "seq_len": shape[-2], "tile": COURSE_TILE,
                                          "aligned": shape[-2] % COURSE_TILE == 0})
            for prop in spec.get("properties", PROPERTIES):
                shape = spec["gqa_shape"] if prop == "gqa" else spec["property_shape"]
                shape_id = "x".join(map(str, shape))
                cases.append({**base, "check": prop, "dtype": spec["property_dtype"], "causal": True,
                              "shape": shape_id, "case_id": f"{name}_{kind}-{prop}-{shape_id}",
                              "tier": "property", "head_dim": shape[-1], "seq_len": shape[-2],
                              "tile": COURSE_TILE, "aligned": shape[-2] % COURSE_TILE == 0})
    return cases


def distributed_cases(spec: dict) -> list[dict]:
    """contender x adapter contract (lmperf.contenders.DISTRIBUTED, both handout years), trained
    on Gloo, or those of them the spec's `contracts` names: the bucketed DDP once per bucket size
    (`bucket_sizes_mb`), FSDP once per compute dtype (`fsdp_dtypes`; defaults:
    bench/contender_distributed.py)."""
    from lmperf.bench import contender_distributed
    cases = []
    for name, source in contenders_mod.normalise(spec["contenders"]).items():
        for contract in spec.get("contracts", contenders_mod.DISTRIBUTED):
            for extra in contender_distributed.cases(contract, spec):
                part = extra.pop("id")
                cases.append({"contender": name, "source": source, "contract": contract, "backend": "gloo",
                              "procs": spec.get("procs", 2), "steps": spec.get("steps", 3), **extra,
                              "case_id": f"{name}-{contract}-{part + '-' if part else ''}gloo"})
    return cases


# ---------------------------------------------------------------------------------------------
# attention


def _contender(case: dict):
    return contenders_mod.load(case["contender"], case["source"])


def _inputs(case: dict, seed: int):
    import torch
    cuda = torch.cuda.is_available()
    gen = torch.Generator(device="cuda" if cuda else "cpu").manual_seed(seed)
    dims = [int(x) for x in case["shape"].split("x")]
    dtype = common.torch_dtype(case["dtype"])
    make = lambda shape: torch.randn(shape, generator=gen, device=gen.device, dtype=dtype)
    if case["check"] == "gqa":  # [B, H, H_kv, N, D]
        b, h, h_kv, n, d = dims
        return make((b, h, n, d)), make((b, h_kv, n, d)), make((b, h_kv, n, d))
    return make(dims), make(dims), make(dims)


def measure_attention(case: dict) -> list[dict]:
    """A case's rows; what the contender's code raises is a `failed` row (an out-of-memory an
    `oom` row), what it returns against the contract a `wrong` row."""
    try:
        return _measure_attention(case)
    except common.NotRun:
        raise
    except AssertionError as exc:  # the contract's own checks (attention_contract.saved_logsumexp)
        raise contenders_mod.Wrong(str(exc)) from None
    except Exception as exc:
        if failures.is_oom(exc):
            raise
        raise contenders_mod.Failed(failures.describe(exc)) from None


def _measure_attention(case: dict) -> list[dict]:
    import torch
    from lmperf.kernels.attention_contract import compare

    cuda = torch.cuda.is_available()
    if case["kind"] == "triton" and case["dtype"] == "bf16" and not cuda:
        raise common.NotRun("needs CUDA: Triton's interpreter computes bfloat16 dots wrongly")
    fn = contenders_mod.attention_fn(_contender(case), case["kind"])
    seed = random.randrange(2**31)  # fresh inputs every run; the seed is kept to reproduce them
    q, k, v = _inputs(case, seed)
    if case["check"] != "values":
        return [{**row, "seed": seed} for row in _property(case, fn, q, k, v)]

    def forward(q, k, v, is_causal):
        out = fn(q, k, v, is_causal)
        honest.check_output(out, q)
        return out
    rows = []
    compared = compare(forward, q, k, v, case["causal"])
    lse_dtype = next(r["saved_dtype"] for r in compared if r["quantity"] == "lse")
    for r in compared:
        row = common.summarize(f"{r['quantity']}_max_abs_err", "abs", [r["max_abs_err"]])
        row.update(torch_err=r["torch_err"], tolerance=r["tolerance"], passed=r["passed"],
                   course_ratio=r["course_ratio"], course_passed=r["course_passed"], lse_dtype=lse_dtype,
                   seed=seed)
        rows.append(row)
    return rows


def _property_row(prop: str, holds: bool, message: str = "") -> dict:
    row = common.summarize(prop, "bool", [float(holds)])
    row.update(passed=bool(holds), message=message)
    return row


def _property(case: dict, fn, q, k, v) -> list[dict]:
    """One row: whether the contender has the property `case['check']`."""
    import torch
    from lmperf.kernels.attention_contract import reference

    prop, causal = case["check"], case["causal"]
    if prop == "gqa":
        try:
            out = fn(q, k, v, causal)
        except Exception as exc:  # a contender without grouped-query attention: not wrong, unsupported
            raise common.Unsupported(f"does not take fewer K/V heads than Q heads: "
                                     f"{type(exc).__name__}: {str(exc)[:200]}") from None
        honest.check_output(out, q)
        ref, _ = reference(q, k, v, causal, dtype=torch.float64)
        torch_out, _ = reference(q, k, v, causal, dtype=q.dtype)
        from lmperf.kernels.attention_contract import tolerance
        err = float((out.double() - ref).abs().max())
        tol = tolerance(float((torch_out.double() - ref).abs().max()), q.dtype)
        return [_property_row("gqa", err <= tol, f"forward error {err:.3g}, tolerance {tol:.3g}")]
    if prop == "compiles":
        cuda = torch.cuda.is_available()
        import torch._dynamo
        torch._dynamo.reset()
        eager = fn(q, k, v, causal)
        try:
            compiled = torch.compile(fn, fullgraph=True, backend="inductor" if cuda else "aot_eager")(q, k, v, causal)
        except Exception as exc:
            return [_property_row("compiles", False, f"torch.compile(fullgraph=True): {type(exc).__name__}: "
                                                     f"{str(exc).splitlines()[0][:300] if str(exc) else ''}")]
        honest.check_output(compiled, q, "compiled output")
        same = torch.equal(compiled, eager)
        err = float((compiled.double() - eager.double()).abs().max())
        return [_property_row("compiles", True, "compiled equals eager bitwise" if same else
                              f"compiled differs from eager by up to {err:.3g}")]
    if prop == "deterministic":
        grad_out = torch.randn_like(q)

        def run():
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            out = fn(*leaves, causal)
            honest.check_output(out, q)
            out.backward(grad_out)
            return [out.detach()] + [t.grad for t in leaves]
        first = run()
        same = all(all(torch.equal(a, b) for a, b in zip(first, run())) for _ in range(3))
        return [_property_row("deterministic", same, "forward and backward bitwise equal over 4 runs" if same
                              else "forward or backward differ between runs on the same inputs")]
    if prop == "fresh":
        with torch.no_grad():
            for _ in range(3):  # called as a timing loop calls it: the same tensors every time
                honest.check_output(fn(q, k, v, causal), q)
        why = honest.stale_output(fn, q, k, v, causal)
        if why:
            raise contenders_mod.Wrong(why)
        return [_property_row("fresh", True, "the output follows the inputs' contents in the same storage")]
    raise ValueError(f"unknown property {prop!r}")


# ---------------------------------------------------------------------------------------------
# distributed


def measure_distributed(case: dict) -> list[dict]:
    from lmperf.bench import contender_distributed
    return contender_distributed.measure(case, _contender(case))


class PerContender:
    """isolation.Ahead's children, one contender at a time: a case runs only in a child of its own
    contender, so two contenders' packages of one name (every student's `cs336_systems`) never
    meet in an interpreter. Each contender's cases are measured ahead of the job's loop in
    `workers` children of its own, started when the loop reaches its first case (the cases come
    contender by contender: attention_cases, distributed_cases) and closed when it moves on."""

    def __init__(self, measure, time_limit_s: float, workers: int, cases: list[dict]):
        self.measure, self.time_limit_s, self.workers = measure, time_limit_s, workers
        self.todo: dict[str, list[dict]] = {}
        for case in cases:
            self.todo.setdefault(case["contender"], []).append(case)
        self.name, self.ahead = None, None

    def __call__(self, case: dict) -> list[dict]:
        if case["contender"] != self.name:
            self._close()
            self.name = case["contender"]
            # a contender met again (an unusual selection of cases): the rest in fresh children
            self.ahead = isolation.Ahead(self.measure, self.time_limit_s, self.workers, self.todo.pop(self.name, []))
        return self.ahead(case)

    def _close(self, *exc) -> None:
        if self.ahead is not None:
            self.ahead.__exit__(*(exc or (None, None, None)))
        self.name, self.ahead = None, None

    def __enter__(self) -> "PerContender":
        return self

    def __exit__(self, *exc) -> None:
        self._close(*exc)


STUDIES = {"attention": (attention_cases, measure_attention), "distributed": (distributed_cases, measure_distributed)}


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares."""
    return STUDIES[study][0](spec)


def main(argv=None):
    args = common.bench_args(__doc__, argv, studies=STUDIES, options=lambda p: jobs.options(p, workers=False),
                             shares_device=True)  # checks, not timings
    measure = STUDIES[args.study][1]
    try:
        cases = job_cases(args.study, args.spec)
    except contenders_mod.ContenderError as exc:
        raise SystemExit(f"error: {exc}") from None
    limit = float(args.spec.get("time_limit_s", 600))
    # the contenders' files: an edit to one starts its journal over
    digest = contenders_mod.digest(args.spec["contenders"])
    # the children load their own contender alone, never every contender the environment names
    os.environ.pop(contenders_mod.ENV, None)
    # each case in a child process (a crash or a hang is its row), `workers` of them side by side,
    # and every child one contender's: two contenders never share an interpreter
    jobs.run(section="contenders", study=args.study, cases=cases, measure=measure, args=args,
             fingerprint={"spec": args.spec, "contender_files": digest},
             ahead=lambda todo: PerContender(measure, limit, int(args.spec.get("workers", 1)), todo))


if __name__ == "__main__":
    main()
