"""The numerics floor: how often plain greedy ``generate()`` itself changes its output when the same prompt runs
in another batch shape.

A forward over N tokens does not round like N one-token forwards (the matrix products reduce in other orders
and block sizes), and in bfloat16/float16 that rounding is large enough to flip a near-tie argmax now and then;
after one flipped token the continuations part. Tree verification is a forward over many tokens, so in
bf16/fp16 a speculative method's greedy output can leave plain decoding's by rounding alone, with no
acceptance bug. The floor puts a number on that noise for plain decoding, on the same prompts and in the same
dtype, in two shapes:

* ``batch_of_two``: the prompt as one row of a batch of two identical rows;
* ``split_prefill``: the prompt's prefill split in two forwards (the first half cached, then ``generate``
  over the rest), as a multi-token forward over an extension of a cached prefix (what verification does).

In float32 both are identical to the batch-of-one output on the reference model and the tiny test models;
a method's identical-output rate is read against this floor.
"""

from __future__ import annotations

import statistics
from typing import Sequence

import torch

from .._compat import cache_arg

__all__ = ["FLOOR_VARIANTS", "first_divergence", "divergence_summary", "floor_outputs", "summarize_floor"]

FLOOR_VARIANTS = ("batch_of_two", "split_prefill")


def first_divergence(output_ids: Sequence[int], reference_ids: Sequence[int]) -> int | None:
    """Index of the first new token where ``output_ids`` leaves ``reference_ids`` (a shorter one leaves at its
    end); ``None`` when they are identical."""
    for i, (a, b) in enumerate(zip(output_ids, reference_ids)):
        if a != b:
            return i
    return None if len(output_ids) == len(reference_ids) else min(len(output_ids), len(reference_ids))


def divergence_summary(positions: Sequence[int | None]) -> dict:
    """``identical`` / ``n`` prompts and ``identical_rate``; over the diverging prompts the first divergence's
    ``mean``, ``min`` and ``max`` (token index into the new tokens; ``None`` when none diverges)."""
    diverging = [p for p in positions if p is not None]
    n = len(positions)
    return {
        "identical": n - len(diverging),
        "n": n,
        "identical_rate": (n - len(diverging)) / n if n else None,
        "first_divergence_mean": statistics.mean(diverging) if diverging else None,
        "first_divergence_min": min(diverging) if diverging else None,
        "first_divergence_max": max(diverging) if diverging else None,
    }


def _until_eos(ids: list[int], eos: set[int]) -> list[int]:
    """The new tokens up to and including the first EOS (a batch pads a finished row after it)."""
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


@torch.no_grad()
def floor_outputs(model, input_ids: torch.LongTensor, common: dict) -> dict[str, list[int]]:
    """Plain greedy new tokens of the prompt ``input_ids`` ``(1, L)`` in each of `FLOOR_VARIANTS`, from
    transformers' own ``generate`` (also on a model that `hf_speculative.enable` patched) with the keyword
    arguments ``common`` (greedy, ``max_new_tokens``, ``eos_token_id``, ...)."""
    from transformers import DynamicCache, GenerationMixin

    def generate(ids, **kwargs):
        out = GenerationMixin.generate(model, ids, attention_mask=torch.ones_like(ids), **kwargs, **common)
        return (out.sequences if hasattr(out, "sequences") else out)[0, length:].tolist()

    length = input_ids.shape[1]
    eos = common.get("eos_token_id")
    eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    outputs = {"batch_of_two": _until_eos(generate(input_ids.expand(2, -1).contiguous()), eos)}
    cache = DynamicCache(config=model.config)
    if length > 1:  # a one-token prompt has nothing to split: its plain prefill
        model(input_ids[:, : length // 2], **cache_arg(cache), use_cache=True)
    outputs["split_prefill"] = _until_eos(generate(input_ids, **cache_arg(cache)), eos)
    return outputs


def summarize_floor(per_prompt: dict[str, dict[str, int | None]]) -> dict:
    """``{variant: divergence_summary}`` over prompts, plus ``any``: the prompts where at least one variant
    changed plain's output (its ``first_divergence`` the earliest of them)."""
    summary = {v: divergence_summary([p[v] for p in per_prompt.values()]) for v in FLOOR_VARIANTS}
    earliest = [min((p[v] for v in FLOOR_VARIANTS if p[v] is not None), default=None) for p in per_prompt.values()]
    summary["any"] = divergence_summary(earliest)
    return summary
