"""The one interface between a drafter and the engine. Only the engine runs the target; a drafter proposes trees and
learns from what the engine verified (docs/drafter_protocol.md has a complete example drafter).

A `TreeDrafter` holds one `generate()` call's drafting state over a batch of B left-padded prompts (B = 1
included). The engine calls, in order:

1. ``attach_target(target)`` once per call (read the target, never run it).
2. ``begin_batch(prompts, target_outputs)`` after the target's prefill forward. ``prompts[i]`` is row i's prompt
   ``(1, L_i)`` with its left padding removed; ``target_outputs`` is a `TargetRows`.
3. per step ``propose_batch(sequences, rows, tree, options) -> list[DraftTree]``: one draft per row still
   generating. ``sequences[j]`` ``(1, L_j)`` is the committed sequence (no padding) of original row ``rows[j]``;
   the root of draft j is ``sequences[j][0, -1]``. The engine verifies every row's tree in ONE target forward;
   a drafter with `pruning_layer` set drops nodes inside that forward through `prune_batch`.
4. per step ``advance_batch(sequences, rows, drafts, results, target_outputs)`` once the accepted tokens are
   committed (only for the rows that go on generating); ``target_outputs.top_k`` holds the verified logits'
   top-`verified_top_k` of every node when the drafter asks for them.
5. ``end_batch()``.

``target_outputs.row(j)`` is a batch-1 view of row j: tensors sliced to ``[j : j + 1]`` (prompt padding removed
on the prefill), its cache the row's real cached tokens only (`hf_speculative.engine.rows`).

A drafter written for one sequence subclasses `OneRowDrafter`, the engine's adapter: it implements ``begin`` /
``propose`` / ``advance`` / ``end`` and the adapter runs them once per row. The engine never branches on the kind
of drafter. A drafter keeps one path per step: a subclass of `OneRowDrafter` overrides a batched method only in
place of its one-row counterpart, never beside it.

What the engine and other drafters (`HybridDrafter`) read of a drafter is declared here, on `TreeDrafter`, and
nothing else: the class attributes below (gathered in one value by `TreeDrafter.capabilities`), `tree_for_batch`,
`candidate_tree` and `draft_cost`. Reading them changes nothing: a getter never caches into the drafter.
"""

from __future__ import annotations

import copy
from abc import ABC
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .acceptance import AcceptanceResult
from .rows import TargetRows
from .trees import DraftingOptions, DraftTree, DynamicTree, TreeSpec

__all__ = ["DrafterCapabilities", "TreeDrafter", "OneRowDrafter"]


@dataclass(frozen=True)
class DrafterCapabilities:
    """What a drafter declares to the engine and to other drafters, in one value (`TreeDrafter.capabilities`; each
    field is the `TreeDrafter` attribute of that name)."""

    #: the vocabulary the drafter drafts token ids from (the engine refuses a target that predicts another size);
    #: None: whatever the target's
    vocab_size: int | None
    #: deepest tree this drafter can fill (None: unbounded)
    max_depth: int | None
    #: the engine hands the target's hidden states of every forward (`TargetRows`)
    needs_target_hidden_states: bool
    #: this drafter builds a `DynamicTree` per step besides filling a static `TreeSpec`
    fills_dynamic_tree: bool
    #: the target's top-k per verified position the drafter reads (0: none)
    verified_top_k: int
    #: decoder layer whose input states `prune_batch` reads (None: no pruning)
    pruning_layer: int | None
    #: `propose_batch` may be left out for some rows on some steps (see `TreeDrafter.proposals_optional`)
    proposals_optional: bool = False
    #: each draft is the tree this drafter would verify alone, priced on the target's cost curve (see
    #: `TreeDrafter.prices_own_draft`)
    prices_own_draft: bool = False


