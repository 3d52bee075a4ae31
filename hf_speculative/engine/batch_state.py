"""The state of one speculative ``generate()`` call's rows: their committed tokens, the shared cache's bookkeeping,
the tree masks and the stopping checks (what `hf_speculative.engine.decoding.SpeculativeLoop` holds)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .cache import attention_window
from .trees import BatchTreeMaskBuffer, DraftTree, batch_tree_block

__all__ = ["Batch", "Row", "SpeculativeStats", "StepTimer", "Stopping", "TreeMasks"]


@dataclass
class SpeculativeStats:
    """What one speculative `generate` call did.

    ``accepted_lengths[i]``: tokens committed by target forward i (the prefill forward commits 1; a tree
    step commits its accepted drafted tokens plus the bonus token). tau is their mean.
    ``timings`` (seconds): ``draft`` (drafter calls), ``target`` (target forwards), ``engine`` (masks,
    acceptance, cache compaction, bookkeeping).

    With a batch: ``accepted_lengths[i]`` sums the tokens all rows committed in forward i, and ``rows[b]``
    holds row b's own statistics (its ``accepted_lengths`` per forward it took part in: its tau). With one
    row ``rows[0]`` repeats the call's numbers.
    """

    accepted_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=lambda: {"draft": 0.0, "target": 0.0, "engine": 0.0})
    rows: list["SpeculativeStats"] = field(default_factory=list)

    @property
    def mean_accepted_length(self) -> float:
        """tau: mean tokens committed per target forward and row, bonus token included (1.0 = no speedup)."""
        if len(self.rows) > 1:
            forwards = sum(r.num_target_forwards for r in self.rows)
            return sum(r.num_new_tokens for r in self.rows) / max(forwards, 1)
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)

    @property
    def num_target_forwards(self) -> int:
        return len(self.accepted_lengths)

    @property
    def num_new_tokens(self) -> int:
        return sum(self.accepted_lengths)


class StepTimer:
    """Adds a block's wall time to ``timings[key]``; synchronizes CUDA first so GPU splits are real."""

    def __init__(self, timings: dict, key: str, device: torch.device | None = None):
        self.timings, self.key = timings, key
        self.sync = device is not None and device.type == "cuda"

    def __enter__(self):
        if self.sync:
            torch.cuda.synchronize()
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        if self.sync:
            torch.cuda.synchronize()
        self.timings[self.key] += time.perf_counter() - self.start


class Row:
    """One prompt of the batch: its committed tokens (left padding included, as generate returns them) and
    its stopping state."""

    def __init__(self, ids: torch.LongTensor, pad: int):
        self.ids, self.pad = ids, pad
        self.finished_at: int | None = None  # sequence length at which its stopping criteria fired
        self.scores: list[torch.Tensor] = []
        self.logits: list[torch.Tensor] = []
        self.stats = SpeculativeStats()

    @property
    def sequence(self) -> torch.LongTensor:
        """What the drafter sees: the committed tokens without the prompt's padding."""
        return self.ids[:, self.pad :] if self.pad else self.ids


