"""The FP8 rung's convergence check: the held-out loss of the ladder's FP8 rung against bf16's,
trained on the same real text. Three runs of `steps` training steps, each on the same batches:

- `bf16`: the settings of the ladder rung the FP8 rung follows (the FP8 rung's own, without
  float8), weights initialised with seed 0;
- `bf16_init1`: the same, weights initialised with seed 1: the two bf16 runs differ only in
  their initial weights, and how far apart their held-out losses lie is the noise the report's
  tolerance is scaled by;
- `float8_<recipe>`: the FP8 rung's settings (float8 training of our stack), seed 0.

    python -m lmperf.bench.convergence --spec '{...}' --out results/cpu/convergence/convergence.csv --hw cpu

The text is the spec's `text`: a file in the repository (data/text/: its source, licence and
checksum are in its README), refused unless its sha256 is the spec's. Its tokens are its bytes
(0-255, within the model's vocabulary): no tokenizer to download or train. The last `heldout`
share of the file is held out; each training step takes batch_size x micro_batches windows of
context + 1 bytes at offsets drawn from the rest (a torch.Generator seeded with the spec's
`data_seed`: the same batches for every run, on every machine). Every `eval_every` steps (and
after the last) the model's loss on `eval_batches` fixed batches of held-out windows, evenly
spaced through the held-out text, is a `heldout_loss` row; every step's training loss (the one
train.step computes, train.loss) is a `loss` row.

The runs' settings are the ladder's own (bench/ladder.py's cases over the spec's `ladder`, its
`float8_ours` naming the FP8 rung, and a user's contenders where the run has any, so that the
rung numbers are the ladder job's): each case's `rung` is the ladder rung it runs. On a machine
without CUDA the ladder's CUDA-only changes are not carried, so the bf16 runs are real there and
the FP8 run is a `skipped` row ("needs CUDA").
"""
from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from lmperf import failures, stats, train
from lmperf.bench import cli, float8, jobs, ladder

REPO = Path(__file__).resolve().parents[3]  # where a relative text path is found outside the repository's root


def runs(recipe: str) -> list[tuple[str, str, int]]:
    """(run, its float8 recipe or 'none', the seed of its initial weights): the reference, the
    noise floor (other initial weights), the FP8 run."""
    return [("bf16", "none", 0), ("bf16_init1", "none", 1), (f"float8_{recipe}", recipe, 0)]


def cases(spec: dict, cuda: bool = False) -> list[dict]:
    """One case a run, each with the settings of the ladder's FP8 rung (without its float8 for
    the bf16 runs) at the spec's size, labelled with the ladder rung it runs. The ids are the same
    with and without CUDA."""
    size, text = spec["size"], spec["text"]
    fp8 = float8.ours(spec["ladder"])
    if fp8 is None:
        raise ValueError("convergence: the ladder spec has no float8_ours, the FP8 rung whose settings it trains")
    ladder_spec = {**spec["ladder"], **({"contenders": spec["contenders"]} if spec.get("contenders") else {})}
    rungs = ladder.cases(ladder_spec, size, cuda)
    at = next(i for i, c in enumerate(rungs) if float8.is_ours(c["name"]))
    rung = rungs[at]
    keys = {k: rung[k] for k in (*ladder.BASE, "context", "batch_size")}
    # the rung the bf16 runs run: the nearest before the FP8 rung whose settings are its own
    # without float8 (the rung it follows)
    bf16 = next((c["case_id"] for c in reversed(rungs[:at])
                 if {k: c[k] for k in keys} == {**keys, "float8": "none"}), "")
    return [{**keys, "float8": recipe, "size": size, "mode": "train", "run": run, "init_seed": seed,
             "steps": spec["steps"], "rung": rung["case_id"] if recipe != "none" else bf16,
             "needs_cuda": recipe != "none", "text": text["path"], "text_sha256": text["sha256"],
             "heldout": text["heldout"], "data_seed": spec.get("data_seed", 0), "eval_every": spec["eval_every"],
             "eval_batches": spec["eval_batches"], "case_id": f"{size}-{run}"}
            for run, recipe, seed in runs(fp8["recipe"])]


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning; the ids are the same with and without CUDA)."""
    return cases(spec)


def text_bytes(path: str, sha256: str) -> bytes:
    """The text's bytes: `path` from the working directory (a job's: the repository's root), else
    from the repository's root; ValueError naming it if it is missing or not the checksum's."""
    file = Path(path)
    if not file.is_absolute() and not file.exists():
        file = REPO / path
    if not file.exists():
        raise ValueError(f"convergence text {path}: no such file (in {Path.cwd()} or {REPO})")
    data = file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ValueError(f"convergence text {file}: sha256 {digest}, but the spec names {sha256} (another text?)")
    return data


def splits(case: dict):
    """(training tokens, held-out tokens) of the case's text: its bytes as int64, the last
    `heldout` share held out."""
    import torch

    tokens = torch.frombuffer(bytearray(text_bytes(case["text"], case["text_sha256"])), dtype=torch.uint8).long()
    cut = int(len(tokens) * (1 - case["heldout"]))
    need = case["context"] + 2
    if cut < need or len(tokens) - cut < need:
        raise ValueError(f"convergence text {case['text']}: {len(tokens):,} bytes leave {cut:,} to train on and "
                         f"{len(tokens) - cut:,} held out; each needs windows of {case['context'] + 1:,}")
    return tokens[:cut], tokens[cut:]


def windows(tokens, offsets, context: int):
    """(inputs, targets): the windows of context + 1 tokens at `offsets`, shifted by one."""
    import torch

    rows = torch.stack([tokens[o:o + context + 1] for o in offsets.tolist()])
    return rows[:, :-1], rows[:, 1:]


def batches(case: dict, tokens):
    """The training batches, one a step: windows at offsets drawn by a generator seeded with the
    case's data seed (the same batches for every run)."""
    import torch

    rows, context = case["batch_size"] * case["micro_batches"], case["context"]
    g = torch.Generator().manual_seed(case["data_seed"])
    for _ in range(case["steps"]):
        yield windows(tokens, torch.randint(len(tokens) - context - 1, (rows,), generator=g), context)


