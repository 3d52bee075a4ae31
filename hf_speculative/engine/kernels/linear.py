"""The target's linear layers at the machine's cost during the engine's forwards, with no copy of the weights.

A forward over n tokens multiplies n rows by every weight. Decoding is memory-bound, so a forward over a few dozen
tokens should cost about what reading the weights costs, one decoding step. On a CPU the default kernels do not
always get there at small row counts: float32 BLAS re-packs the weight on every call and runs compute-starved at
2-32 rows, MKL's paths on AMD CPUs are slower than the memory allows even at one row, and bfloat16 without native
bf16 products is several times its memory floor beyond one row. The kernels here, each a `LinearKernel`:

* ``"torch"``: ``F.linear``, what plain ``generate()`` runs;
* ``"direct"``: float32 and bfloat16 weights read in place, as ``nn.Linear`` holds them (``direct_gemm.c``,
  compiled once for this CPU by `build_direct_gemm`, compared with ``F.linear`` before first use by
  `verify_kernel`): no copy, no memory beyond the output;
* ``"direct-drafting"``: the direct kernel for a drafter's own layers, reading a float32 weight that bfloat16
  holds exactly (a drafter saved in bfloat16) from a bfloat16 copy (`DraftingDirectKernel`);
* ``"onednn"``: float32 / bfloat16 / float16 with the weight reordered once into oneDNN's blocked layout (AMX and
  AVX512-BF16 where the CPU has them): a copy of every weight it runs, so the speed policy offers it only when its
  memory budget holds that copy (`hf_speculative.engine.policy.SpeedPolicy.memory_budget`).

`KernelTable` says which kernel runs a forward of a given row count (rows = batch rows x tokens); the speed policy
measures it at ``hfs.enable`` in about two seconds (`measure_kernel_table` on a sample of the model's own layers),
or reads the one ``hf-speculative calibrate`` measured thoroughly and cached. The policy gives the model's
``nn.Linear`` modules a forward that runs the chosen kernel only inside an engine forward of the calling thread, so
the model's own forward and plain ``generate()``, in any thread, run torch's ``F.linear``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.utils import logging

__all__ = [
    "ROW_BUCKETS",
    "DirectKernel",
    "DraftingDirectKernel",
    "KernelForward",
    "KernelTable",
    "LinearKernel",
    "OneDnnKernel",
    "available_kernels",
    "default_kernel_table",
    "drafting_kernel",
    "fast_linear",
    "kernel_table_path",
    "linear_layers",
    "measure_kernel_table",
    "native_bf16",
    "read_kernel_table",
    "verify_kernel",
]

logger = logging.get_logger(__name__)

#: row counts a table has an entry for; a forward of r rows runs the kernel of the smallest bucket >= r, and torch's
#: above the last (a long prompt's prefill)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class LinearKernel:
    """One way to compute ``x @ W^T + b`` for an ``nn.Linear``. `prepare` makes what the kernel reads from the
    weight (the weight itself, or a copy in the kernel's layout: `copies` says which), `product` computes. The base
    class is torch's own ``F.linear``."""

    name = "torch"
    copies = False  # True: `prepare` makes a copy of the weight (memory the speed policy must budget)

    def supports(self, weight: torch.Tensor) -> bool:
        return True

    def prepare(self, weight: torch.Tensor):
        return weight

    def copy_bytes(self, weight: torch.Tensor) -> int:
        """The most bytes `prepare` may hold for ``weight`` beside it (0: read in place)."""
        return weight.nbytes if self.copies else 0

    def product(self, prepared, x: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W^T + bias`` from the prepared weight (``x`` of any leading shape)."""
        return F.linear(x, prepared, bias)


class DirectKernel(LinearKernel):
    """float32 and bfloat16 weights read in place through ``direct_gemm.c`` (see
    `hf_speculative.engine.kernels.build`); products accumulate in float32, the output is rounded once to the
    weight's dtype, as ``F.linear`` does."""

    name = "direct"

    def __init__(self, lib):
        self.lib = lib
        #: bfloat16 x against bfloat16 weights run on AMX's tiles (a CPU with AMX-BF16 that lets this process use them)
        self.amx = bool(lib.hfs_direct_amx())

    def supports(self, weight: torch.Tensor) -> bool:
        return (
            weight.dtype in (torch.float32, torch.bfloat16)
            and weight.device.type == "cpu"
            and weight.dim() == 2
            and weight.is_contiguous()
        )

    def product(self, prepared, x, n, bias):
        if self.amx and prepared.dtype == torch.bfloat16 and x.dtype == torch.bfloat16:
            y = self._amx_product(prepared, x, n, bias)
            if y is not None:
                return y.to(torch.bfloat16)
        y = self._float32_product(prepared, x, n, bias)
        return y if prepared.dtype == torch.float32 else y.to(prepared.dtype)

    def _amx_product(self, prepared, x, n, bias) -> torch.Tensor | None:
        """bfloat16 ``x`` against bfloat16 weights through AMX's tiles, the weight read in place (float32 sums of
        exact products); None where the sizes do not fit the tiles (32 | n and 32 | in_features)."""
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        if not rows or n % 32 or k % 32:
            return None
        x, bias = x.contiguous(), _float32_bias(bias)
        y = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
        args = (x.data_ptr(), rows, k, prepared.data_ptr(), n, None if bias is None else bias.data_ptr())
        return y if self.lib.hfs_direct_bf16_amx(*args, y.data_ptr(), torch.get_num_threads()) else None

    def _float32_product(self, prepared, x, n, bias) -> torch.Tensor:
        """``x @ W^T + bias`` in float32 (products accumulate in float32 whatever the weight's dtype)."""
        x = x if x.is_contiguous() and x.dtype == torch.float32 else x.float().contiguous()
        bias = _float32_bias(bias)
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        y = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
        if rows:
            fn = self.lib.hfs_direct_f32 if prepared.dtype == torch.float32 else self.lib.hfs_direct_bf16
            fn(
                x.data_ptr(),
                rows,
                k,
                prepared.data_ptr(),
                n,
                None if bias is None else bias.data_ptr(),
                y.data_ptr(),
                torch.get_num_threads(),
            )
        return y


def _float32_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    """The bias as the C kernels read it: contiguous float32 (None stays None)."""
    if bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()):
        return bias
    return bias.float().contiguous()


class DraftingDirectKernel(DirectKernel):
    """The direct kernel for a drafter's own layers while it drafts. A float32 weight that bfloat16 holds exactly (a
    drafter saved in bfloat16 and widened to its float32 target's dtype, `hf_speculative.engine.placement`) is read
    from a bfloat16 copy: half the bytes for the same values. The kernel widens each weight back to float32 exactly
    before multiplying, so the products are those of the float32 weight (bit for bit where the input width is a
    multiple of 8, within float32 rounding elsewhere), in float32. Any other weight is read in place, as by
    `DirectKernel`. A drafter's forwards over a few rows read its weights from memory each step (the target's
    forward evicts them from the caches in between), so halving the bytes shortens drafting."""

    name = "direct-drafting"
    copies = True

    def prepare(self, weight: torch.Tensor):
        if weight.dtype == torch.float32:
            half = weight.to(torch.bfloat16)
            if torch.equal(half.float(), weight):
                return half
        return weight

    def copy_bytes(self, weight: torch.Tensor) -> int:
        return weight.numel() * 2 if weight.dtype == torch.float32 else 0

    def product(self, prepared, x, n, bias):
        if x.dtype == torch.float32 and prepared.dtype == torch.bfloat16:
            return self._float32_product(prepared, x, n, bias)
        return super().product(prepared, x, n, bias)


class OneDnnKernel(LinearKernel):
    """oneDNN with the weight reordered once into its blocked layout (float32, bfloat16, float16 on the CPU): a
    copy of the weight."""

    name = "onednn"
    copies = True

    def supports(self, weight: torch.Tensor) -> bool:
        return weight.device.type == "cpu" and weight.dim() == 2 and torch.backends.mkldnn.is_available()

    def prepare(self, weight):
        return torch.ops.mkldnn._reorder_linear_weight(weight, None)

    def product(self, prepared, x, n, bias):
        return torch.ops.mkldnn._linear_pointwise.default(x, prepared, bias, "none", [], "")


#: (rows, out_features, in_features, bias) of the products `verify_kernel` compares with ``F.linear``
VERIFY_SHAPES = (
    (1, 67, 45, True),
    (2, 200, 576, False),
    (5, 37, 1003, True),
    (7, 64, 32, False),
    (13, 96, 130, True),
    (20, 70, 517, True),
    (27, 29, 200, False),
    (64, 50, 333, True),
    (17, 64, 96, True),  # multiples of 32: AMX's tiles where the CPU has them
    (40, 96, 64, False),  # two passes of x through the tiles
)
#: largest |kernel - reference| allowed, relative to the reference's largest |value|: float32 summation order only
VERIFY_TOLERANCE = 1e-4


@functools.lru_cache(maxsize=None)
def verify_kernel(kernel: LinearKernel, dtype: torch.dtype) -> bool:
    """Whether ``kernel`` computes ``F.linear`` on ``dtype`` weights (odd sizes, bias, 1-64 rows), once per process:
    compared in float32 with the product of the same (exactly widened) values, within `VERIFY_TOLERANCE` of the
    output's scale. A kernel that fails is not used (a warning says so)."""
    from transformers.utils import logging

    gen = torch.Generator().manual_seed(0)
    for rows, n, k, with_bias in VERIFY_SHAPES:
        weight = torch.randn(n, k, generator=gen).to(dtype)
        x = torch.randn(rows, k, generator=gen).to(dtype)
        bias = torch.randn(n, generator=gen).to(dtype) if with_bias else None
        expected = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        try:
            got = kernel.product(kernel.prepare(weight), x, n, bias).float()
        except (RuntimeError, OSError, ValueError) as error:
            got, problem = None, f"{type(error).__name__}: {error}"
        if got is not None:
            scale = float(expected.abs().max())
            if dtype != torch.float32:  # the kernel's output is rounded to the weight's dtype once
                expected = expected.to(dtype).float()
                tolerance = float(torch.finfo(dtype).eps) * scale
            else:
                tolerance = VERIFY_TOLERANCE * scale
            error_size = float((got - expected).abs().max()) if got.shape == expected.shape else float("inf")
            problem = None if error_size <= tolerance else f"off by {error_size:.3g} (tolerance {tolerance:.3g})"
        if problem is not None:
            logging.get_logger(__name__).warning_once(
                f"the {kernel.name!r} kernel does not compute F.linear on {dtype} weights ({rows}x{k} @ {k}x{n}: "
                f"{problem}); torch's kernels stay in use"
            )
            return False
    return True


@functools.lru_cache(maxsize=None)
def _direct_kernel() -> DirectKernel | None:
    """The direct kernel if built (`build_direct_gemm`, run by ``hfs.enable``) and loaded with every check passed."""
    from .build import built_direct_gemm, load_direct_gemm

    path = built_direct_gemm()  # built by `hfs.enable` / ``hf-speculative calibrate``, never here
    lib = load_direct_gemm(str(path)) if path is not None else None
    return DirectKernel(lib) if lib is not None else None


@functools.lru_cache(maxsize=None)
def _drafting_direct(lib) -> DraftingDirectKernel:
    return DraftingDirectKernel(lib)


def drafting_kernel(kernel: LinearKernel) -> LinearKernel:
    """The kernel a drafter's own linear layers run while it drafts, for the kernel the table chose: the direct
    kernel's drafting variant (`DraftingDirectKernel`), else the same kernel."""
    return _drafting_direct(kernel.lib) if type(kernel) is DirectKernel else kernel


def available_kernels(dtype: torch.dtype, copies: bool = True) -> dict[str, LinearKernel]:
    """The kernels that can run ``dtype`` weights on this machine and passed `verify_kernel` (``"torch"`` always;
    ``"direct"`` once built; ``copies=False`` leaves out the kernels that copy the weight)."""
    kernels: dict[str, LinearKernel] = {"torch": LinearKernel()}
    direct = _direct_kernel() if dtype in (torch.float32, torch.bfloat16) else None
    if direct is not None and verify_kernel(direct, dtype):
        kernels["direct"] = direct
    if copies and dtype in (torch.float32, torch.bfloat16, torch.float16) and _onednn_runs(dtype):
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
    the largest bucket's above it (a prefill: past 64 rows a kernel's time per row stays as it is at 64, the direct
    kernel running passes of at most 64 rows). ``milliseconds[kernel][b]``: what the measurement saw (empty for a
    default)."""

    choice: dict[int, str]
    milliseconds: dict[str, dict[int, float]] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def kernel_for(self, rows: int) -> str:
        buckets = sorted(self.choice)
        for bucket in buckets:
            if rows <= bucket:
                return self.choice[bucket]
        return self.choice[buckets[-1]] if buckets else "torch"

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


@functools.lru_cache(maxsize=None)
def last_level_cache_bytes() -> int | None:
    """The largest CPU cache this machine reports (``/sys/devices/system/cpu/cpu0/cache``), in bytes; None when it
    reports none. A virtual machine may report its host's whole cache (hundreds of MiB)."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = entry.read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def memory_bound_sample_bytes(least: int) -> int:
    """Weight bytes a kernel measurement must stream for its products to come from memory, as a decoding step's do:
    twice the last-level cache (`last_level_cache_bytes`), at least ``least``. A sample the cache holds times the
    kernels' arithmetic, not their reads: on a CPU whose cache held the 40 MiB sample, the one-row choice between
    two kernels that stream at different speeds came out either way."""
    cache = last_level_cache_bytes()
    return max(least, 2 * cache) if cache else least