class Batch:
    """The rows still generating and the bookkeeping of the shared cache.

    ``active[a]`` is the original row of cache row a; ``visible`` ``(A, C)`` marks the cache columns that hold
    row a's real tokens; ``next_position[a]`` is the position of row a's root (its real token count);
    ``column_positions`` ``(A, C)`` the position of every column (kept only when a sliding window needs it).
    """

    def __init__(self, rows: list[Row], visible: torch.Tensor, column_positions: torch.Tensor, keep_positions: bool):
        self.rows = rows
        self.active = list(range(len(rows)))
        self.visible = visible
        self.next_position = visible.sum(-1)
        self.column_positions = column_positions if keep_positions else None

    def sequences(self) -> list[torch.LongTensor]:
        return [self.rows[r].sequence for r in self.active]

    def tree_inputs(self, drafts: list[DraftTree], device) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` and ``position_ids`` ``(A, n)`` of the drafts, padded to the widest with root tokens at
        the root's position."""
        if len(drafts) == 1:
            draft = drafts[0]
            return draft.tokens.to(device)[None], self.next_position[:, None] + draft.depths.to(device)[None]
        n = max(len(d) for d in drafts)
        tokens = torch.stack([torch.cat([d.tokens, d.tokens[:1].expand(n - len(d))]) for d in drafts]).to(device)
        depths = torch.zeros(len(drafts), n, dtype=torch.long)
        for a, d in enumerate(drafts):
            depths[a, : len(d)] = d.depths
        return tokens, self.next_position[:, None] + depths.to(device)

    def append_columns(self, path_lengths: torch.Tensor, m: int) -> None:
        """After `keep_paths`: m new columns per row, the first ``path_lengths[a]`` of them real."""
        new = torch.arange(m, device=self.visible.device)[None]
        if self.column_positions is not None:
            self.column_positions = torch.cat([self.column_positions, self.next_position[:, None] + new], dim=1)
        self.visible = torch.cat([self.visible, new < path_lengths[:, None]], dim=1)
        self.next_position = self.next_position + path_lengths

    def select(self, keep: list[int]) -> torch.Tensor:
        """Keep cache rows ``keep`` (indices into the current rows); returns them as a tensor."""
        index = torch.tensor(keep, dtype=torch.long, device=self.visible.device)
        self.active = [self.active[a] for a in keep]
        self.visible, self.next_position = self.visible[index], self.next_position[index]
        if self.column_positions is not None:
            self.column_positions = self.column_positions[index]
        return index


class TreeMasks:
    """Each step's attention mask(s) for the verification forward (see the module docstring)."""

    def __init__(self, model, device):
        self.window, self.layout = attention_window(model.config)
        self.dtype = model.dtype
        self.buffer = BatchTreeMaskBuffer(self.dtype, device)
        self.blocks: list = []

    def __call__(self, batch: Batch, drafts: list[DraftTree], position_ids: torch.Tensor):
        block = batch_tree_block(drafts, self.dtype, self.buffer.device, self.blocks)
        full = self.buffer(batch.visible, block)
        if self.window is None:
            return full
        sliding = self._windowed(full, batch, position_ids)
        return sliding if self.layout == "all" else {"full_attention": full, "sliding_attention": sliding}

    def _windowed(self, full: torch.Tensor, batch: Batch, position_ids: torch.Tensor) -> torch.Tensor:
        if full.shape[-1] <= self.window:  # no key can be `window` positions behind a query (positions <= columns)
            return full
        keys = torch.cat([batch.column_positions, position_ids], dim=1)  # (A, C + n)
        too_old = (position_ids[:, :, None] - keys[:, None, :]) >= self.window
        return full.masked_fill(too_old[:, None], torch.finfo(self.dtype).min)

    def select(self, index: torch.Tensor) -> None:
        self.buffer.select(index)


class Stopping:
    """Commits accepted tokens as plain decoding would, one stopping check per token and row.

    With an EOS criterion a finished row stops (plain `generate` pads it); without one plain `generate` keeps
    extending finished rows until every row is finished, and so does this loop (`is_done`)."""

    def __init__(self, stopping_criteria, streamer, pad_token_id, keep_scores: bool, keep_logits: bool):
        self.criteria, self.streamer = stopping_criteria, streamer
        self.stop_rows = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
        self.pad_token_id = pad_token_id
        self.keep_scores, self.keep_logits = keep_scores, keep_logits

    def commit(self, row: Row, tokens: list[int], token_scores, token_logits) -> int:
        """Append ``tokens`` to ``row``; returns how many count (up to the one where the row stops). Without an
        EOS criterion the tokens past a stop are still appended (the row goes on; `output` cuts them off)."""
        length = row.ids.shape[1]
        grown = torch.cat([row.ids, row.ids.new_tensor([tokens])], dim=-1)
        row.ids = grown
        if row.finished_at is not None:
            return 0
        for i in range(len(tokens)):
            if self.keep_scores:
                row.scores.append(token_scores[i])
            if self.keep_logits:
                row.logits.append(token_logits[i])
            if self.streamer is not None:
                self.streamer.put(grown[:, length + i].cpu())
            scores = token_scores[i][None] if token_scores is not None and i < len(token_scores) else None
            if bool(self.criteria(grown[:, : length + i + 1], scores)[0]):  # scores: (1, V), as plain passes them
                row.finished_at = length + i + 1
                if self.stop_rows:
                    row.ids = grown[:, : length + i + 1]
                return i + 1
        return len(tokens)

    def is_done(self, row: Row, rows: list[Row]) -> bool:
        if row.finished_at is None:
            return False
        if self.stop_rows:
            return True
        if any(r.finished_at is None for r in rows):
            return False
        return row.ids.shape[1] >= max(r.finished_at for r in rows)

    def output(self, rows: list[Row]) -> torch.LongTensor:
        """The rows as one tensor, as plain `generate` returns them."""
        if not self.stop_rows:  # finished rows went on decoding; generate stops them all at the last finish
            end = max(r.finished_at for r in rows)
            return torch.cat([r.ids[:, :end] for r in rows])
        if len(rows) == 1:
            return rows[0].ids
        end = max(r.ids.shape[1] for r in rows)
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        return torch.cat([torch.nn.functional.pad(r.ids, (0, end - r.ids.shape[1]), value=int(pad)) for r in rows])
