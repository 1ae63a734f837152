"""Mixed precision: the accumulation experiment and the autocast dtype table, on this device.

    python -m lmperf.bench.precision --out results/cpu/precision/precision.csv --hw cpu
"""
from __future__ import annotations

from lmperf import stats
from lmperf.bench import cli, loop
from lmperf.dtypes import torch_dtype


ADDITIONS, ADDEND = 1000, 0.01


def accumulation() -> list[dict]:
    """ADDITIONS additions of ADDEND into accumulators of different dtypes; the exact values."""
    import torch

    def run(acc_dtype, addend_dtype, upcast: bool):
        s = torch.tensor(0.0, dtype=acc_dtype)
        x = torch.tensor(ADDEND, dtype=addend_dtype)
        for _ in range(ADDITIONS):
            s += x.to(acc_dtype) if upcast else x
        return float(s)

    variants = [("fp32 accumulator, fp32 addends", torch.float32, torch.float32, False),
                ("fp16 accumulator, fp16 addends", torch.float16, torch.float16, False),
                ("fp32 accumulator, fp16 addends", torch.float32, torch.float16, False),
                ("fp32 accumulator, fp16 addends up-cast explicitly", torch.float32, torch.float16, True)]
    rows = []
    for name, acc, addend, upcast in variants:
        value = run(acc, addend, upcast)
        row = stats.summarize("sum", "value", [value])
        row.update(variant=name, exact=repr(value), error=value - ADDITIONS * ADDEND,
                   additions=ADDITIONS, addend=ADDEND)
        rows.append(row)
    return rows


def autocast_dtypes(device: str, dtype_name: str) -> list[dict]:
    """dtypes of a toy model's tensors under autocast, read from the tensors at run time."""
    import torch
    from torch import nn

    class ToyModel(nn.Module):
        def __init__(self, d_in=16, d_out=8):
            super().__init__()
            self.fc1 = nn.Linear(d_in, 10, bias=False)
            self.ln = nn.LayerNorm(10)
            self.fc2 = nn.Linear(10, d_out, bias=False)
            self.relu = nn.ReLU()

        def forward(self, x):
            seen = {}
            x = self.fc1(x)
            seen["fc1 output"] = x.dtype
            x = self.ln(self.relu(x))
            seen["LayerNorm output"] = x.dtype
            x = self.fc2(x)
            seen["logits"] = x.dtype
            return x, seen

    dtype = torch_dtype(dtype_name)
    model = ToyModel().to(device)
    x = torch.randn(4, 16, device=device)
    y = torch.randint(8, (4,), device=device)
    with torch.autocast(device_type=device, dtype=dtype):
        logits, seen = model(x)
        loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    found = {"parameters": {p.dtype for p in model.parameters()}, **{k: {v} for k, v in seen.items()},
             "loss": {loss.dtype}, "gradients": {p.grad.dtype for p in model.parameters()}}
    rows = []
    for tensor, dtypes in found.items():
        row = stats.summarize("dtype", "", [])
        row.update(tensor=tensor, dtype=", ".join(sorted(str(d).replace("torch.", "") for d in dtypes)))
        rows.append(row)
    return rows


def cases() -> list[dict]:
    out = [{"experiment": "accumulation", "autocast": "", "case_id": "accumulation"}]
    out += [{"experiment": "autocast", "autocast": d, "case_id": f"autocast-{d}"} for d in ("fp16", "bf16")]
    return out


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning; it takes no spec)."""
    return cases()


def measure(case: dict) -> list[dict]:
    import torch
    if case["experiment"] == "accumulation":
        return accumulation()
    return autocast_dtypes("cuda" if torch.cuda.is_available() else "cpu", case["autocast"])


def main(argv=None):
    args = cli.bench_args(__doc__, argv, spec=False, shares_device=True)  # numerics, not timings
    loop.run_cases(section="precision", study="precision", cases=cases(), measure=measure,
                     out_csv=args.out, hw=args.hw, log_path=args.log, fingerprint={})


if __name__ == "__main__":
    main()
