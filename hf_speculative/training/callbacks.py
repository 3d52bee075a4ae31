"""Trainer callbacks every drafter's training shares."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

from transformers import TrainerCallback

from ..paths import write_atomically
from .distributed import process0_value

__all__ = ["LearningCurveCallback", "TimeBudgetCallback", "RunningClock", "budget_warmup_steps"]

MAX_BUDGET_WARMUP_STEPS = 100


class RunningClock:
    """Seconds this process has been running: wall-clock time less the spans it was stopped (``kill -STOP`` ...
    ``kill -CONT``, a suspended machine), so that a training run paused while something else is timed keeps its whole
    time budget. A daemon thread wakes every ``tick`` seconds; a wake-up more than ``gap`` seconds late means the
    process was stopped, and the lateness is counted as paused. The thread starts with the first clock, not at import.
    """

    def __init__(self, tick: float = 0.25, gap: float = 2.0):
        self.tick, self.gap, self.paused = tick, gap, 0.0
        self._last = time.monotonic()
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="hf-speculative-running-clock", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(self.tick)
            with self._lock:
                now = time.monotonic()
                self.paused, self._last = self._settled(now), now

    def _settled(self, now: float) -> float:
        """The paused seconds, the stop the watcher has not seen yet included."""
        late = now - self._last - self.tick
        return self.paused + (late if late > self.gap else 0.0)

    def __call__(self) -> float:
        with self._lock:
            now = time.monotonic()
            return now - self._settled(now)


_CLOCK: RunningClock | None = None


def running_clock() -> RunningClock:
    """The process's one `RunningClock` (started on first use)."""
    global _CLOCK
    if _CLOCK is None:
        _CLOCK = RunningClock()
    return _CLOCK


def budget_warmup_steps(total_steps: int, share: float = 0.05, time_budget: float | None = None) -> int:
    """Warm-up steps: ``share`` of ``total_steps``; under a ``time_budget`` at most `MAX_BUDGET_WARMUP_STEPS`, since
    ``total_steps`` then only bounds the run (many epochs planned, the budget ends it) and a share of it would keep
    the learning rate near zero for the whole budget."""
    steps = max(1, int(share * total_steps))
    return min(steps, MAX_BUDGET_WARMUP_STEPS) if time_budget else steps


