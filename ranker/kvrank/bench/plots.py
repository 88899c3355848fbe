"""The few lines every kvrank plot shares: a headless backend, a grid, and a saved PNG.

matplotlib is imported inside the functions so that importing the bench does not pay for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def figure(width: float = 7.0, height: float = 4.5) -> tuple[Any, Any]:
    """A new figure and its axes on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def save(fig: Any, ax: Any, path: Path) -> None:
    """Legend, log-aware grid, then ``path`` (folders created) at 120 dpi; the figure closed."""
    import matplotlib.pyplot as plt

    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
