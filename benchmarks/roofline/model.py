"""The analytic (roofline) throughput model of SPIRe (Neelam et al., "SPIRe: Boosting LLM Inference Throughput with
Speculative Decoding", 2025, Sec. 4 and Fig. 4).

A speculative step drafts k tokens per row (k draft forwards) and verifies them in one target forward over k + 1 tokens
per row. It commits tau tokens per row, so against plain decoding the throughput multiplier is

    multiplier = tau / Delta t,    Delta t = (k draft forwards + verification forward) / one plain decoding step

and every forward is priced by the roofline: a forward costs the larger of its compute and its memory traffic,

    time = max(FLOPs / (FLOP/s), bytes / (B/s)) = max(Compute, (Weights + KV) x HOI) / (FLOP/s)

with HOI = (FLOP/s) / (B/s), the hardware's operational intensity. FLOPs and bytes come from `ModelShape`: weights are
read once per forward whatever the batch, each row's KV cache once per forward, so a forward over more tokens is free
until the batch is compute-bound, and a long context makes the KV cache, not the weights, the cost of a step.

Methods (the draft's cost is what differs):

* ``"vanilla"``: a small dense draft LM with its own full KV cache (two-model speculative decoding);
* ``"magicdec"``: the target itself drafts with a StreamingLLM sparse KV cache of S sinks + W window (MagicDec);
* ``"spire"``: a small drafter (e.g. SPIRe's pruned init: 2 of the target's layers) with the sparse S + W cache, plus
  its feedback-memory update: each step the verified positions' target activations go through the drafter's k/v
  projections into its cache, and drafted positions project the drafter's own feedback memory;
* ``"verify-only"``: drafting counted as free (prompt lookup; an upper bound for heads-style drafters).

Numbers from this model are **projected**, never measured: label them so.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from hf_speculative.perf_model import ModelShape, projected_speedup
from hf_speculative.plotting import save_figure

METHODS = ("vanilla", "magicdec", "spire", "verify-only")
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_CONTEXTS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


# ----------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class Hardware:
    """A machine as the roofline sees it: peak FLOP/s and memory bandwidth (bytes/s).

    Presets (dense bf16 tensor-core peak, HBM bandwidth from the data sheets): `HARDWARE` / `Hardware.preset`;
    this CPU: `Hardware.measure_cpu`.
    """

    name: str
    flops: float
    bandwidth: float
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if not (self.flops > 0 and self.bandwidth > 0):
            raise ValueError(f"Hardware needs flops > 0 and bandwidth > 0, got {self.flops}, {self.bandwidth}")

    @property
    def hoi(self) -> float:
        """Hardware operational intensity: FLOPs the machine does in the time it moves one byte."""
        return self.flops / self.bandwidth

    def to_dict(self) -> dict:
        return {**asdict(self), "hoi": self.hoi}

    @classmethod
    def preset(cls, name: str) -> "Hardware":
        """``"h100"``, ``"h200"`` or ``"a100"``."""
        key = name.lower()
        if key not in HARDWARE:
            raise ValueError(f"unknown hardware {name!r}; presets: {sorted(HARDWARE)} (or Hardware.measure_cpu())")
        return HARDWARE[key]

    @classmethod
    def measure_cpu(
        cls, threads: int | None = None, seconds: float = 1.0, refresh: bool = False, cache: bool = True
    ) -> "Hardware":
        """This CPU's float32 matmul FLOP/s and memory bandwidth with ``threads`` torch threads (default: torch's
        current count), each the best of repeats over about ``seconds / 2``: FLOP/s from 1024 x 1024 matmuls,
        bandwidth from copying a 128 MiB tensor (read + write, as STREAM's copy counts it). Cached as JSON under
        ``$HF_SPECULATIVE_CACHE/hardware/`` per CPU model and thread count; ``refresh=True`` measures again."""
        import torch

        from hf_speculative.paths import cache_root
        from hf_speculative.perf_model import machine_description

        previous = torch.get_num_threads()
        threads = int(threads or previous)
        torch.set_num_threads(threads)
        try:
            machine = machine_description("cpu")
            key = hashlib.sha256(machine.encode()).hexdigest()[:16]
            path = cache_root() / "hardware" / f"cpu-{key}.json"
            if cache and not refresh and path.exists():
                try:
                    data = json.loads(path.read_text())
                    return cls(data["name"], float(data["flops"]), float(data["bandwidth"]), data.get("meta", {}))
                except (ValueError, KeyError, TypeError):
                    pass  # a damaged file is measured again
            flops = _best_rate(
                lambda a, b, c: torch.mm(a, b, out=c),
                2 * 1024**3,
                seconds / 2,
                lambda: [torch.randn(1024, 1024) for _ in range(3)],
            )
            n = 32 * 1024**2  # 128 MiB of float32 per tensor: far beyond the caches
            bandwidth = _best_rate(
                lambda a, b: b.copy_(a), 2 * 4 * n, seconds / 2, lambda: [torch.ones(n), torch.empty(n)]
            )
            meta = {
                "machine": machine,
                "threads": threads,
                "dtype": "float32",
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "how": "best of repeats: 1024^3 float32 matmul (2 n^3 FLOPs); 128 MiB tensor copy (read + write bytes)",
            }
            hw = cls(f"cpu ({threads} thread{'s' if threads > 1 else ''})", flops, bandwidth, meta)
            if cache:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(
                    json.dumps({"name": hw.name, "flops": flops, "bandwidth": bandwidth, "meta": meta}, indent=1) + "\n"
                )
                tmp.replace(path)
            return hw
        finally:
            torch.set_num_threads(previous)


def _best_rate(op, work: float, seconds: float, make) -> float:
    """``work`` units per second of ``op(*make())``: the fastest of repeats (at least 3) filling ``seconds``."""
    args = make()
    op(*args)  # warm up (page faults, thread pool)
    best, spent, runs = float("inf"), 0.0, 0
    while runs < 3 or spent < seconds:
        start = time.perf_counter()
        op(*args)
        dt = time.perf_counter() - start
        best, spent, runs = min(best, dt), spent + dt, runs + 1
    return work / best


#: data-sheet peaks: dense bf16 tensor-core FLOP/s (no sparsity), HBM bandwidth
HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("H100 SXM", 989e12, 3.35e12),
    "h200": Hardware("H200", 989e12, 4.8e12),
    "a100": Hardware("A100 SXM", 312e12, 2.0e12),
}


# ----------------------------------------------------------------------------- forwards and steps


def forward_time(
    shape: ModelShape, hw: Hardware, batch: int, new_tokens: int, context: int, kv_window: int | None = None
) -> float:
    """Seconds of one forward by the roofline: ``max(FLOPs / hw.flops, bytes / hw.bandwidth)`` for ``batch`` rows
    of ``new_tokens`` new tokens after ``context`` cached positions (``kv_window``: a sparse S + W cache)."""
    compute = shape.forward_flops(batch, new_tokens, context, kv_window) / hw.flops
    memory = shape.forward_bytes(batch, new_tokens, context, kv_window) / hw.bandwidth
    return max(compute, memory)


def expected_tau(alpha: float, k: int) -> float:
    """Expected tokens per step of a k-token chain whose tokens are each accepted with probability ``alpha``
    (independently), bonus token included: ``1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)``."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got {alpha}, {k}")
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass(frozen=True)
class StepTimes:
    """Seconds of one speculative step's parts and of the plain decoding step it replaces."""

    plain: float  # one plain decoding step of the target (1 token per row, full KV)
    draft: float  # the k draft forwards
    verify: float  # the target's forward over the k + 1 (or tree) tokens per row
    memory: float = 0.0  # SPIRe's feedback-memory update

    @property
    def delta_t(self) -> float:
        """The step's cost in plain decoding steps (SPIRe's Delta t)."""
        return (self.draft + self.memory + self.verify) / self.plain


