"""The dtypes a config names, and the torch dtype each name stands for: 'fp32', 'fp16' and
'bf16' in the config, the CSVs and the report; float32, float16 and bfloat16 in torch."""
from __future__ import annotations

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def torch_dtype(name: str):
    """'fp32' | 'fp16' | 'bf16' -> the torch dtype."""
    import torch
    return getattr(torch, DTYPES[name])
