"""The one interface between a drafter and the tree engine. Only the engine runs the target; a drafter proposes
trees and learns from what the engine verified (see docs/drafter_protocol.md for a complete example drafter).

A `TreeDrafter` holds one `generate()` call's drafting state. **The batched contract** (what the engine calls; a
batch of B left-padded prompts, B = 1 included):

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
on the prefill), its cache the row's real cached tokens only (`hf_speculative.rows`).

**Drafting one row at a time.** A drafter written for one sequence sets ``drafts_one_row = True`` and implements
``begin`` / ``propose`` / ``advance`` / ``end``; the engine then loops over the rows (`RowLoop`: a shallow copy of
the drafter per row, the drafter itself for a single row), so it works for any batch provided its ``begin``
*assigns* fresh per-call state rather than mutating shared objects in place. A drafter that drafts all rows at once
implements the ``*_batch`` methods (Medusa heads: one head forward over B hidden states; Token Recycling).

The engine never branches on the kind of drafter.
"""

from __future__ import annotations

import copy
from abc import ABC

import torch

from ..acceptance import AcceptanceResult
from ..rows import TargetRows
from ..trees import DraftingOptions, DraftTree, DynamicTree, TreeSpec, fill_children

__all__ = [
    "DraftingOptions",
    "TreeDrafter",
    "fill_children",
    "final_hidden_state",
    "output_embeddings",
    "input_embeddings",
    "sparse_visibility",
    "streaming_keep",
    "streaming_slots",
    "chain_nodes",
    "ChainTreeFiller",
    "ChainDrafting",
    "RowLoop",
    "batched",
    "require_mask_attention",
]


class TreeDrafter(ABC):
    """Base class of every drafter's per-call state (see the module docstring)."""

    #: ask the engine for the target's hidden states of the verification forward
    needs_target_hidden_states: bool = False
    #: deepest tree this drafter can fill (None: unbounded)
    max_depth: int | None = None
    #: the tree used when the call gives no ``speculative_tree``
    default_tree: TreeSpec | DynamicTree | None = None
    #: this drafter builds a `DynamicTree` per step (EAGLE-2) besides filling a static `TreeSpec`
    fills_dynamic_tree: bool = False
    #: the drafter drafts one row at a time: it implements ``begin`` / ``propose`` / ``advance`` / ``end`` for one
    #: sequence and the engine loops over the rows (`RowLoop`); False: it implements the ``*_batch`` methods
    drafts_one_row: bool = False
    #: drafters with a cost-aware default tree set ``batch_tree(batch_size) -> TreeSpec`` (see `tree_for_batch`)
    batch_tree = None
    #: how many of the target's most likely next tokens per verified position this drafter reads
    #: (``TargetRows.top_k``; Token Recycling learns from them); 0: none, and the engine computes no extra logits
    verified_top_k: int = 0
    #: decoder layer whose input states `prune_batch` reads to drop nodes inside the verification forward (None: no
    #: pruning; Speculative Streaming's parallel tree pruning, Sec. 3.1.3)
    pruning_layer: int | None = None

    def attach_target(self, target) -> None:
        """Called once per `generate` call, before anything else, with the target model (never to run it: only
        the engine runs the target). Drafters that size their tree by the target's cost curve read it here."""

    def tree_for_batch(self, batch_size: int) -> TreeSpec | None:
        """The tree of a call over ``batch_size`` rows when it gives no ``speculative_tree``: `default_tree`, or
        for a cost-aware drafter the tree that pays off at that batch size (smaller as B grows), cached per B."""
        if batch_size == 1 or self.batch_tree is None:
            return self.default_tree
        trees = self.__dict__.setdefault("_batch_trees", {})
        if batch_size not in trees:
            trees[batch_size] = self.batch_tree(batch_size=batch_size)
        return trees[batch_size]

    def begin(self, prompt_ids: torch.LongTensor, target_outputs) -> None:
        """Reset state for a new call; ``target_outputs`` is the target's prefill output."""

    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        """A one-row drafter's draft for the committed ``sequence`` (shape ``(1, L)``; the root is its last token)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither propose (with drafts_one_row = True) nor propose_batch")

    def prune_batch(self, states: torch.Tensor, drafts: list[DraftTree]) -> list[list[int]] | None:
        """With `pruning_layer` set: the nodes of each row's draft that stay (ascending, closed under ancestors),
        from the states ``(A, n, H)`` entering decoder layer `pruning_layer` of the verification forward; None
        keeps every node. The engine applies the answer inside its one forward (`hf_speculative.tree_forward`)."""
        return None

    def advance(self, sequence: torch.LongTensor, draft: DraftTree, result: AcceptanceResult, target_outputs) -> None:
        """Bring the drafter's state in step with the committed ``sequence`` after a verification."""

    def end(self) -> None:
        """Release per-call state."""

    # ------------------------------------------------------------------ the batched contract (module docstring)
    def begin_batch(self, prompts: list[torch.LongTensor], target_outputs: TargetRows) -> None:
        """Reset state for a call over ``len(prompts)`` rows."""
        raise NotImplementedError(_ONE_ROW_HINT.format(type(self).__name__))

    def propose_batch(
        self, sequences: list[torch.LongTensor], rows: list[int], tree: TreeSpec, options: DraftingOptions
    ) -> list[DraftTree]:
        """One draft per row (``sequences[j]`` is the committed sequence of original row ``rows[j]``)."""
        raise NotImplementedError(_ONE_ROW_HINT.format(type(self).__name__))

    def advance_batch(
        self,
        sequences: list[torch.LongTensor],
        rows: list[int],
        drafts: list[DraftTree],
        results: list[AcceptanceResult],
        target_outputs: TargetRows,
    ) -> None:
        """Bring each continuing row's state in step with its committed sequence (entry j: ``target_outputs.row(j)``)."""
        raise NotImplementedError(_ONE_ROW_HINT.format(type(self).__name__))

    def end_batch(self) -> None:
        """Release the call's state (every row's)."""


