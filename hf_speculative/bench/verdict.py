"""A speed verdict that one disturbed measurement cannot decide: per-prompt speedups, their median and spread, and a
check for timings that look disturbed.

Total tokens over total seconds lets one slow run (another process on the cores for a minute) swing the verdict:
a plain run of 73 s instead of 6 s turns per-prompt speedups of 0.90-1.13x into "3.25x". Here:

* each prompt's speedup is plain seconds over the method's seconds on that prompt (the same tokens, greedy);
* the verdict is the **median** of those speedups, shown with their range and interquartile range;
* a run is **disturbed** when its time per token is more than `DISTURBED_FACTOR` times the median of the same
  method's other runs: a prompt changes the per-token cost of decoding by far less than that, other work on the
  cores does not;
* the spread is **wide** when the range of per-prompt speedups is more than `WIDE_RATIO` of its median: then the
  runs are worth measuring again (`hf-speculative bench --repeats`, the demo re-measures its disturbed prompts).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["DISTURBED_FACTOR", "WIDE_RATIO", "SpeedupSpread", "disturbed_runs", "disturbed_line", "speedup_verdict"]

#: a run whose seconds per token exceed this multiple of the other runs' median looks disturbed
DISTURBED_FACTOR = 3.0
#: per-prompt speedups whose range exceeds this share of their median are a wide spread
WIDE_RATIO = 0.5


@dataclass(frozen=True)
class SpeedupSpread:
    """Per-prompt speedups (plain seconds / method seconds) and their summary."""

    speedups: tuple[float, ...]

    @classmethod
    def from_seconds(cls, plain_seconds: Sequence[float], method_seconds: Sequence[float]) -> "SpeedupSpread":
        return cls(tuple(p / m for p, m in zip(plain_seconds, method_seconds) if p > 0 and m > 0))

    @property
    def median(self) -> float:
        return statistics.median(self.speedups)

    @property
    def low(self) -> float:
        return min(self.speedups)

    @property
    def high(self) -> float:
        return max(self.speedups)

    @property
    def quartiles(self) -> tuple[float, float]:
        """First and third quartile (both the one value when there is one prompt)."""
        if len(self.speedups) < 2:
            return self.speedups[0], self.speedups[0]
        q = statistics.quantiles(self.speedups, n=4, method="inclusive")
        return q[0], q[2]

    @property
    def wide(self) -> bool:
        return (self.high - self.low) > WIDE_RATIO * self.median

    def as_dict(self) -> dict:
        q1, q3 = self.quartiles
        return {
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "q1": q1,
            "q3": q3,
            "per_prompt": list(self.speedups),
            "wide": self.wide,
        }

    def describe(self) -> str:
        """``1.05x (median of 6 prompts; per prompt 0.90-1.13x, middle half 1.00-1.08x)``."""
        q1, q3 = self.quartiles
        return (
            f"{self.median:.2f}x (median of {len(self.speedups)} prompts; per prompt {self.low:.2f}-{self.high:.2f}x, "
            f"middle half {q1:.2f}-{q3:.2f}x)"
        )


def disturbed_runs(seconds_per_token: Mapping[str, float], factor: float = DISTURBED_FACTOR) -> dict[str, float]:
    """``{run: how many times the others' median seconds per token it took}`` for the runs of one method that took
    more than ``factor`` times the median of the other runs (needs three runs or more)."""
    out = {}
    for run, value in seconds_per_token.items():
        others = [v for r, v in seconds_per_token.items() if r != run]
        if len(others) >= 2 and statistics.median(others) > 0 and value > factor * statistics.median(others):
            out[run] = value / statistics.median(others)
    return out


def disturbed_line(disturbed: Mapping[str, Mapping[str, float]], remeasured: bool = False) -> str | None:
    """One line naming the disturbed runs (``{method: {run: ratio}}``), or None when none was."""
    parts = [
        f"{method} on {run} took {ratio:.1f}x the other prompts' time per token"
        for method, runs in disturbed.items()
        for run, ratio in runs.items()
    ]
    if not parts:
        return None
    after = (
        " (re-measured; the verdict uses the re-measured times)"
        if remeasured
        else " (the verdict is the median, which one run cannot move far)"
    )
    return "timings look disturbed (other work on these cores?): " + "; ".join(parts) + after


def speedup_verdict(spread: SpeedupSpread) -> str:
    """``faster than`` / ``slower than`` / ``as fast as`` plain decoding, from the median speedup."""
    return "faster than" if spread.median >= 1.02 else "slower than" if spread.median <= 0.98 else "as fast as"
