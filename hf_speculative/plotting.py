"""Writing matplotlib figures: one helper for the bench plots and the studies in benchmarks/."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write (creating the folder; through a unique temporary file and ``os.replace``) and close a matplotlib
    figure."""
    import matplotlib.pyplot as plt

    from .paths import atomic_path

    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:  # the format from the final name (the temporary's ends in .tmp)
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or None)
    plt.close(fig)
    return path
