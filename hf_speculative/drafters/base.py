"""The one interface between a drafter and the tree engine.

A `TreeDrafter` holds one `generate()` call's drafting state. The engine calls, in order:

1. ``begin(prompt_ids, target_outputs)`` after the target's prefill forward;
2. per step ``propose(sequence, tree, options) -> DraftTree``: the draft whose root is ``sequence[0, -1]``;
   then ``verify(target, draft, **forward_kwargs)`` runs the target's verification forward (the plain
   forward unless the drafter prunes the tree inside it);
3. per step ``advance(sequence, draft, result, target_outputs)`` once the accepted tokens are committed,
   with the verification forward's outputs (its hidden states when ``needs_target_hidden_states``).

The engine never branches on the kind of drafter: Medusa heads, ParallelSpec, SPIRe and a plain causal
LM differ only in how they implement these three calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..trees import DraftTree, DynamicTree, TreeSpec
from ..verify import AcceptanceResult

__all__ = [
    "DraftingOptions",
    "TreeDrafter",
    "fill_children",
    "tree_from_depth_logits",
    "vocab_logits",
    "final_hidden_state",
    "output_embeddings",
    "input_embeddings",
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
    #: "typical" to use Medusa's typical acceptance when sampling (lossy); None for exact acceptance
    acceptance: str | None = None
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3

    def begin(self, prompt_ids: torch.LongTensor, target_outputs) -> None:
        """Reset state for a new call; ``target_outputs`` is the target's prefill output."""

    @abstractmethod
    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        """This step's draft for the committed ``sequence`` (shape ``(1, L)``; the root is its last token)."""

    def verify(self, target, draft: DraftTree, **forward_kwargs) -> tuple[object, DraftTree]:
        """The target's verification forward over ``draft`` (``forward_kwargs``: the tree's ``input_ids``,
        attention mask, position ids, cache); returns the outputs and the draft they verified. A drafter may
        verify a pruned draft here (Speculative Streaming's parallel tree pruning, Sec. 3.1.3), returning
        its outputs over the kept nodes only (cache included) and the pruned `DraftTree`."""
        return target(**forward_kwargs), draft

    def advance(self, sequence: torch.LongTensor, draft: DraftTree, result: AcceptanceResult, target_outputs) -> None:
        """Bring the drafter's state in step with the committed ``sequence`` after a verification."""

    def end(self) -> None:
        """Release per-call state."""


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


def vocab_logits(states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(states, weight)`` for drafting: a few rows through a large, bias-free vocabulary projection.

    Drafters project a handful of rows per step (K Medusa heads, k+1 ParallelSpec positions, gamma
    streams). CPU BLAS runs ``linear`` with 2-16 rows against a 49k x 576 weight about 2x slower than
    ``(W @ x^T)^T`` (measured on this project's 2-core machine: 48 ms against 25 ms for 5 rows), so
    without autograd the transposed product is used; otherwise (training, one row, many rows) ``linear``.
    """
    x = states.to(weight.dtype)
    rows = x.reshape(-1, x.shape[-1])
    if 1 < rows.shape[0] <= 16 and not torch.is_grad_enabled():
        return (weight @ rows.T).T.reshape(*x.shape[:-1], weight.shape[0])
    return torch.nn.functional.linear(x, weight)


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
