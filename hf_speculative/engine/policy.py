"""The engine's speed policy: one object that decides how the verification forward spends this machine's time and
memory, and owns what it learns to decide it.

`SpeedPolicy` holds the kernel setting, the memory budget, the kernel table (which `LinearKernel` runs a forward of
r rows, `hf_speculative.engine.kernels`) and the kernels' prepared state. ``hfs.enable(model)`` creates it (or takes
one given) and prepares it once: it reads ``HF_SPECULATIVE_KERNELS`` (the only time the environment is read),
builds and checks this CPU's kernel, and measures the table in about `SpeedPolicy.measure_seconds` on a sample of the
model's own layers (or reads the one ``hf-speculative calibrate`` cached). Every forward of the engine then asks it
for its kernels (`SpeedPolicy.engine_kernels`); plain ``generate()`` and the model's own forward never do.

Memory: the default kernels read the target's weights in place, so the policy holds no copy of any of them; a kernel
that needs a copy (oneDNN's reordered layout) is offered only when ``memory_budget`` (a fraction of the model's
parameter bytes) holds the copy of every weight it would run, and its copies are made on first use and counted. The
one copy the default kernels make is of a drafter's own weights saved in bfloat16 and widened to a float32 target's
dtype: a bfloat16 copy of each (half their float32 bytes), read while it drafts (`DraftingLinearForward`); it counts
against the same budget (`SpeedPolicy.drafting_kernels`), and a drafter whose copy does not fit reads its weights in
place.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from dataclasses import dataclass, field

import torch

from .decoder_loop import DecoderLoop
from .kernels.linear import (
    ROW_BUCKETS,
    KernelForward,
    KernelTable,
    LinearKernel,
    available_kernels,
    default_kernel_table,
    drafting_kernel,
    kernel_table_path,
    linear_layers,
    measure_kernel_table,
    memory_bound_sample_bytes,
    read_kernel_table,
)
from .step_pricing import PRICING_ENV, StepPricer

__all__ = [
    "FORWARD_ENV",
    "KERNELS_ENV",
    "DrafterInUseError",
    "DraftingLinearForward",
    "EngineLinearForward",
    "SpeedPolicy",
    "engine_product",
    "speed_policy",
]

KERNELS_ENV = "HF_SPECULATIVE_KERNELS"
FORWARD_ENV = "HF_SPECULATIVE_FORWARD"
#: engine forwards between two scans of a model's modules (a module added later, e.g. an adapter, is found then)
RESCAN_EVERY = 256
#: models with fewer linear-weight bytes than this get the default table (too small to time meaningfully)
MEASURE_MIN_BYTES = 8 * 2**20
#: weight bytes the quick measurement at ``enable`` times at least; more where the CPU's last-level cache would hold
#: them (`hf_speculative.engine.kernels.linear.memory_bound_sample_bytes`: memory-bound, as a step)
MEASURE_SAMPLE_BYTES = 40 * 2**20
#: time a drafter network's kernel table may take to measure (`SpeedPolicy.drafting_table`, once per network)
DRAFTING_MEASURE_SECONDS = 0.3
#: drafter networks with fewer linear-weight bytes than this take the model's table (too small to time meaningfully)
DRAFTING_MEASURE_MIN_BYTES = 2 * 2**20


@dataclass
class SpeedPolicy:
    """How the engine runs the target's forwards on this machine.

    Args:
        kernels: ``"auto"`` (default): each forward's linear layers run the kernel the table chose for its row
            count; ``"torch"``: torch's own ``F.linear`` always (``HF_SPECULATIVE_KERNELS=torch`` at ``enable`` also).
        memory_budget: extra resident memory the kernels may hold, as a fraction of the model's parameter bytes
            (default 0.10). The default kernels hold none of the model's; oneDNN's reordered copies (about 1.0 of
            the linear weights) are offered only within it, and a drafter's bfloat16 copies are made only within
            what is left of it.
        measure_seconds: time the quick kernel measurement at ``enable`` may take (0: use the default table unless
            ``hf-speculative calibrate`` cached one).
        table: the kernel table in force (measured or read by `prepare`; set one to use it as is).
        pricing: draft only while tree steps beat one-token steps here (`hf_speculative.engine.step_pricing`;
            ``HF_SPECULATIVE_PRICING=0`` at ``enable`` turns it off; a call's ``speculative_pricing`` overrides it).
        forward: ``"auto"`` (default): the verification forward of a model the engine's decoder loop reproduces
            bitwise (`hf_speculative.engine.decoder_loop`, checked once per model) runs that loop, without
            transformers' per-layer plumbing; ``"model"``: the model's own forward always
            (``HF_SPECULATIVE_FORWARD=model`` at ``enable`` also).
    """

    kernels: str = "auto"
    memory_budget: float = 0.10
    measure_seconds: float = 2.0
    table: KernelTable | None = None
    pricing: bool = True
    forward: str = "auto"
    _kernels: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _linears: list = field(default_factory=lambda: [RESCAN_EVERY, []], init=False, repr=False, compare=False)
    _prepared: "weakref.WeakKeyDictionary" = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False, compare=False
    )
    _local: threading.local = field(default_factory=threading.local, init=False, repr=False, compare=False)
    _pricers: "weakref.WeakKeyDictionary" = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False, compare=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    #: drafter networks whose linear layers have their `EngineLinearForward` (`drafting_kernels`)
    _drafting: "weakref.WeakSet" = field(default_factory=weakref.WeakSet, init=False, repr=False, compare=False)
    #: bytes of the memory budget the model's kernels leave for drafters' copies (set by `prepare`), and those held
    _allowance: list = field(default_factory=lambda: [0, 0], init=False, repr=False, compare=False)
    #: per model, its checked decoder loop (or None) and, when the check failed, why (`decoder_loop`)
    _loops: "weakref.WeakKeyDictionary" = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False, compare=False
    )
    #: the model's cost curves this process read, measured or was given (`hf_speculative.perf_model.get_cost_curve`)
    cost_curves: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.kernels not in ("auto", "torch"):
            raise ValueError(f"kernels must be 'auto' or 'torch', got {self.kernels!r}")
        if self.forward not in ("auto", "model"):
            raise ValueError(f"forward must be 'auto' or 'model', got {self.forward!r}")
        if not self.memory_budget >= 0:
            raise ValueError(
                f"memory_budget must be a fraction >= 0 of the model's parameter bytes, got {self.memory_budget!r}"
            )

    @classmethod
    def from_env(cls, **settings) -> "SpeedPolicy":
        """A policy from ``settings``, the environment read once: ``HF_SPECULATIVE_KERNELS=torch`` (or 0/off/false/no)
        turns the kernels off, ``HF_SPECULATIVE_PRICING=0`` step pricing."""
        policy = cls(**settings)
        if os.environ.get(KERNELS_ENV, "auto").strip().lower() in ("0", "off", "false", "no", "torch"):
            policy.kernels = "torch"
        if os.environ.get(PRICING_ENV, "1").strip().lower() in ("0", "off", "false", "no"):
            policy.pricing = False
        if os.environ.get(FORWARD_ENV, "auto").strip().lower() in ("0", "off", "false", "no", "model"):
            policy.forward = "model"
        return policy

    # --------------------------------------------------------------------- preparing, at enable

    def prepare(self, model) -> None:
        """Check the decoder loop against the model's forward (`decoder_loop`); build and check this CPU's kernel, then
        measure or read the table for the model's dtype. No kernel is prepared for a model with any weight off the CPU
        (CUDA, meta, offloaded), or with the kernels off."""
        self._kernels, self._linears[0] = {}, RESCAN_EVERY
        self._loops.pop(model, None)
        self.decoder_loop(model)
        if not self.runs_kernels(model):
            return
        from .kernels.build import build_direct_gemm

        build_direct_gemm()
        dtype = next(model.parameters()).dtype
        kernels = self.offered_kernels(model, dtype)
        if self.table is None or not set(self.table.choice.values()) <= set(kernels):
            self.table = self._table_for(model, dtype, kernels)
        self._kernels = kernels
        self._allowance[:] = [self._drafting_allowance(model), 0]

    def _drafting_allowance(self, model) -> int:
        """The bytes of the memory budget left for drafters' copies: the budget less the copies the table's kernels
        make of the model's linear weights."""
        budget = self.memory_budget * _parameter_bytes(model)
        for name in set(self.table.choice.values()) if self.table is not None else ():
            budget -= _copy_bytes(self._kernels.get(name, LinearKernel()), model)
        return max(0, int(budget))

    def runs_kernels(self, model) -> bool:
        """Whether the kernels can run this model: on, and every parameter a CPU tensor."""
        return self.kernels == "auto" and all(p.device.type == "cpu" for p in model.parameters())

    def offered_kernels(self, model, dtype: torch.dtype) -> dict[str, LinearKernel]:
        """The kernels this machine runs for ``dtype``, less those whose copies the memory budget cannot hold."""
        budget = self.memory_budget * _parameter_bytes(model)
        kernels = available_kernels(dtype)
        return {n: k for n, k in kernels.items() if _copy_bytes(k, model) <= budget}

    def _table_for(self, model, dtype: torch.dtype, kernels: dict) -> KernelTable:
        """The table ``hf-speculative calibrate`` cached for this machine and model if there is one, else a quick
        measurement (a model big enough to time), else the default."""
        cached = read_kernel_table(kernel_table_path(model), kernels)
        if cached is not None:
            return cached
        size = sum(m.weight.nbytes for m in linear_layers(model))
        if self.measure_seconds > 0 and size >= MEASURE_MIN_BYTES and len(kernels) > 1:
            return _quick_table(model, kernels, self.measure_seconds)
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
        """For one forward of the engine over ``rows`` rows, in this thread: the model's linear layers run the table's
        kernel. Their forward (`EngineLinearForward`, installed once) reads the kernel from this thread's state, so a
        plain ``generate()`` or a forward in another thread meanwhile runs torch's own ``F.linear``."""
        if self.table is not None and not self._kernels and self.runs_kernels(model):  # unpickled: load them again
            self._kernels = self.offered_kernels(model, next(model.parameters()).dtype)
            self._allowance[:] = [self._drafting_allowance(model), 0]
        kernel = self.kernel_for_rows(rows)
        if kernel is not None:
            self._install(model)
        with self._in_thread(kernel):
            yield kernel

    @contextlib.contextmanager
    def _in_thread(self, kernel: LinearKernel | None):
        """``kernel`` is this thread's (`thread_kernel`) inside the block, the previous one again after it."""
        previous = getattr(self._local, "kernel", None)
        self._local.kernel = kernel
        try:
            yield kernel
        finally:
            self._local.kernel = previous

    @contextlib.contextmanager
    def drafting_kernels(self, drafter):
        """While ``drafter`` drafts, in this thread: each forward of the linear layers of its networks
        (`TreeDrafter.draft_modules`, on the CPU in a dtype the kernels take) runs the kernel its network's own table
        chose for that many rows (`drafting_table`), in its drafting variant (`DraftingLinearForward`: a weight saved
        in bfloat16 read from a bfloat16 copy); a layer of the model the drafter shares (an LM head) runs the model's
        table's kernel for one row (the drafter's own product where that is torch's, e.g.
        `hf_speculative.engine.logits.vocab_logits`); torch's own ``F.linear`` everywhere else. A layer the engine
        already runs as part of a model (`EngineLinearForward`) keeps its forward."""
        modules = drafter.draft_modules() if self._kernels and self.table is not None else ()
        if not modules:
            yield None
            return
        for module in modules:
            if module not in self._drafting:
                self._install_drafting(module, self.drafting_table(module))
                self._drafting.add(module)
        kernel = self.kernel_for_rows(1)
        previous = getattr(self._local, "drafting", False)
        self._local.drafting = True
        try:
            with self._in_thread(kernel):
                yield kernel
        finally:
            self._local.drafting = previous

    def drafting_now(self) -> bool:
        """Whether a drafter is drafting in this thread (`drafting_kernels`)."""
        return getattr(self._local, "drafting", False)

    def drafting_table(self, module: torch.nn.Module) -> KernelTable:
        """The kernel table of a drafter network's own layers: torch's ``F.linear`` against the drafting variant of
        each kernel offered (`hf_speculative.engine.kernels.linear.drafting_kernel`), timed on those layers
        (`measure_kernel_table`, about `DRAFTING_MEASURE_SECONDS`, once per network). The model's table does not
        decide for them: a drafter saved in bfloat16 is read from half the bytes the model's table timed, so its
        kernel can win where the model's lost (on an Intel Xeon, at one to sixteen rows where the model's table keeps
        torch's at one and two). A network too small to time, or a policy that measures nothing, takes the model's
        table."""
        size = sum(m.weight.nbytes for m in linear_layers(module))
        if self.measure_seconds <= 0 or size < DRAFTING_MEASURE_MIN_BYTES:
            return self.table
        kernels = {n: drafting_kernel(k) if n != "torch" else k for n, k in self._kernels.items()}
        return _quick_table(module, kernels, DRAFTING_MEASURE_SECONDS)

    def _install_drafting(self, module: torch.nn.Module, table: KernelTable) -> None:
        """Give the linear layers of a drafter network their forward: `DraftingLinearForward` with the network's
        ``table`` when the copies its kernels may make (`LinearKernel.copy_bytes`, counted before any is made) fit in
        what the memory budget has left (`_allowance`), else `EngineLinearForward` (weights read in place, the
        model's kernel for one row). A layer that already has an `EngineLinearForward` (part of the model) keeps
        it."""
        layers = [m for m in linear_layers(module) if type(m.__dict__.get("forward")) is not EngineLinearForward]
        kernels = {n: drafting_kernel(self._kernels[n]) for n in set(table.choice.values()) if n in self._kernels}
        need = sum(k.copy_bytes(m.weight) for k in kernels.values() for m in layers)
        left, held = self._allowance
        fits = need <= left - held
        self._allowance[1] += need if fits else 0
        for linear in layers:
            linear.forward = DraftingLinearForward(linear, self, table) if fits else EngineLinearForward(linear, self)

    def thread_kernel(self) -> LinearKernel | None:
        """The kernel of the engine forward running in this thread (None: torch's own)."""
        return getattr(self._local, "kernel", None)

    def _install(self, model) -> None:
        """Give each linear layer of ``model`` its `EngineLinearForward` (rescanned every `RESCAN_EVERY` forwards:
        a module added later, e.g. an adapter, is found then)."""
        if self._linears[0] < RESCAN_EVERY:
            self._linears[0] += 1
            return
        with self._lock:
            for module in linear_layers(model):
                module.forward = EngineLinearForward(module, self)
            self._linears[:] = [1, []]

    def uninstall(self, model) -> None:
        """Remove the `EngineLinearForward` of every layer of ``model`` (`hfs.disable`)."""
        for module in model.modules():
            if isinstance(module.__dict__.get("forward"), EngineLinearForward):
                del module.__dict__["forward"]
        self._linears[0] = RESCAN_EVERY

    def decoder_loop(self, model) -> DecoderLoop | None:
        """The engine's decoder loop for this forward of ``model``, or None (the model's own forward then runs): with
        ``forward="auto"``, for a model the loop serves (`DecoderLoop.for_model`) that passed its bitwise check against
        the model's forward (`DecoderLoop.check`, once per model, at ``enable``; `loop_report` says why one failed), while nothing
        it would bypass has a hook and no gradient is taken."""
        if self.forward != "auto":
            return None
        entry = self._loops.get(model)
        if entry is None:
            try:
                loop = DecoderLoop.for_model(model)
                failed = loop.check(model.get_input_embeddings().num_embeddings) if loop is not None else None
            except Exception as error:  # a transformers whose Llama the loop does not reproduce
                loop, failed = None, f"{type(error).__name__}: {error}"
            entry = self._loops[model] = (None, failed) if failed else (loop, None)
        loop = entry[0]
        return loop if loop is not None and loop.usable() else None

    def loop_report(self, model) -> str:
        """Which forward the engine runs for ``model``, and why."""
        if self.forward != "auto":
            return "the model's own forward (forward='model')"
        with torch.no_grad():  # as the engine's forwards run
            loop = self.decoder_loop(model)
        failed = self._loops[model][1] if model in self._loops else None
        if loop is not None:
            return "the engine's decoder loop (checked bitwise against the model's forward)"
        if failed:
            return f"the model's own forward: the decoder loop's check failed ({failed})"
        return (
            "the model's own forward: the decoder loop does not serve this model, or a hook is on a module it bypasses"
        )

    # --------------------------------------------------------------------- per drafter

    def step_pricer(self, drafter, model, rows: int) -> StepPricer:
        """The `StepPricer` of ``drafter`` on ``model`` at ``rows`` rows, kept across calls while the drafter lives (a
        drafter that cannot be weakly referenced gets a new one per call)."""
        try:
            per_model = self._pricers.setdefault(drafter, weakref.WeakKeyDictionary())
        except TypeError:
            return StepPricer()
        pricers = per_model.setdefault(model, {})
        if rows not in pricers:
            pricers[rows] = StepPricer()
        return pricers[rows]

    @contextlib.contextmanager
    def drafter_in_use(self, drafter):
        """Marks ``drafter`` in use by one call: a second call with the same drafter object while the first runs
        raises `DrafterInUseError` (a drafter keeps per-call state: its rows, its prices)."""
        busy = drafter.__dict__.setdefault("_hfs_in_use", InUseLock()) if hasattr(drafter, "__dict__") else None
        if busy is not None and not busy.acquire(blocking=False):
            raise DrafterInUseError(
                f"this {type(drafter).__name__} is drafting for another generate() call that has not finished; give "
                "each concurrent call its own drafter (copy.deepcopy(drafter), or a new one), or wait for the other"
            )
        try:
            yield drafter
        finally:
            if busy is not None:
                busy.release()

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

    def __getstate__(self):  # pickles without its native kernels, copies, prices and threads' state (made on use)
        return {k: v for k, v in self.__dict__.items() if k not in _RUNTIME}

    def __setstate__(self, state):
        self.__dict__.update(state, **_runtime_state())

    def __deepcopy__(self, memo):
        copy = SpeedPolicy.__new__(SpeedPolicy)
        memo[id(self)] = copy
        copy.__setstate__({k: v for k, v in self.__getstate__().items()})
        return copy


_RUNTIME = (
    "_kernels",
    "_linears",
    "_prepared",
    "_local",
    "_pricers",
    "_lock",
    "_drafting",
    "_allowance",
    "_loops",
    "cost_curves",
)


def _runtime_state() -> dict:
    return dict(
        _kernels={},
        _linears=[RESCAN_EVERY, []],
        _prepared=weakref.WeakKeyDictionary(),
        _local=threading.local(),
        _pricers=weakref.WeakKeyDictionary(),
        _lock=threading.Lock(),
        _drafting=weakref.WeakSet(),
        _allowance=[0, 0],
        _loops=weakref.WeakKeyDictionary(),
        cost_curves={},
    )


class InUseLock:
    """Whether a drafter is drafting for a call (`SpeedPolicy.drafter_in_use`); a copy or a pickle of the drafter
    gets a free lock of its own."""

    def __init__(self):
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True) -> bool:
        return self._lock.acquire(blocking)

    def release(self) -> None:
        self._lock.release()

    def __reduce__(self):
        return (InUseLock, ())


