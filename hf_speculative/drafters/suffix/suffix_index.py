"""The two suffix structures of SuffixDecoding (Oliaro et al., arXiv 2411.04975, "Suffix Tree Construction").

* `SuffixIndex`, the **global** structure over previous outputs: every output in one token buffer (each followed by
  a separator) and a suffix array over it, sorted by the first ``key_length`` tokens of each suffix. It answers the
  same queries as the paper's suffix tree -- the longest suffix of the context that occurs, and where it occurs --
  with binary searches, and stores 8 bytes per token (a suffix tree in Python objects would take hundreds). Outputs
  are added in batches (a binary search per new suffix and one array insert; a large batch re-sorts everything) and
  the oldest are evicted under a byte cap.
* `match_in_sequence`, the **per-request** structure over the row's prompt and output: the longest earlier
  occurrence of the sequence's suffix, found by vectorised comparison over the row (it changes every step, so it is
  matched directly instead of being indexed).

Tokens are stored as codes ``token + 1``; code 0 is the separator after each output, so a match never crosses two
outputs and a continuation stops at an output's end.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np

__all__ = ["SuffixIndex", "match_in_sequence", "suffix_array"]

SEPARATOR = 0
#: bytes per stored token: its code in the buffer and its entry in the suffix array
BYTES_PER_TOKEN = 8
#: bytes per stored output besides its tokens: its separator and its length
BYTES_PER_OUTPUT = 8


def suffix_array(codes: np.ndarray, positions: np.ndarray, depth: int) -> np.ndarray:
    """``positions`` sorted by ``codes[p : p + depth]`` (lexicographic; past the end compares lowest): prefix doubling."""
    n = len(codes)
    rank = codes.astype(np.int64)
    h = 1
    while h < depth:
        following = np.zeros(n, np.int64)
        following[: n - h] = rank[h:]
        order = np.lexsort((following, rank))
        first, second = rank[order], following[order]
        new_group = np.ones(n, dtype=bool)
        new_group[1:] = (first[1:] != first[:-1]) | (second[1:] != second[:-1])
        rank = np.empty(n, np.int64)
        rank[order] = np.cumsum(new_group)  # >= 1: past the end (0) stays lowest
        h *= 2
        if new_group.all():
            break
    return positions[np.argsort(rank[positions], kind="stable")].astype(np.int32)


class SuffixIndex:
    """Previous outputs in one buffer with a suffix array, under a memory cap (see the module docstring).

    Args:
        key_length: tokens each suffix is sorted by: the longest match it can find.
        max_bytes: the cap of `nbytes`; the oldest outputs are evicted to stay under it.
    """

    def __init__(self, key_length: int = 64, max_bytes: int = 64 * 2**20):
        self.key_length = int(key_length)
        self.max_bytes = int(max_bytes)
        self._buffer = b""  # codes as big-endian uint32: bytes order is the tokens' lexicographic order
        self.suffixes = np.empty(0, np.int32)  # positions of real tokens, sorted by their next key_length codes
        self.lengths: list[int] = []  # tokens per stored output, oldest first

    # ------------------------------------------------------------------ size
    @property
    def codes(self) -> np.ndarray:
        """The buffer as an array of codes (a view, no copy)."""
        return np.frombuffer(self._buffer, dtype=">u4")

    @property
    def nbytes(self) -> int:
        """The stored bytes: 4 per code (tokens and separators), 4 per suffix array entry, 4 per output length."""
        return len(self._buffer) + self.suffixes.nbytes + 4 * len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return len(self.suffixes)

    def __len__(self) -> int:
        return len(self.lengths)

    # ------------------------------------------------------------------ adding and evicting
    def add(self, outputs: Sequence[Sequence[int]]) -> None:
        """Index ``outputs`` (token id lists), newest last, evicting the oldest stored outputs past the cap."""
        outputs = self._fitting([np.asarray(o, dtype=np.int64).reshape(-1) for o in outputs if len(o)])
        if not outputs:
            return
        needed = sum(BYTES_PER_TOKEN * len(o) + BYTES_PER_OUTPUT for o in outputs)
        self._evict(self.max_bytes - needed)
        start = len(self._buffer) // 4
        encoded = np.concatenate([np.append(o + 1, SEPARATOR) for o in outputs]).astype(">u4")
        self._buffer += encoded.tobytes()
        new = (np.flatnonzero(encoded != SEPARATOR) + start).astype(np.int32)
        if len(new) * 4 >= len(self.suffixes):  # a large batch: sort everything again
            all_positions = np.flatnonzero(self.codes != SEPARATOR)
            self.suffixes = suffix_array(self.codes, all_positions, self.key_length)
        else:
            self._insert(new)
        self.lengths.extend(len(o) for o in outputs)

    def _fitting(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
        """The newest of ``outputs`` that fit under the cap together (an output larger than the cap is cut to its end)."""
        kept, total = [], 0
        for out in reversed(outputs):
            room = (self.max_bytes - total - BYTES_PER_OUTPUT) // BYTES_PER_TOKEN
            if room <= 0 or (kept and room < len(out)):
                break
            out = out[-room:]
            kept.append(out)
            total += BYTES_PER_TOKEN * len(out) + BYTES_PER_OUTPUT
        return kept[::-1]

    def _insert(self, new: np.ndarray) -> None:
        """Binary-search each new suffix into the sorted array (new suffixes in their own sorted order)."""
        buf, width = self._buffer, 4 * self.key_length

        def key(i) -> bytes:
            return buf[4 * int(i) : 4 * int(i) + width]

        ordered = sorted(new.tolist(), key=key)
        at, lo = [], 0
        for position in ordered:
            lo = bisect.bisect_right(self.suffixes, key(position), lo=lo, key=key)
            at.append(lo)
        self.suffixes = np.insert(self.suffixes, at, ordered).astype(np.int32)

    def _evict(self, budget: int) -> None:
        """Drop the oldest outputs until `nbytes` is at most ``budget``."""
        drop, freed = 0, 0
        while drop < len(self.lengths) and self.nbytes - freed > budget:
            freed += BYTES_PER_TOKEN * self.lengths[drop] + BYTES_PER_OUTPUT
            drop += 1
        if drop:
            cut = sum(self.lengths[:drop]) + drop  # codes of the dropped outputs, separators included
            self._buffer = self._buffer[4 * cut :]
            kept = self.suffixes[self.suffixes >= cut]
            self.suffixes = (kept - cut).astype(np.int32)
            del self.lengths[:drop]

    # ------------------------------------------------------------------ matching
    def longest_match(self, context: np.ndarray, max_length: int) -> tuple[int, int, int]:
        """The longest suffix of ``context`` (token ids) stored here, up to ``max_length`` (at most `key_length`)
        tokens: ``(length, lo, hi)``, its occurrences being ``suffixes[lo:hi]``; ``(0, 0, 0)`` when none."""
        limit = min(max_length, self.key_length, len(context))
        if not limit or not len(self.suffixes):
            return 0, 0, 0
        pattern = (np.asarray(context[-limit:], dtype=np.int64) + 1).astype(">u4").tobytes()
        best, found = 0, (0, 0)
        low, high = 1, limit
        while low <= high:  # occurrence is monotone in the length: a suffix of an occurring pattern occurs
            length = (low + high) // 2
            span = self._span(pattern[-4 * length :])
            if span[1] > span[0]:
                best, found, low = length, span, length + 1
            else:
                high = length - 1
        return best, found[0], found[1]

    def _span(self, pattern: bytes) -> tuple[int, int]:
        """The suffix array range of the suffixes that start with ``pattern``."""
        buf, width = self._buffer, len(pattern)

        def key(i) -> bytes:
            return buf[4 * int(i) : 4 * int(i) + width]

        lo = bisect.bisect_left(self.suffixes, pattern, key=key)
        if lo == len(self.suffixes) or key(self.suffixes[lo]) != pattern:
            return lo, lo
        return lo, bisect.bisect_right(self.suffixes, pattern, lo=lo, key=key)

    def occurrences(self, lo: int, hi: int, max_count: int) -> np.ndarray:
        """Start positions of ``suffixes[lo:hi]``; at most ``max_count`` of them, at evenly spaced ranks (the array
        is sorted by what follows, so this samples the continuations in proportion to their counts)."""
        if hi - lo > max_count:
            return self.suffixes[np.linspace(lo, hi - 1, max_count).round().astype(np.int64)].astype(np.int64)
        return self.suffixes[lo:hi].astype(np.int64)

    # ------------------------------------------------------------------ saving
    def state(self) -> dict[str, np.ndarray]:
        """The arrays `load_state` restores: token codes, suffix array and output lengths."""
        return {
            "codes": self.codes.astype(np.int32),
            "suffixes": self.suffixes.copy(),
            "lengths": np.asarray(self.lengths, dtype=np.int32),
        }

    def load_state(self, codes: np.ndarray, suffixes: np.ndarray, lengths: np.ndarray) -> None:
        if int(lengths.sum()) + len(lengths) != len(codes) or len(suffixes) != int(lengths.sum()):
            raise ValueError("suffix structure arrays disagree: codes, suffix array and output lengths do not match")
        self._buffer = np.asarray(codes).astype(">u4").tobytes()
        self.suffixes = np.asarray(suffixes, dtype=np.int32)
        self.lengths = [int(n) for n in lengths]
        self._evict(self.max_bytes)


def match_in_sequence(sequence: np.ndarray, max_length: int) -> tuple[int, np.ndarray]:
    """The per-request match: the longest suffix of ``sequence`` (up to ``max_length`` tokens) that occurs earlier in
    it with at least one token after it. Returns its length and the positions of the tokens that follow each of its
    occurrences; ``(0, [])`` when the last token never occurred before."""
    n = len(sequence)
    if n < 2:
        return 0, np.empty(0, np.int64)
    ends = np.flatnonzero(sequence[:-1] == sequence[-1])
    length = 1
    while len(ends) and length < max_length:
        ok = ends >= length
        ok[ok] = sequence[ends[ok] - length] == sequence[n - 1 - length]
        if not ok.any():
            break
        ends, length = ends[ok], length + 1
    return (length, ends + 1) if len(ends) else (0, ends)
