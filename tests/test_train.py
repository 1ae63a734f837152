"""The one training step (lmperf.train): micro-batches, the loss, the gradient-reduce and phase
hooks, forward-only mode, activation checkpointing and the optimizer's implementations."""
import contextlib
from pathlib import Path

import pytest
import torch

from lmperf import train
from lmperf.bench import e2e
from lmperf.model import ModelConfig, TransformerLM

DIMS = {"d_model": 64, "d_ff": 128, "n_layers": 4, "n_heads": 4}
SRC = Path(__file__).resolve().parents[1] / "src" / "lmperf"


def test_the_loss_is_written_once():
    """Every study of the Transformer LM trains through train.step, whose loss is train.loss: no
    other module computes a cross-entropy, but the mixed-precision study's toy model (which asks
    what dtype autocast gives a loss) and a contender's FSDP check, which trains as the course's
    own test does (its loss: the last position's cross-entropy)."""
    writers = sorted(p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if "cross_entropy(" in p.read_text())
    assert writers == ["bench/contender_distributed.py", "bench/precision.py", "train.py"]


def test_loss_is_the_mean_next_token_cross_entropy():
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(**DIMS, vocab_size=97, context_length=8))
    tokens = torch.randint(97, (2, 9))
    logp = torch.log_softmax(model(tokens[:, :-1]).double(), dim=-1)
    want = -logp.gather(-1, tokens[:, 1:, None]).mean()
    torch.testing.assert_close(train.loss(model, tokens[:, :-1], tokens[:, 1:]).double(), want, rtol=1e-5, atol=1e-6)


def test_forward_only_step_runs_one_phase_without_gradients():
    cfg, model, optimizer, inputs, targets, autocast = train.setup(
        {"context": 8, "attention": "plain", "mode": "forward", "dtype": "fp32", "compile": False, "batch_size": 2},
        {**DIMS, "vocab_size": 97})
    seen = []
    train.step(model, optimizer, inputs, targets, autocast, lambda p: (seen.append(p), contextlib.nullcontext())[1])
    assert optimizer is None and seen == ["forward"]
    assert all(p.grad is None for p in model.parameters())


def test_reduce_runs_once_after_every_micro_batch_and_before_the_optimizer():
    """The gradient-reduce hook (data parallelism by hand) sees the summed gradients of all
    micro-batches, once, in its own phase."""
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(**DIMS, vocab_size=97, context_length=8))
    tokens = torch.randint(97, (4, 9))
    seen, reduced = [], []
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    reduce = lambda: reduced.append(model.lm_head.weight.grad.clone())
    train.step(model, opt, tokens[:, :-1], tokens[:, 1:], contextlib.nullcontext(),
               lambda p: (seen.append(p), contextlib.nullcontext())[1], micro_batches=2, reduce=reduce)
    assert seen == ["forward", "backward", "forward", "backward", "allreduce", "optimizer"]
    model.zero_grad(set_to_none=True)
    train.loss(model, tokens[:, :-1], tokens[:, 1:]).backward()
    (got,) = reduced
    torch.testing.assert_close(got, model.lm_head.weight.grad, rtol=1e-4, atol=1e-6)


def test_gradient_sync_is_switched_on_data_parallel_wrappers_only():
    class DDPLike(torch.nn.Module):
        require_backward_grad_sync = True
    class FSDPLike(torch.nn.Module):
        synced = True
        def set_requires_gradient_sync(self, on):
            self.synced = on
    ddp, fsdp, plain = DDPLike(), FSDPLike(), torch.nn.Linear(2, 2)
    for model in (ddp, fsdp, plain):
        train.gradient_sync(model, False)
    assert ddp.require_backward_grad_sync is False and fsdp.synced is False
    train.gradient_sync(ddp, True)
    assert ddp.require_backward_grad_sync is True


def test_checkpointed_blocks_give_the_same_gradients():
    torch.manual_seed(0)
    cfg = ModelConfig(**DIMS, vocab_size=97, context_length=16)
    model = TransformerLM(cfg)
    tokens = torch.randint(cfg.vocab_size, (2, 16))

    def grads(every):
        model.zero_grad(set_to_none=True)
        assert train.checkpoint_blocks(model, every) == len(range(0, cfg.n_layers, every)) if every else True
        model(tokens).sum().backward()
        return [p.grad.clone() for p in model.parameters()]
    for a, b in zip(grads(0), grads(2)):
        torch.testing.assert_close(a, b)
    assert train.checkpoint_blocks(model, 0) == 0 and all("forward" not in b.__dict__ for b in model.blocks)


def test_optimizer_axis_names_the_implementation():
    model = torch.nn.Linear(4, 4)
    assert train.make_optimizer(model, "fused").defaults["fused"] is True
    assert train.make_optimizer(model, "foreach").defaults["foreach"] is True
    with pytest.raises(ValueError, match="optimizer='sgd'"):
        train.make_optimizer(model, "sgd")
    spec = {"batch_size": 1, "timed_steps": 2,
            "grid": {"contexts": [8], "dtypes": ["fp32"], "compile": [False], "modes": ["train"], "warmup": [0],
                     "optimizers": ["foreach", "fused"]}}
    ids = [c["case_id"] for c in e2e.study_cases(spec, "tiny")]
    assert ids == ["tiny-ctx8-fp32-eager-train-warmup0", "tiny-ctx8-fp32-eager-train-warmup0-fused"]


def test_accumulated_micro_batches_give_one_batch_gradients():
    """train.step with k micro-batches: the loss of each scaled by 1/k, gradients accumulated; the
    same gradients as one step on the whole batch, and each phase seen k times."""
    torch.manual_seed(0)
    cfg = ModelConfig(**DIMS, vocab_size=97, context_length=16)
    model = TransformerLM(cfg)
    tokens = torch.randint(cfg.vocab_size, (4, 17))
    seen = []

    class Capture(torch.optim.SGD):  # keeps the gradients the step saw
        def step(self, closure=None):
            self.grads = [p.grad.clone() for p in model.parameters()]

    def grads(k):
        opt = Capture(model.parameters(), lr=0.0)
        around = lambda phase: (seen.append(phase), contextlib.nullcontext())[1]
        train.step(model, opt, tokens[:, :-1], tokens[:, 1:], contextlib.nullcontext(), around, k)
        return opt.grads
    for a, b in zip(grads(1), grads(4)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert seen[3:] == ["forward", "backward"] * 4 + ["optimizer"]
