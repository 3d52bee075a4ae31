"""The measured cost curve: what a tree step costs on this machine, in plain decoding steps.

A tree step verifies ``N + 1`` tokens (the root and N drafted nodes) in one target forward. On a GPU a
forward over a few dozen tokens costs about as much as a one-token step (decoding is memory-bound); on a
CPU the cost grows much sooner. The *cost curve*

    c(n) = time of a target forward over n new tokens after a cached prefix / time of a one-token step

measured once per machine, dtype and model, turns a tree's expected acceptance length tau into a speed:
a step commits tau tokens for ``c(N + 1) + drafting`` plain steps. This is the "Delta t" of SPIRe and the
hardware-aware tree size of Sequoia; `hf_speculative.engine.trees.TreeSpec.optimize` uses it to choose the
tree (`cost=`). The forward computes the LM head on all n rows, as the tree engine does.

Drafters that project a few rows onto the vocabulary per step (Medusa heads, ParallelSpec positions,
Speculative Streaming's streams) pay for those rows with the same large matrix as the target's LM
head; the curve also stores that cost (`CostCurve.projection_cost`), measured with the target's own head.

Curves are cached as JSON under ``$HF_SPECULATIVE_CACHE/cost_curves/``; `get_cost_curve` loads or
measures once; `set_cost_curve` injects a fixed curve (tests, or a curve measured elsewhere).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from transformers.utils import logging

from .._compat import cache_arg
from ..paths import machine_description, write_atomically

logger = logging.get_logger(__name__)

DEFAULT_NODES = (1, 2, 4, 8, 16, 24, 32, 48, 64)
DEFAULT_PROJECTION_ROWS = (1, 2, 3, 4, 6, 8)


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through the points; flat below the first, linear from the last two above the last."""
    if x <= xs[0]:
        return float(ys[0])
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    if len(xs) == 1:
        return float(ys[-1])
    slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
    return float(ys[-1] + slope * (x - xs[-1]))


