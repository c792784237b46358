"""Plots a researcher would put in a paper (matplotlib, the ``viz`` extra)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from .errors import SchedoptError

__all__ = ["pyplot", "save_figure", "write_sweep_plot"]


def pyplot():
    """Return ``matplotlib.pyplot`` on the file-only Agg backend, or say how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SchedoptError("plotting needs matplotlib: pip install 'schedopt[viz]'") from exc
    return plt


def write_sweep_plot(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str], *, title: str = "") -> None:
    """Plot speedup over pytorch-ddp against bandwidth: a line per solver, a panel per world size."""
    plt = pyplot()
    world_sizes = sorted({r["world_size"] for r in rows})
    solvers = list(dict.fromkeys(r["solver"] for r in rows))
    fig, axes = plt.subplots(1, len(world_sizes), figsize=(5.2 * len(world_sizes), 4.0), sharey=True, squeeze=False)
    for ax, n in zip(axes[0], world_sizes):
        for solver in solvers:
            points = sorted((r["bandwidth_Bps"] * 8 / 1e9, r["speedup_vs_ddp"]) for r in rows
                            if r["world_size"] == n and r["solver"] == solver and r["speedup_vs_ddp"])
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", label=solver)
        ax.axhline(1.0, color="#888888", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        ax.set_xlabel("bandwidth per rank (Gbit/s)")
        ax.set_title(f"{n} ranks")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("speedup over pytorch-ddp")
    axes[0][-1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    save_figure(fig, path)


def save_figure(fig: Any, path: str | os.PathLike[str]) -> None:
    """Write a figure as PNG through a temporary file and a rename, then close it."""
    from .io import destination, publish, temporary_beside

    plt = pyplot()
    fig.tight_layout()
    target = destination(path)
    fd, tmp = temporary_beside(target, suffix=".png")  # unique: two writers of one chart do not collide
    try:
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, dpi=120, format="png")
        publish(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
