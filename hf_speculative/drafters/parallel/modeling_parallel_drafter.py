"""The ParallelSpec drafter (Xiao et al., 2024) as a `PreTrainedModel` and as a tree drafter.

A one-layer transformer (the target architecture's own decoder layer, its own final norm) that shares the
target's embedding table and ``lm_head``. Its input is the context followed by k learned [MASK] tokens:

    tokens     x_c ... x_t   MASK_1  ...  MASK_k
    positions  c   ... t     t + 1   ...  t + k
    predicts   ...   x_{t+1} x_{t+2} ...  x_{t+k+1}

so ONE forward gives k + 1 distributions, which fill depths 1 .. k + 1 of the step's draft tree (Sec. 3).
Between steps the drafter's own KV cache holds the committed tokens only: the mask tokens' keys and values
are dropped after every forward (the next step's masks sit at other positions).

With ``use_target_hidden_states`` (Sec. 4.3, the EAGLE-style integration) a context token ``x_i`` enters as
``W [e(x_i); h_{i-1}]``, ``h_{i-1}`` being the target's final hidden state at position ``i - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModel, DynamicCache, PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from ..._compat import cache_arg, get_cache, takes_cache
from ...engine.logits import vocab_logits
from ...engine.protocol import OneRowDrafter
from ...engine.trees import DraftingOptions, DraftTree, TreeSpec
from ..base import final_hidden_state, input_embeddings
from ..draft_vocab import DraftVocabMixin, draft_vocab_logits
from ..modeling_drafter import DepthTreeDrafter, DrafterModel
from .configuration_parallel_drafter import ParallelDrafterConfig

__all__ = ["ParallelDrafter", "ParallelDrafterOutput", "ParallelTreeDrafter"]


@dataclass
class ParallelDrafterOutput(ModelOutput):
    """``logits`` ``(B, Q, V)`` (or of the rows asked for); ``hidden_states`` ``(B, Q, H)`` after the final norm;
    ``cache`` the drafter's cache when ``use_cache``."""

    logits: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    cache: object | None = None


class ParallelDrafterPreTrainedModel(DrafterModel):
    config_class = ParallelDrafterConfig
    base_model_prefix = "drafter"
    main_input_name = "input_ids"
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Embedding):  # the [MASK] embeddings
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.Linear) and module is getattr(self, "fuse", None):
            # W [e; h] = e at init: the drafter starts as a token-only model and learns to read h
            h = self.config.hidden_size
            init.zeros_(module.weight)
            module.weight[:, :h].copy_(torch.eye(h, dtype=module.weight.dtype))
        else:  # decoder layers, norm, rotary embedding: the library's generic init
            super()._init_weights(module)