def default_kernel_table(dtype: torch.dtype, kernels: dict[str, LinearKernel]) -> KernelTable:
    """The table when nothing was measured (a model too small to time, or measuring turned off): the direct kernel
    up to 64 rows where it runs ``dtype``, torch's otherwise."""
    kernel = "direct" if "direct" in kernels else "torch"
    return KernelTable(
        {b: kernel for b in ROW_BUCKETS}, meta={"source": "default", "dtype": str(dtype).replace("torch.", "")}
    )


# ----------------------------------------------------------------------------- measuring the table


class KernelForward:
    """Marks the forward a speed policy gives an ``nn.Linear`` (`hf_speculative.engine.policy.EngineLinearForward`)."""

    __slots__ = ()


def linear_layers(model) -> list[torch.nn.Linear]:
    """The model's linear layers a kernel may replace: plain ``nn.Linear`` on the CPU, whose forward is the class's
    own or a speed policy's (a module whose forward was replaced otherwise, e.g. by accelerate's hooks, is left
    alone)."""
    return [
        m
        for m in model.modules()
        if type(m) is torch.nn.Linear
        and isinstance(m.__dict__.get("forward", KernelForward()), KernelForward)
        and m.weight.device.type == "cpu"
    ]


def _sample_layers(model, budget_bytes: int) -> list[torch.nn.Linear]:
    """Whole decoder layers' linear modules, in order, up to ``budget_bytes`` of weights (at least one layer), plus
    the LM head when it fits: what a step reads, in proportion."""
    linears, size = [], 0
    for module in linear_layers(model):
        if linears and size + module.weight.nbytes > budget_bytes:
            break
        linears.append(module)
        size += module.weight.nbytes
    return linears


