"""The project's one cost model: what a speculative step costs against a plain decoding step.

Both halves price SPIRe's Delta t (Neelam et al., Sec. 4): a step that commits tau tokens for the time of Delta t
plain steps speeds decoding up by ``tau / Delta t``.

* `cost_curve` -- **measured** on this machine: ``c(n)``, a target forward over n tokens in one-token steps, cached
  per machine, dtype and model; cost-aware trees (`hf_speculative.drafters.cost_aware`, `TreeSpec.optimize(cost=)`)
  choose their size with it.
* `roofline` -- **projected** from shapes alone: each forward costs ``max(FLOPs / FLOP/s, bytes / B/s)`` on a
  `Hardware` (H100, H200, A100 presets, or this CPU measured), which gives SPIRe's throughput multiplier of vanilla
  speculative decoding, MagicDec and SPIRe over batch size x context length (`speedup_grid`, `plot_heatmap`; the
  ``hf-speculative perf-model`` command).
* `shapes` -- `ModelShape` (parameters, FLOPs and bytes of a forward from a config) and the named `SHAPES`.

`projected_speedup` is the formula both use, also with step times measured on a GPU at real shapes
(`hf_speculative.bench.projection`).
"""

from .cost_curve import (
    CURVE_VERSION,
    DEFAULT_NODES,
    DEFAULT_PROJECTION_ROWS,
    CostCurve,
    cost_curve_path,
    get_cost_curve,
    machine_description,
    measure_cost_curve,
    set_cost_curve,
)
from .roofline import (
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
    projected_speedup,
    speedup_grid,
    step_times,
    throughput_multiplier,
)
from .shapes import DTYPE_BYTES, SHAPES, ModelShape, shape_config

__all__ = [  # the package's public names; its modules list none of their own
    # measured cost curve
    "CostCurve",
    "measure_cost_curve",
    "get_cost_curve",
    "set_cost_curve",
    "cost_curve_path",
    "machine_description",
    "DEFAULT_NODES",
    "DEFAULT_PROJECTION_ROWS",
    "CURVE_VERSION",
    # shapes
    "SHAPES",
    "shape_config",
    "ModelShape",
    "DTYPE_BYTES",
    # roofline
    "Hardware",
    "HARDWARE",
    "METHODS",
    "StepTimes",
    "SpeedupGrid",
    "forward_time",
    "step_times",
    "throughput_multiplier",
    "projected_speedup",
    "expected_tau",
    "speedup_grid",
    "plot_heatmap",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_CONTEXTS",
]
