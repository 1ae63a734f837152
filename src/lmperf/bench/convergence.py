"""The FP8 rung's convergence check (#31 item 3): the loss of every step of `steps` training steps
on one fixed, learnable token stream, in bf16 (the settings of the ladder rung the FP8 rung
follows: the best bf16 rung's) against the FP8 rung's settings (the same plus torchao float8
training), from the same initial weights (train.build_model is seeded) on the same batches; and
bf16 once more on another draw of the same stream (data seed 1), the noise floor the report's
tolerance is scaled by.

    python -m lmperf.bench.convergence --spec '{...}' --out results/cpu/convergence/convergence.csv --hw cpu

The runs' settings are the ladder's own (bench/ladder.py's cases over the spec's `ladder`, its
`float8_ours` naming the FP8 rung): on a machine without CUDA its CUDA-only changes are not
carried, so the bf16 runs are real there and the FP8 run is a `skipped` row ("needs CUDA").

The stream (generated on the host with seeded torch.Generators, then copied to the device: the
same tokens on every machine): a fixed dictionary of `phrases` phrases of `phrase_length`
distinct tokens each (no token in two phrases), and each sequence a run of phrases drawn
independently with Zipf weights 1 / rank^zipf, cut at a random offset. Within a phrase the next
token follows from the one before; at a phrase's end the next phrase is a fresh draw: the lowest
loss a model can reach is the phrase draw's entropy / phrase_length nats a token (the
`stream_entropy` column), far below log(vocab) where uniform random tokens would leave the loss.
Every step's loss is the one train.step computes (train.loss, recorded as it returns).
"""
from __future__ import annotations

import contextlib
import math

from lmperf import train
from lmperf.bench import common, float8, jobs, ladder

VOCAB = 10_000  # lmperf.model.ModelConfig's vocabulary, as every model size's


def stream_entropy(stream: dict) -> float:
    """The stream's entropy rate in nats a token: the Zipf phrase draw's entropy over the phrase
    length (the tokens within a phrase follow from its first)."""
    w = [1 / (i + 1) ** stream["zipf"] for i in range(stream["phrases"])]
    p = [x / sum(w) for x in w]
    return -sum(x * math.log(x) for x in p) / stream["phrase_length"]


def runs(recipe: str) -> list[tuple[str, str, int]]:
    """(run, its float8 recipe or 'none', data seed): the reference, the noise floor, the FP8 run."""
    return [("bf16", "none", 0), ("bf16_seed1", "none", 1), (f"float8_{recipe}", recipe, 0)]


def cases(spec: dict, cuda: bool = False) -> list[dict]:
    """One case a run, each with the settings of the ladder's FP8 rung (without its float8 for
    the bf16 runs) at the spec's size. The ids are the same with and without CUDA."""
    size, stream = spec["size"], spec["stream"]
    if stream["phrases"] * stream["phrase_length"] > VOCAB:
        raise ValueError(f"convergence stream: phrases x phrase_length = {stream['phrases'] * stream['phrase_length']} "
                         f"distinct tokens, more than the vocabulary's {VOCAB:,}")
    fp8 = float8.ours(spec["ladder"])
    if fp8 is None:
        raise ValueError("convergence: the ladder spec has no float8_ours, the FP8 rung whose settings it trains")
    rung = next(c for c in ladder.cases(spec["ladder"], size, cuda) if float8.is_ours(c["name"]))
    keys = {k: rung[k] for k in (*ladder.BASE, "context", "batch_size")}
    return [{**keys, "size": size, "mode": "train", "run": run, "float8": recipe, "data_seed": seed,
             "steps": spec["steps"], "rung": rung["case_id"], "needs_cuda": recipe != "none",
             "phrases": stream["phrases"], "phrase_length": stream["phrase_length"], "zipf": stream["zipf"],
             "stream_seed": stream["seed"], "stream_entropy": stream_entropy(stream),
             "case_id": f"{size}-{run}"} for run, recipe, seed in runs(fp8["recipe"])]


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning; the ids are the same with and without CUDA)."""
    return cases(spec)


def batches(case: dict, device: str):
    """The case's (inputs, targets) a step, from its stream and data seed: the same batches for
    every run of one data seed."""
    import torch

    n, length = case["phrases"], case["phrase_length"]
    g = torch.Generator().manual_seed(case["stream_seed"])
    phrases = torch.randperm(VOCAB, generator=g)[:n * length].view(n, length)
    weights = 1 / torch.arange(1, n + 1, dtype=torch.float64) ** case["zipf"]
    rows, context = case["batch_size"] * case["micro_batches"], case["context"]
    per_row = context // length + 2  # phrases a row: enough for context + 1 tokens after any offset
    g = torch.Generator().manual_seed(1_000_003 * (case["data_seed"] + 1) + case["stream_seed"])
    for _ in range(case["steps"]):
        drawn = torch.multinomial(weights, rows * per_row, replacement=True, generator=g)
        tokens = phrases[drawn].view(rows, per_row * length)
        offset = torch.randint(length, (rows, 1), generator=g)
        tokens = tokens.gather(1, offset + torch.arange(context + 1))
        tokens = tokens.to(device)
        yield tokens[:, :-1], tokens[:, 1:]


@contextlib.contextmanager
def recorded_losses():
    """Inside the block, every loss train.step computes (train.loss's value) is appended, detached,
    to the list it yields."""
    losses, compute = [], train.loss

    def loss(*args):
        value = compute(*args)
        losses.append(value.detach())
        return value
    train.loss = loss
    try:
        yield losses
    finally:
        train.loss = compute


def measure(case: dict, dims: dict) -> list[dict]:
    """One run: `steps` training steps (train.step) from the seeded initial weights on the
    case's stream; one `loss` row a step (the mean over its micro-batches)."""
    import torch

    cuda = torch.cuda.is_available()
    if case["needs_cuda"] and not cuda:
        raise common.NotRun("needs CUDA")
    change = ladder.model_changes(case)  # the rung's fused kernels and float8, as the ladder's
    device = "cuda" if cuda else "cpu"
    k = case["micro_batches"]
    with train.matmul_precision(case["tf32"]):
        cfg, model, optimizer, _, _, autocast = train.setup(case, dims)
        change(model)
        with recorded_losses() as losses:
            for inputs, targets in batches(case, device):
                train.step(model, optimizer, inputs, targets, autocast, train.nothing, k)
    del model, optimizer
    per_step = torch.stack(losses).float().view(-1, k).mean(dim=1).tolist()
    return [{"step": i + 1, **common.summarize("loss", "nats", [x])} for i, x in enumerate(per_step)]


def main(argv=None):
    args = common.bench_args(__doc__, argv, options=lambda p: jobs.options(p, workers=False))
    import torch

    spec = args.spec
    jobs.run(section="convergence", study="convergence", cases=cases(spec, cuda=torch.cuda.is_available()),
             measure=lambda case: measure(case, spec["models"][spec["size"]]), args=args,
             fingerprint={"spec": spec})


if __name__ == "__main__":
    main()