def _time_stack(kernel: LinearKernel, prepared: list, linears: list, inputs: dict) -> float:
    start = time.perf_counter()
    for module, weight in zip(linears, prepared):
        kernel.product(weight, inputs[module.in_features], module.out_features, module.bias)
    return time.perf_counter() - start


#: timed rounds of the one-row bucket at least, whatever the time limit
ONE_ROW_ROUNDS = 5
#: a kernel replaces torch's own only when at least this much faster (a tie keeps what plain ``generate()`` runs)
MARGIN = 0.02


def _time_bucket(b: int, round_: int, kernels: dict, prepared: dict, linears: list, best: dict, gen) -> None:
    """One round of bucket ``b``: every kernel once, the order turned every other round; round 0 warms up."""
    dtype = linears[0].weight.dtype
    inputs = {f: torch.randn(b, f, generator=gen).to(dtype) for f in {m.in_features for m in linears}}
    names = list(kernels) if round_ % 2 else list(reversed(kernels))
    for n in names:
        elapsed = _time_stack(kernels[n], prepared[n], linears, inputs)
        if round_:
            best[n][b] = min(best[n][b], elapsed * 1e3)


def _fastest(best: dict, b: int) -> str:
    """The fastest kernel at bucket ``b``; torch's own unless another beats it by `MARGIN`."""
    name = min(best, key=lambda n: best[n][b])
    if "torch" in best and best[name][b] > (1 - MARGIN) * best["torch"][b]:
        return "torch"
    return name


