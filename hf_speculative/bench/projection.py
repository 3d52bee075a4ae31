"""Projected GPU speedup from a measured tau and the step overhead measured at real shapes.

On a CPU, a 135M model tells us tau (how many tokens a method commits per target forward) but not
what a tree step costs on a GPU, where verifying n tree tokens takes about as long as decoding one
(decoding is memory-bound) until n gets large. So on a CUDA machine we build a randomly initialized
model of a real shape (e.g. Llama-2-7B) in bf16, fill a KV cache of a realistic prefix length, and
time one forward over the ``n`` tokens of a verification tree (root + drafted nodes, with the tree
attention mask) against a one-token decoding forward:

    projected speedup = tau / (t_n / t_1)

This is **projected**, not measured: it leaves out the drafter's own time (pass ``draft_time`` to
include it) and the engine's bookkeeping, so it is an upper bound for methods whose drafting is not
negligible. Always label such numbers "projected".

The shapes (`SHAPES`, `shape_config`) and the formula (`projected_speedup`) belong to the one cost model,
`hf_speculative.perf_model`, and are re-exported here; its roofline half projects the same multiplier from the
shapes alone, without a GPU (``python benchmarks/run_roofline.py``).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch

from .._compat import cache_arg
from ..perf_model import SHAPES, projected_speedup, shape_config

__all__ = ["SHAPES", "shape_config", "projected_speedup", "StepTiming", "measure_step_latency", "project"]


@dataclass
class StepTiming:
    """Median seconds of a one-token forward (``t_one``) and an ``n_tokens`` tree forward (``t_tree``)."""

    shape: str
    n_tokens: int
    prefix_len: int
    dtype: str
    device: str
    t_one: float
    t_tree: float

    @property
    def step_overhead(self) -> float:
        return self.t_tree / self.t_one


def _tree_mask(tree, n_tokens: int, prefix_len: int, dtype, device):
    """The engine's tree mask; without a tree, a causal block (the ancestor matrix of a chain)."""
    from ..engine.trees import tree_attention_mask

    ancestors = tree.ancestors if tree is not None else torch.ones(n_tokens, n_tokens, dtype=torch.bool).tril()
    return tree_attention_mask(ancestors, prefix_len, dtype, device)


def _timed_forward(model, cache, prefix_len: int, ids, pos, attn, cuda: bool) -> float:
    """Seconds of one forward on top of the ``prefix_len``-token cache (CUDA events on a GPU), the cache cropped
    back to the prefix afterwards."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(input_ids=ids, position_ids=pos, attention_mask=attn, **cache_arg(cache), use_cache=True)
        end.record()
        torch.cuda.synchronize()
        dt = start.elapsed_time(end) / 1000
    else:
        import time

        t0 = time.perf_counter()
        model(input_ids=ids, position_ids=pos, attention_mask=attn, **cache_arg(cache), use_cache=True)
        dt = time.perf_counter() - t0
    extra = cache.get_seq_length() - prefix_len
    if extra > 0:
        cache.crop(-extra)  # transformers >= 5: a negative value removes that many tokens
    return dt


@torch.inference_mode()
def measure_step_latency(
    shape: str = "llama-2-7b",
    tree=None,
    n_tokens: int | None = None,
    prefix_len: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cuda",
    iters: int = 30,
    warmup: int = 5,
    seed: int = 0,
) -> StepTiming:
    """Time a one-token forward and an ``n``-token tree forward on a random-weight model of ``shape``.

    ``tree`` (a ``TreeSpec``) gives ``n = num_nodes + 1`` (root included) and the tree attention mask;
    otherwise ``n_tokens`` with a causal mask. Both forwards run on top of a ``prefix_len``-token KV
    cache, which is cropped back after every timed forward.
    """
    from transformers import AutoModelForCausalLM, DynamicCache

    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("measure_step_latency on 'cuda' needs a CUDA GPU; none is available on this machine")
    n = tree.num_nodes + 1 if tree is not None else int(n_tokens or 1)
    torch.manual_seed(seed)
    config = shape_config(shape)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa").eval()
    vocab = config.vocab_size
    cache = DynamicCache(config=config)
    prefix = torch.randint(vocab, (1, prefix_len), device=device)
    model(input_ids=prefix, **cache_arg(cache), use_cache=True)
    one = torch.randint(vocab, (1, 1), device=device)
    many = torch.randint(vocab, (1, n), device=device)
    mask = _tree_mask(tree, n, prefix_len, dtype, device)
    depths = tree.depths.to(device) if tree is not None else torch.arange(n, device=device)
    pos_many = (prefix_len + depths)[None]
    pos_one = torch.tensor([[prefix_len]], device=device)
    cuda = torch.device(device).type == "cuda"
    results = {"one": [], "tree": []}
    for i in range(warmup + iters):
        for key, (ids, pos, attn) in (("one", (one, pos_one, None)), ("tree", (many, pos_many, mask))):
            dt = _timed_forward(model, cache, prefix_len, ids, pos, attn, cuda)
            if i >= warmup:
                results[key].append(dt)
    return StepTiming(
        shape=shape,
        n_tokens=n,
        prefix_len=prefix_len,
        dtype=str(dtype).replace("torch.", ""),
        device=str(device),
        t_one=statistics.median(results["one"]),
        t_tree=statistics.median(results["tree"]),
    )


def project(tau: float, timing: StepTiming, draft_time: float = 0.0) -> dict:
    """The JSON record of one projection (``kind: "projected"``)."""
    return {
        "kind": "projected",
        "tau_measured": tau,
        **asdict(timing),
        "step_overhead": timing.step_overhead,
        "draft_time": draft_time,
        "projected_speedup": projected_speedup(tau, timing.t_tree, timing.t_one, draft_time),
    }
