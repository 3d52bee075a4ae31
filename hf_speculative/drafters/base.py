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

**Drafting one row at a time.** The default batched methods call ``begin`` / ``propose`` / ``advance`` / ``end``
once per row, on a shallow copy of the drafter per row (on the drafter itself for a single row). So a drafter
written for batch 1 works for any batch, provided its ``begin`` *assigns* fresh per-call state (a new cache, new
tensors) rather than mutating shared objects in place. A drafter that drafts all rows at once overrides the
``*_batch`` methods (Medusa heads: one head forward over B hidden states).

The engine never branches on the kind of drafter.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..acceptance import AcceptanceResult
from ..rows import TargetRows
from ..trees import DraftTree, DynamicTree, TreeSpec

__all__ = [
    "DraftingOptions",
    "TreeDrafter",
    "fill_children",
    "tree_from_depth_logits",
    "final_hidden_state",
    "output_embeddings",
    "input_embeddings",
    "sparse_visibility",
    "streaming_keep",
    "streaming_slots",
    "chain_nodes",
    "ChainTreeFiller",
    "ChainDrafting",
    "require_mask_attention",
]


@dataclass
class DraftingOptions:
    """How this call wants candidates drawn (taken from the generation config)."""

    do_sample: bool = False
    temperature: float = 1.0
    generator: torch.Generator | None = None

    def scheme(self, draft_sampling: str) -> str:
        """The `DraftTree.sampling` scheme: a drafter's own choice when sampling, top-k when greedy."""
        return draft_sampling if self.do_sample else "deterministic"


class TreeDrafter(ABC):
    """Base class of every drafter's per-call state (see the module docstring)."""

    #: ask the engine for the target's hidden states of the verification forward
    needs_target_hidden_states: bool = False
    #: deepest tree this drafter can fill (None: unbounded)
    max_depth: int | None = None
    #: the tree used when the call gives no ``speculative_tree``
    default_tree: TreeSpec | None = None
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

    @abstractmethod
    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        """This step's draft for the committed ``sequence`` (shape ``(1, L)``; the root is its last token)."""

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
    _per_row: dict[int, "TreeDrafter"] | None = None

    def _row_drafter(self, row: int) -> "TreeDrafter":
        return self if self._per_row is None else self._per_row[row]

    def begin_batch(self, prompts: list[torch.LongTensor], target_outputs: TargetRows) -> None:
        """Reset state for a call over ``len(prompts)`` rows. Default: `begin` per row, on a shallow copy of the
        drafter per row (on the drafter itself for a single row)."""
        if len(prompts) == 1:
            self._per_row = None
            self.begin(prompts[0], target_outputs.row(0))
            return
        per_row = {}
        for j, prompt in enumerate(prompts):
            drafter = copy.copy(self)
            drafter._per_row = None
            drafter.begin(prompt, target_outputs.row(j))
            per_row[j] = drafter
        self._per_row = per_row

    def propose_batch(
        self, sequences: list[torch.LongTensor], rows: list[int], tree: TreeSpec, options: DraftingOptions
    ) -> list[DraftTree]:
        """One draft per row (``sequences[j]`` is the committed sequence of original row ``rows[j]``)."""
        return [self._row_drafter(r).propose(seq, tree, options) for seq, r in zip(sequences, rows)]

    def advance_batch(
        self,
        sequences: list[torch.LongTensor],
        rows: list[int],
        drafts: list[DraftTree],
        results: list[AcceptanceResult],
        target_outputs: TargetRows,
    ) -> None:
        """Bring each continuing row's state in step with its committed sequence (entry j: ``target_outputs.row(j)``)."""
        for j, r in enumerate(rows):
            self._row_drafter(r).advance(sequences[j], drafts[j], results[j], target_outputs.row(j))

    def end_batch(self) -> None:
        """Release the call's state (every row's)."""
        for drafter in (self._per_row or {}).values():
            drafter.end()
        self._per_row = None
        self.end()


class ChainDrafting:
    """`TreeDrafter.propose` / `propose_batch` of a drafter that drafts every row's chain in one batched forward per
    depth (SPIRe, MagicDec): both call its ``_propose(states, sequences, tree, options)`` with the rows' states."""

    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        return self._propose([self], [sequence], tree, options)[0]

    def propose_batch(self, sequences, rows, tree, options) -> list[DraftTree]:
        return self._propose([self._row_drafter(r) for r in rows], sequences, tree, options)


