"""Medusa heads (Cai et al., "Medusa", 2024) as a `PreTrainedModel` and as a tree drafter.

K heads read the base model's final hidden state ``h_t``. Head k is ``num_layers`` residual blocks
``h <- h + SiLU(W1 h + b1)`` followed by a vocabulary projection W2, and predicts the token at ``t + k + 2``
(the base ``lm_head`` predicts ``t + 1``). With W1 = 0 and W2 = the base ``lm_head`` a head starts as a copy
of the base model's next-token prediction (Medusa-1 init, Sec. 2.2.1).

In the tree loop the heads need no forward pass of their own on the target: the verification forward of
one step returns the hidden state of the last accepted node, whose ``lm_head`` output is the bonus token
(the next step's root) and whose Medusa heads fill depths 1..K of the next step's tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from ...engine.logits import vocab_logits
from ...engine.trees import DraftTree
from ..base import final_hidden_state
from ..draft_vocab import DraftVocabMixin, draft_vocab_logits
from ..modeling_drafter import DepthTreeDrafter, DrafterModel
from .configuration_medusa import MedusaConfig

__all__ = ["MedusaResBlock", "MedusaHead", "MedusaHeadsModel", "MedusaOutput", "MedusaDrafter", "final_hidden_state"]


class MedusaResBlock(nn.Module):
    """``h + SiLU(W1 h + b1)``. Owns W1 and b1 directly, so `_init_weights` sees it as a leaf and zeroes both."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size, hidden_size))
        self.bias = nn.Parameter(torch.empty(hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + F.silu(F.linear(hidden_states, self.weight, self.bias))


class MedusaHead(nn.Module):
    """One head: independent residual blocks, then its own W2 unless the base ``lm_head`` is shared."""

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.blocks = nn.ModuleList([MedusaResBlock(config.hidden_size) for _ in range(config.num_layers)])
        self.lm_head = None if config.share_lm_head else nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            hidden_states = block(hidden_states)
        return hidden_states


@dataclass
class MedusaOutput(ModelOutput):
    """``logits``: ``(..., num_heads, vocab_size)``, head k's logits for the token at ``t + k + 2``.
    ``loss``: the Medusa-1 loss when ``labels`` were given."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class MedusaPreTrainedModel(DrafterModel):
    config_class = MedusaConfig
    base_model_prefix = "medusa"
    main_input_name = "hidden_states"
    _no_split_modules = ["MedusaHead"]

    @torch.no_grad()
    def _init_weights(self, module):
        if isinstance(module, MedusaResBlock):  # W1 = 0: the block starts as the identity
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):  # a W2 not copied from a base lm_head
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)


class MedusaHeadsModel(DraftVocabMixin, MedusaPreTrainedModel):
    """K Medusa heads; a drafter for ``model.generate(assistant_model=heads)``.

    Create from a base model with `from_base_model`; load with ``from_pretrained(folder, base_model=model)``
    (or plain ``AutoModel.from_pretrained(folder)``: with ``share_lm_head`` the base ``lm_head`` is then
    attached the first time the heads draft for a target).
    """

    def __init__(self, config: MedusaConfig):
        super().__init__(config)
        self.heads = nn.ModuleList([MedusaHead(config) for _ in range(config.num_heads)])
        self._init_draft_vocab()  # FR-Spec draft vocabulary (config.draft_vocab_size): target ids, saved with the weights
        self.post_init()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_base_model(
        cls,
        model: PreTrainedModel,
        num_heads: int = 4,
        num_layers: int = 1,
        share_lm_head: bool = True,
        **config_kwargs,
    ) -> "MedusaHeadsModel":
        """Medusa-1 init for ``model``: W1 = 0 and W2 = the base ``lm_head`` (shared or copied)."""
        fields = cls._base_model_fields(model)
        config = MedusaConfig(
            num_heads=num_heads, num_layers=num_layers, share_lm_head=share_lm_head, **fields, **config_kwargs
        )
        return cls._from_base_config(model, config)

    def _init_from_base_model(self, model: PreTrainedModel) -> None:
        if not self.config.share_lm_head:
            for head in self.heads:
                head.lm_head.weight.copy_(model.get_output_embeddings().weight)

    @classmethod
    def _load_checkpoint(cls, path, *args, **kwargs) -> "MedusaHeadsModel":
        """Also reads a folder in the reference implementation's layout (FasterDecoding/Medusa: ``config.json`` with
        ``medusa_num_heads`` and ``medusa_lm_head.safetensors`` / ``.pt``; see `fasterdecoding`), as heads that
        each own their vocabulary projection (``share_lm_head=False``)."""
        from .fasterdecoding import fasterdecoding_config, read_fasterdecoding_heads

        if fasterdecoding_config(path) is None:
            return super()._load_checkpoint(path, *args, **kwargs)
        config, state = read_fasterdecoding_heads(path)
        dtype = kwargs.get("dtype")
        heads = cls(config)
        heads.load_state_dict(state)
        return heads.to(dtype if isinstance(dtype, torch.dtype) else next(iter(state.values())).dtype)

    @property
    def shared_modules(self) -> tuple[str, ...]:
        """With ``share_lm_head`` the heads use the base ``lm_head``; they never use its token embeddings."""
        return ("base_lm_head",) if self.config.share_lm_head else ()

    # ------------------------------------------------------------------ forward
    def head_states(self, hidden_states: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """``(..., H)`` final hidden states -> ``(..., K, H)`` states after each head's residual blocks (only the
        first ``num_heads`` heads when given)."""
        dtype = self.heads[0].blocks[0].weight.dtype if self.config.num_layers else hidden_states.dtype
        hidden_states = hidden_states.to(dtype)
        return torch.stack([head(hidden_states) for head in self.heads[:num_heads]], dim=-2)

    def project(self, states: torch.Tensor, draft_vocab: bool = False) -> torch.Tensor:
        """``(..., K, H)`` -> ``(..., K, V)`` logits through W2 (the shared base ``lm_head`` or each head's own).
        ``draft_vocab``: project onto the draft vocabulary only (-inf elsewhere) when the heads have one."""
        d2t = self.draft_to_target if draft_vocab else None
        if self.config.share_lm_head:
            self._require_base()
            weight = self.base_lm_head.weight
            # one matmul for all heads
            return vocab_logits(states, weight) if d2t is None else draft_vocab_logits(states, weight, d2t)
        if d2t is not None:
            return torch.stack(
                [
                    draft_vocab_logits(states[..., k, :], self.heads[k].lm_head.weight, d2t)
                    for k in range(states.shape[-2])
                ],
                dim=-2,
            )
        return torch.stack([self.heads[k].lm_head(states[..., k, :]) for k in range(states.shape[-2])], dim=-2)

    def forward(self, hidden_states: torch.Tensor, labels: torch.LongTensor | None = None, **kwargs) -> MedusaOutput:
        """``hidden_states`` ``(..., H)``: the base model's final hidden states. ``labels`` ``(..., K)``: head k's
        target for each position (``-100`` ignored), see `training_medusa.medusa_labels`."""
        logits = self.project(self.head_states(hidden_states))
        loss = None
        if labels is not None:
            from .training_medusa import medusa_loss

            loss = medusa_loss(logits, labels)
        return MedusaOutput(loss=loss, logits=logits)

    # ------------------------------------------------------------------ drafting
    def _tree_drafter(self, target: PreTrainedModel) -> "MedusaDrafter":
        return MedusaDrafter(self, target=target)


class MedusaDrafter(DepthTreeDrafter):
    """Fills a static tree from the Medusa heads' predictions at the last accepted node.

    Greedy: the node at depth d with rank i gets head (d-1)'s i-th most likely token, whatever its parent
    (Medusa's Cartesian / sparse trees). Sampling: each inner node's children are drawn from head (d-1)'s
    distribution q (Gumbel-top-k, without replacement) and verified by exact tree rejection sampling.
    """

    needs_target_hidden_states = True
    proposals_optional = True  # the heads read the last committed node's state, kept by advance
    accuracy_key = "head_top_i_accuracy"

    def __init__(self, heads: MedusaHeadsModel, **kwargs):
        """``kwargs``: `DepthTreeDrafter`'s ``draft_sampling`` and ``target``."""
        self.heads = heads
        self.row_hidden: dict[int, torch.Tensor] | None = None  # original row -> h at its last committed token
        super().__init__(heads.config, heads.config.num_heads, **kwargs)

    def draft_cost(self, curve) -> list[float]:
        """Drafting cost per tree depth d in plain steps: d heads' vocabulary projections (one matmul over d rows
        with a shared ``lm_head``, d matrices otherwise) on the draft vocabulary's share of the matrix; the
        residual blocks (H x H) are negligible beside them."""
        config, share = self.heads.config, self.heads.draft_vocab_share
        if config.share_lm_head:
            return [curve.projection_cost(d, share) for d in range(1, config.num_heads + 1)]
        return [d * curve.projection_cost(1, share) for d in range(1, config.num_heads + 1)]

    # ------------------------------------------------------------------ drafting: all rows' heads in one forward
    def begin_batch(self, prompts, target_outputs) -> None:
        h = final_hidden_state(target_outputs.outputs)[:, -1]  # left padding: the last column is every row's last token
        self.row_hidden = {j: h[i] for j, i in enumerate(target_outputs.rows)}

    @torch.no_grad()
    def propose_batch(self, sequences, rows, tree, options) -> list[DraftTree]:
        # only the heads the tree reaches: each head's vocabulary projection costs about as much as the target's
        # own lm_head, a large share of a small model's decoding step (SmolLM2-135M: 4 heads ~ 0.8 target forwards)
        states = self.heads.head_states(torch.stack([self.row_hidden[r] for r in rows]), num_heads=tree.depth)
        logits = self.heads.project(states, draft_vocab=True).float()  # (A, depth, V)
        scheme = options.scheme(self.draft_sampling)
        return [tree.fill(logits[j], seq[0, -1], scheme, options) for j, seq in enumerate(sequences)]

    def advance_batch(self, sequences, rows, drafts, results, target_outputs) -> None:
        h = final_hidden_state(target_outputs.outputs)
        for j, r in enumerate(rows):
            self.row_hidden[r] = h[target_outputs.rows[j], results[j].path[-1]]

    def end_batch(self) -> None:
        self.row_hidden = None