class TreeDrafter(ABC):  # noqa: B024  (no abstract method: a drafter implements the batched or the per-row API)
    """Base class of every drafter's per-call state (see the module docstring)."""

    #: ask the engine for the target's hidden states of the verification forward
    needs_target_hidden_states: bool = False
    #: deepest tree this drafter can fill (None: unbounded)
    max_depth: int | None = None
    #: the tree used when the call gives no ``speculative_tree``
    default_tree: TreeSpec | DynamicTree | None = None
    #: this drafter builds a `DynamicTree` per step (EAGLE-2) besides filling a static `TreeSpec`
    fills_dynamic_tree: bool = False
    #: drafters with a cost-aware default tree set ``batch_tree(batch_size) -> TreeSpec`` at construction (see
    #: `tree_for_batch`)
    batch_tree = None
    #: the vocabulary the drafter drafts token ids from (None: whatever the target's); the engine checks it
    vocab_size: int | None = None
    #: how many of the target's most likely next tokens per verified position this drafter reads
    #: (``TargetRows.top_k``; Token Recycling learns from them); 0: none, and the engine computes no extra logits
    verified_top_k: int = 0
    #: decoder layer whose input states `prune_batch` reads to drop nodes inside the verification forward (None: no
    #: pruning; Speculative Streaming's parallel tree pruning, Sec. 3.1.3)
    pruning_layer: int | None = None
    #: the drafter's state follows the committed sequence through `advance_batch` alone (a drafter with its own cache
    #: catches up on the committed tokens when it next drafts), so a drafter that merges several (`HybridDrafter`) may
    #: leave out its `propose_batch` for some rows on some steps, when its drafting would not pay
    proposals_optional: bool = False
    #: every draft `propose_batch` returns is already the tree this drafter would verify alone, sized on the target's
    #: cost curve by the drafter's own scores (SuffixDecoding), even when a `HybridDrafter` gives it a larger budget;
    #: on a row where it is the only part that drafted, the hybrid verifies that draft as it is
    prices_own_draft: bool = False
    #: the long-lived object whose step prices (`hf_speculative.engine.step_pricing`) are kept across calls: a drafter
    #: model makes a new `TreeDrafter` per call, so `resolve_drafter` sets the model here (None: this drafter)
    pricing_owner: object | None = None
    #: the drafter keeps what it saw across calls (Token Recycling's matrix, SuffixDecoding's outputs), so a second
    #: call on the same prompt drafts from the first call's answer; `hf-speculative bench` times its first call only
    learns_across_calls: bool = False

    def attach_target(self, target) -> None:  # noqa: B027  (optional hook: most drafters ignore the target)
        """Called once per `generate` call, before anything else, with the target model (never to run it: only
        the engine runs the target). Drafters that size their tree by the target's cost curve read it here."""

    @property
    def capabilities(self) -> DrafterCapabilities:
        """What this drafter declares (its attributes of those names), read without running anything."""
        return DrafterCapabilities(
            vocab_size=self.vocab_size,
            max_depth=self.max_depth,
            needs_target_hidden_states=bool(self.needs_target_hidden_states),
            fills_dynamic_tree=bool(self.fills_dynamic_tree),
            verified_top_k=int(self.verified_top_k),
            pruning_layer=self.pruning_layer,
            proposals_optional=bool(self.proposals_optional),
            prices_own_draft=bool(self.prices_own_draft),
        )

    def tree_for_batch(self, batch_size: int) -> TreeSpec | DynamicTree | None:
        """The tree of a call over ``batch_size`` rows when it gives no ``speculative_tree``: `default_tree`, or
        for a cost-aware drafter the tree that pays off at that batch size (smaller as B grows). Pure: computed on
        each call (the engine asks once per `generate` call), nothing is stored."""
        if batch_size == 1 or self.batch_tree is None:
            return self.default_tree
        return self.batch_tree(batch_size=batch_size)

    def candidate_tree(self, num_nodes: int) -> TreeSpec | None:
        """The ``num_nodes`` nodes most likely to be accepted, whatever they cost, for a drafter that merges
        several drafters' trees and prices the merged tree itself (`HybridDrafter`); None (the default): this
        drafter offers its own tree, `tree_for_batch`."""
        return None

    def draft_modules(self) -> tuple[torch.nn.Module, ...]:
        """The networks this drafter runs while it drafts (EAGLE's decoder layer and head): the engine runs their linear
        layers through its kernels, as it runs the target's (`SpeedPolicy.drafting_kernels`). Default: none."""
        return ()

    def draft_cost(self, curve) -> float | Sequence[float]:
        """This drafter's cost per step in plain target steps on the target's cost curve (a
        `hf_speculative.perf_model.CostCurve`): a number, or one number per tree depth (index: depth - 1). The
        default 0.0: drafting costs nothing worth pricing (prompt lookup, Token Recycling)."""
        return 0.0

    def begin_batch(self, prompts: list[torch.LongTensor], target_outputs: TargetRows) -> None:
        """Reset state for a call over ``len(prompts)`` rows."""
        raise NotImplementedError(_HINT.format(type(self).__name__))

    def propose_batch(
        self, sequences: list[torch.LongTensor], rows: list[int], tree: TreeSpec, options: DraftingOptions
    ) -> list[DraftTree]:
        """One draft per row (``sequences[j]`` is the committed sequence of original row ``rows[j]``)."""
        raise NotImplementedError(_HINT.format(type(self).__name__))

    def prune_batch(self, states: torch.Tensor, drafts: list[DraftTree]) -> list[list[int]] | None:
        """With `pruning_layer` set: the nodes of each row's draft that stay (ascending, closed under ancestors),
        from the states ``(A, n, H)`` entering decoder layer `pruning_layer` of the verification forward; None
        keeps every node. The engine applies the answer inside its one forward (`hf_speculative.engine.tree_forward`)."""
        return None

    def advance_batch(
        self,
        sequences: list[torch.LongTensor],
        rows: list[int],
        drafts: list[DraftTree],
        results: list[AcceptanceResult],
        target_outputs: TargetRows,
    ) -> None:
        """Bring each continuing row's state in step with its committed sequence (entry j: ``target_outputs.row(j)``)."""
        raise NotImplementedError(_HINT.format(type(self).__name__))

    def end_batch(self) -> None:  # noqa: B027  (optional hook: drafters without per-call state keep none)
        """Release the call's state (every row's)."""


