"""Where a results row was measured: the commit of the code (marked dirty where the sources,
rules or config differ from it), the GPU and the library versions, and when. Every row carries
these (lmperf.csv_schema.PROVENANCE_COLUMNS)."""
from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path


def git_commit(cwd: Path | None = None) -> str:
    if os.environ.get("LMPERF_COMMIT"):
        return os.environ["LMPERF_COMMIT"]
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=cwd, capture_output=True, text=True,
                                        timeout=10, check=True).stdout.strip()
        sha = run("rev-parse", "--short=12", "HEAD")
        dirty = run("status", "--porcelain", "--untracked-files=no", "--", "src", "Snakefile",
                    "rules", "config")
        return sha + ("-dirty" if dirty else "")
    except (subprocess.SubprocessError, OSError):
        return "unknown"


def provenance(hw: str) -> dict:
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    cuda = torch.cuda.is_available()
    return {
        "hw": hw,
        "gpu": torch.cuda.get_device_name() if cuda else "none",
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": (torch.version.cuda or "none") if cuda else "none",
        "python": platform.python_version(),
        "commit": git_commit(),
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
