"""Sampling keyed by position: every sampled token is the Gumbel-max draw ``argmax(scores + G)`` with noise ``G`` that
depends only on the call's seed, the row and the token's position.

The Gumbel-max trick: for ``G`` a vector of independent standard Gumbel variables, ``argmax(log p + G)`` is a draw
from ``p``. Plain sampling draws position t's token from ``p_t`` with fresh randomness; here position t's randomness is
``G_t = gumbel(seed, row, t)``, fixed before the step that reaches t. A tree step then accepts a drafted child exactly
when its token is the one ``argmax(scores_t + G_t)`` picks, and the bonus token is that draw: the committed tokens are
the same whether they came one per step or several per tree, whatever was drafted, whatever the step pricer decided
and however long the steps took. Each ``G_t`` is independent of everything before position t, so the output follows
the model's distribution exactly (Gumbel, 1954; the coupling behind Leviathan et al.'s and SpecTr's analyses).

Acceptance: a deterministic candidate x (top-k, prompt lookup, suffix matches) is accepted with probability ``p(x)``,
as in rejection sampling with a one-hot proposal; k candidates of one node with ``p(x_1) + ... + p(x_k)``, as
SpecInfer's multi-candidate test. The seed is one draw from torch's global generator per call, so
``torch.manual_seed(s)`` makes a sampled ``generate()`` reproducible.
"""

from __future__ import annotations

import torch

__all__ = ["PositionNoise"]

_MASK = (1 << 64) - 1


def _mix(*values: int) -> int:
    """A 63-bit seed from integers (splitmix64 steps): nearby rows and positions get unrelated streams."""
    state = 0x9E3779B97F4A7C15
    for v in values:
        state = (state ^ (v & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        state = (state ^ (state >> 31)) * 0x94D049BB133111EB & _MASK
        state ^= state >> 29
    return state & ((1 << 63) - 1)


class PositionNoise:
    """Standard Gumbel noise per (row, position) for one call, cached while its position may still be drawn."""

    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        self.seed, self.device = int(seed), torch.device(device)
        self._noise: dict[tuple[int, int], torch.Tensor] = {}

    @classmethod
    def for_call(cls, device: torch.device | str = "cpu") -> "PositionNoise":
        """The noise of one call, its seed one draw from torch's global CPU generator (`torch.manual_seed`)."""
        return cls(int(torch.randint(0, 2**62, (1,))), device)

    def gumbel(self, row: int, position: int, vocab: int) -> torch.Tensor:
        """``G`` ``(vocab,)`` float32 for the token at ``position`` (0-based, without padding) of ``row``."""
        key = (row, position)
        noise = self._noise.get(key)
        if noise is None or noise.shape[0] != vocab:
            generator = torch.Generator().manual_seed(_mix(self.seed, row, position))
            u = torch.rand(vocab, generator=generator, dtype=torch.float64).clamp_(1e-300, 1.0)
            noise = (-torch.log(-torch.log(u))).float().to(self.device)
            self._noise[key] = noise
        return noise

    def sample(self, row: int, position: int, scores: torch.Tensor) -> torch.Tensor:
        """The token drawn from ``softmax(scores)`` at ``position`` of ``row`` (a 0-dim long tensor)."""
        return torch.argmax(scores.float() + self.gumbel(row, position, scores.shape[-1]), dim=-1)

    def forget(self, row: int, below: int) -> None:
        """Drop the noise of ``row``'s positions before ``below`` (committed: never drawn again)."""
        for key in [k for k in self._noise if k[0] == row and k[1] < below]:
            del self._noise[key]
