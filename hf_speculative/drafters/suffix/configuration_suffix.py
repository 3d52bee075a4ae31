"""Configuration of SuffixDecoding (Oliaro et al., "SuffixDecoding", arXiv 2411.04975)."""

from __future__ import annotations

from ..configuration_drafter import ModelFreeDrafterConfig

__all__ = ["SuffixConfig"]


class SuffixConfig(ModelFreeDrafterConfig):
    r"""Configuration of a `SuffixDrafter`: no weights, only how it matches and how large its trees and its memory are
    (besides the fields of `ModelFreeDrafterConfig`: ``max_nodes`` defaults to 24, ``max_depth`` to 16).

    Args:
        max_match_length (`int`, defaults to 64):
            Longest suffix of the context that is matched (the paper's pattern length bound P); also the depth to
            which the global structure's suffixes are sorted.
        min_match_length (`int`, defaults to 1):
            Shortest match that drafts anything.
        alpha (`float`, defaults to 2.0):
            Adaptive speculation length: a match of p tokens drafts at most ``ceil(alpha * p)`` nodes (the paper's
            ``MAX_SPEC = alpha * p``; it uses alpha between 1 and 4).
        min_probability (`float`, defaults to 0.1):
            Nodes whose estimated acceptance probability (product of conditional frequencies along the path) is
            below this are not drafted.
        max_occurrences (`int`, defaults to 1024):
            Occurrences of a match read to count its continuations; a match with more is read at evenly spaced ranks
            of the suffix array (a stratified sample of its continuations).
        max_cache_bytes (`int`, defaults to 64 MiB):
            Memory cap of the global structure (tokens, suffix array and output lengths); the oldest outputs are
            evicted to stay under it.
        learn_outputs (`bool`, defaults to `True`):
            Add every row's output to the global structure at the end of each `generate()` call.
    """

    model_type = "suffix_decoding"
    default_max_nodes, default_max_depth = 24, 16

    def __init__(
        self,
        max_match_length: int = 64,
        min_match_length: int = 1,
        alpha: float = 2.0,
        min_probability: float = 0.1,
        max_occurrences: int = 1024,
        max_cache_bytes: int = 64 * 2**20,
        learn_outputs: bool = True,
        **kwargs,
    ):
        if not 1 <= min_match_length <= max_match_length:
            raise ValueError(
                f"need 1 <= min_match_length <= max_match_length, got {min_match_length}, {max_match_length}"
            )
        if alpha <= 0 or max_occurrences < 1 or max_cache_bytes < 1:
            raise ValueError("alpha, max_occurrences and max_cache_bytes must be positive")
        if not 0 <= min_probability <= 1:
            raise ValueError(f"min_probability must be in [0, 1], got {min_probability}")
        self.max_match_length = int(max_match_length)
        self.min_match_length = int(min_match_length)
        self.alpha = float(alpha)
        self.min_probability = float(min_probability)
        self.max_occurrences = int(max_occurrences)
        self.max_cache_bytes = int(max_cache_bytes)
        self.learn_outputs = bool(learn_outputs)
        super().__init__(**kwargs)