def _non_decreasing(ys: Sequence[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators): a longer forward never costs less, and
    one noisy point is averaged with its neighbours instead of lifting every later point."""
    blocks: list[list[float]] = []  # [mean, weight]
    for y in ys:
        blocks.append([float(y), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1), (m2, w2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2]
    return [m for m, w in blocks for _ in range(int(w))]


@dataclass(frozen=True)
class CostCurve:
    """The measured cost curve ``c(n)`` of one target on one machine (see the module docstring).

    Args:
        nodes: token counts n of the measured forwards, ascending, starting at 1.
        ratios: ``c(n)`` at those counts (``ratios[0] == 1`` when ``nodes[0] == 1``), non-decreasing.
        projection_rows / projection_ratios: the cost of projecting that many rows onto the full vocabulary
            with the target's LM head, in plain steps (empty when not measured: drafting then counts as free).
        meta: how it was measured (machine, dtype, model key, prefix, seconds of a one-token step).
    """

    nodes: tuple[int, ...]
    ratios: tuple[float, ...]
    projection_rows: tuple[int, ...] = ()
    projection_ratios: tuple[float, ...] = ()
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(int(n) for n in self.nodes))
        object.__setattr__(self, "ratios", tuple(float(r) for r in self.ratios))
        object.__setattr__(self, "projection_rows", tuple(int(n) for n in self.projection_rows))
        object.__setattr__(self, "projection_ratios", tuple(float(r) for r in self.projection_ratios))
        if not self.nodes or len(self.nodes) != len(self.ratios):
            raise ValueError("CostCurve needs as many ratios as node counts (at least one)")
        if len(self.projection_rows) != len(self.projection_ratios):
            raise ValueError("CostCurve needs as many projection_ratios as projection_rows")
        for xs in (self.nodes, self.projection_rows):
            if any(b <= a for a, b in zip(xs, xs[1:])) or (xs and xs[0] < 1):
                raise ValueError(f"CostCurve counts must be positive and strictly increasing, got {list(xs)}")
        if any(r <= 0 for r in self.ratios + self.projection_ratios):
            raise ValueError("CostCurve ratios must be positive")

    def __call__(self, n: float) -> float:
        """``c(n)``: cost of a forward over n new tokens in one-token steps (linear between measured counts)."""
        return _interpolate(self.nodes, self.ratios, n)

    def batched(self, n: float, batch_size: int = 1) -> float:
        """Cost of a forward over ``batch_size`` rows of n tokens against a plain batched step:
        ``c(B * n) / c(B)`` (a batch's tokens share the weight reads as a longer sequence does)."""
        return self(batch_size * n) / self(batch_size)

    def projection_cost(self, rows: int, vocab_fraction: float = 1.0) -> float:
        """Cost, in plain steps, of projecting ``rows`` rows onto ``vocab_fraction`` of the vocabulary (a
        truncated draft vocabulary reads that share of the matrix). 0 when the curve has no projection data."""
        if rows <= 0 or not self.projection_rows:
            return 0.0
        return vocab_fraction * _interpolate(self.projection_rows, self.projection_ratios, rows)

    @property
    def max_nodes(self) -> int:
        """The largest measured forward; trees up to ``max_nodes - 1`` drafted nodes stay inside the data."""
        return self.nodes[-1]

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> "CostCurve":
        return cls(
            nodes=data["nodes"],
            ratios=data["ratios"],
            projection_rows=data.get("projection_rows", ()),
            projection_ratios=data.get("projection_ratios", ()),
            meta=data.get("meta", {}),
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write the curve as JSON through a unique temporary file and ``os.replace`` (`paths.write_atomically`)."""
        write_atomically(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CostCurve":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def __repr__(self) -> str:
        pts = ", ".join(f"{n}: {r:.2f}" for n, r in zip(self.nodes, self.ratios))
        return f"CostCurve({{{pts}}})"


# ----------------------------------------------------------------------------- measuring


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_forward(model, ids, cache, mask, prefix: int, n: int, logits_to_keep, no_rows, fast_head, lm_head) -> float:
    """Seconds of one target forward over ``n`` new tokens after the ``prefix``-token cache (with the engine's lazy
    LM head when ``logits_to_keep`` is None), the cache cropped back to the prefix afterwards."""
    from ..engine.logits import PREFETCH_ROWS, vocab_logits
    from ..engine.policy import speed_policy

    device = ids.device
    engine_step = logits_to_keep is None and n > 1
    keep = (1 if n == 1 else no_rows) if logits_to_keep is None else logits_to_keep
    _sync(device)
    start = time.perf_counter()
    with speed_policy(model).engine_kernels(model, rows=n) if logits_to_keep is None else contextlib.nullcontext():
        out = model(
            input_ids=ids[:, prefix : prefix + n],
            attention_mask=mask,
            **cache_arg(cache),
            use_cache=True,
            position_ids=torch.arange(prefix, prefix + n, device=device)[None],
            logits_to_keep=keep,
            output_hidden_states=engine_step,
        )
    if engine_step:  # the engine's lazy LM head: the first rows the walk reads, in one product
        states = out.hidden_states[-1][0, : max(2, min(n, PREFETCH_ROWS))]
        if fast_head is None or fast_head(states) is None:
            vocab_logits(states, lm_head.weight)
    _sync(device)
    seconds = time.perf_counter() - start
    cache.crop(prefix - cache.get_seq_length())  # a negative count: the columns to drop
    return seconds


def _time_projection(states: torch.Tensor, head, r: int, device: torch.device) -> float:
    """Seconds of the LM head over ``r`` rows."""
    from ..engine.logits import vocab_logits

    _sync(device)
    start = time.perf_counter()
    vocab_logits(states[:r], head.weight)
    _sync(device)
    return time.perf_counter() - start


@torch.no_grad()
def measure_cost_curve(
    model,
    nodes: Sequence[int] = DEFAULT_NODES,
    prefix: int = 128,
    repeats: int = 5,
    projection_rows: Sequence[int] = DEFAULT_PROJECTION_ROWS,
    logits_to_keep: int | None = None,
    seed: int = 0,
) -> CostCurve:
    """Time target forwards over n new tokens after a ``prefix``-token cache, and the LM head over a few rows;
    best of ``repeats`` each, all sizes interleaved per round so that load changes on a shared machine hit
    every size alike. Ratios are over the one-token step (a plain decoding step: the LM head on its one row),
    fitted non-decreasing (a longer forward never costs less).

    ``logits_to_keep=None`` (default) times a tree step as the engine runs it: the forward computes no logits
    and the LM head runs on the rows the acceptance walk reads first (`logits.PREFETCH_ROWS`, one product);
    an int times the forward with transformers' ``logits_to_keep`` instead (0: the head on every row). The engine's
    forwards run the linear layers through the kernel its table chooses for their row count (`hf_speculative.engine.kernels`),
    and so do these (with ``logits_to_keep=None``): the curve prices the verification forward the engine runs."""
    from transformers import DynamicCache

    from ..engine.policy import speed_policy
    from ..engine.trees import additive_mask

    nodes = sorted({1, *(int(n) for n in nodes)})
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, prefix + nodes[-1]), generator=gen).to(device)
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :prefix], **cache_arg(cache), use_cache=True)
    masks = {
        n: additive_mask(torch.ones(n, prefix + n, dtype=torch.bool).tril(prefix), dtype).to(device) for n in nodes
    }
    head = model.get_output_embeddings() if projection_rows else None
    rows = [int(r) for r in projection_rows] if head is not None else []
    states = torch.randn(max(rows, default=1), head.weight.shape[1], generator=gen).to(device) if rows else None

    lm_head = model.get_output_embeddings()
    fast_head = speed_policy(model).head_projector(lm_head)
    no_rows = torch.empty(0, dtype=torch.long, device=device)

    def seconds(key: tuple[str, int]) -> float:  # ("n", n): a forward over n new tokens; ("r", r): the head on r rows
        kind, size = key
        if kind == "n":
            return _time_forward(
                model, ids, cache, masks[size], prefix, size, logits_to_keep, no_rows, fast_head, lm_head
            )
        return _time_projection(states, head, size, device)

    best = _best_of_rounds([("n", n) for n in nodes] + [("r", r) for r in rows], repeats, seconds)
    meta = {"machine": machine_description(device), "dtype": str(dtype).replace("torch.", ""), "prefix": prefix}
    meta |= {"repeats": repeats, "logits_to_keep": "engine" if logits_to_keep is None else logits_to_keep}
    return _fitted_curve(best, nodes, rows, meta)


def _best_of_rounds(keys: list, repeats: int, seconds) -> dict:
    """``{key: best of repeats}`` of ``seconds(key)``: one warm-up round, then ``repeats`` rounds, every key once per
    round (interleaved, so that load changes on a shared machine hit every key alike)."""
    best = dict.fromkeys(keys, float("inf"))
    for round_ in range(repeats + 1):  # round 0 warms up
        for key in best:
            t = seconds(key)
            if round_:
                best[key] = min(best[key], t)
    return best


def _fitted_curve(best: dict, nodes: list[int], rows: list[int], meta: dict) -> CostCurve:
    """The curve of the best timings (`_best_of_rounds`): ratios over the one-token step, fitted non-decreasing;
    ``meta`` completed with the step's seconds and the time of creation."""
    fitted = _non_decreasing([best[("n", n)] for n in nodes])
    step = fitted[0]  # c(1) = 1 by definition
    ratios = [t / step for t in fitted]
    proj = _non_decreasing([best[("r", r)] / step for r in rows])
    meta = {**meta, "step_seconds": step, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return CostCurve(tuple(nodes), tuple(ratios), tuple(rows), tuple(proj), meta)


def kernel_table_curve(model) -> CostCurve | None:
    """``c(n)`` from the speed policy's measured kernel table: the time of the table's kernel over its sample of the
    model's linear layers at n rows, over its time at one row (the table's row buckets, fitted non-decreasing). The
    linear layers are most of a forward on a CPU, and the forward's other work (attention over a short context,
    norms, the per-layer overhead) costs about the same at every n and is left out, so this is an upper bound of the
    measured curve; it is measured on this machine at ``hfs.enable``, where the built-in default curve was measured
    on another. None when the model is not enabled or its table was not measured (a default table)."""
    if "_hfs_policy" not in model.__dict__:
        return None
    from ..engine.policy import speed_policy

    table = speed_policy(model).table
    if table is None or not table.milliseconds or not table.choice:
        return None
    buckets = sorted(table.choice)
    times = [table.milliseconds.get(table.kernel_for(b), {}).get(b) for b in buckets]
    if buckets[0] != 1 or any(t is None or not t < float("inf") or t <= 0 for t in times):
        return None
    fitted = _non_decreasing(times)
    meta = {"source": "kernel table", "dtype": table.meta.get("dtype"), "created": table.meta.get("created")}
    return CostCurve(tuple(buckets), tuple(t / fitted[0] for t in fitted), meta=meta)


# ----------------------------------------------------------------------------- caching


def _curves_of(model) -> dict | None:
    """What this process knows of ``model``'s cost curves: held by its speed policy (`hfs.enable`), so it lives and
    dies with the model; None for a model never enabled (nothing is remembered for it)."""
    from ..engine.policy import speed_policy

    if "_hfs_policy" not in model.__dict__ and not getattr(type(model), "speculative_generation", False):
        return None
    return speed_policy(model).cost_curves


#: bumped when what a curve measures changes, so that curves cached by older code are measured again
CURVE_VERSION = "engine-step-4"  # 4: timed with the in-place kernels


def cost_curve_path(model, prefix: int = 128) -> Path:
    """``$HF_SPECULATIVE_CACHE/cost_curves/<key>.json``, the key naming the machine, dtype, model and whether the
    engine's kernels are on (`hf_speculative.engine.policy.SpeedPolicy`), and if on, the kernel's source."""
    from ..engine.kernels.build import source_digest
    from ..engine.policy import speed_policy
    from ..paths import cache_root, speed_key

    param = next(model.parameters())
    parts = [machine_description(param.device), str(param.dtype), speed_key(model), str(prefix), CURVE_VERSION]
    if speed_policy(model).kernels != "auto":
        parts.append(f"kernels={speed_policy(model).kernels}")
    else:  # a curve measured with another version of the kernel is measured again
        parts.append(source_digest())
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return cache_root() / "cost_curves" / f"{key}.json"


def set_cost_curve(model, curve: CostCurve | None) -> None:
    """Use ``curve`` for ``model`` in this process (deterministic tests; a curve measured elsewhere); None forgets it
    (and what was read or found missing on disk: the next call looks again). The model's speed policy holds it, so a
    curve needs an enabled model (`hfs.enable`)."""
    curves = _curves_of(model)
    if curves is None:
        if curve is not None:
            raise ValueError("set_cost_curve needs an enabled model (hfs.enable(model)): its speed policy holds it")
        return
    curves.clear()
    if curve is not None:
        curves["injected"] = curve


#: what reading a damaged curve file raises: unreadable, not UTF-8 or JSON (ValueError), or JSON of another shape
_DAMAGED = (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError)


def read_cost_curve(path: str | os.PathLike) -> CostCurve | None:
    """The curve cached at ``path``; None when there is none, or when the file is damaged (truncated, not a curve):
    then one warning per file, and the caller measures again or uses the default curve."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return CostCurve.load(path)
    except _DAMAGED as error:
        logger.warning_once(
            f"ignoring the damaged cost curve {path} ({type(error).__name__}: {error}); it is measured again by "
            "`hf-speculative calibrate` or `get_cost_curve(model)`, a default curve stands in until then"
        )
        return None


def get_cost_curve(model, measure_if_missing: bool = True, **measure_kwargs) -> CostCurve | None:
    """The model's cost curve: injected (`set_cost_curve`), else cached on disk, else measured once
    (`measure_cost_curve`) and cached. Returns None when missing and ``measure_if_missing`` is False; a miss is
    remembered for the model in this process (a curve another process calibrates later is read after a restart)."""
    known = _curves_of(model)
    loaded = known if known is not None else {}
    if "injected" in loaded:
        return loaded["injected"]
    param = next(model.parameters())
    memo_key = (str(param.device), param.dtype, measure_kwargs.get("prefix", 128))
    if memo_key in loaded:
        return loaded[memo_key]
    if loaded.get(("missing", *memo_key)) and not measure_if_missing:
        return None  # looked for once per process: the cache key hashes every weight (its cost: docs/results)
    path = cost_curve_path(model, measure_kwargs.get("prefix", 128))
    cached = read_cost_curve(path)
    if cached is not None:
        loaded[memo_key] = cached
        return cached
    if not measure_if_missing:
        loaded[("missing", *memo_key)] = True
        return None
    was_training = model.training
    model.eval()
    try:
        curve = measure_cost_curve(model, **measure_kwargs)
    finally:
        model.train(was_training)
    curve.save(path)
    loaded[memo_key] = curve
    return curve
