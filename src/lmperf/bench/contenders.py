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
properties, one case each: grouped-query (K and V with fewer heads, (B, H, N, D) inputs, at
`gqa_shape`), compiles (torch.compile fullgraph and its output beside eager's, at one small shape:
`compile_shape`), deterministic (forward and backward bitwise equal over 4 runs) and fresh (a
result follows its inputs when their contents change in the same storage: an implementation that
caches is caught), those two at `property_shape`. The report judges them (report/contenders.py).

`distributed`: each distributed adapter (DDP, FSDP, sharded optimizer) trains a small model for a
few steps in 2 processes over Gloo; its weights must equal one process's training on the whole
batch (the assignment's correctness).

What runs where. This process plans, journals and writes the CSV; it never imports a contender's
code. Each contender's cases run in child processes of that contender alone (bench/isolation.py;
two contenders never share an interpreter, so that packages of one name cannot collide), `workers`
of them side by side (the spec's; 1 by default), each living through all the cases given it, with
a time limit per case. A case that hangs or kills its process is a `timeout` or `crashed` row, and
the cases after it run in a fresh child of the same contender; a waiting case prints a line every
30 s. For `attention`, a child gets its cases grouped by shape class (`shape_class`: kind, head dim,
dtype, causal, N aligned to the tile; the properties last, compiles at the very end), a whole class
in one child, so that each class compiles once and the child's compiled kernels serve the rest.
The child only builds its inputs from the case's seed, runs the contender and sends back what it
returned (bench/contender_attention.py's `outputs`); this process rebuilds the inputs from the
seed, computes float64 from them and writes the verdict (`judge`): a wrong shape, dtype or device
or a NaN is a `wrong` row. An adapter that is missing or raises NotImplementedError is a `skipped`
row saying "not implemented". `distributed` cases are measured in the child (their ranks' own
processes, bench/contender_distributed.py) and their rows come back as they are.
"""
from __future__ import annotations

import os
import random
import sys
import threading
import time

from lmperf import contenders as contenders_mod, csv_schema
from lmperf.bench import cli, contender_attention, isolation, jobs

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
                shape = spec["gqa_shape"] if prop == "gqa" else compile_shape(spec) if prop == "compiles" \
                    else spec["property_shape"]
                shape_id = "x".join(map(str, shape))
                cases.append({**base, "check": prop, "dtype": spec["property_dtype"], "causal": True,
                              "shape": shape_id, "case_id": f"{name}_{kind}-{prop}-{shape_id}",
                              "tier": "property", "head_dim": shape[-1], "seq_len": shape[-2],
                              "tile": COURSE_TILE, "aligned": shape[-2] % COURSE_TILE == 0})
    return cases


def compile_shape(spec: dict) -> list[int]:
    """The compiles property's one shape a kind: the spec's `compile_shape`, else one head of the
    course's tile of tokens at the property shape's head dim ([1, 1, 128, D]). Small, because
    torch.compile unrolls a Python tile loop (a PyTorch attention's) into one graph, minutes to
    compile at a few hundred tokens; inside the course's contract, so that a kernel written to the
    handout's promises is asked to compile, not to handle an awkward N."""
    from lmperf.kernels.attention_contract import COURSE_TILE
    return list(spec.get("compile_shape") or [1, 1, COURSE_TILE, spec["property_shape"][-1]])


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
# attention: the contender's outputs in its process, the verdict in the job's (bench/contender_attention.py)

CHECK_ORDER = {"values": 0, "gqa": 1, "fresh": 2, "deterministic": 3, "compiles": 4}


def shape_class(case: dict) -> tuple:
    """The cases that run in one contender process one after another, so that what the first
    compiles the others reuse, in the order they run: by kind (in the job's order), values before
    the properties (compiles last: it resets torch.compile's caches), then (head dim, dtype,
    causal, N a multiple of the tile)."""
    return (list(contenders_mod.ATTENTION).index(case["kind"]), CHECK_ORDER[case["check"]], int(case["head_dim"]),
            case["dtype"], bool(case["causal"]), bool(case["aligned"]))


def seeded(case: dict) -> dict:
    """The case as its contender's process gets it: with the seed its inputs are built from (fresh
    every run; kept in its rows to reproduce them)."""
    return {**case, "seed": random.randrange(2**31)}


# ---------------------------------------------------------------------------------------------
# distributed


def measure_distributed(case: dict) -> list[dict]:
    from lmperf.bench import contender_distributed
    return contender_distributed.measure(case, contenders_mod.load(case["contender"], case["source"]))


class PerContender:
    """isolation.Ahead's children, each contender's of its own: a case runs only in a child of its
    own contender, so two contenders' packages of one name (every student's `cs336_systems`) never
    meet in an interpreter. Each contender's cases are measured ahead of the job's loop in
    `workers` children of its own. The cases come contender by contender (attention_cases,
    distributed_cases): when the loop reaches a contender's first case, its children start (if
    they have not) and so do the next contender's, which start up and compile while this one's
    cases run; when the loop moves on, they end in the background, with a line on stderr saying
    how many cases they ran in how many processes, and when each process sent its last reply.

    `group`, `judge`: isolation.Ahead's (a contender's cases sorted by `group`, each group in one
    child; `judge` run in this process). `prepare(case)`: the case its child gets (a seed
    added). `before(case)`: why the case is not run here (a `skipped` row, no child), or None."""

    def __init__(self, measure, time_limit_s: float, workers: int, cases: list[dict], *, judge=None, group=None,
                 prepare=None, before=None):
        self.measure, self.time_limit_s, self.workers = measure, time_limit_s, workers
        self.judge, self.group, self.before = judge, group, before
        self.prepare = prepare or (lambda case: case)
        self.todo: dict[str, list[dict]] = {}
        for case in cases:
            if not (before and before(case)):
                self.todo.setdefault(case["contender"], []).append(case)
        self.order = list(self.todo)  # the contenders in the cases' order
        # each started contender: [its Ahead, the cases sent to it by id, its start, its cases so far,
        # when each of its processes replied (by lane)]
        self.running: dict[str, list] = {}
        self.name: str | None = None
        self.ending: list[threading.Thread] = []  # the contenders' children ending

    def _start(self, name: str) -> None:
        """The contender's children started on its cases (once; one met again gets fresh children)."""
        if name in self.running:
            return
        todo = [self.prepare(c) for c in self.todo.pop(name, [])]
        if self.group is not None:
            todo.sort(key=self.group)
        t0, replies = time.monotonic(), {}

        def timed(case, payload):
            """The judge, noting when each process's replies came (by its lane's thread)."""
            replies.setdefault(threading.current_thread().name, []).append(time.monotonic() - t0)
            return self.judge(case, payload)
        ahead = isolation.Ahead(self.measure, self.time_limit_s, self.workers, todo,
                                judge=timed if self.judge else None, group=self.group)
        self.running[name] = [ahead, {c["case_id"]: c for c in todo}, t0, 0, replies]

    def __call__(self, case: dict) -> list[dict]:
        why = self.before(case) if self.before else None
        if why:
            return [csv_schema.failure_row("skipped", why)]
        name = case["contender"]
        if name != self.name:
            self._close(self.name)
            self.name = name
            self._start(name)
            later = self.order[self.order.index(name) + 1:] if name in self.order else []
            if later:
                self._start(later[0])
        entry = self.running[name]
        entry[3] += 1
        return entry[0](entry[1].pop(case["case_id"], None) or self.prepare(case))

    def _close(self, name: str | None, *exc) -> None:
        """The contender's children ended, while the next contender's run (their exits take
        seconds: a CUDA context, torch.compile's worker pool); the job's end waits for them."""
        entry = self.running.pop(name, None) if name is not None else None
        if entry is None:
            return
        ahead, _, t0, count, replies = entry
        line = f"[{name}] {count} cases in {ahead.started} processes of its own, {time.monotonic() - t0:.1f} s"
        if replies:  # where the time went: the slowest process sets the contender's
            ends = sorted(times[-1] for times in replies.values())
            line += f"; their last replies at {', '.join(f'{t:.1f}' for t in ends)} s"
        if exc and exc[0] is not None:
            ahead.__exit__(*exc)
        else:
            ending = threading.Thread(target=ahead.__exit__, args=(None, None, None), daemon=True,
                                      name=f"ending-{name}")
            ending.start()
            self.ending.append(ending)
        print(line, file=sys.stderr, flush=True)

    def __enter__(self) -> "PerContender":
        return self

    def __exit__(self, *exc) -> None:
        for name in [self.name] + [n for n in self.running if n != self.name]:
            self._close(name, *exc)
        self.name = None
        for ending in self.ending:
            ending.join()


STUDIES = {"attention": (attention_cases, contender_attention.outputs),
           "distributed": (distributed_cases, measure_distributed)}


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares."""
    return STUDIES[study][0](spec)


def main(argv=None):
    args = cli.bench_args(__doc__, argv, studies=STUDIES, options=lambda p: jobs.options(p, workers=False),
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
    # the cases in child processes (a crash or a hang is its case's row), `workers` of them side by
    # side, every child one contender's: two contenders never share an interpreter. The attention
    # check's children send back outputs, which this process judges against float64
    attention = args.study == "attention"
    checks = dict(judge=contender_attention.judge, group=shape_class, prepare=seeded,
                  before=contender_attention.not_run) if attention else {}
    jobs.run(section="contenders", study=args.study, cases=cases, measure=measure, args=args,
             fingerprint={"spec": args.spec, "contender_files": digest},
             ahead=lambda todo: PerContender(measure, limit, int(args.spec.get("workers", 1)), todo, **checks))


if __name__ == "__main__":
    main()
