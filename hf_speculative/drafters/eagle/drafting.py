"""EAGLE's drafting inside the engine: the drafter rows of a step's tree (EAGLE Sec. 4.1's tree attention), for one
row or every row of a batch in the same forwards.

A step first runs the committed rows each row has not cached yet (`committed_rows`); the last one's output drafts
depth 1. A drafted node at depth d is a drafter row at position ``L - 2 + d`` fed its parent's output, attending to
its row's committed rows and to its ancestors' rows (`TreeRows`). Tree rows are dropped after the step.

A drafter forward over a few rows is memory-bound: it reads the decoder layer's weights once, whatever its row count.
So the rows of a batch draft together: one forward per depth for all of them (`propose_rows`), not one per row and
depth. Every row drafts the same static tree (the call's `TreeSpec`), so which tree rows a node attends to is the
same for all; only the committed lengths differ, and they are padded: row b's cached keys fill the first ``C_b``
columns of a ``(B, kv_heads, max C, head_dim)`` block and the additive mask hides the rest. Each row keeps its own
state in its `EagleTreeDrafter` (its features, its cache of committed rows, its draft vocabulary with the context
tokens of its prompt). EAGLE-2's dynamic tree is grown per row (`grow_dynamic`).
"""

from __future__ import annotations

import torch

from ...engine.trees import DraftTree, TreeSpec

__all__ = ["ROOT", "TreeRows", "committed_rows", "grow_dynamic", "propose_rows"]

#: the key of the root (the last committed token) among a step's tree nodes
ROOT = -1
#: a committed pass over more rows than this computes only its last row's output (`committed_rows`)
LAST_ROW_ONLY_FROM = 2


def _padded(parts: list[torch.Tensor | None], lengths: list[int], like: torch.Tensor) -> torch.Tensor:
    """``(B, heads, max length, d)``: each row's ``(1, heads, length, d)`` keys (or values) left-aligned, zeros
    after them; ``like`` gives the heads, head size, dtype and device. One row: its own tensor (no copy)."""
    if len(parts) == 1 and parts[0] is not None and parts[0].shape[2] == lengths[0]:
        return parts[0]
    block = like.new_zeros(len(parts), like.shape[1], max(lengths), like.shape[3])
    for b, (part, n) in enumerate(zip(parts, lengths)):
        if n:
            block[b, :, :n] = part[0, :, :n]
    return block


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean ``(B, T, S)`` visibility -> the additive ``(B, 1, T, S)`` mask the drafter takes."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[:, None]


