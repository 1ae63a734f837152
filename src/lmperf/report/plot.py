"""What every section's figures share: matplotlib without a display, saving, and the figure
written when there is no data (the report rule declares every figure as an output)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401  (the sections plot with it)


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def empty(path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{title}: no data", ha="center", va="center")
    return save(fig, path)