class DrafterInUseError(RuntimeError):
    """A drafter object was given to a ``generate()`` call while another call was still drafting with it."""


class EngineLinearForward(KernelForward):
    """The forward of an ``nn.Linear`` of a model whose speed policy runs kernels: torch's own ``F.linear``, except
    inside an engine forward in this thread (`SpeedPolicy.engine_kernels`), where the policy's kernel for the forward's
    row count runs. Pickles and deep-copies with its module."""

    __slots__ = ("module", "policy")

    def __init__(self, module: torch.nn.Linear, policy: SpeedPolicy):
        self.module, self.policy = module, policy

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        module = self.module
        kernel = None if torch.is_grad_enabled() else self.kernel_for(x)
        if kernel is None or kernel.name == "torch" or not kernel.supports(module.weight):
            return torch.nn.Linear.forward(module, x)
        return self.policy._bound(module, kernel)(x)

    def kernel_for(self, x: torch.Tensor) -> LinearKernel | None:
        """The kernel this layer runs for ``x`` now: the thread's engine forward's (None: torch's own)."""
        return self.policy.thread_kernel()

    def runs_now(self) -> bool:
        """Whether this forward runs a kernel of the policy's in this thread now (else torch's own)."""
        return self.policy.thread_kernel() is not None

    def __getstate__(self):
        return (self.module, self.policy)

    def __setstate__(self, state):
        self.module, self.policy = state


