"""What machine this is: its GPUs and libraries, the peak rates MFU is measured against, and the
link between two GPUs (nvidia-smi's topology and NVLink speeds, the datasheet's peak).

Importing this module does not import torch: the Snakefile uses it at parse time.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from importlib import metadata

# The GPU's state a timed row records at its timed work's start and end (NVML's readings,
# lmperf.bench.energy; the columns lmperf.bench.timing writes and lmperf.report.validate reads).
READINGS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c")
CLOCK_COLUMNS = tuple(f"{name}_{at}" for name in READINGS for at in ("start", "end"))

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


# Peak memory bandwidth in TB/s by datasheet, keyed as PEAK_TFLOPS: with the dense bf16 peak, the
# roofline floor under which no time of a kernel's FLOPs and bytes is possible (bench/honest.py).
PEAK_BANDWIDTH_TBS = {
    "H100 80GB HBM3": 3.35, "H100 PCIe": 2.0, "H100 NVL": 3.9, "H200": 4.8,
    "A100-SXM4-80GB": 2.039, "A100-SXM4-40GB": 1.555, "A100-PCIE": 1.555, "A800": 2.039,
    "L40S": 0.864, "RTX 4090": 1.008,
}


def peak_bandwidth_tbs(gpu_name: str) -> float | None:
    """Peak memory bandwidth in TB/s of this GPU by datasheet, or None if unknown."""
    return next((bw for key, bw in PEAK_BANDWIDTH_TBS.items() if key in gpu_name), None)


def peak_tflops(gpu_name: str, dtype: str) -> float | None:
    """Peak dense TFLOP/s for `dtype` ('fp32', 'tf32' or 'bf16') on this GPU, or None if unknown."""
    for key, peaks in PEAK_TFLOPS.items():
        if key in gpu_name:
            return peaks.get(dtype)
    return None


def nvidia_smi(*args: str) -> str:
    """nvidia-smi's output for these arguments, or "" where there is no nvidia-smi or it fails."""
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return ""


def gpu_names() -> list[str]:
    """The GPUs' names as nvidia-smi prints them, without importing torch; [] without a GPU."""
    out = nvidia_smi("--query-gpu=name", "--format=csv,noheader")
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_name() -> str | None:
    """The first GPU's name as nvidia-smi prints it, without importing torch; None if no GPU."""
    names = gpu_names()
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
    return len(gpu_names())


def machine_slug(name: str | None, count: int) -> str:
    """Directory name for results that depend on the GPU count: 'cpu', or the GPU's slug and
    the count, e.g. 2 x 'NVIDIA H200' -> 'h200-x2'."""
    return "cpu" if not name else f"{hw_slug(name)}-x{count}"


# ---------------------------------------------------------------------------------------------
# The link between two GPUs: the ceiling of an all-reduce's bus bandwidth

# NVLink bandwidth per GPU and direction (GB/s), by datasheet, keyed by a substring of the GPU's
# name. NVLink 4 is 18 links x 25 GB/s a direction.
LINK_DATASHEET = {
    "H100 80GB HBM3": (450.0, "H100 SXM5, NVLink 4: 900 GB/s bidirectional"),
    "H200": (450.0, "H200 SXM, NVLink 4: 900 GB/s bidirectional"),
    "H100 NVL": (300.0, "H100 NVL, NVLink bridge: 600 GB/s bidirectional"),
    "A100-SXM4": (300.0, "A100 SXM4, NVLink 3: 600 GB/s bidirectional"),
    "B200": (900.0, "B200, NVLink 5: 1.8 TB/s bidirectional"),
}
# PCIe bandwidth per lane and direction after line coding (GB/s), by generation.
PCIE_LANE_GBPS = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def topo_link(topo: str, a: int = 0, b: int = 1) -> str | None:
    """The connection between GPU a and GPU b in `nvidia-smi topo -m`'s matrix ('NV18', 'PIX',
    'SYS', ...), or None if the matrix has no such pair."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).split() for line in topo.splitlines()]
    first = next((i for i, words in enumerate(lines) if words[:1] == ["GPU0"]), None)
    if first is None:  # the header is the first line that starts with GPU0, the rows follow
        return None
    header = lines[first]
    row = next((words for words in lines[first + 1:] if words[:1] == [f"GPU{a}"]), None)
    if not row or f"GPU{b}" not in header:
        return None
    col = header.index(f"GPU{b}") + 1  # a row starts with its own name
    return row[col] if col < len(row) else None


def nvlink_speeds(status: str) -> list[float]:
    """GB/s of each active link in `nvidia-smi nvlink -s -i 0` ('Link 3: 26.562 GB/s');
    inactive links are left out."""
    return [float(m[1]) for m in re.finditer(r"Link\s+\d+:\s+([0-9.]+)\s*GB/s", status)]


def link_peaks(gpu: str) -> list[tuple[str, float, str]]:
    """The GPU0-GPU1 link's peak, GB/s per GPU and direction, as (source, GB/s, how it was read):
    ('driver', ...) from nvidia-smi's topology and NVLink speeds (or PCIe generation and width),
    ('datasheet', ...) from LINK_DATASHEET for the GPU named `gpu`; each where known."""
    peaks = []
    link = topo_link(nvidia_smi("topo", "-m"))
    if link and link.startswith("NV"):
        speeds = nvlink_speeds(nvidia_smi("nvlink", "-s", "-i", "0"))
        if speeds:
            peaks.append(("driver", sum(speeds), f"GPU0-GPU1 {link} (nvidia-smi topo -m); GPU0 has "
                          f"{len(speeds)} active NVLinks at {speeds[0]:g} GB/s a direction (nvidia-smi nvlink -s)"))
    elif link:
        pcie = nvidia_smi("--query-gpu=pcie.link.gen.max,pcie.link.width.max", "--format=csv,noheader",
                          "-i", "0").strip()
        m = re.match(r"\s*(\d+)\s*,\s*(\d+)", pcie)
        if m and int(m[1]) in PCIE_LANE_GBPS:
            peaks.append(("driver", PCIE_LANE_GBPS[int(m[1])] * int(m[2]),
                          f"GPU0-GPU1 {link} (nvidia-smi topo -m): PCIe gen {m[1]} x{m[2]}"))
    for key, (gbps, what) in LINK_DATASHEET.items():
        if key in gpu:
            peaks.append(("datasheet", gbps, f"{what}, so {gbps:g} GB/s a direction (datasheet)"))
            break
    return peaks