_ONE_ROW_HINT = (
    "{} implements no batched drafting: set drafts_one_row = True to have the engine call begin / propose / advance "
    "/ end once per row, or implement begin_batch / propose_batch / advance_batch / end_batch"
)


class RowLoop:
    """The batched methods of a one-row drafter (``drafts_one_row = True``): ``begin`` / ``propose`` / ``advance`` /
    ``end`` once per row, on a shallow copy of the drafter per row (the drafter itself for a single row). Safe when
    the drafter's ``begin`` *assigns* fresh per-call state (a new cache, new tensors) rather than mutating shared
    objects in place. Every other attribute is the drafter's."""

    def __init__(self, drafter: TreeDrafter):
        self.drafter = drafter
        self.rows: dict[int, TreeDrafter] = {}

    def __getattr__(self, name: str):
        return getattr(self.__dict__["drafter"], name)

    def row(self, row: int) -> TreeDrafter:
        """The drafter of original row ``row``."""
        return self.rows[row]

    def begin_batch(self, prompts: list[torch.LongTensor], target_outputs: TargetRows) -> None:
        self.rows = {0: self.drafter} if len(prompts) == 1 else {j: copy.copy(self.drafter) for j in range(len(prompts))}
        for j, prompt in enumerate(prompts):
            self.rows[j].begin(prompt, target_outputs.row(j))

    def propose_batch(self, sequences, rows, tree, options) -> list[DraftTree]:
        return [self.rows[r].propose(seq, tree, options) for seq, r in zip(sequences, rows)]

    def advance_batch(self, sequences, rows, drafts, results, target_outputs: TargetRows) -> None:
        for j, r in enumerate(rows):
            self.rows[r].advance(sequences[j], drafts[j], results[j], target_outputs.row(j))

    def end_batch(self) -> None:
        for drafter in self.rows.values():
            drafter.end()
        if all(d is not self.drafter for d in self.rows.values()):
            self.drafter.end()
        self.rows = {}


def batched(drafter: TreeDrafter) -> "TreeDrafter | RowLoop":
    """What the engine calls for ``drafter``: the drafter itself, or for a one-row drafter its `RowLoop`."""
    return RowLoop(drafter) if drafter.drafts_one_row else drafter


class ChainDrafting:
    """The batched methods of a drafter that keeps one state per row but drafts every row's chain in one batched
    forward per depth (SPIRe, MagicDec): the rows' states are a `RowLoop`'s, and ``propose_batch`` calls its
    ``_propose(states, sequences, tree, options)`` with them."""

    def begin_batch(self, prompts, target_outputs) -> None:
        self._rows = RowLoop(self)
        self._rows.begin_batch(prompts, target_outputs)

    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        return self._propose([self], [sequence], tree, options)[0]

    def propose_batch(self, sequences, rows, tree, options) -> list[DraftTree]:
        return self._propose([self._rows.row(r) for r in rows], sequences, tree, options)

    def advance_batch(self, sequences, rows, drafts, results, target_outputs) -> None:
        self._rows.advance_batch(sequences, rows, drafts, results, target_outputs)

    def end_batch(self) -> None:
        self._rows.end_batch()
        self._rows = None


def require_mask_attention(model, role: str, mask: str, fix: str) -> None:
    """A `ValueError` unless ``model`` runs eager or sdpa attention, the implementations that take a custom ``mask``."""
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl not in ("eager", "sdpa"):
        raise ValueError(
            f"{role} uses attn_implementation={impl!r}, which cannot take {mask}; call `{fix}.set_attn_implementation('sdpa')` "
            "(or 'eager') first"
        )


