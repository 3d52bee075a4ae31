"""Parallel tree pruning (Speculative Streaming, Sec. 3.1.3): drop unlikely tree nodes halfway through the
verification forward.

The tree draft enters the target's forward whole. After ``pruning_layer`` (l) decoder layers, an early exit
(the base's final norm and ``lm_head`` on the layer-l state plus a rank-theta adapter) gives every inner node
a cheap estimate of the next-token distribution, so every node gets an estimated transition probability
``p_l(token | parent)``. Nodes below ``pruning_threshold`` are pruned together with their subtrees, and
layers l..N-1 (the MSA layers among them) run on the kept nodes only. The layers below l have already
cached keys/values for every node; they are compacted to the kept nodes before the upper layers run, so at
the end of the forward every layer caches exactly the kept nodes (the paper's lazy backtracking, done before
the step's acceptance instead of after it).

Pruning only removes candidates; every kept node is still verified by the full model with exactly its
ancestors visible, so greedy output is unchanged. Removing sampled candidates by a rule on their tokens would
bias tree rejection sampling, so pruning applies to greedy drafts only.

Training the early exit is in `training_pruning` (it needs the Trainer stack, which inference does not).
"""

from __future__ import annotations


import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..._compat import cache_arg, takes_cache
from ...cache import keep_path
from ...trees import DraftTree
from ..base import vocab_logits

__all__ = [
    "early_exit_states",
    "transition_probabilities",
    "prune_tree",
    "pruned_verify_forward",
]


def early_exit_states(ss, hidden: torch.Tensor) -> torch.Tensor:
    """Final-normed early-exit states of layer-l states ``(..., H)``: ``norm(h + adapter_theta(h))``."""
    adapter = ss.streams.pruning
    h = hidden.to(ss.lm_head.weight.dtype)
    return ss.model.norm(h + adapter(h))


def transition_probabilities(ss, hidden: torch.Tensor, draft: DraftTree) -> torch.Tensor:
    """``(n,)`` estimated ``p_l(token_i | parent_i)`` of every node from the layer-l states ``(n, H)`` of the
    tree nodes (1 at the root); the vocabulary projection runs on the inner nodes only."""
    n = len(draft)
    probs = torch.ones(n, device=hidden.device)
    if n == 1:
        return probs
    inner = sorted(set(draft.parents[1:]))
    row = {node: i for i, node in enumerate(inner)}
    logits = vocab_logits(early_exit_states(ss, hidden[inner]), ss.lm_head.weight).float()
    log_probs = torch.log_softmax(logits, dim=-1)
    rows = torch.tensor([row[p] for p in draft.parents[1:]], device=hidden.device)
    probs[1:] = log_probs[rows, draft.tokens[1:].to(hidden.device)].exp()
    return probs


def prune_tree(draft: DraftTree, probs: torch.Tensor, threshold: float) -> list[int]:
    """Ascending indices of the nodes kept: the root, and every node whose parent is kept and whose
    transition probability ``probs[i]`` is at least ``threshold`` (a pruned node takes its subtree along)."""
    kept = [0]
    alive = [True] + [False] * (len(draft) - 1)
    for node in range(1, len(draft)):
        parent = draft.parents[node]
        if parent >= node:
            raise ValueError("prune_tree needs every parent listed before its children")
        if alive[parent] and float(probs[node]) >= threshold:
            alive[node] = True
            kept.append(node)
    return kept


@torch.no_grad()
@takes_cache
def pruned_verify_forward(
    ss,
    draft: DraftTree,
    threshold: float,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor,
    position_ids: torch.LongTensor,
    cache,
    use_cache: bool = True,
    output_hidden_states: bool = False,
    logits_to_keep: int | torch.Tensor = 0,
) -> tuple[CausalLMOutputWithPast, DraftTree]:
    """The base model's verification forward over ``draft`` with parallel tree pruning after layer l.

    ``attention_mask`` is the tree's additive 4D mask ``(1, 1, n, past + n)``. Returns the outputs over the
    kept nodes (``hidden_states``: the input of every decoder layer and the final-normed state, as the base
    model's) and the pruned draft they belong to.
    """
    decoder = ss.model
    layers = decoder.layers[: ss.config.num_hidden_layers]
    split = ss.config.pruning_layer
    past = cache.get_seq_length()
    hidden = decoder.embed_tokens(input_ids)
    cos, sin = decoder.rotary_emb(hidden, position_ids)
    inputs: list[torch.Tensor] = []

    def run(block, hidden, mask, positions, rotary):
        for layer in block:
            inputs.append(hidden)
            hidden = layer(hidden, attention_mask=mask, position_ids=positions, **cache_arg(cache), use_cache=True, position_embeddings=rotary)
        return hidden

    hidden = run(layers[:split], hidden, attention_mask, position_ids, (cos, sin))
    keep = prune_tree(draft, transition_probabilities(ss, hidden[0], draft), threshold)
    if len(keep) < len(draft):
        keep_path(cache, past, keep, num_layers=split)
        index = torch.tensor(keep, device=hidden.device)
        columns = torch.cat([torch.arange(past, device=hidden.device), past + index])
        attention_mask = attention_mask[:, :, index][..., columns]
        position_ids, cos, sin, hidden = position_ids[:, index], cos[:, index], sin[:, index], hidden[:, index]
        inputs[:] = [h[:, index] for h in inputs]
        draft = draft.select(keep)
    hidden = decoder.norm(run(layers[split:], hidden, attention_mask, position_ids, (cos, sin)))
    keep_rows = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep  # as transformers does
    logits = ss.lm_head(hidden[:, keep_rows])
    states = (*inputs, hidden) if output_hidden_states else None
    return CausalLMOutputWithPast(logits=logits, **cache_arg(cache if use_cache else None), hidden_states=states), draft
