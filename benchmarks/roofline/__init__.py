"""SPIRe's roofline throughput model (Neelam et al., 2025, Sec. 4, Fig. 4): each forward priced as
``max(FLOPs / FLOP/s, bytes / B/s)`` on a `Hardware` (H100, H200, A100 presets, or this CPU measured), the throughput
multiplier of vanilla speculative decoding, MagicDec and SPIRe over batch size x context length (`model`), and its
command (`cli`, ``python benchmarks/run_roofline.py``). Built on `hf_speculative.perf_model` (`ModelShape`,
`projected_speedup`); this folder sits beside the package and is not installed with it.
"""

from .model import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_CONTEXTS,
    HARDWARE,
    METHODS,
    Hardware,
    SpeedupGrid,
    StepTimes,
    expected_tau,
    forward_time,
    plot_heatmap,
    speedup_grid,
    step_times,
    throughput_multiplier,
)

__all__ = [
    "Hardware",
    "HARDWARE",
    "METHODS",
    "StepTimes",
    "SpeedupGrid",
    "forward_time",
    "step_times",
    "throughput_multiplier",
    "expected_tau",
    "speedup_grid",
    "plot_heatmap",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_CONTEXTS",
]
