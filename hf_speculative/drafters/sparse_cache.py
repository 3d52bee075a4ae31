"""StreamingLLM's sparse KV cache (Xiao et al., "Efficient Streaming Language Models with Attention Sinks"), as the
self-speculative drafters that draft over it read it (SPIRe, MagicDec)."""

from __future__ import annotations

import torch

__all__ = ["streaming_keep", "sparse_visibility", "streaming_slots"]


def streaming_keep(positions: torch.Tensor, next_position: int | torch.Tensor, window: int, sinks: int) -> torch.Tensor:
    """StreamingLLM's sparse KV cache (Xiao et al., "Efficient Streaming Language Models with Attention Sinks"): which
    of the keys at text ``positions`` a query at ``next_position`` still sees: the ``sinks`` first positions and the
    last ``window - 1`` positions before it (the query itself is the window's last entry)."""
    return (positions < sinks) | (positions > next_position - window)


def sparse_visibility(
    query_positions: torch.Tensor, key_positions: torch.Tensor, window: int, sinks: int
) -> torch.Tensor:
    """The StreamingLLM mask: ``[..., q, s]`` is True where the key at text position ``key_positions[s]`` is visible to
    the query at ``query_positions[q]``: ``0 <= t - s < window`` or (``s < sinks`` and ``s <= t``)."""
    t = query_positions.unsqueeze(-1)
    s = key_positions.unsqueeze(-2)
    return (s <= t) & streaming_keep(s, t, window, sinks)


def streaming_slots(length: int, window: int, sinks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The StreamingLLM cache of ``length`` cached tokens (positions ``0 .. length - 1``) in ``sinks + window - 1``
    fixed slots: ``sinks`` sink slots (positions ``0 .. sinks - 1``), then ``window - 1`` window slots, right-aligned
    (the last holds position ``length - 1``). Returns each slot's position and whether it holds a token: a short
    sequence leaves sink slots past its end and window slots before ``sinks`` empty (a position is never in both)."""
    sink_positions = torch.arange(sinks)
    window_positions = length - (window - 1) + torch.arange(window - 1)
    positions = torch.cat([sink_positions, window_positions])
    valid = torch.cat([sink_positions < length, window_positions >= sinks])
    return positions, valid
