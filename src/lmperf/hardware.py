"""What machine this is, and the peak rates MFU is measured against.

Importing this module does not import torch: the Snakefile uses it at parse time.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from importlib import metadata

# Dense peak TFLOP/s by datasheet, keyed by a substring of torch.cuda.get_device_name().
# "fp32" is the plain (non-tensor-core) fp32 rate: PyTorch's default matmul precision
# ("highest") does not use TF32. "tf32" is the dense tensor-core rate of fp32 matmuls run as TF32
# (set_float32_matmul_precision("high")). "bf16" is the dense tensor-core rate without sparsity.
PEAK_TFLOPS = {
    "H100 80GB HBM3": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.0},  # H100 SXM5
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0},
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.0},  # same compute as H100 SXM5
    "A100-SXM4-80GB": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
    "A100-SXM4-40GB": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
    "A100-PCIE": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
    "A800": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0},
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.0},
}


def peak_tflops(gpu_name: str, dtype: str) -> float | None:
    """Peak dense TFLOP/s for `dtype` ('fp32', 'tf32' or 'bf16') on this GPU, or None if unknown."""
    for key, peaks in PEAK_TFLOPS.items():
        if key in gpu_name:
            return peaks.get(dtype)
    return None


def gpu_name() -> str | None:
    """The first GPU's name as nvidia-smi prints it, without importing torch; None if no GPU."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names[0] if names else None


def hw_slug(name: str | None) -> str:
    """Directory name for results of this hardware: 'cpu', or the GPU name in lowercase words,
    e.g. 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    if not name:
        return "cpu"
    name = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries whose change must rerun the benchmarks."""
    out = {}
    for lib in ("torch", "triton"):
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = "none"
    return out


def gpu_count() -> int:
    """How many GPUs nvidia-smi lists, without importing torch; 0 without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return 0
    return sum(1 for line in out.splitlines() if line.strip())


def machine_slug(name: str | None, count: int) -> str:
    """Directory name for results that depend on the GPU count: 'cpu', or the GPU's slug and
    the count, e.g. 2 x 'NVIDIA H200' -> 'h200-x2'."""
    return "cpu" if not name else f"{hw_slug(name)}-x{count}"
