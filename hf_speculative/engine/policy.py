"""The engine's speed policy: one object that decides how the verification forward spends this machine's time and
memory, and owns what it learns to decide it.

`SpeedPolicy` holds the kernel setting, the memory budget, the kernel table (which `LinearKernel` runs a forward of
r rows, `hf_speculative.engine.kernels`) and the kernels' prepared state. ``hfs.enable(model)`` creates it (or takes
one given) and prepares it once: it reads ``HF_SPECULATIVE_KERNELS`` (the only time the environment is read),
builds and checks this CPU's kernel, and measures the table in about `SpeedPolicy.measure_seconds` on a sample of the
model's own layers (or reads the one ``hf-speculative calibrate`` cached). Every forward of the engine then asks it
for its kernels (`SpeedPolicy.engine_kernels`); plain ``generate()`` and the model's own forward never do.

Memory: the default kernels read the weights in place, so the policy holds no copy of any weight; a kernel that
needs a copy (oneDNN's reordered layout) is offered only when ``memory_budget`` (a fraction of the model's parameter
bytes) holds the copy of every weight it would run, and its copies are made on first use and counted.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from dataclasses import dataclass, field

import torch

from .kernels.linear import (
    ROW_BUCKETS,
    KernelTable,
    LinearKernel,
    available_kernels,
    default_kernel_table,
    kernel_table_path,
    linear_layers,
    measure_kernel_table,
    read_kernel_table,
)

__all__ = ["KERNELS_ENV", "SpeedPolicy", "speed_policy"]

KERNELS_ENV = "HF_SPECULATIVE_KERNELS"
#: engine forwards between two scans of a model's modules (a module added later, e.g. an adapter, is found then)
RESCAN_EVERY = 256
#: models with fewer linear-weight bytes than this get the default table (too small to time meaningfully)
MEASURE_MIN_BYTES = 8 * 2**20
#: weight bytes the quick measurement at ``enable`` times (more than a CPU's last-level cache: memory-bound, as a step)
MEASURE_SAMPLE_BYTES = 40 * 2**20


@dataclass
class SpeedPolicy:
    """How the engine runs the target's forwards on this machine.

    Args:
        kernels: ``"auto"`` (default): each forward's linear layers run the kernel the table chose for its row
            count; ``"torch"``: torch's own ``F.linear`` always (``HF_SPECULATIVE_KERNELS=torch`` at ``enable`` also).
        memory_budget: extra resident memory the kernels may hold, as a fraction of the model's parameter bytes
            (default 0.10). The default kernels hold none; oneDNN's reordered copies (about 1.0 of the linear
            weights) are offered only within it.
        measure_seconds: time the quick kernel measurement at ``enable`` may take (0: use the default table unless
            ``hf-speculative calibrate`` cached one).
        table: the kernel table in force (measured or read by `prepare`; set one to use it as is).
    """

    kernels: str = "auto"
    memory_budget: float = 0.10
    measure_seconds: float = 2.0
    table: KernelTable | None = None
    _kernels: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _linears: list = field(default_factory=lambda: [RESCAN_EVERY, []], init=False, repr=False, compare=False)
    _prepared: "weakref.WeakKeyDictionary" = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False, compare=False
    )

    def __post_init__(self):
        if self.kernels not in ("auto", "torch"):
            raise ValueError(f"kernels must be 'auto' or 'torch', got {self.kernels!r}")
        if not self.memory_budget >= 0:
            raise ValueError(
                f"memory_budget must be a fraction >= 0 of the model's parameter bytes, got {self.memory_budget!r}"
            )

    @classmethod
    def from_env(cls, **settings) -> "SpeedPolicy":
        """A policy from ``settings``, with ``HF_SPECULATIVE_KERNELS=torch`` (or 0/off/false/no) turning kernels off."""
        policy = cls(**settings)
        if os.environ.get(KERNELS_ENV, "auto").strip().lower() in ("0", "off", "false", "no", "torch"):
            policy.kernels = "torch"
        return policy

    # --------------------------------------------------------------------- preparing, at enable

    def prepare(self, model) -> None:
        """Build and check this CPU's kernel, then measure or read the table for the model's dtype. Nothing is done
        for a model with any weight off the CPU (CUDA, meta, offloaded), or with the kernels off."""
        self._kernels, self._linears[0] = {}, RESCAN_EVERY
        if not self.runs_kernels(model):
            return
        from .kernels.build import build_direct_gemm

        build_direct_gemm()
        dtype = next(model.parameters()).dtype
        kernels = self.offered_kernels(model, dtype)
        if self.table is None or not set(self.table.choice.values()) <= set(kernels):
            self.table = self._table_for(model, dtype, kernels)
        self._kernels = kernels

    def runs_kernels(self, model) -> bool:
        """Whether the kernels can run this model: on, and every parameter a CPU tensor."""
        return self.kernels == "auto" and all(p.device.type == "cpu" for p in model.parameters())

    def offered_kernels(self, model, dtype: torch.dtype) -> dict[str, LinearKernel]:
        """The kernels this machine runs for ``dtype``, less those whose copies the memory budget cannot hold."""
        kernels = available_kernels(dtype)
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        copies = sum(m.weight.nbytes for m in linear_layers(model))
        return {n: k for n, k in kernels.items() if not k.copies or copies <= self.memory_budget * params}

    def _table_for(self, model, dtype: torch.dtype, kernels: dict) -> KernelTable:
        """The table ``hf-speculative calibrate`` cached for this machine and model if there is one, else a quick
        measurement (a model big enough to time), else the default."""
        cached = read_kernel_table(kernel_table_path(model), kernels)
        if cached is not None:
            return cached
        size = sum(m.weight.nbytes for m in linear_layers(model))
        if self.measure_seconds > 0 and size >= MEASURE_MIN_BYTES and len(kernels) > 1:
            return measure_kernel_table(
                model,
                ROW_BUCKETS,
                repeats=3,
                budget_bytes=MEASURE_SAMPLE_BYTES,
                seconds=self.measure_seconds,
                kernels=kernels,
            )
        return default_kernel_table(dtype, kernels)

    # --------------------------------------------------------------------- running, in the engine's forwards

    def kernel_for_rows(self, rows: int) -> LinearKernel | None:
        """The kernel a forward of ``rows`` rows runs (None: torch's own)."""
        if torch.is_grad_enabled() or self.table is None or not self._kernels:
            return None
        name = self.table.kernel_for(rows)
        return None if name == "torch" else self._kernels.get(name)

    @contextlib.contextmanager
    def engine_kernels(self, model, rows: int):
        """For one forward of the engine over ``rows`` rows: the model's linear layers run the table's kernel."""
        if self.table is not None and not self._kernels and self.runs_kernels(model):  # unpickled: load them again
            self._kernels = self.offered_kernels(model, next(model.parameters()).dtype)
        kernel = self.kernel_for_rows(rows)
        linears = [m for m in self._model_linears(model) if kernel.supports(m.weight)] if kernel is not None else []
        for module in linears:
            module.forward = self._bound(module, kernel)  # an instance attribute: removed again below
        try:
            yield kernel
        finally:
            for module in linears:
                module.__dict__.pop("forward", None)

    def head_projector(self, head: torch.nn.Module):
        """``project(states)``: the LM head on a few rows (the engine's lazy head) through the table's kernel for
        that many rows (``F.linear`` where the table chose torch's), when ``head`` is a plain ``nn.Linear`` on the
        CPU; None when the kernels are off (the engine then keeps its own product)."""
        if type(head) is not torch.nn.Linear or not self._kernels or head.weight.device.type != "cpu":
            return None

        def project(states: torch.Tensor) -> torch.Tensor:
            states = states.to(head.weight.dtype)
            kernel = self.kernel_for_rows(states.reshape(-1, states.shape[-1]).shape[0])
            if kernel is None or not kernel.supports(head.weight):
                return torch.nn.functional.linear(states, head.weight, head.bias)
            return self._bound(head, kernel)(states)

        return project

    def _model_linears(self, model) -> list[torch.nn.Linear]:
        """`linear_layers`, scanned again every `RESCAN_EVERY` calls (a scan walks every module: about 2 ms on a
        30-layer model, too much for every step)."""
        if self._linears[0] >= RESCAN_EVERY:
            self._linears[:] = [0, linear_layers(model)]
        self._linears[0] += 1
        return self._linears[1]

    def _bound(self, module: torch.nn.Linear, kernel: LinearKernel):
        """``module``'s forward through ``kernel``. A kernel that reads the weight in place reads it on every call;
        one that copies keeps its copy while the weight's identity, shape, dtype and version are unchanged."""
        if not kernel.copies:
            return lambda x: kernel.product(module.weight, x, module.out_features, module.bias)
        slots = self._prepared.setdefault(module, {})

        def forward(x: torch.Tensor) -> torch.Tensor:
            weight, bias = module.weight, module.bias
            stamp = (
                id(weight),
                weight.data_ptr(),
                tuple(weight.shape),
                weight.dtype,
                _version(weight),
                None if bias is None else (bias.data_ptr(), _version(bias)),
            )
            if slots.get(kernel.name, (None,))[0] != stamp:
                slots[kernel.name] = (stamp, kernel.prepare(weight.detach().contiguous()))
            return kernel.product(
                slots[kernel.name][1], x, module.out_features, None if bias is None else bias.detach()
            )

        return forward

    def __getstate__(self):  # pickles without the loaded kernels and prepared copies (prepared again on use)
        return {k: v for k, v in self.__dict__.items() if k not in ("_kernels", "_linears", "_prepared")}

    def __setstate__(self, state):
        self.__dict__.update(state, _kernels={}, _linears=[RESCAN_EVERY, []], _prepared=weakref.WeakKeyDictionary())


def _version(tensor: torch.Tensor) -> int:
    """The tensor's in-place version counter; 0 for an inference tensor (it has none, and cannot change in place
    outside inference mode)."""
    try:
        return tensor._version
    except RuntimeError:
        return 0


def speed_policy(model) -> SpeedPolicy:
    """The speed policy ``hfs.enable`` gave ``model``; for a model never enabled, one that runs torch's kernels."""
    policy = getattr(model, "_hfs_policy", None)
    return policy if policy is not None else SpeedPolicy(kernels="torch")