class LearningCurveCallback(TrainerCallback):
    """The learning curve of a drafter with a calibrated tree: at the start and at ``num_points`` evenly spaced steps
    of training, its held-out top-i accuracies (`accuracies`: ``[depth][i]``) and the expected acceptance length of
    the tree calibrated on them for ``num_nodes``, appended to ``curve``; with ``save_dir`` the drafter is also saved
    in ``save_dir/step<N>`` (to measure real tau against training seen afterwards). ``per_step``: what one step
    trains on (positions, groups, tokens), passed as ``per_step=`` or under the subclass's ``per_step_key``
    (``batch_size=``, ``tokens_per_step=``). Subclasses implement `accuracies`, name the point's keys and give the
    defaults of ``num_nodes``, ``num_points`` and ``per_step``.

    Under a time budget (``budget``: the run's `TimeBudgetCallback`, set by `hf_speculative.training.trainer.train_drafter`)
    the points fall at evenly spaced shares of the budget instead of the planned steps, the last one when training
    ends; each point records the training seconds so far, and the seconds spent measuring it are not counted
    against the budget (the curve is tau against training time)."""

    FILE = "learning_curve.json"
    seen_key = "train_tokens"  # step x per_step
    top1_key = "top1"  # the per-depth top-1 accuracies
    per_step_key = "per_step"
    default_num_nodes, default_num_points, default_per_step = 16, 4, 0

    def __init__(
        self,
        model,
        held_out,
        num_nodes: int | None = None,
        num_points: int | None = None,
        save_dir: str | None = None,
        **per_step: float,
    ):
        if len(per_step) > 1 or set(per_step) - {"per_step", self.per_step_key}:
            raise TypeError(f"{type(self).__name__} takes per_step or {self.per_step_key}, got {sorted(per_step)}")
        self.model, self.held_out, self.save_dir = model, held_out, save_dir
        self.num_nodes = self.default_num_nodes if num_nodes is None else num_nodes
        self.num_points = self.default_num_points if num_points is None else num_points
        self.per_step = next(iter(per_step.values()), self.default_per_step)
        self.curve: list[dict] = []
        self.budget = None  # TimeBudgetCallback of a time-budgeted run
        self._marks_passed = 0
        self._file: Path | None = None  # the points so far, in the run's output folder (time-budgeted runs)

    def accuracies(self) -> list[list[float]]:
        """The drafter's held-out top-i accuracies ``[depth][i]`` (called in eval mode)."""
        raise NotImplementedError

    def _record(self, step: int, seconds: float | None = None) -> None:
        from ..engine.trees import TreeSpec, expected_acceptance_length

        was_training = self.model.training
        self.model.eval()
        acc = self.accuracies()
        tree = TreeSpec.optimize(acc, self.num_nodes)
        point = {
            "step": step,
            self.seen_key: int(step * self.per_step),
            self.top1_key: [round(r[0], 4) for r in acc],
            "expected_tau_calibrated": round(expected_acceptance_length(tree, acc), 4),
        }
        if seconds is not None:
            point["train_seconds"] = round(seconds, 1)
        if self.save_dir is not None:
            path = Path(self.save_dir) / f"step{step}"
            self.model.save_pretrained(path)
            point["checkpoint"] = str(path)
        self.curve.append(point)
        if self._file is not None:  # a resumed run continues the curve
            write_atomically(self._file, json.dumps(self.curve))
        self.model.train(was_training)

    def _timed_record(self, step: int) -> None:
        start = self.budget.clock()
        self._record(step, self.budget.elapsed())
        self.budget.start += self.budget.clock() - start  # measuring is not training: the budget gets its seconds back

    def on_train_begin(self, args, state, control, **kwargs):
        if self.budget is None:
            self._record(0)
        else:  # before the budget's clock starts: the seconds earlier (resumed) runs spent, and their points
            self._file = Path(args.output_dir) / self.FILE if state.is_world_process_zero else None
            if self.budget.spent and self._file is not None and self._file.is_file():
                self.curve = [p for p in json.loads(self._file.read_text()) if p["step"] <= state.global_step]
            self._marks_passed = self._marks(self.budget.spent)
            if not self.curve or self.curve[-1]["step"] != state.global_step:
                self._record(state.global_step, self.budget.spent)

    def _marks(self, seconds: float) -> int:
        """How many of the first ``num_points - 1`` shares of the budget ``seconds`` of training have passed."""
        return min(self.num_points - 1, int(seconds * self.num_points / self.budget.seconds))

    def on_step_end(self, args, state, control, **kwargs):
        if self.budget is not None:
            passed = self._marks(self.budget.elapsed())
            if passed > self._marks_passed:
                self._marks_passed = passed
                self._timed_record(state.global_step)
            return
        marks = {max(1, round(state.max_steps * (i + 1) / self.num_points)) for i in range(self.num_points)}
        if state.global_step in marks:
            self._record(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.budget is not None and (not self.curve or self.curve[-1]["step"] != state.global_step):
            self._record(state.global_step, self.budget.elapsed())


class TimeBudgetCallback(TrainerCallback):
    """Stops training once ``seconds`` have passed (a shared CPU's time slot). With ``anneal`` the learning rate
    follows a cosine over the budget: ``lr = base * warmup * 0.5 (1 + cos(pi f))`` with ``f`` the larger of the
    elapsed share of the time budget and of ``max_steps`` (so a run cut by time still ends with a small rate);
    use it with ``lr_scheduler_type="constant"``.

    The budget spans resumed runs: each checkpoint records the seconds spent so far (``time_budget.json``), and
    ``spent`` (set from it by `hf_speculative.training.trainer.train_resumable`) counts against the budget. Under
    several processes every one follows process 0's clock (`process0_value`): they stop at the same step (a process
    that stopped alone would leave the others waiting in the gradient all-reduce) and anneal alike. The clock is a
    `RunningClock`: seconds the process spent stopped (paused while something else is timed) are not counted."""

    FILE = "time_budget.json"

    def __init__(self, seconds: float, anneal: bool = True, warmup_steps: int = 5, spent: float = 0.0):
        self.seconds, self.anneal, self.warmup_steps, self.spent = seconds, anneal, warmup_steps, spent
        self.clock = running_clock()
        self.start = self.clock()
        self.base: list[float] | None = None

    @classmethod
    def spent_in(cls, checkpoint) -> float:
        """The training seconds a checkpoint folder records (0 when it records none)."""
        path = Path(checkpoint) / cls.FILE
        return float(json.loads(path.read_text())["seconds"]) if path.is_file() else 0.0

    def elapsed(self) -> float:
        return self.spent + self.clock() - self.start

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = self.clock()

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir():
            write_atomically(folder / self.FILE, json.dumps({"seconds": round(self.elapsed(), 3)}))

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        if not self.anneal or optimizer is None:
            return
        if self.base is None:
            self.base = [g["lr"] for g in optimizer.param_groups]
        frac = min(1.0, max(process0_value(self.elapsed()) / self.seconds, state.global_step / max(state.max_steps, 1)))
        factor = min(1.0, (state.global_step + 1) / self.warmup_steps) * 0.5 * (1 + math.cos(math.pi * frac))
        for group, base in zip(optimizer.param_groups, self.base):
            group["lr"] = base * factor

    def on_step_end(self, args, state, control, **kwargs):
        if process0_value(self.elapsed()) > self.seconds:
            control.should_training_stop = True
            control.should_save = bool(args.save_strategy != "no")  # a resumed run starts where the budget ended
