"""What every section's figures share: matplotlib without a display, and saving.

A section's `figures(inputs, paths) -> dict` writes each figure it has rows for and returns
{name: why} for those it did not draw; no figure is drawn without data, and the template shows
the reason in place of the image (templates/figure.md.j2)."""
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
