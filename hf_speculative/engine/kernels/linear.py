"""The target's linear layers at the machine's cost during the engine's forwards.

A forward over n tokens multiplies n rows by every weight. Decoding is memory-bound, so a forward over a few dozen
tokens should cost about what reading the weights costs, one decoding step. On a CPU the default kernels do not get
there at small row counts: float32 BLAS re-packs the weight on every call and runs compute-starved at 2-32 rows
(a forward over 8 tokens costs 1.6-1.8 one-token steps), and the default bfloat16 path is three times its memory
floor at one row. The kernels here, each a `LinearKernel`:

* ``"torch"``: ``F.linear``, what plain ``generate()`` runs;
* ``"packed"``: float32; the weight packed once into column panels, every panel streamed once per call through an
  outer-product micro-kernel (``small_gemm.c``, compiled once for this CPU by `build_small_gemm`);
* ``"onednn"``: float32 / bfloat16 / float16; the weight reordered once into oneDNN's blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``; AMX and AVX512-BF16 where the CPU has them).

`KernelTable` says which kernel runs a forward of a given row count (rows = batch rows x tokens); it is measured by
``hf-speculative calibrate`` (`measure_kernel_table`, cached per machine, dtype and model) and otherwise follows
`default_kernel_table`. `engine_kernels(model, rows)` installs the chosen kernel on the model's ``nn.Linear``
modules for one forward of the engine and restores them after it, so the model's own forward and plain
``generate()`` never run these kernels. The prepared weights are copies (a packed float32 copy of every linear
weight, or oneDNN's reordered copy), made on the first forward that needs them and kept while the weight is
unchanged: memory grows by the size of the linear weights (LM head included). ``HF_SPECULATIVE_KERNELS=torch``
(or ``hfs.enable(model, kernels="torch")``) turns them off.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = [
    "KERNELS_ENV", "ROW_BUCKETS", "KernelTable", "LinearKernel", "available_kernels", "default_kernel_table",
    "engine_kernels", "fast_linear", "head_projector", "kernel_for_rows", "kernel_table", "kernel_table_path",
    "kernels_setting", "measure_kernel_table", "native_bf16", "prepare_kernels", "set_kernel_table",
]  # fmt: skip

KERNELS_ENV = "HF_SPECULATIVE_KERNELS"
#: row counts a table has an entry for; a forward of r rows runs the kernel of the smallest bucket >= r, and torch's
#: above the last (a long prompt's prefill)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class LinearKernel:
    """One way to compute ``x @ W^T + b`` for an ``nn.Linear``: `prepare` makes the weight's copy in the kernel's
    layout, `bind` returns the module's ``forward(x)`` through the kernel (its copy made on first use and again when
    the weight or bias changes). The base class is torch's own ``F.linear``."""

    name = "torch"

    def supports(self, weight: torch.Tensor) -> bool:
        return True

    def prepare(self, weight: torch.Tensor):
        return weight

    def product(self, prepared, x: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W^T + bias`` from the prepared weight (``x`` of any leading shape)."""
        return F.linear(x, prepared, bias)

    def bind(self, module: torch.nn.Linear):
        ref, state, n = weakref.ref(module), {}, module.out_features

        def forward(x: torch.Tensor) -> torch.Tensor:
            owner = ref()
            weight, bias = owner.weight, owner.bias
            stamp = (weight.data_ptr(), weight._version, None if bias is None else (bias.data_ptr(), bias._version))
            if state.get("stamp") != stamp:
                b = None if bias is None else bias.detach().contiguous()
                state.update(stamp=stamp, prepared=self.prepare(weight.detach().contiguous()), bias=b)
            return self.product(state["prepared"], x, n, state["bias"])

        return forward


class PackedKernel(LinearKernel):
    """float32 on the CPU through ``small_gemm.c``'s packed panels (see `hf_speculative.engine.kernels.build`); about 8 us
    of call overhead."""

    name = "packed"

    def __init__(self, lib):
        self.lib = lib
        self.panel = int(lib.hfs_panel_width())

    def supports(self, weight: torch.Tensor) -> bool:
        return weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 2

    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        n, k = weight.shape
        packed = torch.empty(-(-n // self.panel) * k * self.panel, dtype=torch.float32)
        self.lib.hfs_pack(weight.data_ptr(), packed.data_ptr(), n, k)
        return packed

    def product(self, prepared, x, n, bias):
        x = x if x.is_contiguous() and x.dtype == torch.float32 else x.float().contiguous()
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        y = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
        if rows:
            self.lib.hfs_gemm(x.data_ptr(), rows, k, prepared.data_ptr(), n, None if bias is None else bias.data_ptr(),
                              y.data_ptr(), torch.get_num_threads())  # fmt: skip
        return y


class OneDnnKernel(LinearKernel):
    """oneDNN with the weight reordered once into its blocked layout (float32, bfloat16, float16 on the CPU)."""

    name = "onednn"

    def supports(self, weight: torch.Tensor) -> bool:
        return weight.device.type == "cpu" and weight.dim() == 2 and torch.backends.mkldnn.is_available()

    def prepare(self, weight):
        return torch.ops.mkldnn._reorder_linear_weight(weight, None)

    def product(self, prepared, x, n, bias):
        return torch.ops.mkldnn._linear_pointwise.default(x, prepared, bias, "none", [], "")


def available_kernels(dtype: torch.dtype) -> dict[str, LinearKernel]:
    """The kernels that can run ``dtype`` weights on this machine (``"torch"`` always; ``"packed"`` once built)."""
    from .build import built_small_gemm, load_small_gemm

    kernels: dict[str, LinearKernel] = {"torch": LinearKernel()}
    if dtype == torch.float32:
        path = built_small_gemm()  # built by `hfs.enable` / ``hf-speculative calibrate``, never here
        lib = load_small_gemm(str(path)) if path is not None else None
        if lib is not None:
            kernels["packed"] = PackedKernel(lib)
    if dtype in (torch.float32, torch.bfloat16, torch.float16) and _onednn_runs(dtype):
        kernels["onednn"] = OneDnnKernel()
    return kernels


@functools.cache
def _onednn_runs(dtype: torch.dtype) -> bool:
    """Whether oneDNN's prepacked linear runs ``dtype`` on this CPU (its bfloat16 path needs AVX512BW/VL/DQ or
    AVX-NE-CONVERT; some AMD EPYCs have neither): one tiny product, once per process."""
    if not torch.backends.mkldnn.is_available():
        return False
    kernel = OneDnnKernel()
    weight = torch.zeros(8, 8, dtype=dtype)
    try:
        kernel.product(kernel.prepare(weight), torch.zeros(2, 8, dtype=dtype), 8, None)
    except RuntimeError:
        return False
    return True


# ----------------------------------------------------------------------------- which kernel for how many rows


@dataclass
class KernelTable:
    """The kernel for a forward of r rows: ``choice[b]`` for the smallest bucket ``b >= r`` of `ROW_BUCKETS`;
    ``"torch"`` above the largest. ``milliseconds[kernel][b]``: what the measurement saw (empty for a default)."""

    choice: dict[int, str]
    milliseconds: dict[str, dict[int, float]] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def kernel_for(self, rows: int) -> str:
        for bucket in sorted(self.choice):
            if rows <= bucket:
                return self.choice[bucket]
        return "torch"

    def to_dict(self) -> dict:
        return {"choice": self.choice, "milliseconds": self.milliseconds, "meta": self.meta}

    @classmethod
    def from_dict(cls, data: dict) -> "KernelTable":
        ms = {k: {int(b): float(t) for b, t in v.items()} for k, v in data.get("milliseconds", {}).items()}
        return cls({int(b): str(k) for b, k in data["choice"].items()}, ms, data.get("meta", {}))


@functools.lru_cache(maxsize=None)
def native_bf16() -> bool:
    """True when the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def default_kernel_table(dtype: torch.dtype, kernels: dict[str, LinearKernel]) -> KernelTable:
    """The kernels that measured fastest on the project's CPUs (Intel Xeon with AMX, AMD EPYC) when this machine
    has no measured table: float32 through the packed panels up to 48 rows; bfloat16 through oneDNN where the
    CPU has native bf16 products; torch's otherwise."""
    if dtype == torch.float32 and "packed" in kernels:
        kernel = "packed"
    elif dtype == torch.bfloat16 and "onednn" in kernels and native_bf16():
        kernel = "onednn"
    else:
        kernel = "torch"
    return KernelTable({b: kernel for b in ROW_BUCKETS if b <= 32}, meta={"source": "default"})


