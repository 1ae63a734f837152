"""MasterWeightAdamW (kernels/adamw_master.py): its steps against AdamW in float64 and against
bf16 autocast with fp32 weights and torch's AdamW (the math it claims to keep), gradient
accumulation in fp32, and its errors. On a CPU the kernel runs in Triton's interpreter."""
import math

import pytest
import torch
from torch import nn

from lmperf.kernels import adamw_master
from lmperf.kernels.adamw_master import MasterWeightAdamW

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
B = adamw_master.BLOCK
# awkward sizes: under one chunk, exactly one, one past, several with a ragged end; a bias
SHAPES = [(3, 5), (B // 8, 8), (B + 1,), (3, B // 2 + 7), (1, 1)]


class Linears(nn.Module):
    """Linear layers of the given weight shapes (1-d: a bias-only layer's bias), and one fp32
    parameter that is not a Linear weight (stays with torch's AdamW)."""

    def __init__(self, shapes):
        super().__init__()
        self.layers = nn.ModuleList()
        for shape in shapes:
            layer = nn.Linear(shape[-1], shape[0] if len(shape) == 2 else 1, bias=len(shape) == 1)
            if len(shape) == 1:
                layer.weight = None
                layer.bias = nn.Parameter(torch.empty(shape))
            self.layers.append(layer)
        self.scale = nn.Parameter(torch.ones(4))
        for p in self.parameters():
            nn.init.normal_(p)


def adamw64(p, grads, lr, betas, eps, wd):
    """AdamW in float64 from p (a float64 tensor) over a list of gradients: the reference."""
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        p = p - lr * wd * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        p = p - lr / (1 - betas[0] ** t) * m / (v.sqrt() / math.sqrt(1 - betas[1] ** t) + eps)
    return p


@pytest.mark.parametrize("lr,wd", [(1e-2, 1e-2), (3e-3, 0.0)])
def test_steps_against_float64(lr, wd):
    """Three steps on fresh random weights and bf16 gradients: master weights match AdamW in
    float64 to fp32 rounding, and every bf16 weight is its master rounded to nearest."""
    torch.manual_seed(0)
    model = Linears(SHAPES).to(DEVICE)
    start = {name: p.detach().double().clone() for name, p in model.named_parameters()}
    opt = MasterWeightAdamW(model, lr=lr, weight_decay=wd)
    weights = {name: p for name, p in model.named_parameters() if p.dtype == torch.bfloat16}
    assert len(weights) == len(SHAPES)
    grads = {name: [] for name in weights}
    for _ in range(3):
        for name, w in weights.items():
            w.grad = torch.randn_like(w, dtype=torch.float32).to(torch.bfloat16)
            grads[name].append(w.grad.double())
        model.scale.grad = torch.randn_like(model.scale)
        opt.step()
        opt.zero_grad()
    for (name, w), master in zip(weights.items(), opt.master_weights()):
        ref = adamw64(start[name], grads[name], lr, (0.9, 0.999), 1e-8, wd)
        err = (master.double() - ref).abs().max().item()
        assert err <= 4e-6 * ref.abs().max().item() + 1e-7, (name, err)
        assert torch.equal(w, master.to(torch.bfloat16)), name  # rounded to nearest even
        assert (master.double() - start[name]).abs().max() > 0, name  # it moved
    assert opt.state and opt.steps == 3


def _pair(shapes, seed=0):
    torch.manual_seed(seed)
    ref = Linears(shapes).to(DEVICE)
    ours = Linears(shapes).to(DEVICE)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _loss(model, x):
    out = x
    for layer in model.layers:
        out = torch.tanh(layer(out))
    return (out * model.scale[0]).square().mean()


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("micro_batches", [1, 3])
def test_same_math_as_autocast_with_fp32_weights(micro_batches, accumulate):
    """bf16 autocast with fp32 weights and torch's fused AdamW against bf16 weights and this
    optimizer: the same loss, and after the step the same fp32 weights to a few fp32 ulps (the
    two kernels round AdamW's scalars apart; later steps' bf16 copies could then round apart,
    so one step is compared). Micro-batches summed in fp32 on both sides, whether gradients go
    into the sums as they come (accumulate) or at the next micro-batch."""
    shapes = [(48, 40), (40, 48), (B + 3, 40)]
    ref, ours = _pair(shapes)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, fused=True)
    opt = MasterWeightAdamW(ours, lr=1e-2)
    opt.accumulate = accumulate
    x = torch.randn(micro_batches * 4, 40, device=DEVICE)
    losses = []
    for model, optimizer in ((ref, ref_opt), (ours, opt)):
        total = 0.0
        for part in x.chunk(micro_batches):
            with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
                loss = _loss(model, part) / micro_batches
            loss.backward()
            total += loss.item()
        losses.append(total)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert losses[0] == pytest.approx(losses[1], rel=1e-6, abs=1e-7)
    named = {id(p): n for n, p in ours.named_parameters()}
    ref_params = dict(ref.named_parameters())
    for w, master in zip(opt.weights, opt.master_weights()):
        ref_w = ref_params[named[id(w)]].detach()
        # two fp32 ulps at the weights' size (about 1): CUDA's fused kernel contracts to FMAs
        torch.testing.assert_close(master, ref_w, rtol=2.5e-7, atol=2.5e-7)
        assert torch.equal(w, master.to(torch.bfloat16))
    torch.testing.assert_close(ours.scale, ref.scale, rtol=2.5e-7, atol=2.5e-7)


@pytest.mark.parametrize("accumulate", [False, True])
def test_bf16_gradients_are_not_summed_in_bf16(accumulate):
    """Two micro-batches' bf16 gradients, 256 and 1 (256 + 1 is no bf16 number): the step's
    first moment is 0.1 x 257, their fp32 sum."""
    torch.manual_seed(1)
    model = Linears([(B + 5,)]).to(DEVICE)  # one bias of B + 5 elements
    bias = model.layers[0].bias
    opt = MasterWeightAdamW(model, lr=1e-3, weight_decay=0.0)
    opt.accumulate = accumulate
    for value in (256.0, 1.0):  # what backward does: each gradient through the weight's hooks
        bias.backward(torch.full_like(bias, value))
    n = bias.numel()
    assert (bias.grad is None) == accumulate
    assert torch.equal(opt.acc[:n], torch.full_like(opt.acc[:n], 257.0 if accumulate else 256.0))
    before = opt.master_weights()[0]
    opt.step()
    torch.testing.assert_close(opt.exp_avg[:n], torch.full_like(opt.exp_avg[:n], 25.7), rtol=1e-6, atol=0)
    # a first step moves every weight by lr (AdamW's normalized update), whatever the gradient
    torch.testing.assert_close(opt.master_weights()[0], before - 1e-3, rtol=0, atol=1e-6)
    opt.zero_grad()  # drops the sum too: with nothing to apply, a step is an error
    assert opt.acc is None and bias.grad is None
    with pytest.raises(RuntimeError, match="no gradient"):
        opt.step()


def test_dropping_model_and_optimizer_frees_the_weights():
    """The hooks on the weights do not keep the optimizer (and its state) alive, nor it them."""
    import gc
    import weakref

    model = Linears([(B + 3, 40)]).to(DEVICE)
    opt = MasterWeightAdamW(model)
    opt.accumulate = True
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
        _loss(model, torch.randn(4, 40, device=DEVICE)).backward()
    opt.step()
    refs = [weakref.ref(opt), weakref.ref(opt.exp_avg), weakref.ref(model.layers[0].weight)]
    del model, opt
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_errors_name_what_is_wrong():
    model = Linears([(4, 4)]).to(DEVICE)
    with pytest.raises(ValueError, match="betas"):
        MasterWeightAdamW(model, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="no nn.Linear"):
        MasterWeightAdamW(nn.Sequential(nn.Embedding(3, 4)))
    opt = MasterWeightAdamW(model)
    with pytest.raises(ValueError, match="must be fp32"):
        MasterWeightAdamW(model)  # its weights are bf16 now
    with pytest.raises(RuntimeError, match="no gradient"):
        opt.step()
    with pytest.raises(ValueError, match="set_to_none"):
        opt.zero_grad(set_to_none=False)


def test_split_and_join_are_exact():
    """The kernel's fp32 <-> (bf16 weight, int16 remainder) (integer arithmetic: the interpreter's
    own cast truncates) against PyTorch: the weight is PyTorch's cast on random values, exact
    ties both ways, carries into the exponent, infinities and NaN; joined, every master is its
    fp32 value again but a tie that rounds down (one fp32 bit lower); PyTorch's twins agree."""
    import triton
    import triton.language as tl

    @triton.jit
    def roundtrip(x_ptr, w_ptr, r_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        weight, rest = adamw_master.split_master(tl.load(x_ptr + offs, mask=offs < n))
        tl.store(w_ptr + offs, weight, mask=offs < n)
        tl.store(r_ptr + offs, rest, mask=offs < n)
        tl.store(y_ptr + offs, adamw_master.join_master(weight, rest), mask=offs < n)

    torch.manual_seed(0)
    upper = torch.randint(0, 2**15, (512,), dtype=torch.int32) << 16
    ties = upper | 0x8000  # exactly halfway: even upper halves round down, odd ones up
    specials = torch.tensor([0x3F80_8000, 0x3F81_8000, 0x3FFF_FFFF, 0x7F7F_FFFF, 0x7F80_0000, 0xFF80_0000 - 2**32,
                             0x7FC0_0000, 0x0000_8000, 0x0000_0001, 0x8000_0000 - 2**32], dtype=torch.int32)
    x = torch.cat([torch.randn(1000) * 100, torch.randn(1000) * 1e-30, ties.view(torch.float32),
                   (ties | 0x1).view(torch.float32), -ties.view(torch.float32), specials.view(torch.float32)])
    x = x.to(DEVICE)
    weight, rest, y = torch.empty_like(x, dtype=torch.bfloat16), torch.empty_like(x, dtype=torch.int16), torch.empty_like(x)
    roundtrip[(triton.cdiv(x.numel(), 256),)](x, weight, rest, y, x.numel(), BLOCK=256)
    nan = x.isnan()
    assert torch.equal(weight[~nan].view(torch.int16), x[~nan].to(torch.bfloat16).view(torch.int16))
    assert bool(weight[nan].isnan().all()) and bool(y[nan].isnan().all())
    bits = x.view(torch.int32)
    tie_down = ((bits & 0xFFFF) == 0x8000) & (((bits >> 16) & 1) == 0)
    assert int(tie_down.sum()) > 200
    assert torch.equal(y[~nan & ~tie_down].view(torch.int32), bits[~nan & ~tie_down])
    assert torch.equal(y[tie_down].view(torch.int32), bits[tie_down] - 1)  # one fp32 bit lower
    high, low = adamw_master.split(x[~nan])
    assert torch.equal(high.view(torch.int16), weight[~nan].view(torch.int16)) and torch.equal(low, rest[~nan])
    assert torch.equal(adamw_master.join(high, low).view(torch.int32), y[~nan].view(torch.int32))


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_training_steps_match_autocast_on_fp32_weights(micro_batches):
    """The training step every section runs (lmperf.train.step) on the Transformer LM, optimizer
    'master' against 'fused' (fp32 weights under bf16 autocast): the same weights after a step, to
    a few fp32 ulps (AdamW's scalars round differently in each kernel; a later step's bf16 copies
    can then round apart, so one step is compared), and every weight moved by about lr."""
    from lmperf import train

    dims = {"d_model": 64, "d_ff": 128, "n_layers": 2, "n_heads": 4, "vocab_size": 97}
    case = {"context": 16, "attention": "plain", "mode": "train", "dtype": "bf16", "compile": False,
            "batch_size": 2, "micro_batches": micro_batches}
    trained = {}
    for impl in ("fused", "master"):
        cfg, model, opt, x, y, autocast = train.setup({**case, "optimizer": impl}, dims)
        start = [p.detach().float().clone() for p in model.parameters()]
        train.step(model, opt, x, y, autocast, train.nothing, micro_batches)
        trained[impl] = (model, opt)
    (ref, _), (ours, opt) = trained["fused"], trained["master"]
    masters = {id(w): m for w, m in zip(opt.weights, opt.master_weights())}
    assert len(masters) == 4 * dims["n_layers"] * 2 - dims["n_layers"] + 1  # q k v o w1 w2 w3 a block, lm_head
    for (name, r), p, p0 in zip(ref.named_parameters(), ours.parameters(), start):
        value = masters.get(id(p), p)
        assert value.dtype == torch.float32, name
        torch.testing.assert_close(value, r.detach(), rtol=0, atol=3e-8, msg=name)  # 1 ulp at 0.06: 3.7e-9
        assert (value - p0).abs().max() > 0.5e-4, name  # lr 1e-4: a first step moves each by about lr
        assert p.dtype == (torch.bfloat16 if id(p) in masters else torch.float32), name


def test_setup_refuses_master_weights_without_bf16():
    from lmperf import train

    case = {"context": 16, "attention": "plain", "mode": "train", "dtype": "fp32", "compile": False,
            "batch_size": 2, "optimizer": "master"}
    with pytest.raises(ValueError, match="dtype is 'fp32'"):
        train.setup(case, {"d_model": 64, "d_ff": 128, "n_layers": 1, "n_heads": 4, "vocab_size": 97})


def _check_rows(kind, monkeypatch, lr_error=1.0):
    """The check rule's rows for its first case of `kind` (lmperf.bench.adamw_master, two steps
    of a smoke-sized spec), the kernel's learning rate scaled by `lr_error`."""
    from lmperf.bench import adamw_master as check

    spec = {"steps": 2, "lr": 1e-2, "weight_decay": 0.1, "vocab_size": 97, "context": 16, "batch_size": 2,
            "micro_batches": [1], "compile": [False],
            "models": {"tiny": {"d_model": 64, "d_ff": 128, "n_layers": 2, "n_heads": 4}}}
    case = next(c for c in check.check_cases(spec) if c["kind"] == kind)
    step = MasterWeightAdamW.step

    def wrong_step(self):
        self.lr *= lr_error
        step(self)
        self.lr /= lr_error
    monkeypatch.setattr(MasterWeightAdamW, "step", wrong_step)
    return {r["metric"]: r for r in check.measure_check(case)}


@pytest.mark.parametrize("kind", ["float64", "lm"])
def test_check_rule_passes_and_fails_a_wrong_learning_rate(kind, monkeypatch):
    """The rows of the check (rule adamw_master_check) pass for the kernel and fail for one whose
    learning rate is 1% off (float64: against AdamW in float64; lm: after the first step against
    fused AdamW under autocast)."""
    rows = _check_rows(kind, monkeypatch)
    assert rows and all(r["passed"] for r in rows.values()), rows
    wrong = _check_rows(kind, monkeypatch, lr_error=1.01)
    metric = {"float64": "master_vs_float64_max_abs_err", "lm": "step1_vs_fused_max_abs_err"}[kind]
    assert not wrong[metric]["passed"], wrong[metric]