def heldout_batches(case: dict, tokens) -> list:
    """`eval_batches` batches of batch_size windows of the held-out tokens, evenly spaced."""
    import torch

    rows, context = case["batch_size"], case["context"]
    n = rows * case["eval_batches"]
    offsets = torch.linspace(0, len(tokens) - context - 1, n).long()
    return [windows(tokens, offsets[i:i + rows], context) for i in range(0, n, rows)]


def eval_steps(case: dict) -> list[int]:
    """The steps after which the held-out loss is measured: every eval_every, and the last."""
    return sorted({*range(case["eval_every"], case["steps"] + 1, case["eval_every"]), case["steps"]})


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


def heldout_loss(model, held: list, autocast, device: str) -> float:
    """The mean of train.loss over the held-out batches, without gradients, under the run's
    autocast (an FP8 model multiplies in fp8 here too)."""
    import torch

    with torch.no_grad(), autocast:
        values = [train.loss(model, x.to(device), y.to(device)) for x, y in held]
    return float(torch.stack(values).float().mean())


def measure(case: dict, dims: dict) -> list[dict]:
    """One run: `steps` training steps (train.step) from the case's seeded initial weights on
    the text's batches; one `loss` row a step (the mean over its micro-batches) and one
    `heldout_loss` row at each of eval_steps."""
    import torch

    cuda = torch.cuda.is_available()
    if case["needs_cuda"] and not cuda:
        raise failures.NotRun("needs CUDA")
    change = ladder.model_changes(case)  # the rung's fused kernels and float8, as the ladder's
    device = "cuda" if cuda else "cpu"
    k = case["micro_batches"]
    train_tokens, held_tokens = splits(case)
    held, at = heldout_batches(case, held_tokens), set(eval_steps(case))
    losses, heldout = [], {}
    with train.matmul_precision(case["tf32"]):
        cfg, model, optimizer, _, _, autocast = train.setup(case, dims)
        change(model)
        for step, (inputs, targets) in enumerate(batches(case, train_tokens), start=1):
            with recorded_losses() as step_losses:
                train.step(model, optimizer, inputs.to(device), targets.to(device), autocast, train.nothing, k)
            losses += step_losses
            if step in at:
                heldout[step] = heldout_loss(model, held, autocast, device)
    del model, optimizer
    per_step = torch.stack(losses).float().view(-1, k).mean(dim=1).tolist()
    rows = [{"step": i + 1, **stats.summarize("loss", "nats", [x])} for i, x in enumerate(per_step)]
    return rows + [{"step": s, **stats.summarize("heldout_loss", "nats", [x])} for s, x in sorted(heldout.items())]


def main(argv=None):
    args = cli.bench_args(__doc__, argv, options=lambda p: jobs.options(p, workers=False))
    import torch

    spec = args.spec
    jobs.run(section="convergence", study="convergence", cases=cases(spec, cuda=torch.cuda.is_available()),
             measure=lambda case: measure(case, spec["models"][spec["size"]]), args=args,
             fingerprint={"spec": spec})


if __name__ == "__main__":
    main()