def kernels_setting(model=None) -> str:
    """``"auto"`` (measured or default table) or ``"torch"`` (off): the model's `enable` setting, else
    ``$HF_SPECULATIVE_KERNELS``."""
    env = os.environ.get(KERNELS_ENV, "auto").strip().lower()
    if env in ("0", "off", "false", "no", "torch"):
        return "torch"
    return getattr(model, "_hfs_kernels", "auto") if model is not None else "auto"


# ----------------------------------------------------------------------------- measuring and caching the table


_LINEARS: "weakref.WeakKeyDictionary[torch.nn.Module, list]" = weakref.WeakKeyDictionary()
#: engine forwards between two scans of a model's modules (a module added later, e.g. an adapter, is found then)
RESCAN_EVERY = 256


def _cached_linears(model) -> list[torch.nn.Linear]:
    """`_linears`, scanned again every `RESCAN_EVERY` calls (a scan walks every module: about 2 ms on a 30-layer
    model, too much for every step)."""
    entry = _LINEARS.get(model)
    if entry is None or entry[0] >= RESCAN_EVERY:
        entry = _LINEARS[model] = [0, _linears(model)]
    entry[0] += 1
    return entry[1]


def _linears(model) -> list[torch.nn.Linear]:
    """The model's linear layers a kernel may replace: plain ``nn.Linear`` on the CPU, whose forward is the class's
    own (a module whose forward was replaced, e.g. by accelerate's hooks, is left alone)."""
    return [
        m for m in model.modules()
        if type(m) is torch.nn.Linear and "forward" not in m.__dict__ and m.weight.device.type == "cpu"
    ]  # fmt: skip


