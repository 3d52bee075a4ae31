"""Writing matplotlib figures: one helper for the bench plots and the studies in benchmarks/."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write (creating the folder) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
