"""Plot saving: a headless pyplot, and one place that writes and closes a figure."""

from __future__ import annotations

import pathlib


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path, dpi: int | None = None, tight: bool = False) -> pathlib.Path:
    """Write ``fig`` to ``path`` (folders made; ``dpi`` default the figure's) and close it. -> the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    fig.savefig(path, **({} if dpi is None else {"dpi": dpi}))
    pyplot().close(fig)
    return path


def learning_curves(rows: list[dict], summary: dict, path, title: str, methods, colors: dict,
                    goal_success: float = 0.9) -> None:
    """Session learning curves per task (``jobs.collect`` rows, ``jobs.summarize``'s summary): mean over seeds with
    the min-max band for each of ``methods`` (in ``colors``), the base VLA dashed, the goal dotted."""
    import textwrap

    import numpy as np

    plt = pyplot()
    tasks = list(summary)
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(5.2 * max(1, len(tasks)), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        base = None
        for method in methods:
            runs = [r for r in rows if r["task"] == task and r["method"] == method and "curve" in r]
            if not runs:
                continue
            grid = np.array(sorted({t for r in runs for t, _ in r["curve"]}))
            ys = np.stack([np.interp(grid, [t for t, _ in r["curve"]], [v for _, v in r["curve"]]) for r in runs]) * 100
            ax.plot(grid, ys.mean(0), color=colors[method], lw=2, label=f"{method} (n={len(runs)})")
            ax.fill_between(grid, ys.min(0), ys.max(0), color=colors[method], alpha=0.15)
            base = np.mean([r["base"] for r in runs]) * 100
        if base is not None:
            ax.axhline(base, color="k", ls="--", lw=1, label=f"base VLA {base:.0f}%")
        ax.axhline(goal_success * 100, color="g", ls=":", lw=1, label=f"goal {goal_success:.0%}")
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("environment steps (control ticks)")
        ax.set_ylabel("eval success (%)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, width=int(95 * max(1, len(tasks)) ** 0.5 * 0.6)), fontsize=9)
    fig.tight_layout()
    save(fig, path, dpi=120)
