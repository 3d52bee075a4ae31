"""Any small causal LM as a tree drafter (two-model speculative decoding: Leviathan et al.; Chen et al.;
SpecInfer's token tree), and the layer-cut self-speculative draft.

The draft model fills the tree level by level: one forward over the newly committed tokens gives the
root's candidates, then one batched forward per depth over that level's inner nodes, with a tree
attention mask on the draft's own cache. After drafting, the draft's cache is cropped back to the
committed tokens, so it only ever holds committed tokens between steps. The draft cache keeps every token
in every layer (a `DynamicCache()` without a config: the crop counts absolute positions); a draft model with sliding-window
layers gets its window in the tree masks instead.
"""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from .._compat import cache_arg
from ..engine.cache import attention_window
from ..engine.placement import match_target
from ..engine.protocol import OneRowDrafter
from ..engine.trees import DraftingOptions, DraftTree, TreeSpec, additive_mask, fill_children
from .base import require_mask_attention

__all__ = ["CausalLMDrafter", "causal_lm_assistant", "layer_cut_draft", "windowed_mask"]

DEFAULT_LM_TREE = TreeSpec.from_choices(
    [
        [0],
        [1],
        [2],
        [3],
        [0, 0],
        [0, 1],
        [1, 0],
        [2, 0],
        [0, 0, 0],
        [0, 0, 1],
        [0, 1, 0],
        [1, 0, 0],
        [0, 0, 0, 0],
        [0, 0, 0, 1],
        [0, 0, 0, 0, 0],
    ]
)


class CausalLMDrafter(OneRowDrafter):
    """Drafts a tree with a causal LM that shares the target's vocabulary."""

    proposals_optional = True  # its cache holds committed tokens only; a proposal runs the ones not cached yet

    def __init__(
        self, model: PreTrainedModel, tree: TreeSpec | None = None, draft_sampling: str = "without_replacement"
    ):
        """``draft_sampling``: how siblings are drawn when sampling ("without_replacement", "with_replacement"
        or "deterministic" top-k); every choice is exact, they differ in acceptance rate."""
        require_mask_attention(model, "the draft model", "a tree attention mask", "draft")
        self.model = model
        self.default_tree = tree or DEFAULT_LM_TREE
        self.draft_sampling = draft_sampling
        self.cache: DynamicCache | None = None
        self.window, self.window_layout = attention_window(model.config)

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def attach_target(self, target) -> None:
        """The draft model moves to the target's dtype and device (`hf_speculative.engine.placement.match_target`)."""
        match_target(self.model, target)

    def begin(self, prompt_ids, target_outputs) -> None:
        self.cache = DynamicCache()  # no config: plain full-length layers (the crop counts absolute positions)

    def _forward(self, ids, positions, mask=None):
        out = self.model(
            input_ids=ids[None],
            position_ids=positions[None],
            attention_mask=mask,
            **cache_arg(self.cache),
            use_cache=True,
        )
        return out.logits[0]

    @torch.no_grad()
    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        device = self.model.device
        scheme = options.scheme(self.draft_sampling)
        committed = sequence.shape[1]
        cached = self.cache.get_seq_length()
        # 1) the newly committed tokens (the root last): logits for the root's children
        new = sequence[0, cached:].to(device)
        logits = {0: self._forward(new, torch.arange(cached, committed, device=device))[-1]}

        n = tree.num_nodes + 1
        tokens = torch.empty(n, dtype=torch.long, device=device)
        tokens[0] = sequence[0, -1]
        probs = None
        anc = tree.ancestors.to(device)
        in_cache: list[int] = []  # tree nodes appended to the draft cache, in order
        level = [0]
        while level:
            next_level = []
            for node in level:
                kids = tree.children[node]
                if not kids:
                    continue
                chosen, q = fill_children(logits.pop(node), len(kids), scheme, options)
                tokens[list(kids)] = chosen.to(device)
                if q is not None:
                    if probs is None:
                        probs = torch.zeros(n, q.shape[-1], device=device)
                    probs[node] = q
                next_level.extend(c for c in kids if tree.children[c])
            if not next_level:
                break
            # 2) one forward over the level's inner nodes: prefix + their ancestors + themselves visible
            idx = torch.tensor(next_level, device=device)
            visible = torch.cat(
                [
                    torch.ones(len(next_level), committed, dtype=torch.bool, device=device),
                    anc[idx][:, in_cache + next_level],
                ],
                dim=1,
            )
            positions = committed - 1 + tree.depths.to(device)[idx]
            mask = self._level_mask(
                visible, positions, tree.depths.to(device)[in_cache + next_level] + committed - 1, committed
            )
            out = self._forward(tokens[idx], positions, mask)
            logits.update(zip(next_level, out))
            in_cache.extend(next_level)
            level = next_level
        # 3) the draft cache keeps committed tokens only (transformers 5: a negative count removes that many tokens)
        drafted = self.cache.get_seq_length() - committed
        if drafted > 0:
            self.cache.crop(-drafted)
        return DraftTree.from_spec(tree, tokens, draft_probs=probs, sampling=scheme)

    def _level_mask(self, visible, positions, node_positions, committed):
        """The level forward's additive mask, with the draft model's own sliding window (`windowed_mask`)."""
        keys = torch.cat([torch.arange(committed, device=positions.device), node_positions])
        return windowed_mask(visible, positions, keys, self.window, self.window_layout, self.model.dtype)

    def end(self) -> None:
        self.cache = None