class DraftingLinearForward(EngineLinearForward):
    """The forward of a drafter's own linear layer (`SpeedPolicy.drafting_kernels`): while it drafts, the kernel its
    network's table (`SpeedPolicy.drafting_table`) chose for the forward's row count, in its drafting variant
    (`hf_speculative.engine.kernels.linear.drafting_kernel`: a weight saved in bfloat16 is read from a bfloat16 copy,
    half the bytes for the same products); torch's own ``F.linear`` where the table chose it, and outside drafting."""

    __slots__ = ("table",)

    def __init__(self, module: torch.nn.Linear, policy: SpeedPolicy, table: KernelTable):
        super().__init__(module, policy)
        self.table = table

    def runs_now(self) -> bool:
        return self.policy.drafting_now()

    def kernel_for(self, x: torch.Tensor) -> LinearKernel | None:
        """While drafting, the drafting variant of the kernel the table chose for ``x``'s rows; else None."""
        if not self.policy.drafting_now():
            return None
        kernel = self.policy._kernels.get(self.table.kernel_for(x.numel() // max(x.shape[-1], 1)))
        return None if kernel is None else drafting_kernel(kernel)

    def __getstate__(self):
        return (self.module, self.policy, self.table)

    def __setstate__(self, state):
        self.module, self.policy, self.table = state


def engine_product(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """``module(x)`` through the engine's kernel when ``module`` is a linear layer with an `EngineLinearForward` and an
    engine forward or drafting runs in this thread (`SpeedPolicy.drafting_kernels`); None otherwise (the caller then
    keeps its own product, e.g. `hf_speculative.engine.logits.vocab_logits`)."""
    forward = module.__dict__.get("forward") if hasattr(module, "__dict__") else None
    if not isinstance(forward, EngineLinearForward) or not forward.runs_now():
        return None
    return forward(x)


def _quick_table(module: torch.nn.Module, kernels: dict, seconds: float) -> KernelTable:
    """``kernels`` timed on ``module``'s own linear layers (a memory-bound sample of them) in about ``seconds``."""
    budget = memory_bound_sample_bytes(MEASURE_SAMPLE_BYTES)
    return measure_kernel_table(module, ROW_BUCKETS, repeats=3, budget_bytes=budget, seconds=seconds, kernels=kernels)


def _parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _copy_bytes(kernel: LinearKernel, model) -> int:
    """The bytes ``kernel`` may copy of the model's linear weights (0 for a kernel that reads them in place)."""
    return sum(kernel.copy_bytes(m.weight) for m in linear_layers(model)) if kernel.copies else 0


def _version(tensor: torch.Tensor) -> int:
    """The tensor's in-place version counter; 0 for an inference tensor (it has none, and cannot change in place
    outside inference mode)."""
    try:
        return tensor._version
    except RuntimeError:
        return 0


def speed_policy(model) -> SpeedPolicy:
    """The speed policy ``hfs.enable`` gave ``model``; for a model never enabled, a new one that runs torch's kernels
    (held by nothing)."""
    policy = model.__dict__.get("_hfs_policy") if hasattr(model, "__dict__") else None
    if policy is None and getattr(type(model), "speculative_generation", False):
        # a model class that decodes speculatively by itself (Speculative Streaming): a policy of its own, torch's
        # kernels, made on first use
        policy = model.__dict__["_hfs_policy"] = SpeedPolicy.from_env(kernels="torch")
    # a model never enabled: a policy for this call only, which runs the model's own forward (its loop unchecked)
    return policy if policy is not None else SpeedPolicy.from_env(kernels="torch", forward="model")
