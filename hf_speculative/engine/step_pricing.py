"""Online step pricing: speculate only while it pays, so a speculative ``generate()`` is never slower than plain.

A tree step commits tau tokens for the time of one draft, one verification forward over the tree and the engine's
bookkeeping; a one-token step commits one token for the time of one forward over one token. Which is faster depends
on the machine (the cost curve), the text (how much the drafter's trees are accepted) and the drafter's own cost, and
it changes as a generation goes on. The engine measures both as it decodes (`StepPricer`):

* it speculates first, for ``window`` steps; then it times ``probe`` one-token steps (no draft: the root alone is
  verified) to learn what plain decoding costs here (its price: the median of the last ``plain_samples`` one-token
  steps, so that one slow step, such as the first after a prefill, does not make tree steps look cheap);
* from then on it judges the recent tree steps (up to ``history`` of them) against one-token steps: each tree step
  gains ``tokens x plain seconds - seconds``, the time it saved over committing its tokens one forward each. Tree
  steps lose only when that gain is negative with some confidence: its mean plus ``z`` standard errors is below
  zero (or none of them accepted a drafted token, which no timing can redeem). A handful of steps of a drafter worth
  1.2x is a noisy sample, and judging on the point estimate stopped such drafters on false losses. When they lose it
  decodes one-token steps for a back-off, then tries ``window`` fresh tree steps again; while tree steps win, a
  one-token step every ``recheck`` steps keeps the plain price current;
* the back-off is ``backoff`` steps, doubling each time speculation loses again (up to ``max_backoff``). From the
  second loss in a row on, it is also at least long enough that the next window's expected loss (``window`` tree
  steps at the mean loss per tree step just measured) is ``explore`` (2%) of the back-off's time, that too doubling
  with each further loss (up to ``max_quiet`` steps). A drafter whose trees pay in bursts (SuffixDecoding: a long
  match now and then) wins between its losses and is retried after 8 steps; one whose tree step costs two plain
  steps for 1.1 tokens, losing window after window, waits 8 steps, then about 190, then 380, ...: its exploration
  costs 2% of the time, then less (docs/results/2026-11-30-exploration-budget.md).

A one-token step is an ordinary decoding step through the engine (the same forward, acceptance and cache), so the
output is unchanged: greedy stays token for token equal to plain ``generate()``, sampling keeps its distribution.
The drafter is still told each committed token (`TreeDrafter.advance_batch`), so it keeps learning and keeps in step.
The prices outlive a call: the pricer of a drafter, target and batch size carries its measurements and its plan into
the next ``generate()`` (`hf_speculative.engine.policy.SpeedPolicy.step_pricer`), so a drafter that does not pay here stops paying its exploration on every
prompt. Turn pricing off with ``generate(..., speculative_pricing=False)``, ``SpeedPolicy(pricing=False)``, or
``HF_SPECULATIVE_PRICING=0`` (read by ``hfs.enable``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["PRICING_ENV", "StepPricer"]

PRICING_ENV = "HF_SPECULATIVE_PRICING"


@dataclass
class StepPricer:
    """Decides each step whether to draft (see the module docstring); `record` is told what each step did."""

    window: int = 4
    history: int = 24
    z: float = 1.0
    probe: int = 2
    backoff: int = 8
    max_backoff: int = 128
    explore: float = 0.02
    max_quiet: int = 1024
    recheck: int = 48
    plain_samples: int = 8
    margin: float = 0.02
    tree_steps: deque = field(init=False)  # (seconds, tokens per row) of the last `history` tree steps
    plain_seconds: deque = field(init=False)  # seconds of the recent one-token steps (up to `plain_samples`)
    _plan: deque = field(init=False, default_factory=deque)  # the steps decided ahead: True = draft
    _since_plain: int = field(init=False, default=0)
    _losses: int = field(init=False, default=0)

    def __post_init__(self):
        self.tree_steps = deque(maxlen=max(self.history, self.window))
        self.plain_seconds = deque(maxlen=max(self.probe, self.plain_samples))

    def draft_this_step(self) -> bool:
        if not self._plan:
            self._plan.extend(self._next_plan())
        return self._plan.popleft()

    def record(self, drafted: bool, seconds: float, tokens: int, rows: int) -> None:
        """One step took ``seconds`` and committed ``tokens`` over ``rows`` rows; ``drafted``: it verified drafted
        nodes (a step whose drafter found nothing to propose, e.g. prompt lookup without a match, was a one-token
        step, and is priced as one)."""
        if drafted:
            self.tree_steps.append((seconds, tokens / max(rows, 1)))
            self._since_plain += 1
        else:
            self.plain_seconds.append(seconds)
            self._since_plain = 0

    # ------------------------------------------------------------------ the plan
    def _next_plan(self) -> list[bool]:
        if len(self.tree_steps) < self.window:  # cleared at each back-off: the tree steps since then
            return [True] * (self.window - len(self.tree_steps))
        if not self.plain_seconds:
            return [False] * self.probe
        if not self.speculation_pays():
            self._losses += 1
            doubling = 2 ** (self._losses - 1)
            steps = min(self.backoff * doubling, self.max_backoff)
            if self._losses > 1:  # a loser again after its back-off: exploring it costs at most the `explore` share
                steps = max(steps, min(self.quiet_steps() * doubling // 2, self.max_quiet))
            self.tree_steps.clear()  # judged again on fresh tree steps after the back-off
            return [False] * steps + [True] * self.window
        self._losses = 0
        if self._since_plain >= self.recheck:
            return [False]
        return [True]

    def _plain(self) -> float:
        # the median (of two probes, their mean): one slow step (a cold cache after the prefill, an interrupt) must not
        # make tree steps look cheap, nor one fast step make them look dear
        return statistics.median(self.plain_seconds)

    def quiet_steps(self) -> int:
        """One-token steps after which one more window of tree steps, at the mean loss per tree step measured
        (in one-token steps' time), costs ``explore`` of the time spent."""
        plain = self._plain()
        losses = [seconds * (1 + self.margin) - tokens * plain for seconds, tokens in self.tree_steps]
        loss = max(statistics.fmean(losses), 0.0) * self.window / plain
        return math.ceil(loss / self.explore)

    def speculation_pays(self) -> bool:
        """Some drafted token was accepted, and the recent tree steps' mean gain over one-token steps (by ``margin``)
        is not confidently negative (mean + ``z`` standard errors)."""
        steps = self.tree_steps
        if sum(t for _, t in steps) <= len(steps):  # one token per step: nothing drafted was ever accepted
            return False
        plain = self._plain()
        gains = [tokens * plain - seconds * (1 + self.margin) for seconds, tokens in steps]
        error = statistics.pstdev(gains) / math.sqrt(len(gains))
        return statistics.fmean(gains) + self.z * error > 0