class ParallelDrafter(DraftVocabMixin, ParallelDrafterPreTrainedModel):
    """A ParallelSpec drafter; use as ``model.generate(assistant_model=drafter)``.

    Create from a target with `from_base_model`; load with ``from_pretrained(folder, base_model=model)`` or
    plain ``AutoModel.from_pretrained(folder)`` (the target's embeddings and ``lm_head`` are then attached the
    first time the drafter drafts for a target).
    """

    def __init__(self, config: ParallelDrafterConfig):
        super().__init__(config)
        decoder = AutoModel.from_config(config.decoder())
        decoder.embed_tokens = None  # the target's embedding table is shared, never stored here
        self.decoder = decoder
        self.mask_embeddings = nn.Embedding(config.num_mask_tokens, config.hidden_size)
        self.fuse = (
            nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
            if config.use_target_hidden_states
            else None
        )
        self._init_draft_vocab()  # FR-Spec draft vocabulary (config.draft_vocab_size), saved with the weights
        self.post_init()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_base_model(
        cls,
        model: PreTrainedModel,
        num_mask_tokens: int = 4,
        num_layers: int = 1,
        init_layer: int = -1,
        use_target_hidden_states: bool = False,
        **config_kwargs,
    ) -> "ParallelDrafter":
        """A drafter for ``model``: its decoder layers copied from the target's layers ending at ``init_layer``
        (default: the last ``num_layers``), its final norm from the target's, the mask embeddings set to the
        mean token embedding plus small noise."""
        fields = cls._base_model_fields(model)
        last = init_layer % len(getattr(model, model.base_model_prefix).layers)
        if last + 1 < num_layers:
            raise ValueError(f"init_layer={init_layer} leaves fewer than num_layers={num_layers} target layers to copy")
        config = ParallelDrafterConfig(
            decoder_config=model.config.to_dict(),
            num_mask_tokens=num_mask_tokens,
            num_layers=num_layers,
            use_target_hidden_states=use_target_hidden_states,
            init_layer=last,
            **fields,
            **config_kwargs,
        )
        return cls._from_base_config(model, config)

    def _init_from_base_model(self, model: PreTrainedModel) -> None:
        base = getattr(model, model.base_model_prefix)
        last, num_layers = self.config.init_layer, self.config.num_layers
        for j, i in enumerate(range(last + 1 - num_layers, last + 1)):
            self.decoder.layers[j].load_state_dict(base.layers[i].state_dict())
        self.decoder.norm.load_state_dict(base.norm.state_dict())
        emb = input_embeddings(model, type(self).__name__).weight.float()
        g = torch.Generator(device="cpu").manual_seed(0)  # the same noise on every device
        noise = (
            torch.randn(self.config.num_mask_tokens, self.config.hidden_size, generator=g).to(emb.device) * emb.std()
        )
        self.mask_embeddings.weight.copy_(emb.mean(0) + 0.1 * noise)

    def mask_token_ids(self, device=None) -> torch.LongTensor:
        """The ids that stand for MASK_1 .. MASK_k in the drafter's inputs: ``vocab_size + j``."""
        return torch.arange(self.config.num_mask_tokens, device=device) + self.config.vocab_size

    # ------------------------------------------------------------------ forward
    def embed(self, input_ids: torch.LongTensor, target_hidden_states: torch.Tensor | None = None) -> torch.Tensor:
        """Input embeddings: the target's table for tokens, the learned [MASK] embeddings for ids ``>= vocab_size``;
        with ``use_target_hidden_states`` a token's embedding is fused with ``target_hidden_states`` (the target's
        state at the previous position, same shape as the ids plus ``H``; ignored at mask positions)."""
        self._require_base()
        V = self.config.vocab_size
        is_mask = input_ids >= V
        dtype = self.mask_embeddings.weight.dtype
        with torch.no_grad():  # the shared table is frozen
            tokens = self.base_embeddings(input_ids.clamp(max=V - 1)).to(dtype)
        if self.fuse is not None:
            if target_hidden_states is None:
                raise ValueError(
                    "this ParallelDrafter conditions on the target's hidden states: pass target_hidden_states"
                )
            tokens = self.fuse(torch.cat([tokens, target_hidden_states.to(dtype)], dim=-1))
        masks = self.mask_embeddings((input_ids - V).clamp(min=0))
        return torch.where(is_mask[..., None], masks, tokens)

    def project(self, hidden_states: torch.Tensor, draft_vocab: bool = False) -> torch.Tensor:
        """Logits through the target's shared ``lm_head`` (``draft_vocab``: on the draft vocabulary only, -inf
        elsewhere, when the drafter has one)."""
        self._require_base()
        if draft_vocab and self.draft_to_target is not None:
            # the parameter itself, not a fresh .detach(): draft_vocab_weight caches its slice per weight object
            return draft_vocab_logits(hidden_states, self.base_lm_head.weight, self.draft_to_target)
        weight = self.base_lm_head.weight.detach()  # shared and frozen: no gradient for the 49K-row table
        return vocab_logits(hidden_states, weight)

    @takes_cache
    def forward(
        self,
        input_ids: torch.LongTensor,
        position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        target_hidden_states: torch.Tensor | None = None,
        cache=None,
        use_cache: bool = False,
        logits_rows: torch.Tensor | None = None,
        draft_vocab: bool = False,
        **kwargs,
    ) -> ParallelDrafterOutput:
        """``input_ids`` ``(B, Q)`` with mask tokens as ids ``vocab_size + j``; ``attention_mask`` a 4D additive
        float mask (the group-wise training layout) or None (causal); ``logits_rows`` ``(B, R)`` indices of the
        rows to project (the LM head over 49K tokens is the bulk of the cost), default all rows; ``draft_vocab``:
        project onto the draft vocabulary (drafting)."""
        embeds = self.embed(input_ids, target_hidden_states)
        out = self.decoder(
            inputs_embeds=embeds,
            position_ids=position_ids,
            attention_mask=attention_mask,
            **cache_arg(cache),
            use_cache=use_cache,
        )
        hidden = out.last_hidden_state
        if logits_rows is not None:
            hidden = torch.gather(hidden, 1, logits_rows[..., None].expand(-1, -1, hidden.shape[-1]))
        return ParallelDrafterOutput(
            logits=self.project(hidden, draft_vocab), hidden_states=hidden, cache=get_cache(out)
        )

    # ------------------------------------------------------------------ drafting
    def _tree_drafter(self, target: PreTrainedModel) -> "ParallelTreeDrafter":
        return ParallelTreeDrafter(self, target=target)