_HINT = (
    "{} implements no batched drafting: subclass OneRowDrafter and implement begin / propose / advance / end (the "
    "engine runs them once per row), or implement begin_batch / propose_batch / advance_batch / end_batch"
)


class OneRowDrafter(TreeDrafter):
    """The engine's adapter for a drafter written for one sequence: a subclass implements ``begin`` / ``propose`` /
    ``advance`` / ``end``, and the batched contract runs them once per row, on a shallow copy of the drafter per row
    (the drafter itself for a single row). Safe when ``begin`` *assigns* fresh per-call state (a new cache, new
    tensors) rather than mutating shared objects in place. A subclass may still override a batched method to draft
    every row at once (Medusa heads: one head forward over B hidden states)."""

    def begin(self, prompt_ids: torch.LongTensor, target_outputs) -> None:
        """Reset state for a new call; ``target_outputs`` is the target's prefill output for this row."""

    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        """The draft for the committed ``sequence`` (shape ``(1, L)``; the root is its last token)."""
        raise NotImplementedError(f"{type(self).__name__} implements no propose")

    def advance(self, sequence: torch.LongTensor, draft: DraftTree, result: AcceptanceResult, target_outputs) -> None:
        """Bring the drafter's state in step with the committed ``sequence`` after a verification."""

    def end(self) -> None:
        """Release per-call state."""

    def row_drafter(self, row: int) -> "OneRowDrafter":
        """The drafter of original row ``row`` in the current call."""
        return self._row_drafters[row]

    def begin_batch(self, prompts: list[torch.LongTensor], target_outputs: TargetRows) -> None:
        rows = {0: self} if len(prompts) == 1 else {j: copy.copy(self) for j in range(len(prompts))}
        self._row_drafters = rows
        for j, prompt in enumerate(prompts):
            rows[j].begin(prompt, target_outputs.row(j))

    def propose_batch(self, sequences, rows, tree, options) -> list[DraftTree]:
        return [self.row_drafter(r).propose(seq, tree, options) for seq, r in zip(sequences, rows)]

    def advance_batch(self, sequences, rows, drafts, results, target_outputs: TargetRows) -> None:
        for j, r in enumerate(rows):
            self.row_drafter(r).advance(sequences[j], drafts[j], results[j], target_outputs.row(j))

    def end_batch(self) -> None:
        rows = self.__dict__.pop("_row_drafters", {})
        for drafter in rows.values():
            drafter.end()
        if all(d is not self for d in rows.values()):
            self.end()
