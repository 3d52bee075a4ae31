"""The training curve of a run as a plot: the logged loss, and each unrolled step's or head's parts, against steps."""

from __future__ import annotations

import re
import time
from pathlib import Path

from transformers import TrainerCallback
from transformers.utils import logging

from ..plotting import save_figure

logger = logging.get_logger(__name__)

PLOT_NAME = "training_curve.png"
_PART = re.compile(r"^(loss_)?(kd|acc|ce|head|lm|stream)_?(\d+)$")  # kd_0, acc_1, loss_stream2, ...


def curve_series(log_history: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """``{name: [(step, value), ...]}`` of the logged ``loss`` and of every numbered loss part (``kd_0``,
    ``acc_1``, ``loss_stream2``, ...), from a Trainer's ``log_history``."""
    series: dict[str, list[tuple[int, float]]] = {}
    for entry in log_history:
        step = entry.get("step")
        if step is None:
            continue
        for key, value in entry.items():
            if (key == "loss" or _PART.match(key)) and isinstance(value, (int, float)):
                series.setdefault(key, []).append((int(step), float(value)))
    return series


def plot_training_curve(log_history: list[dict], path: str | Path, title: str | None = None) -> Path | None:
    """Write the curve of ``log_history`` to ``path``: the loss and the loss parts on the left, the accuracies
    (``acc_*``) on the right when logged. None (nothing written) when nothing was logged yet or matplotlib is not
    installed (``pip install matplotlib``)."""
    series = curve_series(log_history)
    if "loss" not in series:
        return None
    try:
        from matplotlib.figure import Figure  # no pyplot: the caller's backend and figures stay as they are
    except ImportError:
        logger.warning_once("matplotlib is not installed: no training-curve plot (pip install matplotlib)")
        return None
    accuracies = {k: v for k, v in series.items() if k.startswith("acc")}
    fig = Figure(figsize=(11 if accuracies else 6, 4))
    axes = fig.subplots(1, 2 if accuracies else 1, squeeze=False)
    for name, points in series.items():
        if name not in accuracies:
            axes[0][0].plot(*zip(*points), label=name, linewidth=2 if name == "loss" else 1)
    axes[0][0].set(xlabel="optimizer step", ylabel="training loss", title=title or "training curve")
    axes[0][0].legend(fontsize=8)
    if accuracies:
        for name, points in accuracies.items():
            axes[0][1].plot(*zip(*points), label=name)
        axes[0][1].set(xlabel="optimizer step", ylabel="training-batch top-1 accuracy", ylim=(0, 1))
        axes[0][1].legend(fontsize=8)
    return save_figure(fig, path)


class TrainingCurveCallback(TrainerCallback):
    """Redraw ``output_dir/training_curve.png`` at a checkpoint (at most every ``min_interval`` seconds) and at the
    end of training (process 0 only), so a run of hours shows its curve while it runs."""

    def __init__(self, title: str | None = None, min_interval: float = 60.0):
        self.title, self.min_interval = title, min_interval
        self._last: float | None = None

    def _draw(self, args, state) -> None:
        if state.is_world_process_zero:
            plot_training_curve(state.log_history, Path(args.output_dir) / PLOT_NAME, self.title)
            self._last = time.monotonic()

    def on_save(self, args, state, control, **kwargs):
        if self._last is None or time.monotonic() - self._last >= self.min_interval:
            self._draw(args, state)

    def on_train_end(self, args, state, control, **kwargs):
        self._draw(args, state)