def step_times(
    method: str,
    target: ModelShape,
    draft: ModelShape | None,
    hw: Hardware,
    batch: int,
    context: int,
    k: int,
    sliding_window: int = 64,
    sink_tokens: int = 1,
    verify_tokens: int | None = None,
) -> StepTimes:
    """The roofline times of one step of ``method`` (`METHODS`) at batch ``batch`` and context ``context``.

    ``draft``: the draft LM (``"vanilla"``) or drafter (``"spire"``) shape; ignored by ``"magicdec"`` (the target
    drafts) and ``"verify-only"``. ``verify_tokens``: tokens per row of the verification forward, default ``k + 1``
    (a chain; pass ``num_nodes + 1`` for a tree). Sparse caches hold ``sink_tokens + sliding_window`` positions.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {list(METHODS)}")
    if batch < 1 or context < 0 or k < 0:
        raise ValueError(f"need batch >= 1, context >= 0, k >= 0, got {batch}, {context}, {k}")
    if method in ("vanilla", "spire") and draft is None:
        raise ValueError(f"method {method!r} needs a draft shape")
    n = k + 1 if verify_tokens is None else int(verify_tokens)
    window = int(sink_tokens) + int(sliding_window)
    plain = forward_time(target, hw, batch, 1, context)
    verify = forward_time(target, hw, batch, n, context)
    memory = 0.0
    if method == "vanilla":
        drafting = k * forward_time(draft, hw, batch, 1, context)
    elif method == "magicdec":
        drafting = k * forward_time(target, hw, batch, 1, context, kv_window=window)
    elif method == "spire":
        drafting = k * forward_time(draft, hw, batch, 1, context, kv_window=window)
        memory = _spire_memory_time(draft, hw, batch, k, n)
    else:
        drafting = 0.0
    return StepTimes(plain=plain, draft=drafting, verify=verify, memory=memory)


def _spire_memory_time(draft: ModelShape, hw: Hardware, batch: int, k: int, verified: int) -> float:
    """SPIRe's feedback memory (Sec. 3.3) beyond the drafter's forwards: per drafter layer, the k/v projections of
    the ``verified`` positions' target activations (after verification, reading those activations and the k/v
    weights once more) and of the k drafted positions' feedback memory (inside the draft forwards: weights already
    read). The softmax-weighted sums of activations are elementwise and left out."""
    kv_proj = 2 * draft.hidden * draft.kv_heads * draft.head_dim  # k and v projection weights of one layer
    flops = 2 * kv_proj * draft.layers * batch * (verified + k)
    read = (batch * verified * draft.layers * draft.hidden + draft.layers * kv_proj) * draft.dtype_bytes
    bytes_ = read + batch * verified * draft.kv_bytes_per_token  # the new cache entries written
    return max(flops / hw.flops, bytes_ / hw.bandwidth)


def throughput_multiplier(
    method: str,
    target: ModelShape,
    draft: ModelShape | None,
    hw: Hardware,
    batch: int,
    context: int,
    k: int,
    tau: float,
    **kwargs,
) -> float:
    """``tau / Delta t``: projected tokens/s of ``method`` over plain decoding (keyword arguments: `step_times`)."""
    t = step_times(method, target, draft, hw, batch, context, k, **kwargs)
    return projected_speedup(tau, t.verify, t.plain, draft_time=t.draft + t.memory)


# ----------------------------------------------------------------------------- grids and heatmaps


@dataclass
class SpeedupGrid:
    """Projected multipliers of one method over batch sizes (rows) x context lengths (columns)."""

    method: str
    target: str
    draft: str | None
    hardware: str
    k: int
    tau: float
    batch_sizes: list[int]
    contexts: list[int]
    speedup: list[list[float]]  # [batch index][context index]
    delta_t: list[list[float]]
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"kind": "projected", **asdict(self)}

    def table(self, digits: int = 2) -> str:
        """Rows B, columns L, cells the multiplier."""
        width = max(7, *(len(str(c)) + 1 for c in self.contexts))
        lines = ["B \\ L".rjust(6) + "".join(str(c).rjust(width) for c in self.contexts)]
        for b, row in zip(self.batch_sizes, self.speedup):
            lines.append(str(b).rjust(6) + "".join(f"{v:.{digits}f}".rjust(width) for v in row))
        return "\n".join(lines)


def speedup_grid(
    method: str,
    target: ModelShape,
    draft: ModelShape | None,
    hw: Hardware,
    k: int,
    tau: float,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    **kwargs,
) -> SpeedupGrid:
    """`throughput_multiplier` at every batch size x context length (keyword arguments: `step_times`)."""
    speedup, delta = [], []
    for b in batch_sizes:
        times = [step_times(method, target, draft, hw, int(b), int(L), k, **kwargs) for L in contexts]
        speedup.append([projected_speedup(tau, t.verify, t.plain, t.draft + t.memory) for t in times])
        delta.append([t.delta_t for t in times])
    draft_name = (
        target.name if method == "magicdec" else (draft.name if draft is not None and method != "verify-only" else None)
    )
    return SpeedupGrid(
        method=method,
        target=target.name,
        draft=draft_name,
        hardware=hw.name,
        k=int(k),
        tau=float(tau),
        batch_sizes=[int(b) for b in batch_sizes],
        contexts=[int(c) for c in contexts],
        speedup=speedup,
        delta_t=delta,
        settings={
            "sliding_window": kwargs.get("sliding_window", 64),
            "sink_tokens": kwargs.get("sink_tokens", 1),
            "verify_tokens": kwargs.get("verify_tokens") or k + 1,
            "dtype_bytes": target.dtype_bytes,
        },
    )


def plot_heatmap(grid: SpeedupGrid, path: str | Path, title: str | None = None) -> Path:
    """SPIRe Fig. 4 style: context length on x, batch size on y, colour and number = projected multiplier (red
    below 1, green above). The title always says "projected"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    values = grid.speedup
    lo, hi = min(map(min, values)), max(map(max, values))
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.999), vmax=max(hi, 1.001))
    title = title or (
        f"Projected throughput multiplier: {grid.method}, {grid.target} on {grid.hardware}\n"
        f"draft {grid.draft or '-'}, k={grid.k}, tau={grid.tau:.2f}"
    )
    if "projected" not in title.lower():
        title = f"Projected: {title}"
    fig, ax = plt.subplots(
        figsize=(max(6.0, 1.6 + 0.8 * len(grid.contexts)), max(3.5, 1.6 + 0.45 * len(grid.batch_sizes)))
    )
    im = ax.imshow(values, origin="lower", aspect="auto", cmap="RdYlGn", norm=norm)
    for i in range(len(grid.batch_sizes)):
        for j in range(len(grid.contexts)):
            ax.text(j, i, f"{values[i][j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(grid.contexts)), [str(c) for c in grid.contexts])
    ax.set_yticks(range(len(grid.batch_sizes)), [str(b) for b in grid.batch_sizes])
    ax.set_xlabel("context length L (tokens)")
    ax.set_ylabel("batch size B")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="projected speedup (x)")
    return save_figure(fig, path)