def _past(drafters, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rows' cached keys and values padded to one block; None when no row has any."""
    if not max(lengths):
        return None
    like = next(d.kv[0] for d in drafters if d.kv is not None)
    keys = _padded([d.kv[0] if d.kv is not None else None for d in drafters], lengths, like)
    values = _padded([d.kv[1] if d.kv is not None else None for d in drafters], lengths, like)
    return keys, values


@torch.no_grad()
def committed_rows(drafters, sequences: list[torch.LongTensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run every row's uncached committed rows in one forward and extend each row's cache (row j = (x_{j+1}, f_j) at
    position j). Returns per row the last row's output and its logits over the draft vocabulary (they draft
    depth 1). Only the last row's output is computed (``output_rows``): the others are needed for their keys and
    values alone, so their queries, ``o_proj`` and MLP are skipped (on a prompt of a hundred rows, most of the pass;
    over more rows than `LAST_ROW_ONLY_FROM`: on fewer, picking the rows costs more than it saves)."""
    model = drafters[0].drafter
    device, dtype = model.fc.weight.device, model.fc.weight.dtype
    starts = [d.rows for d in drafters]
    news = [seq.shape[1] - 1 - s for seq, s in zip(sequences, starts)]
    B, T, P = len(drafters), max(news), max(starts)
    last_only = T > LAST_ROW_ONLY_FROM  # the pass computes one output per row (``output_rows``)
    ids = torch.zeros(B, T, dtype=torch.long, device=device)
    feats = drafters[0].features.new_zeros(B, T, drafters[0].features.shape[-1]).to(device)
    positions = torch.zeros(B, T, dtype=torch.long, device=device)
    visible = torch.zeros(B, T, P + T, dtype=torch.bool, device=device)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    for b, (d, seq, s, n) in enumerate(zip(drafters, sequences, starts, news)):
        ids[b, :n] = seq[0, s + 1 :].to(device)
        feats[b, :n] = d.features[s : s + n].to(device)
        positions[b] = torch.arange(s, s + T, device=device)
        visible[b, :, :s] = True
        visible[b, :, P:] = causal
    out = model(
        ids,
        target_features=feats,
        position_ids=positions,
        attention_mask=_additive(visible, dtype),
        cache=_past(drafters, starts),
        use_cache=True,
        compute_logits=False,
        output_rows=torch.tensor([n - 1 for n in news], device=device) if last_only else None,
    )
    keys, values = out.cache
    roots = []
    for b, (d, s, n) in enumerate(zip(drafters, starts, news)):
        new = (keys[b : b + 1, :, P : P + n], values[b : b + 1, :, P : P + n])
        d.kv = new if d.kv is None else (torch.cat([d.kv[0], new[0]], 2), torch.cat([d.kv[1], new[1]], 2))
        d.rows = s + n
        last = out.hidden_states[b, 0 if last_only else n - 1]
        roots.append((last, d._logits(last[None, None])[0, 0]))
    return roots


class TreeRows:
    """The drafter rows of one step's tree for every row of the batch: the committed caches padded once, then each
    depth's rows appended. Nodes are keyed by the caller (`ROOT` the root); a node's tree row is the same in every
    row of the batch."""

    def __init__(self, drafters, roots: list[torch.Tensor]):
        self.drafters = drafters
        self.model = drafters[0].drafter
        self.device = self.model.fc.weight.device
        self.committed = [d.rows for d in drafters]
        self.keys, self.values = _past(drafters, self.committed)
        self.width = self.keys.shape[2]  # the longest committed length
        self.row_of: dict[int, int] = {}  # node -> its row among the tree rows
        self.hidden_of: dict[int, torch.Tensor] = {ROOT: torch.stack(roots)}  # node -> its (B, H) outputs
        self.tree_rows = 0

    def run(self, nodes: list[int], tokens: torch.Tensor, parents: list[int], depth: int, chains: list[list[int]]):
        """The drafter rows of ``nodes`` at ``depth`` (their ``tokens`` ``(B, m)``, their parents' keys, each node's
        ancestors' tree rows) in one forward; returns their outputs ``(B, m, H)``."""
        device, dtype = self.device, self.model.fc.weight.dtype
        B, m, C, R = tokens.shape[0], len(nodes), self.width, self.tree_rows
        hidden = torch.stack([self.hidden_of[p] for p in parents], 1)
        positions = torch.tensor([c - 1 + depth for c in self.committed], device=device)[:, None].expand(B, m)
        visible = torch.zeros(B, m, C + R + m, dtype=torch.bool, device=device)
        for b, c in enumerate(self.committed):
            visible[b, :, :c] = True
        for i, chain in enumerate(chains):
            visible[:, i, [C + r for r in chain] + [C + R + i]] = True
        out = self.model(
            tokens.to(device),
            hidden=hidden,
            position_ids=positions,
            attention_mask=_additive(visible, dtype),
            cache=(self.keys, self.values),
            use_cache=True,
            compute_logits=False,
        )
        self.keys, self.values = out.cache
        for i, node in enumerate(nodes):
            self.row_of[node] = R + i
            self.hidden_of[node] = out.hidden_states[:, i]
        self.tree_rows += m
        return out.hidden_states

    def expand(self, depth: int, frontier, cand_tokens, cand_parents) -> torch.Tensor:
        """`DynamicTree.grow`'s expansion for one row: the frontier candidates' rows at ``depth`` (candidate ids,
        parent -1 the root), as log-probabilities over the draft vocabulary."""
        chains = []
        for c in frontier:
            chain, p = [], int(cand_parents[c])
            while p >= 0:
                chain.append(self.row_of[p])
                p = int(cand_parents[p])
            chains.append(chain)
        tokens = torch.tensor([[int(cand_tokens[c]) for c in frontier]])
        parents = [int(cand_parents[c]) for c in frontier]
        hidden = self.run(list(frontier), tokens, parents, depth, chains)
        return torch.log_softmax(self.drafters[0]._logits(hidden[0]).float(), dim=-1)


def _chain(tree: TreeSpec, node: int, row_of: dict[int, int]) -> list[int]:
    """The tree rows of a static tree node's drafted ancestors (the root's row is a committed one)."""
    chain, p = [], tree.parents[node]
    while p > 0:
        chain.append(row_of[p])
        p = tree.parents[p]
    return chain


@torch.no_grad()
def propose_rows(drafters, sequences: list[torch.LongTensor], tree: TreeSpec, options) -> list[DraftTree]:
    """One static tree per row (``drafters[b]`` the `EagleTreeDrafter` of row b, ``sequences[b]`` its committed
    ``(1, L_b)`` tokens), depth by depth, the inner nodes of a depth expanded for every row in one drafter forward.
    Children are each row's top-k (greedy) or drawn from its drafter's distribution (sampling, exact tree rejection
    sampling: ``EagleTreeDrafter._fill_static_children``); a node's score is its path confidence."""
    roots = committed_rows(drafters, sequences)
    rows = TreeRows(drafters, [hidden for hidden, _ in roots])
    scheme = options.scheme(drafters[0].draft_sampling)
    n, depths, device = tree.num_nodes + 1, tree.depths.tolist(), rows.device
    tokens = torch.empty(len(drafters), n, dtype=torch.long, device=device)
    tokens[:, 0] = torch.stack([seq[0, -1] for seq in sequences]).to(device)
    vocab = drafters[0].vocab_size
    probs = [torch.zeros(n, vocab, device=device) if scheme != "deterministic" else None for _ in drafters]
    scores = [[1.0] * n for _ in drafters]
    for d in range(tree.depth):
        inner = [i for i in range(n) if depths[i] == d and tree.children[i]]
        if d == 0:
            logits = [{0: logit.float()} for _, logit in roots]
        else:
            chains = [_chain(tree, i, rows.row_of) for i in inner]
            parents = [tree.parents[i] if tree.parents[i] > 0 else ROOT for i in inner]
            hidden = rows.run(inner, tokens[:, inner], parents, d, chains)
            logits = [dict(zip(inner, drafter._logits(h).float())) for drafter, h in zip(drafters, hidden)]
        for b, drafter in enumerate(drafters):
            for i in inner:
                kids = tree.children[i]
                chance = drafter._fill_static_children(i, kids, logits[b][i], tokens[b], probs[b], scheme, options)
                for kid, p in zip(kids, chance):
                    scores[b][kid] = scores[b][i] * p
    return [
        DraftTree.from_spec(
            tree, tokens[b].to(seq.device), draft_probs=probs[b], sampling=scheme, scores=tuple(scores[b])
        )
        for b, seq in enumerate(sequences)
    ]


@torch.no_grad()
def grow_dynamic(drafter, sequence: torch.LongTensor, tree) -> DraftTree:
    """EAGLE-2's dynamic tree for one row (`DynamicTree.grow`: expand the top-k by path confidence, rerank), each
    frontier in one drafter forward (`TreeRows.expand`)."""
    ((root_hidden, root_logits),) = committed_rows([drafter], [sequence])
    rows = TreeRows([drafter], [root_hidden])
    root_lp = torch.log_softmax(root_logits.float(), dim=-1)
    return tree.grow(root_lp, rows.expand, sequence[0, -1].to(rows.device), vocab_ids=drafter._target_ids)
