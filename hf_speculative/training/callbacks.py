"""Trainer callbacks every drafter's training shares."""

from __future__ import annotations

import math
import time

from transformers import TrainerCallback

__all__ = ["LearningCurveCallback", "TimeBudgetCallback"]


class LearningCurveCallback(TrainerCallback):
    """Calls ``self._record(step)`` at the start and at ``self.num_points`` evenly spaced steps of training
    (a drafter's held-out accuracy / expected tau against training seen); subclasses implement `_record`."""

    num_points: int = 4

    def _record(self, step: int) -> None:
        raise NotImplementedError

    def on_train_begin(self, args, state, control, **kwargs):
        self._record(0)

    def on_step_end(self, args, state, control, **kwargs):
        marks = {max(1, round(state.max_steps * (i + 1) / self.num_points)) for i in range(self.num_points)}
        if state.global_step in marks:
            self._record(state.global_step)


class TimeBudgetCallback(TrainerCallback):
    """Stops training once ``seconds`` have passed (a shared CPU's time slot). With ``anneal`` the learning rate
    follows a cosine over the budget: ``lr = base * warmup * 0.5 (1 + cos(pi f))`` with ``f`` the larger of the
    elapsed share of the time budget and of ``max_steps`` (so a run cut by time still ends with a small rate);
    use it with ``lr_scheduler_type="constant"``."""

    def __init__(self, seconds: float, anneal: bool = True, warmup_steps: int = 5):
        self.seconds, self.anneal, self.warmup_steps = seconds, anneal, warmup_steps
        self.start = time.perf_counter()
        self.base: list[float] | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        if not self.anneal or optimizer is None:
            return
        if self.base is None:
            self.base = [g["lr"] for g in optimizer.param_groups]
        frac = min(1.0, max((time.perf_counter() - self.start) / self.seconds, state.global_step / max(state.max_steps, 1)))
        factor = min(1.0, (state.global_step + 1) / self.warmup_steps) * 0.5 * (1 + math.cos(math.pi * frac))
        for group, base in zip(optimizer.param_groups, self.base):
            group["lr"] = base * factor

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() - self.start > self.seconds:
            control.should_training_stop = True
