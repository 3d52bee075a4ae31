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

The global structure's state is one immutable `SuffixSnapshot` (buffer, suffix array, output lengths) that each change
replaces whole: a lookup reads one snapshot, so drafting in one thread while another adds outputs is safe.

Tokens are stored as codes ``token + 1``; code 0 is the separator after each output, so a match never crosses two
outputs and a continuation stops at an output's end.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = ["SuffixIndex", "SuffixSnapshot", "check_state", "match_in_sequence", "suffix_array"]

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


def _key_function(buffer: bytes, width: int):
    """``key(p)``: the ``width`` bytes of ``buffer`` from code ``p`` on (the sort key of suffix ``p``)."""

    def key(i) -> bytes:
        return buffer[4 * int(i) : 4 * int(i) + width]

    return key


@dataclass(frozen=True, eq=False)
class SuffixSnapshot:
    """One consistent state of a `SuffixIndex`: its buffer, the suffix array over that buffer, and the output
    lengths. Immutable (bytes, a read-only array, a tuple): the index publishes a new snapshot in one attribute
    assignment, and a reader that takes `SuffixIndex.snapshot` once per lookup never sees a buffer with the suffix
    array of another."""

    buffer: bytes = b""  # codes as big-endian uint32: bytes order is the tokens' lexicographic order
    suffixes: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))  # positions of real tokens, sorted
    lengths: tuple[int, ...] = ()  # tokens per stored output, oldest first
    key_length: int = 64

    def __post_init__(self):
        suffixes = np.asarray(self.suffixes, dtype=np.int32)  # the writers hand over arrays of their own
        suffixes.setflags(write=False)
        object.__setattr__(self, "suffixes", suffixes)
        object.__setattr__(self, "lengths", tuple(int(n) for n in self.lengths))

    @property
    def codes(self) -> np.ndarray:
        """The buffer as an array of codes (a read-only view, no copy)."""
        return np.frombuffer(self.buffer, dtype=">u4")

    @property
    def nbytes(self) -> int:
        """The stored bytes: 4 per code (tokens and separators), 4 per suffix array entry, 4 per output length."""
        return len(self.buffer) + self.suffixes.nbytes + 4 * len(self.lengths)

    def longest_match(self, context: np.ndarray, max_length: int) -> tuple[int, int, int]:
        """The longest suffix of ``context`` (token ids) stored here, up to ``max_length`` (at most ``key_length``)
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
        key = _key_function(self.buffer, len(pattern))
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


class SuffixIndex:
    """Previous outputs in one buffer with a suffix array, under a memory cap (see the module docstring).

    The state is one immutable `SuffixSnapshot`, replaced whole by each change (`add`, eviction, `load_state`) in a
    single attribute assignment; writers take a lock, readers none. A reader in another thread (a `generate()`
    drafting from a memory that another call is adding its outputs to) takes `snapshot` once per lookup and reads the
    buffer and suffix array of one state.

    Args:
        key_length: tokens each suffix is sorted by: the longest match it can find.
        max_bytes: the cap of `nbytes`; the oldest outputs are evicted to stay under it.
    """

    def __init__(self, key_length: int = 64, max_bytes: int = 64 * 2**20):
        self.key_length = int(key_length)
        self.max_bytes = int(max_bytes)
        self._snapshot = SuffixSnapshot(key_length=self.key_length)
        self._write_lock = threading.Lock()

    def __getstate__(self) -> dict:  # pickle and deepcopy: without the lock
        return {k: v for k, v in self.__dict__.items() if k != "_write_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._write_lock = threading.Lock()

    # ------------------------------------------------------------------ the current state
    @property
    def snapshot(self) -> SuffixSnapshot:
        """The current state; take it once and read everything a lookup needs from it."""
        return self._snapshot

    @property
    def codes(self) -> np.ndarray:
        """The buffer as an array of codes (a view, no copy)."""
        return self._snapshot.codes

    @property
    def suffixes(self) -> np.ndarray:
        """Positions of real tokens, sorted by their next ``key_length`` codes (read-only)."""
        return self._snapshot.suffixes

    @property
    def lengths(self) -> list[int]:
        """Tokens per stored output, oldest first (a copy)."""
        return list(self._snapshot.lengths)

    @property
    def nbytes(self) -> int:
        """The stored bytes: 4 per code (tokens and separators), 4 per suffix array entry, 4 per output length."""
        return self._snapshot.nbytes

    @property
    def num_tokens(self) -> int:
        return len(self._snapshot.suffixes)

    def __len__(self) -> int:
        return len(self._snapshot.lengths)

    # ------------------------------------------------------------------ adding and evicting
    def add(self, outputs: Sequence[Sequence[int]]) -> None:
        """Index ``outputs`` (token id lists), newest last, evicting the oldest stored outputs past the cap."""
        outputs = self._fitting([np.asarray(o, dtype=np.int64).reshape(-1) for o in outputs if len(o)])
        if not outputs:
            return
        needed = sum(BYTES_PER_TOKEN * len(o) + BYTES_PER_OUTPUT for o in outputs)
        with self._write_lock:
            old = _evicted(self._snapshot, self.max_bytes - needed)
            start = len(old.buffer) // 4
            encoded = np.concatenate([np.append(o + 1, SEPARATOR) for o in outputs]).astype(">u4")
            buffer = old.buffer + encoded.tobytes()
            new = (np.flatnonzero(encoded != SEPARATOR) + start).astype(np.int32)
            if len(new) * 4 >= len(old.suffixes):  # a large batch: sort everything again
                codes = np.frombuffer(buffer, dtype=">u4")
                suffixes = suffix_array(codes, np.flatnonzero(codes != SEPARATOR), self.key_length)
            else:
                suffixes = _inserted(buffer, old.suffixes, new, self.key_length)
            lengths = old.lengths + tuple(len(o) for o in outputs)
            self._snapshot = SuffixSnapshot(buffer, suffixes, lengths, self.key_length)  # one assignment: published

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

    # ------------------------------------------------------------------ matching (each on one snapshot)
    def longest_match(self, context: np.ndarray, max_length: int) -> tuple[int, int, int]:
        """`SuffixSnapshot.longest_match` on the current state (read `occurrences` from the same `snapshot`)."""
        return self._snapshot.longest_match(context, max_length)

    def occurrences(self, lo: int, hi: int, max_count: int) -> np.ndarray:
        """`SuffixSnapshot.occurrences` on the current state."""
        return self._snapshot.occurrences(lo, hi, max_count)

    # ------------------------------------------------------------------ saving
    def state(self) -> dict[str, np.ndarray]:
        """The arrays `load_state` restores: token codes, suffix array and output lengths (of one snapshot)."""
        snap = self._snapshot
        return {
            "codes": snap.codes.astype(np.int32),
            "suffixes": snap.suffixes.copy(),
            "lengths": np.asarray(snap.lengths, dtype=np.int32),
        }

    def load_state(
        self, codes: np.ndarray, suffixes: np.ndarray, lengths: np.ndarray, vocab_size: int | None = None
    ) -> None:
        """Restore what `state` returned, after checking it (`check_state`: ``ValueError`` when it is inconsistent
        or holds a token id outside ``[0, vocab_size)``)."""
        check_state(codes, suffixes, lengths, vocab_size)
        buffer = np.asarray(codes).astype(">u4").tobytes()
        with self._write_lock:
            snap = SuffixSnapshot(buffer, np.array(suffixes, dtype=np.int32), tuple(lengths), self.key_length)
            self._snapshot = _evicted(snap, self.max_bytes)


def check_state(codes: np.ndarray, suffixes: np.ndarray, lengths: np.ndarray, vocab_size: int | None = None) -> None:
    """``ValueError`` unless the arrays of `SuffixIndex.state` fit together: 1-D integer arrays, the codes an output
    after another (``length`` codes ``token + 1`` in ``[1, vocab_size]``, then a 0), the suffix array a permutation of
    the token positions. Whether the array is sorted is not checked (a wrong order finds fewer matches, never wrong
    outputs: drafts are verified)."""
    codes, suffixes, lengths = (np.asarray(a) for a in (codes, suffixes, lengths))
    if any(a.ndim != 1 or a.dtype.kind not in "iu" for a in (codes, suffixes, lengths)):
        raise ValueError("the suffix structure's codes, suffixes and lengths must be 1-D integer arrays")
    if (lengths < 0).any() or int(lengths.sum()) + len(lengths) != len(codes) or len(suffixes) != int(lengths.sum()):
        raise ValueError("suffix structure arrays disagree: codes, suffix array and output lengths do not match")
    separators = np.zeros(len(codes), dtype=bool)
    separators[np.cumsum(lengths.astype(np.int64) + 1) - 1] = True
    if (codes[separators] != SEPARATOR).any() or (codes[~separators] == SEPARATOR).any():
        raise ValueError("suffix structure arrays disagree: the separators are not where the output lengths put them")
    tokens = codes[~separators].astype(np.int64) - 1
    top = vocab_size if vocab_size is not None else 2**32 - 1
    bad = tokens[(tokens < 0) | (tokens >= top)]
    if len(bad):
        raise ValueError(f"token id {int(bad[0])} is outside [0, {vocab_size}) in the stored outputs")
    if not np.array_equal(np.sort(suffixes.astype(np.int64)), np.flatnonzero(~separators)):
        raise ValueError(
            "suffix structure arrays disagree: the suffix array is not a permutation of the token positions"
        )


def _inserted(buffer: bytes, suffixes: np.ndarray, new: np.ndarray, key_length: int) -> np.ndarray:
    """``suffixes`` with each of ``new`` binary-searched in (the new suffixes in their own sorted order): a new array."""
    key = _key_function(buffer, 4 * key_length)
    ordered = sorted(new.tolist(), key=key)
    at, lo = [], 0
    for position in ordered:
        lo = bisect.bisect_right(suffixes, key(position), lo=lo, key=key)
        at.append(lo)
    return np.insert(suffixes, at, ordered).astype(np.int32)


def _evicted(snap: SuffixSnapshot, budget: int) -> SuffixSnapshot:
    """``snap`` less its oldest outputs, until its `nbytes` is at most ``budget`` (``snap`` itself when nothing goes)."""
    drop, freed = 0, 0
    while drop < len(snap.lengths) and snap.nbytes - freed > budget:
        freed += BYTES_PER_TOKEN * snap.lengths[drop] + BYTES_PER_OUTPUT
        drop += 1
    if not drop:
        return snap
    cut = sum(snap.lengths[:drop]) + drop  # codes of the dropped outputs, separators included
    kept = snap.suffixes[snap.suffixes >= cut]
    return SuffixSnapshot(snap.buffer[4 * cut :], (kept - cut).astype(np.int32), snap.lengths[drop:], snap.key_length)


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