@torch.no_grad()
def measure_kernel_table(
    model,
    buckets=ROW_BUCKETS,
    repeats: int = 3,
    budget_bytes: int = 2**30,
    seconds: float | None = None,
    kernels: dict[str, LinearKernel] | None = None,
) -> KernelTable:
    """Time every kernel of ``kernels`` (default: `available_kernels` of the model's dtype) on the model's own linear
    layers (the first ``budget_bytes`` of weights, in order) at each row count; best of ``repeats``, kernels
    interleaved per round in an order turned every round. Round 0 warms up on the smallest bucket; no round starts
    that would end past ``seconds`` (one timed round at least), but the one-row bucket gets `ONE_ROW_ROUNDS` timed
    rounds. The table picks the fastest, torch's own unless another beats it by `MARGIN`. A kernel that copies
    weights times its copies of the sample only (freed on return)."""
    linears = _sample_layers(model, budget_bytes)
    dtype = linears[0].weight.dtype if linears else torch.float32
    kernels = kernels if kernels is not None else available_kernels(dtype)
    kernels = {n: k for n, k in kernels.items() if all(k.supports(m.weight) for m in linears)}
    prepared = {n: [k.prepare(m.weight.detach()) for m in linears] for n, k in kernels.items()}
    best = {n: {b: float("inf") for b in buckets} for n in kernels}
    gen = torch.Generator().manual_seed(0)
    began = time.perf_counter()
    for round_ in range(repeats + 1):  # round 0 warms up, on the smallest bucket (a pass over a large sample is long)
        start = time.perf_counter()
        for b in buckets[:1] if round_ == 0 else buckets:
            _time_bucket(b, round_, kernels, prepared, linears, best, gen)
        now = time.perf_counter()
        if round_ and seconds is not None and now - began + (now - start) > seconds:  # no round past the limit
            break
    for extra in range(round_ + 1, ONE_ROW_ROUNDS + 1) if 1 in buckets else ():  # one row (a one-token step): cheap
        _time_bucket(1, extra, kernels, prepared, linears, best, gen)
    choice = {b: _fastest(best, b) for b in buckets}
    size = sum(m.weight.nbytes for m in linears)
    meta = {
        "dtype": str(dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "linears": len(linears),
        "weight_megabytes": round(size / 2**20, 1),
        "seconds": round(time.perf_counter() - began, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return KernelTable(choice, best, meta)


def kernel_table_path(model) -> Path:
    """``$HF_SPECULATIVE_CACHE/kernel_tables/<key>.json``, the key naming the machine (CPU, thread count), the
    dtype, the model (`hf_speculative.paths.speed_key`: its config, shapes and a few values) and the kernel's source
    (`build.source_digest`)."""
    import hashlib

    from ...paths import cache_root, machine_description, speed_key
    from .build import source_digest

    param = next(model.parameters())
    parts = [machine_description(param.device), str(param.dtype), speed_key(model), "kernel-table-2", source_digest()]
    return cache_root() / "kernel_tables" / f"{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:16]}.json"


def read_kernel_table(path: Path, kernels: dict[str, LinearKernel]) -> KernelTable | None:
    """The table cached at ``path`` if it is readable and names only ``kernels`` (None otherwise: a damaged,
    truncated or foreign file, or one that names a kernel this process cannot run)."""
    import json

    if not path.is_file():
        return None
    try:
        table = KernelTable.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        logger.warning_once(f"ignoring the damaged kernel table {path} ({type(exc).__name__}); measuring instead")
        return None
    return table if set(table.choice.values()) <= set(kernels) and table.choice else None


def fast_linear(module: torch.nn.Linear, x: torch.Tensor, kernel: LinearKernel) -> torch.Tensor:
    """``module(x)`` through ``kernel`` (its weight prepared now: for tests and measurements)."""
    return kernel.product(kernel.prepare(module.weight.detach()), x, module.out_features, module.bias)
