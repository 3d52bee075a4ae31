"""The project's cost model: what a speculative step costs against a plain decoding step.

A step that commits tau tokens for the time of Delta t plain steps speeds decoding up by ``tau / Delta t``
(`projected_speedup`; SPIRe, Neelam et al., Sec. 4).

* `cost_curve` -- **measured** on this machine: ``c(n)``, a target forward over n tokens in one-token steps, cached
  per machine, dtype and model; cost-aware trees (`hf_speculative.drafters.cost_aware`, `TreeSpec.optimize(cost=)`)
  choose their size with it.
* `shapes` -- `ModelShape` (parameters, FLOPs and bytes of a forward from a config) and the named `SHAPES` (published
  configs, each in its family's config class), which ``hf-speculative project`` builds at real size on a GPU
  (`hf_speculative.bench.projection`) and ``hf-speculative bench --shapes`` with random weights on this machine
  (`hf_speculative.bench.shapes`).

The roofline projection over batch size x context length (SPIRe's Fig. 4) is a study built on these, kept beside the
package in the repository's ``benchmarks/roofline``.
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
from .shapes import DTYPE_BYTES, SHAPES, ModelShape, check_shape_name, shape_config
from .speedup import projected_speedup

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
    # shapes and the speedup formula
    "SHAPES",
    "shape_config",
    "check_shape_name",
    "ModelShape",
    "DTYPE_BYTES",
    "projected_speedup",
]