def final_hidden_state(outputs) -> torch.Tensor:
    """The state the target's ``lm_head`` consumes: in transformers 5 causal LMs the last element of
    ``outputs.hidden_states`` is the output of the final norm (tested: ``lm_head(h) == logits``)."""
    if getattr(outputs, "hidden_states", None) is None:
        raise ValueError("this drafter needs the target's hidden states (output_hidden_states=True)")
    return outputs.hidden_states[-1]


def output_embeddings(model, needed_by: str = "this drafter") -> torch.nn.Module:
    """``model``'s ``lm_head``; a `TypeError` naming ``needed_by`` when it has none."""
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if lm_head is None or getattr(lm_head, "weight", None) is None:
        raise TypeError(f"{type(model).__name__} has no output embeddings (lm_head): {needed_by} needs a causal LM target")
    return lm_head


def input_embeddings(model, needed_by: str = "this drafter") -> torch.nn.Module:
    """``model``'s token embeddings; a `TypeError` naming ``needed_by`` when it has none."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is None:
        raise TypeError(f"{type(model).__name__} has no input embeddings: {needed_by} needs a causal LM target")
    return emb


# ----------------------------------------------------------------------------- StreamingLLM sparse caches (SPIRe, MagicDec)


def streaming_keep(positions: torch.Tensor, next_position: int | torch.Tensor, window: int, sinks: int) -> torch.Tensor:
    """StreamingLLM's sparse KV cache (Xiao et al., "Efficient Streaming Language Models with Attention Sinks"): which
    of the keys at text ``positions`` a query at ``next_position`` still sees: the ``sinks`` first positions and the
    last ``window - 1`` positions before it (the query itself is the window's last entry)."""
    return (positions < sinks) | (positions > next_position - window)


def sparse_visibility(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int, sinks: int) -> torch.Tensor:
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


# ----------------------------------------------------------------------------- chains drafted one token per forward


def chain_nodes(tree: TreeSpec) -> list[int] | None:
    """The chain of a `chain_with_alternatives`-shaped tree: node ids of the root and its rank-0 descendants, when
    those are the tree's only inner nodes; None for another shape."""
    chain = [0]
    while True:
        kids = tree.children[chain[-1]]
        first = [c for c in kids if tree.ranks[c] == 0]
        if not first or not tree.children[first[0]]:
            break
        chain.append(first[0])
    inner = {i for i, kids in enumerate(tree.children) if kids}
    return chain if inner <= set(chain) else None


class ChainTreeFiller:
    """Fills one row's static tree from a chain drafted one token per forward (SPIRe's and MagicDec's drafting).

    For a `chain_with_alternatives`-shaped tree (a chain, or a chain with siblings as leaves) the chain node at depth
    d gets its children from its own distribution: its top-i (greedy) or draws from it (sampling; the chain goes on
    with the first draw), q kept per node for exact tree rejection sampling. Another shape is filled from the chain's
    per-depth distributions by `TreeSpec.fill` (the chain goes on with each depth's argmax).

    Usage: for d in ``range(filler.num_forwards)``, ``next_token = filler(d, logits)`` with the chain node's logits
    ``(vocab,)``; then ``filler.draft_tree()``.
    """

    def __init__(self, sequence: torch.LongTensor, tree: TreeSpec, scheme: str, options: DraftingOptions, vocab_size: int):
        self.sequence, self.tree, self.scheme, self.options = sequence, tree, scheme, options
        self.chain = chain_nodes(tree)
        self.rows: list[torch.Tensor] = []
        if self.chain is None:
            self.num_forwards = tree.depth
            return
        self.num_forwards = len(self.chain)
        self.tokens = torch.empty(tree.num_nodes + 1, dtype=torch.long, device=sequence.device)
        self.tokens[0] = sequence[0, -1]
        self.probs = None if scheme == "deterministic" else torch.zeros(tree.num_nodes + 1, vocab_size, device=sequence.device)

    def __call__(self, d: int, logits: torch.Tensor) -> torch.Tensor:
        """Depth d's chain node's logits; returns the chain's token at depth d + 1."""
        if self.chain is None:
            self.rows.append(logits)
            return logits.argmax()
        tree = self.tree
        kids = list(tree.children[self.chain[d]])
        chosen, q = fill_children(logits, 1 + max(tree.ranks[kid] for kid in kids), self.scheme, self.options)
        for kid in kids:
            self.tokens[kid] = chosen[tree.ranks[kid]]
        if self.probs is not None:
            self.probs[self.chain[d]] = q.to(self.probs.device)
        return chosen[0]

    def draft_tree(self) -> DraftTree:
        if self.chain is None:
            return self.tree.fill(torch.stack(self.rows), self.sequence[0, -1], self.scheme, self.options)
        return DraftTree.from_spec(self.tree, self.tokens, draft_probs=self.probs, sampling=self.scheme)
