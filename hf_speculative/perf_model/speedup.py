"""The speedup of a speculative step: ``tau`` tokens committed for the cost of ``Delta t`` plain decoding steps
(SPIRe, Neelam et al., 2025, Sec. 4)."""

from __future__ import annotations

__all__ = ["projected_speedup"]


def projected_speedup(tau: float, t_tree: float, t_one: float, draft_time: float = 0.0) -> float:
    """``tau / ((t_tree + draft_time) / t_one)``: tokens per step over the step's cost in decoding steps. The times
    are measured (`hf_speculative.bench.projection.measure_step_latency`) or from the roofline (`step_times`)."""
    if tau <= 0 or t_tree <= 0 or t_one <= 0 or draft_time < 0:
        raise ValueError(f"need tau, t_tree, t_one > 0 and draft_time >= 0, got {tau}, {t_tree}, {t_one}, {draft_time}")
    return tau / ((t_tree + draft_time) / t_one)