def require_mask_attention(model, role: str, mask: str, fix: str) -> None:
    """A `ValueError` unless ``model`` runs eager or sdpa attention, the implementations that take a custom ``mask``."""
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl not in ("eager", "sdpa"):
        raise ValueError(
            f"{role} uses attn_implementation={impl!r}, which cannot take {mask}; call `{fix}.set_attn_implementation('sdpa')` "
            "(or 'eager') first"
        )


def fill_children(
    logits: torch.Tensor, num_children: int, scheme: str, options: DraftingOptions, probs: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Ranked candidates for one parent from the drafter's logits ``(vocab,)``.

    ``scheme`` is a `DraftTree.sampling` value. ``"deterministic"``: the top-k tokens. Sampling: ``q = softmax(logits / T)`` and k draws,
    without replacement by the Gumbel-top-k trick (the i-th is a draw from q without the first i-1) or
    with replacement. ``probs``: q when the caller already has it (several parents drawing from one row).
    Returns the tokens and q (None when deterministic).
    """
    k = min(num_children, logits.shape[-1])
    if scheme == "deterministic":
        return torch.topk(logits, k).indices, None
    q = probs if probs is not None else torch.softmax(logits.float() / max(options.temperature, 1e-5), dim=-1)
    if scheme == "with_replacement":
        return torch.multinomial(q, num_children, replacement=True, generator=options.generator), q
    u = torch.rand(q.shape, generator=options.generator, device=q.device).clamp_(1e-20, 1.0)
    gumbel = torch.log(q) - torch.log(-torch.log(u))
    return torch.topk(gumbel, k).indices, q


def tree_from_depth_logits(
    logits: torch.Tensor, sequence: torch.LongTensor, tree: TreeSpec, scheme: str, options: DraftingOptions
) -> DraftTree:
    """Fill a static tree from one distribution per depth (row d drafts depth d + 1), whatever the parent.

    The drafting rule of Medusa heads, ParallelSpec's mask positions and Speculative Streaming's streams.
    ``"deterministic"``: the node of depth d and rank i gets row d - 1's i-th most likely token (Medusa's
    Cartesian / sparse trees). Sampling: every inner node's children are drawn from its depth's q by
    `fill_children`, and q is kept per node for exact tree rejection sampling.

    A `DynamicTree` is built from the rows' own probabilities instead (EAGLE-2), with top-k candidates in
    every mode (see `DynamicTree`).
    """
    if isinstance(tree, DynamicTree):
        return tree.build(torch.log_softmax(logits[: tree.depth].float(), dim=-1), sequence[0, -1])
    device = sequence.device
    depths = tree.depths.tolist()
    if scheme == "deterministic":
        width = max(tree.ranks[1:]) + 1
        top = torch.topk(logits[: tree.depth], min(width, logits.shape[-1]), dim=-1).indices  # (depth, width)
        idx = torch.tensor(depths[1:], device=top.device) - 1
        rank = torch.tensor(tree.ranks[1:], device=top.device)
        tokens = torch.cat([sequence[0, -1:].to(top.device), top[idx, rank]]).to(device)
        return DraftTree.from_spec(tree, tokens, sampling=scheme)
    n = tree.num_nodes + 1
    tokens = torch.empty(n, dtype=torch.long, device=device)
    tokens[0] = sequence[0, -1]
    probs = torch.zeros(n, logits.shape[-1], device=device)
    per_depth = torch.softmax(logits[: tree.depth].float() / max(options.temperature, 1e-5), dim=-1)  # q once per depth
    for node, kids in enumerate(tree.children):
        if kids:
            chosen, q = fill_children(logits[depths[node]], len(kids), scheme, options, probs=per_depth[depths[node]])
            tokens[list(kids)] = chosen.to(device)
            probs[node] = q.to(device)
    return DraftTree.from_spec(tree, tokens, draft_probs=probs, sampling=scheme)


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
    per-depth distributions by `tree_from_depth_logits` (the chain goes on with each depth's argmax).

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
            return tree_from_depth_logits(torch.stack(self.rows), self.sequence, self.tree, self.scheme, self.options)
        return DraftTree.from_spec(self.tree, self.tokens, draft_probs=self.probs, sampling=self.scheme)