def windowed_mask(
    visible: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    window: int | None,
    layout: str,
    dtype: torch.dtype,
):
    """The additive attention mask of a draft forward over a custom cache, honouring the model's own sliding window.

    ``visible`` ``(q, k)`` or ``(B, q, k)`` bool: which keys each query may see; ``query_positions`` ``(..., q)`` and
    ``key_positions`` ``(..., k)`` the rotary positions. ``(window, layout)`` from `attention_window` of the model's
    config: without a window the mask of ``visible`` (``(1, 1, q, k)`` or ``(B, 1, q, k)``); otherwise keys ``>= window``
    positions behind a query are hidden too, in one mask when every layer slides (``layout == "all"``) or in a
    ``{"full_attention", "sliding_attention"}`` mapping for hybrid models (transformers passes both through unchanged).
    """

    def additive(v: torch.Tensor) -> torch.Tensor:
        mask = additive_mask(v, dtype)
        return mask if v.dim() == 2 else mask[0, 0, :, None]

    full = additive(visible)
    if window is None:
        return full
    sliding = additive(visible & (query_positions[..., :, None] - key_positions[..., None, :] < window))
    return sliding if layout == "all" else {"full_attention": full, "sliding_attention": sliding}


def layer_cut_draft(
    model: PreTrainedModel, num_layers: int | None = None, layers: list[int] | None = None
) -> PreTrainedModel:
    """A self-speculative draft: some of the target's decoder layers, its final norm and LM head.

    ``num_layers=k`` keeps the first k layers; ``layers=[...]`` keeps any ordered subset (skipping middle
    layers, as in Draft & Verify, Zhang et al. 2023). The draft shares (does not copy) the target's
    modules; it is an ordinary causal LM of the target's class, so it also serves as transformers' own
    ``assistant_model``.
    """
    base = getattr(model, model.base_model_prefix)
    total = len(base.layers)
    if (num_layers is None) == (layers is None):
        raise ValueError("pass exactly one of num_layers or layers")
    if layers is None:
        if not 1 <= num_layers <= total:
            raise ValueError(f"num_layers must be in [1, {total}], got {num_layers}")
        layers = list(range(num_layers))
    layers = [int(i) for i in layers]
    if not layers or layers != sorted(set(layers)) or layers[0] < 0 or layers[-1] >= total:
        raise ValueError(f"layers must be increasing indices in [0, {total}), got {layers}")
    num_layers = len(layers)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    with torch.device("meta"):
        draft = AutoModelForCausalLM.from_config(config, attn_implementation=model.config._attn_implementation)
    draft_base = getattr(draft, draft.base_model_prefix)
    for name, module in base.named_children():
        if name == "layers":
            module = torch.nn.ModuleList([_with_layer_idx(module[i], j) for j, i in enumerate(layers)])
        setattr(draft_base, name, module)
    draft.lm_head = model.lm_head
    leftover = [n for n, t in list(draft.named_parameters()) + list(draft.named_buffers()) if t.device.type == "meta"]
    if leftover:
        raise ValueError(f"layer_cut_draft could not share these target tensors: {leftover[:5]}")
    draft.generation_config = copy.deepcopy(model.generation_config)
    return draft.eval()


def _with_layer_idx(layer: torch.nn.Module, idx: int) -> torch.nn.Module:
    """The layer itself when it already sits at cache slot ``idx``; else a shallow copy (sharing every
    weight) whose attention writes to slot ``idx`` of the draft's own cache."""
    attn = getattr(layer, "self_attn", None)
    if attn is None or getattr(attn, "layer_idx", idx) == idx:
        return layer
    layer = copy.copy(layer)
    layer._modules = dict(layer._modules)
    layer.self_attn = copy.copy(attn)
    layer.self_attn.layer_idx = idx
    return layer


def causal_lm_assistant(target, assistant_model) -> CausalLMDrafter | None:
    """The registry's assistant adapter: any causal LM (a model with output embeddings) drafts as a
    `CausalLMDrafter`; None for anything else."""
    if isinstance(assistant_model, PreTrainedModel) and hasattr(assistant_model, "get_output_embeddings"):
        return CausalLMDrafter(assistant_model)
    return None