class ParallelTreeDrafter(OneRowDrafter, DepthTreeDrafter):
    """One drafter forward per step over ``[uncached committed tokens, MASK_1 .. MASK_k]`` fills the tree.

    Greedy: the node at depth d with rank i gets the i-th most likely token of distribution d (whatever its
    parent, as with Medusa heads). Sampling: each inner node's children are drawn from q_d (Gumbel-top-k,
    without replacement) and verified by exact tree rejection sampling (ParallelSpec Algorithm 1).
    """

    proposals_optional = True  # its cache holds committed tokens only; a proposal runs the ones not cached yet

    def __init__(self, drafter: ParallelDrafter, *, target: PreTrainedModel | None = None, **kwargs):
        """``kwargs``: `DepthTreeDrafter`'s ``draft_sampling``."""
        self.drafter = drafter
        self.k = drafter.config.num_mask_tokens
        self.target_layers = getattr(getattr(target, "config", None), "num_hidden_layers", None)
        self.needs_target_hidden_states = bool(drafter.config.use_target_hidden_states)
        self.cache: DynamicCache | None = None
        self.target_hidden: torch.Tensor | None = None  # (positions, H): the target's final hidden state per position
        super().__init__(drafter.config, self.k + 1, target=target, **kwargs)

    def draft_cost(self, curve) -> list[float]:
        """Drafting cost per tree depth d in plain steps: the drafter's forward over about k + 2 tokens (its
        ``num_layers`` of the target's layers: that share of c(k + 2)) and d rows through the shared ``lm_head``
        (the draft vocabulary's share of it)."""
        layers = self.drafter.config.num_layers / max(self.target_layers or self.drafter.config.num_layers, 1)
        forward = layers * curve(self.k + 2)
        return [
            forward + curve.projection_cost(d, self.drafter.draft_vocab_share) for d in range(1, self.max_depth + 1)
        ]

    def begin(self, prompt_ids, target_outputs) -> None:
        self.cache = DynamicCache()  # no config: `_keep_committed` slices by absolute length: no sliding-window layers
        if self.needs_target_hidden_states:
            h = final_hidden_state(target_outputs)[0]
            missing = prompt_ids.shape[1] - h.shape[0]  # positions prefilled before this call carry no state: zeros
            self.target_hidden = torch.cat([h.new_zeros(missing, h.shape[-1]), h]) if missing > 0 else h

    def advance(self, sequence, draft, result, target_outputs) -> None:
        if self.needs_target_hidden_states:
            h = final_hidden_state(target_outputs)[0, list(result.path)]
            self.target_hidden = torch.cat([self.target_hidden, h])[: sequence.shape[1] - 1]

    @torch.no_grad()
    def draft_logits(self, sequence: torch.LongTensor, num_depths: int | None = None) -> torch.Tensor:
        """One drafter forward: ``(num_depths, V)`` logits (default ``k + 1``) for the tokens after the root; only
        those rows go through the 49K-token ``lm_head``. The cache then holds the committed tokens only (the
        mask tokens' entries are dropped)."""
        num_depths = self.k + 1 if num_depths is None else num_depths
        drafter = self.drafter
        device = drafter.mask_embeddings.weight.device
        committed = sequence.shape[1]
        cached = self.cache.get_seq_length()
        ids = torch.cat([sequence[0, cached:].to(device), drafter.mask_token_ids(device)])
        positions = torch.arange(cached, committed + self.k, device=device)
        hidden = None
        if self.needs_target_hidden_states:
            # token i is fused with the target's state at i - 1 (zeros before position 0); masks ignore it
            prev = self.target_hidden[max(cached - 1, 0) : committed - 1].to(device)
            if cached == 0:
                prev = torch.cat([prev.new_zeros(1, prev.shape[-1]), prev])
            hidden = torch.cat([prev, prev.new_zeros(self.k, prev.shape[-1])])[None]
        start = ids.shape[0] - self.k - 1
        rows = torch.arange(start, start + num_depths, device=device)[None]
        out = drafter(
            ids[None],
            position_ids=positions[None],
            target_hidden_states=hidden,
            cache=self.cache,
            use_cache=True,
            logits_rows=rows,
            draft_vocab=True,
        )
        self._keep_committed(committed)
        return out.logits[0].float()

    def _keep_committed(self, length: int) -> None:
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]

    @torch.no_grad()
    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        logits = self.draft_logits(sequence, tree.depth)  # (depth, V): depth d + 1 <- row d
        return tree.fill(logits, sequence[0, -1], options.scheme(self.draft_sampling), options)

    def end(self) -> None:
        self.cache = None
        self.target_hidden = None