def _time_stack(forwards: list, linears: list, inputs: dict) -> float:
    start = time.perf_counter()
    for module, forward in zip(linears, forwards):
        forward(inputs[module.in_features])
    return time.perf_counter() - start


@torch.no_grad()
def measure_kernel_table(model, buckets=ROW_BUCKETS, repeats: int = 3, budget_bytes: int = 2**30) -> KernelTable:
    """Time every available kernel on the model's own linear layers (the first ``budget_bytes`` of weights, in
    order) at each row count; best of ``repeats``, kernels interleaved per round. The table picks the fastest."""
    linears, size = [], 0
    for module in _linears(model):
        if size > budget_bytes:
            break
        linears.append(module)
        size += module.weight.numel() * module.weight.element_size()
    dtype = linears[0].weight.dtype if linears else torch.float32
    kernels = {n: k for n, k in available_kernels(dtype).items() if all(k.supports(m.weight) for m in linears)}
    forwards = {n: [k.bind(m) for m in linears] for n, k in kernels.items()}  # temporary copies, freed on return
    best = {n: {b: float("inf") for b in buckets} for n in kernels}
    gen = torch.Generator().manual_seed(0)
    for round_ in range(repeats + 1):  # round 0 warms up
        for b in buckets:
            inputs = {f: torch.randn(b, f, generator=gen).to(dtype) for f in {m.in_features for m in linears}}
            for n in kernels:
                seconds = _time_stack(forwards[n], linears, inputs)
                if round_:
                    best[n][b] = min(best[n][b], seconds * 1e3)
    choice = {b: min(kernels, key=lambda n: best[n][b]) for b in buckets}
    meta = {"dtype": str(dtype).replace("torch.", ""), "threads": torch.get_num_threads(), "linears": len(linears),
            "weight_megabytes": round(size / 2**20, 1), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    return KernelTable(choice, best, meta)


def kernel_table_path(model) -> Path:
    """``$HF_SPECULATIVE_CACHE/kernel_tables/<key>.json``, the key naming the machine (CPU, thread count), the
    dtype and the model."""
    import hashlib

    from ...paths import cache_root, machine_description, model_key

    param = next(model.parameters())
    with torch.no_grad():
        parts = [machine_description(param.device), str(param.dtype), model_key(model, 0), "kernel-table-1"]
    return cache_root() / "kernel_tables" / f"{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:16]}.json"


_TABLES: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def set_kernel_table(model, table: KernelTable | None) -> None:
    """Use ``table`` for ``model`` in this process (None: forget it, read the cache or the default again)."""
    _TABLES.pop(model, None)
    if table is not None:
        _TABLES[model] = {"injected": table}


def kernel_table(model) -> KernelTable:
    """The table in force for ``model``: injected (`set_kernel_table`), else measured and cached (``hf-speculative
    calibrate``), else `default_kernel_table`. Read once per model and dtype; never measured here."""
    param = next(model.parameters())
    memo = _TABLES.setdefault(model, {})
    if "injected" in memo:
        return memo["injected"]
    key = (param.dtype, param.device.type)
    if key not in memo:
        path = kernel_table_path(model)
        table = None
        if path.exists():
            try:
                table = KernelTable.from_dict(json.loads(path.read_text()))
            except (ValueError, KeyError, TypeError):
                table = None  # a damaged file: the default applies
        memo[key] = table or default_kernel_table(param.dtype, available_kernels(param.dtype))
    return memo[key]


# ----------------------------------------------------------------------------- running the engine's forwards


def fast_linear(module: torch.nn.Linear, x: torch.Tensor, kernel: LinearKernel) -> torch.Tensor:
    """``module(x)`` through ``kernel``."""
    return _bound(module, kernel)(x)


_AVAILABLE: dict = {}  # dtype -> available_kernels(dtype), for the engine's per-step lookups


def prepare_kernels(model) -> None:
    """Build this CPU's C kernel once (cached on disk; a second of compiling the first time) unless the kernels are
    off; `hfs.enable` calls it, so that ``generate()`` itself never compiles or writes anything."""
    if kernels_setting(model) == "torch" or not any(p.device.type == "cpu" for p in model.parameters()):
        return
    from .build import build_small_gemm, built_small_gemm

    if built_small_gemm() is None and build_small_gemm() is not None:
        _AVAILABLE.clear()  # the packed kernel is there now: tables chosen without it are chosen again
        for memo in _TABLES.values():
            for key in [k for k in memo if k != "injected"]:
                memo.pop(key)


def kernel_for_rows(model, rows: int) -> LinearKernel | None:
    """The kernel the engine runs a forward of ``rows`` rows with (None: torch's own)."""
    if torch.is_grad_enabled() or kernels_setting(model) == "torch":
        return None
    name = kernel_table(model).kernel_for(rows)
    if name == "torch":
        return None
    dtype = next(model.parameters()).dtype
    if dtype not in _AVAILABLE:
        _AVAILABLE[dtype] = available_kernels(dtype)
    return _AVAILABLE[dtype].get(name)


@contextlib.contextmanager
def engine_kernels(model, rows: int):
    """For one forward of the engine over ``rows`` rows: the model's linear layers run the table's kernel."""
    kernel = kernel_for_rows(model, rows)
    linears = [m for m in _cached_linears(model) if kernel.supports(m.weight)] if kernel is not None else []
    for module in linears:
        module.forward = _bound(module, kernel)  # an instance attribute: removed again below
    try:
        yield kernel
    finally:
        for module in linears:
            module.__dict__.pop("forward", None)


_BOUND: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def _bound(module: torch.nn.Linear, kernel: LinearKernel):
    """``kernel.bind(module)``, made once per module and kernel."""
    slots = _BOUND.setdefault(module, {})
    if kernel.name not in slots:
        slots[kernel.name] = kernel.bind(module)
    return slots[kernel.name]


def head_projector(model, head: torch.nn.Module):
    """``project(states)``: the LM head on a few rows (the engine's lazy head) through the table's kernel for that
    many rows (``F.linear`` where the table chose torch's: what it measured), when ``head`` is a plain ``nn.Linear``
    on the CPU; None when the kernels are off (the engine then keeps its own product)."""
    if type(head) is not torch.nn.Linear or kernels_setting(model) == "torch" or head.weight.device.type != "cpu":
        return None

    def project(states: torch.Tensor) -> torch.Tensor:
        states = states.to(head.weight.dtype)
        kernel = kernel_for_rows(model, states.reshape(-1, states.shape[-1]).shape[0])
        if kernel is None or not kernel.supports(head.weight):  # the table chose torch's kernel for this many rows
            return F.linear(states, head.weight, head.bias)
        return fast_linear(head, states, kernel)

    return project
