"""The EAGLE drafters (EAGLE-1/2/3) as a `PreTrainedModel`, and the tree drafter that runs them in our engine.

EAGLE (Li et al. 2024, Sec. 3-4) drafts at the *feature* level: the drafter sees, at position j, the target's
feature f_j together with the embedding of the token x_{j+1} that was sampled from it, and predicts the next
feature, whose logits give x_{j+2}. The drafter is one decoder layer; it runs autoregressively over its own
outputs to draft several tokens, and keeps its own KV cache of the committed positions.

    EAGLE-1/2 (Sec. 4):  g_j = Layer(fc([e(x_{j+1}) ; f_j]))           logits = target lm_head(g_j)
    EAGLE-3   (Sec. 3):  f_j = fc([l_j ; m_j ; h_j])  (low, mid, high target layers, 3H -> H)
                         g_j = midlayer([input_layernorm(e(x_{j+1})) ; hidden_norm(f_j)])   (attention input 2H)
                         logits = lm_head(norm(g_j)) over the draft vocabulary, target id = d + d2t[d]

Deeper drafts feed the drafter's own output g back in place of the target feature (EAGLE-1 through ``fc``,
EAGLE-3 straight into the midlayer). EAGLE-2 (Sec. 4) builds the tree per step from the drafter's confidence
(`hf_speculative.engine.trees.DynamicTree.grow`).

The drafter shares the target's embedding table (and, EAGLE-1/2, its ``lm_head``); neither is stored. The module
names are the public checkpoints' (``fc``, ``layers.0``, ``midlayer``, ``norm``, ``lm_head``, ``d2t``, ``t2d``),
so `from_pretrained` reads those layouts as published (`load_public_checkpoint`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb
from transformers.utils import ModelOutput

from ..._compat import takes_cache
from ...engine.logits import vocab_logits
from ...engine.policy import engine_product
from ...engine.protocol import OneRowDrafter
from ...engine.trees import DraftingOptions, DraftTree, DynamicTree, fill_children
from ..base import input_embeddings, output_embeddings, rope
from ..modeling_drafter import DrafterModel, decoder_layer_fields, text_config
from .configuration_eagle import EagleConfig
from .drafting import grow_dynamic, propose_rows

__all__ = [
    "EagleDrafter",
    "EagleOutput",
    "EagleTreeDrafter",
    "EagleAttention",
    "EagleDecoderLayer",
    "is_public_checkpoint",
    "load_public_checkpoint",
]


@dataclass
class EagleOutput(ModelOutput):
    """``hidden_states`` ``(B, T, H)``: the drafter's predicted features g (pre-norm for EAGLE-3, what is fed back);
    ``logits`` ``(B, T, V_draft)`` (EAGLE-3: over the draft vocabulary; EAGLE-1/2: the target's vocabulary);
    ``cache``: ``(keys, values)`` of the attention, past ones included, when ``use_cache``."""

    hidden_states: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    cache: tuple[torch.Tensor, torch.Tensor] | None = None


class EagleAttention(nn.Module):
    """Llama attention (GQA, RoPE) whose q/k/v read ``input_size`` features (2H for EAGLE-3's midlayer)."""

    def __init__(self, config: EagleConfig, input_size: int):
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.use_qkv_bias
        self.q_proj = nn.Linear(input_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(input_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(input_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bool(config.attention_bias))

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor | None = None):
        """``x (B, T, input_size)`` -> q ``(B, heads, T, d)``, k and v ``(B, kv_heads, T, d)``, RoPE applied.
        ``rows`` ``(B,)``: queries of those rows only (``(B, heads, 1, d)``; keys and values of every row)."""
        B, T, _ = x.shape
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rows is None:
            q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            return q, k, v
        x, q_cos, q_sin = (_rows_of(t, rows) for t in (x, cos, sin))
        q = self.q_proj(x).view(B, 1, self.num_heads, self.head_dim).transpose(1, 2)
        return rope(q, q_cos, q_sin), rope(k, cos, sin), v

    def attend(self, q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
        """Scaled dot-product attention with an additive float ``mask`` broadcastable to ``(B, heads, Tq, Tk)``. Grouped
        keys and values are shared by their query heads inside the kernel (``enable_gqa``), not copied per head: a
        drafting forward over a few rows spent 6% of its time on that copy."""
        mask = None if mask is None else mask.to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads)
        B, _, T, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class EagleDecoderLayer(nn.Module):
    """EAGLE's one decoder layer. EAGLE-1/2: a Llama layer without ``input_layernorm`` (its input is ``fc``'s
    output). EAGLE-3 (the ``midlayer``): attention over [input_layernorm(embedding) ; hidden_norm(feature)] (2H),
    the residual being the feature."""

    def __init__(self, config: EagleConfig, eagle3: bool):
        super().__init__()
        H = config.hidden_size
        self.eagle3 = eagle3
        self.self_attn = EagleAttention(config, 2 * H if eagle3 else H)
        self.mlp = LlamaMLP(config)
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        if eagle3:
            self.input_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
            self.hidden_norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)

    def attention_input(self, hidden: torch.Tensor, embeds: torch.Tensor | None) -> torch.Tensor:
        if self.eagle3:
            return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        return hidden

    def finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual, post-attention norm, MLP, residual."""
        hidden = hidden + attn_out
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def forward(self, hidden, embeds, cos, sin, mask, past=None, rows=None):
        """``hidden (B, T, H)`` the (fused) features, ``embeds`` the token embeddings (EAGLE-3 only), ``past``
        ``(keys, values)`` to attend to before the new rows; returns the output and the full ``(keys, values)``.
        ``rows`` ``(B,)``: the output of those rows only ``(B, 1, H)`` (keys and values of every row): the
        attention's queries, ``o_proj`` and the MLP run on one row per batch row."""
        q, k, v = self.self_attn.qkv(self.attention_input(hidden, embeds), cos, sin, rows)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if rows is not None:
            hidden, mask = _rows_of(hidden, rows), None if mask is None else _rows_of(mask, rows, dim=2)
        return self.finish(hidden, self.self_attn.attend(q, k, v, mask)), (k, v)


def _rows_of(x: torch.Tensor, rows: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Row ``rows[b]`` along ``dim`` of each batch row b of ``x``, the dimension kept (size 1); a ``x`` broadcast over
    the batch (size 1) gives each batch row its own."""
    index = rows.to(x.device).view(-1, *([1] * (x.dim() - 1)))
    shape = list(x.shape)
    shape[0], shape[dim] = rows.shape[0], 1
    return x.expand(rows.shape[0], *x.shape[1:]).gather(dim, index.expand(shape))


class EaglePreTrainedModel(DrafterModel):
    config_class = EagleConfig
    base_model_prefix = "eagle"
    main_input_name = "input_ids"
    _supports_sdpa = True


class EagleDrafter(EaglePreTrainedModel):
    """An EAGLE-1/2/3 drafter; use as ``model.generate(input_ids, assistant_model=drafter)``.

    Create one with `from_base_model`; load ours or a public checkpoint (EAGLE's, SpecForge's) with
    ``EagleDrafter.from_pretrained(path, base_model=model)``; ``AutoModel.from_pretrained(folder)`` loads ours
    after ``import hf_speculative`` (the target is attached when drafting starts).
    """

    def __init__(self, config: EagleConfig):
        super().__init__(config)
        H = config.hidden_size
        feature = config.target_hidden_size or H
        if config.is_eagle3:
            draft_vocab = config.draft_vocab_size or config.vocab_size
            self.fc = nn.Linear(3 * feature, H, bias=config.fc_bias)
            self.midlayer = EagleDecoderLayer(config, eagle3=True)
            self.norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
            self.lm_head = nn.Linear(H, draft_vocab, bias=False)
            self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long), persistent=True)
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool), persistent=True)
        else:
            if feature != H:
                raise ValueError("EAGLE-1/2 needs target_hidden_size == hidden_size")
            self.fc = nn.Linear(2 * H, H, bias=config.fc_bias)
            self.layers = nn.ModuleList([EagleDecoderLayer(config, eagle3=False)])
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.__dict__["num_target_layers"] = config.target_num_layers
        self.post_init()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_base_model(
        cls,
        model: PreTrainedModel,
        variant: str = "eagle3",
        draft_vocab_size: int | None = None,
        init_from_target: bool = True,
        **config_kwargs,
    ) -> "EagleDrafter":
        """A fresh drafter for ``model`` (its shapes, RoPE and norms eps; EAGLE-3's low/mid/high layers). With
        ``init_from_target`` the drafter's MLP and post-attention norm (and EAGLE-1/2's whole attention) start
        from the target's last decoder layer, ``fc`` as [0 ; I] (the feature passes through) for EAGLE-1/2, and
        EAGLE-3's ``lm_head`` and ``norm`` from the target's (on the ``draft_vocab_size`` lowest ids until
        `set_draft_vocab` picks the frequent ones)."""
        input_embeddings(model, cls.__name__)  # a clear TypeError when the target has no token embeddings
        tc = text_config(model)
        qkv_bias = bool(getattr(tc, "attention_bias", False)) or tc.model_type in ("qwen2",)
        config = EagleConfig(
            variant=variant,
            draft_vocab_size=draft_vocab_size,
            target_num_layers=tc.num_hidden_layers,
            qkv_bias=qkv_bias,
            initializer_range=getattr(tc, "initializer_range", 0.02),
            **cls._base_model_fields(model),
            **decoder_layer_fields(model),
            **config_kwargs,
        )
        return cls._from_base_config(model, config, init_from_base=init_from_target)

    def _init_from_base_model(self, model: PreTrainedModel) -> None:
        """`from_base_model`'s ``init_from_target``. EAGLE-3's attention (q/k/v read [embedding ; feature], 2H) and
        ``fc`` (three features, 3H) have no counterpart in the target and keep their random initialisation; every
        module copied must match the target's (else a ValueError: the drafter would start from random weights)."""
        base = getattr(model, model.base_model_prefix)
        last = base.layers[-1]
        layer = self.midlayer if self.config.is_eagle3 else self.layers[0]
        for name in ("mlp", "post_attention_layernorm"):
            _copy_target_module(getattr(layer, name), last, name)
        if self.config.is_eagle3:
            self.norm.load_state_dict(base.norm.state_dict())
            self.lm_head.weight.copy_(model.get_output_embeddings().weight[: self.lm_head.out_features])
            self._set_d2t(torch.arange(self.lm_head.out_features))
        else:
            H = self.config.hidden_size
            # the target's attention may hold more (Qwen3's q_norm / k_norm): the tensors the drafter's has are copied
            _copy_target_module(layer.self_attn, last, "self_attn", target_may_hold_more=True)
            self.fc.weight.zero_()
            self.fc.weight[:, H:].copy_(torch.eye(H))
            if self.fc.bias is not None:
                self.fc.bias.zero_()

    @classmethod
    def _load_checkpoint(cls, path, *args, **kwargs) -> "EagleDrafter":
        """Our checkpoints (``model_type: eagle_drafter``) through `PreTrainedModel.from_pretrained`; a public
        EAGLE-1/2/3 checkpoint folder (its ``config.json`` a `LlamaConfig`, weights in ``pytorch_model.bin`` or
        safetensors) through `load_public_checkpoint`."""
        config_file = Path(path) / "config.json"
        if config_file.is_file() and json.loads(config_file.read_text()).get("model_type") != EagleConfig.model_type:
            return load_public_checkpoint(path, dtype=kwargs.get("dtype"))
        return super()._load_checkpoint(path, *args, **kwargs)

    def attach_base_model(self, model: PreTrainedModel) -> None:
        """`DrafterModel.attach_base_model`, and the target's number of layers (EAGLE-3 reads three of them)."""
        super().attach_base_model(model)
        num_layers = text_config(model).num_hidden_layers
        self.__dict__["num_target_layers"] = num_layers
        if self.config.target_num_layers is None:
            self.config.target_num_layers = num_layers

    def _shape_checks(self, model: PreTrainedModel) -> dict[str, tuple[int, int]]:
        vocab, hidden = output_embeddings(model, type(self).__name__).weight.shape
        width = input_embeddings(model, type(self).__name__).weight.shape[1]
        feature = self.config.target_hidden_size or self.config.hidden_size
        return {
            "hidden_size": (feature, hidden),
            "vocab_size": (self.config.vocab_size, vocab),
            "embedding_size": (self.config.hidden_size, width),
        }

    # ------------------------------------------------------------------ draft vocabulary (EAGLE-3)
    def _set_d2t(self, draft_ids: torch.Tensor) -> None:
        ids = torch.as_tensor(draft_ids, dtype=torch.long).reshape(-1).to(self.d2t.device)
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    @torch.no_grad()
    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """EAGLE-3: the draft vocabulary's target ids (ascending, e.g. `frequent_tokens` of the training data, as
        EAGLE-3's reference training picks them by frequency); sets ``d2t`` / ``t2d`` and initialises the
        ``lm_head`` rows from the target's rows when the target is attached."""
        if not self.config.is_eagle3:
            raise ValueError("only EAGLE-3 drafts over its own draft vocabulary")
        ids = torch.as_tensor(target_ids, dtype=torch.long).reshape(-1).sort().values
        if (
            ids.numel() != self.lm_head.out_features
            or ids.unique().numel() != ids.numel()
            or int(ids.max()) >= self.config.vocab_size
        ):
            raise ValueError(
                f"set_draft_vocab needs {self.lm_head.out_features} distinct target ids below {self.config.vocab_size}"
            )
        self._set_d2t(ids)
        if self.base_lm_head is not None:
            self.lm_head.weight.copy_(self.base_lm_head.weight[ids.to(self.base_lm_head.weight.device)])

    def draft_to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """EAGLE-3: target id = draft id + ``d2t[draft id]`` (identity for EAGLE-1/2)."""
        if not self.config.is_eagle3:
            return draft_ids
        return draft_ids + self.d2t.to(draft_ids.device)[draft_ids]

    @property
    def draft_target_ids(self) -> torch.Tensor | None:
        """EAGLE-3: the target id of every draft id (None for EAGLE-1/2)."""
        if not self.config.is_eagle3:
            return None
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    # ------------------------------------------------------------------ forward
    def target_features(self, hidden_states) -> torch.Tensor:
        """The target's features the drafter reads, from its ``output_hidden_states`` tuple: EAGLE-3 the low, mid
        and high layers concatenated ``(B, T, 3H)``; EAGLE-1/2 the final post-norm state ``(B, T, H)``."""
        if hidden_states is None:
            raise ValueError("the EagleDrafter needs the target's hidden states (output_hidden_states=True)")
        layers = self.config.feature_layers(self.num_target_layers or len(hidden_states) - 1)
        feats = [hidden_states[i] for i in layers]
        return torch.cat(feats, dim=-1) if len(feats) > 1 else feats[0]

    def embed(self, input_ids: torch.LongTensor) -> torch.Tensor:
        self._require_base()
        with torch.no_grad():  # the shared table is frozen
            return self.base_embeddings(input_ids).to(self.fc.weight.dtype)

    def fuse(
        self, embeds: torch.Tensor, target_features: torch.Tensor | None, hidden: torch.Tensor | None
    ) -> torch.Tensor:
        """The decoder layer's feature input: from the target's features (``target_features``) or from the
        drafter's own previous output (``hidden``)."""
        dtype = self.fc.weight.dtype
        if self.config.is_eagle3:
            return self.fc(target_features.to(dtype)) if target_features is not None else hidden.to(dtype)
        feature = target_features if target_features is not None else hidden
        return self.fc(torch.cat([embeds, feature.to(dtype)], dim=-1))

    @property
    def layer(self) -> EagleDecoderLayer:
        return self.midlayer if self.config.is_eagle3 else self.layers[0]

    def compute_logits(self, hidden: torch.Tensor, extra_rows: torch.Tensor | None = None) -> torch.Tensor:
        """EAGLE-3: ``lm_head(norm(g))`` over the draft vocabulary, then ``extra_rows`` (more head rows, e.g. the
        target's rows of the prompt's tokens outside the draft vocabulary); EAGLE-1/2: the target's ``lm_head(g)``."""
        if self.config.is_eagle3:
            x = self.norm(hidden)
            fast = engine_product(self.lm_head, x)  # while the engine drafts: its kernel
            logits = fast if fast is not None else vocab_logits(x, self.lm_head.weight)
            return logits if extra_rows is None else torch.cat([logits, vocab_logits(x, extra_rows)], dim=-1)
        self._require_base()
        fast = engine_product(self.base_lm_head, hidden) if getattr(self.base_lm_head, "bias", None) is None else None
        if fast is not None:
            return fast
        logits = vocab_logits(hidden, self.base_lm_head.weight.detach())
        return logits + self.base_lm_head.bias if getattr(self.base_lm_head, "bias", None) is not None else logits

    @takes_cache
    def forward(
        self,
        input_ids: torch.LongTensor,
        target_features: torch.Tensor | None = None,
        hidden: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
        use_cache: bool = False,
        compute_logits: bool = True,
        output_rows: torch.LongTensor | None = None,
        **kwargs,
    ) -> EagleOutput:
        """Rows ``(B, T)``: row j pairs token ``input_ids[:, j]`` (x_{j+1}) with ``target_features[:, j]`` (f_j) or,
        drafting deeper, the drafter's own output ``hidden[:, j]``. ``attention_mask``: an additive float mask
        ``(B or 1, 1, T, past + T)``; None is causal (no past). Returns the predicted features and logits.
        ``output_rows`` ``(B,)``: predict for row ``output_rows[b]`` of each batch row only (outputs ``(B, 1, ...)``;
        the cache still gets every row's keys and values): a pass over committed rows needs only its last output."""
        embeds = self.embed(input_ids)
        x = self.fuse(embeds, target_features, hidden)
        B, T = input_ids.shape
        past = 0 if cache is None else cache[0].shape[2]
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=x.device)[None].expand(B, -1)
        if attention_mask is None:
            if past:
                raise ValueError("pass an attention_mask when attending to a cache")
            attention_mask = causal_mask(T, x.dtype, x.device)
        cos, sin = self.rotary_emb(x, position_ids)
        out, kv = self.layer(x, embeds, cos, sin, attention_mask, cache, output_rows)
        logits = self.compute_logits(out) if compute_logits else None
        return EagleOutput(hidden_states=out, logits=logits, cache=kv if use_cache else None)

    # ------------------------------------------------------------------ drafting
    def _tree_drafter(self, target: PreTrainedModel) -> "EagleTreeDrafter":
        return EagleTreeDrafter(self, target=target, context_tokens=self.config.context_tokens)


def _copy_target_module(own: nn.Module, target_layer: nn.Module, name: str, target_may_hold_more: bool = False) -> None:
    """Load the target decoder layer's module ``name`` into the drafter's ``own``: the same tensors at the same
    shapes (``target_may_hold_more``: the target's may have more tensors, left out). A mismatch is a ValueError."""
    theirs = getattr(target_layer, name, None)
    if not isinstance(theirs, nn.Module):
        problems = [f"the target's last decoder layer ({type(target_layer).__name__}) has no {name!r}"]
    else:
        mine, state = own.state_dict(), theirs.state_dict()
        problems = [f"{k} missing" for k in mine if k not in state]
        problems += [f"{k} not in the drafter's" for k in state if k not in mine and not target_may_hold_more]
        problems += [
            f"{k} of shape {tuple(state[k].shape)}, the drafter's {tuple(v.shape)}"
            for k, v in mine.items()
            if k in state and state[k].shape != v.shape
        ]
    if problems:
        raise ValueError(
            f"cannot initialise the EAGLE drafter's {name} from the target's last decoder layer: "
            f"{'; '.join(problems[:6])}. Build the drafter with init_from_target=False to start from random weights"
        )
    own.load_state_dict({k: state[k] for k in mine})


def causal_mask(T: int, dtype: torch.dtype, device, past: int = 0) -> torch.Tensor:
    """Additive ``(1, 1, T, past + T)`` mask: row i sees the past and rows <= i."""
    visible = torch.ones(T, past + T, dtype=torch.bool, device=device).tril(past)
    mask = torch.zeros(T, past + T, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


class EagleTreeDrafter(OneRowDrafter):
    """Drafting a tree with an `EagleDrafter` inside the engine: each row of a batch keeps its own state (below);
    the rows' static trees are drafted together, one drafter forward per depth (`drafting.propose_rows`).

    State between steps: the target's features ``f_0 .. f_{L-2}`` of the committed sequence ``x_0 .. x_{L-1}`` (read
    from the prefill and verification forwards the engine already ran: no extra target pass) and the drafter's
    KV cache of the rows ``j = 0 .. L-2`` (row j = (x_{j+1}, f_j) at position j). A step first runs the rows not
    cached yet; the last row's output drafts depth 1. A drafted node at depth d is a drafter row at position
    ``L - 2 + d`` fed its parent's output, attending to the committed rows and its ancestors' rows (tree
    attention in the drafter, EAGLE Sec. 4.1). Tree rows are dropped after the step: the next step recomputes
    the accepted tokens' rows from the target's true features.

    Trees: EAGLE-2's `DynamicTree` (expand the top-k by path confidence, rerank to ``total_tokens``), with fixed
    top-k candidates in every mode; or a static `TreeSpec`, whose children are the top-k (greedy) or drawn
    without replacement from the drafter's distribution (sampling, exact tree rejection sampling).

    Context tokens (``context_tokens=True``, EAGLE-3 with a reduced draft vocabulary): the prompt's tokens outside
    the draft vocabulary join it for the call, scored with the target's ``lm_head`` rows (the rows EAGLE-3's head
    starts from). Tasks that copy names and values from the prompt can then draft them; the cost is a few more
    head rows per drafter forward.
    """

    needs_target_hidden_states = True
    fills_dynamic_tree = True
    proposals_optional = True  # the features come from advance; propose runs the uncached committed rows
    #: the calibration's held-out accuracies (`training_eagle.eagle_step_accuracies`)
    accuracy_key = "step_top_i_accuracy"

    def __init__(
        self,
        drafter: EagleDrafter,
        draft_sampling: str = "without_replacement",
        target: PreTrainedModel | None = None,
        context_tokens: bool = True,
    ):
        from ..cost_aware import cost_aware_tree

        self.drafter = drafter
        self._body_share, self._head_share = _drafting_shares(drafter, target)
        config = drafter.config
        self.batch_tree = functools.partial(
            cost_aware_tree, config.tree, config, self.accuracy_key, target, self.draft_cost
        )
        self.default_tree = self.batch_tree(batch_size=1)
        self.vocab_size = drafter.config.vocab_size
        self.draft_sampling = draft_sampling
        self.features: torch.Tensor | None = None
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self.rows = 0
        self.context_tokens = context_tokens
        self._vocab_ids = drafter.draft_target_ids  # the draft vocabulary's target ids (None: the full vocabulary)
        self._target_ids, self._extra_rows = self._vocab_ids, None  # this call's, with its context tokens

    def draft_modules(self) -> tuple[nn.Module, ...]:
        return (self.drafter,)

    def draft_cost(self, curve) -> list[float]:
        """Drafting cost per tree depth D in plain steps: D drafter forwards (the committed rows', then one per inner
        depth), each the drafter's share of a target step's decoder weights plus its head over the draft vocabulary.
        Calibrated trees are sized with it (`hf_speculative.drafters.cost_aware`)."""
        head = curve.projection_cost(1) if hasattr(curve, "projection_cost") else 0.0
        head = head or self._head_share  # the head's share of a step, measured, else by its weights
        config = self.drafter.config
        vocab = (config.draft_vocab_size or config.vocab_size) / config.vocab_size
        one = self._body_share * (curve(1) - head) + vocab * head
        depth = max(len((getattr(config, "calibration", None) or {}).get(self.accuracy_key) or []), config.tree_depth)
        return [d * one for d in range(1, depth + 1)]

    # ------------------------------------------------------------------ state
    def begin(self, prompt_ids, target_outputs) -> None:
        feats = self.drafter.target_features(target_outputs.hidden_states)[0]
        missing = prompt_ids.shape[1] - feats.shape[0]  # positions prefilled before this call: zeros
        self.features = torch.cat([feats.new_zeros(missing, feats.shape[-1]), feats]) if missing > 0 else feats
        self.kv, self.rows = None, 0
        self._target_ids, self._extra_rows = self._context_vocab(prompt_ids)

    def _context_vocab(self, prompt_ids: torch.LongTensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(target ids, extra head rows)`` of this call: the draft vocabulary, then the prompt's tokens outside
        it with the target's ``lm_head`` rows (assigned fresh per call: `OneRowDrafter` copies the drafter per row)."""
        base, head = self._vocab_ids, self.drafter.base_lm_head
        if base is None or not self.context_tokens or not self.drafter.config.is_eagle3 or head is None:
            return base, None
        prompt = prompt_ids.reshape(-1).to(base.device)
        seen = torch.zeros(self.vocab_size, dtype=torch.bool, device=base.device)
        seen[prompt[(prompt >= 0) & (prompt < self.vocab_size)]] = True
        seen[base] = False
        extra = seen.nonzero().reshape(-1)
        if extra.numel() == 0:
            return base, None
        rows = head.weight.detach()[extra.to(head.weight.device)].to(self.drafter.lm_head.weight)
        return torch.cat([base, extra]), rows

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The drafter's logits over this call's draft vocabulary (its context tokens last)."""
        return self.drafter.compute_logits(hidden, self._extra_rows)

    def advance(self, sequence, draft, result, target_outputs) -> None:
        new = self.drafter.target_features(target_outputs.hidden_states)[0, list(result.path)]
        self.features = torch.cat([self.features, new])[: sequence.shape[1] - 1]

    def end(self) -> None:
        self.features, self.kv, self.rows = None, None, 0
        self._target_ids, self._extra_rows = self._vocab_ids, None

    # ------------------------------------------------------------------ drafting
    def _full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``(n, V_draft)`` -> target-vocabulary logits ``(n, V)``, -inf outside."""
        if self._target_ids is None:
            return logits.float()
        full = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"), dtype=torch.float32)
        return full.index_copy_(1, self._target_ids.to(logits.device), logits.float())

    @torch.no_grad()
    def propose_batch(self, sequences, rows, tree, options: DraftingOptions) -> list[DraftTree]:
        """The rows' static trees together, one drafter forward per depth (`drafting.propose_rows`); EAGLE-2's
        dynamic tree row by row (`drafting.grow_dynamic`). No rows (a hybrid's gate left every row out): no drafts."""
        if not rows:
            return []
        drafters = [self.row_drafter(r) for r in rows]
        if isinstance(tree, DynamicTree):
            return [grow_dynamic(drafter, seq, tree) for drafter, seq in zip(drafters, sequences)]
        return propose_rows(drafters, sequences, tree, options)

    def _fill_static_children(
        self,
        node: int,
        kids,
        logits: torch.Tensor,
        tokens: torch.Tensor,
        probs: torch.Tensor | None,
        scheme: str,
        options: DraftingOptions,
    ) -> list[float]:
        """A static node's children tokens (and their draft distribution ``q`` when sampled), written in place;
        returns each child's probability under the drafter's distribution."""
        device = tokens.device
        if scheme == "deterministic":  # top-k in the draft vocabulary, mapped to target ids
            top = torch.topk(torch.softmax(logits.float(), dim=-1), min(len(kids), logits.shape[-1]))
            chosen, q, chance = top.indices, None, top.values
            chosen = chosen if self._target_ids is None else self._target_ids[chosen]
        else:  # draws from q over the target vocabulary (zero outside the draft vocabulary)
            chosen, q = fill_children(self._full_logits(logits[None])[0], len(kids), scheme, options)
            chance = q[chosen]
        tokens[list(kids)] = chosen.to(device)
        if probs is not None:
            probs[node] = q.to(device)
        return chance.tolist()


def _drafting_shares(drafter: EagleDrafter, target: PreTrainedModel | None) -> tuple[float, float]:
    """``(body, head)``: the drafter's ``fc`` and decoder layer against the target's decoder weights, and the target's
    ``lm_head`` against all the weights a target step reads (what a memory-bound step costs), from parameter counts
    only (no values read); ``(0, 0)`` without a target."""
    if target is None:
        return 0.0, 0.0
    own = sum(p.numel() for m in (drafter.fc, drafter.layer) for p in m.parameters())
    head = output_embeddings(target).weight
    body = target.num_parameters(exclude_embeddings=True)  # an untied lm_head is not an embedding: take it out
    if head is not getattr(input_embeddings(target), "weight", None):
        body -= head.numel()
    return own / max(body, 1), head.numel() / max(body + head.numel(), 1)


# ---------------------------------------------------------------------- public checkpoints
_IGNORED_PUBLIC_KEYS = ("embed_tokens.weight", "model.embed_tokens.weight")


def _read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    for name in ("model.safetensors", "pytorch_model.bin"):
        path = folder / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(str(path), map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} holds no model.safetensors nor pytorch_model.bin")


def is_public_checkpoint(path) -> bool:
    """Whether ``path`` holds weights in the public EAGLE / EAGLE-3 layout (``fc.weight`` with ``layers.0.*`` or
    ``midlayer.*``), judged from the tensor names alone."""
    folder = Path(path)
    if (folder / "model.safetensors").is_file():
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            keys = set(f.keys())
    elif (folder / "pytorch_model.bin").is_file():
        try:  # names only: the tensors stay on disk (zip-format files)
            keys = set(torch.load(str(folder / "pytorch_model.bin"), map_location="cpu", weights_only=True, mmap=True))
        except RuntimeError:  # a legacy-format file cannot be mapped
            keys = set(torch.load(str(folder / "pytorch_model.bin"), map_location="cpu", weights_only=True))
    else:
        return False
    keys = {k.removeprefix("model.") for k in keys}
    return "fc.weight" in keys and any(k.startswith(("layers.0.", "midlayer.")) for k in keys)


def _public_feature_layers(raw: dict) -> list[int] | None:
    """EAGLE-3 target layers a public config names, as transformers' ``hidden_states`` indices (the input of that
    layer): vLLM's ``eagle_aux_hidden_state_layer_ids`` already are; SGLang's (and SpecForge's)
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` name the layer whose output is taken (SGLang adds 1)."""
    if raw.get("eagle_aux_hidden_state_layer_ids"):
        return [int(i) for i in raw["eagle_aux_hidden_state_layer_ids"]]
    ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return None if not ids else [int(i) + 1 for i in ids]


def load_public_checkpoint(path, dtype: torch.dtype | str | None = None) -> EagleDrafter:
    """An `EagleDrafter` from a public EAGLE checkpoint folder, as the EAGLE repository (SafeAILab/EAGLE), its
    Hub releases (yuhuili/EAGLE-*, EAGLE3-*) and SpecForge publish them and vLLM / SGLang load them (what
    ``hf-speculative export`` writes, `hf_speculative.drafters.eagle.serving`): ``config.json`` with `LlamaConfig`
    fields (``draft_vocab_size``, ``target_hidden_size`` for EAGLE-3) and ``pytorch_model.bin`` (read with
    ``weights_only=True``) or ``model.safetensors``.

    Keys: EAGLE-1/2 ``fc.weight`` (``fc.bias``), ``layers.0.*`` (no ``input_layernorm``); EAGLE-3 ``fc.weight``,
    ``midlayer.*`` (``hidden_norm``, ``input_layernorm``, q/k/v of input width 2H; vLLM's ``layers.0.*`` spelling
    too), ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d`` (identity when absent and the draft vocabulary is the
    full one). An embedding table in the checkpoint is ignored (the target's is shared); an all-zero ``fc.bias``
    (SGLang's EAGLE-1 ``fc`` always has one) is no bias. The variant is read from the keys; EAGLE-3's target layers
    from ``eagle_aux_hidden_state_layer_ids`` / ``eagle_config`` when given, else resolved when the target is
    attached. A folder in vllm-project/speculators' EAGLE-3 layout (``speculators_model_type: eagle3``; ``export
    --format speculators`` writes one) is read the same way, its config through `speculators.public_fields`.
    """
    folder = Path(path)
    raw = json.loads((folder / "config.json").read_text())
    if "speculators_model_type" in raw:
        from .speculators import public_fields

        raw = public_fields(raw)
    state, eagle3 = _public_state(folder, raw)
    fields = _public_config_fields(raw, state, eagle3)
    drafter = EagleDrafter(EagleConfig(variant="eagle3" if eagle3 else "eagle1", **fields))
    _load_public_state(drafter, state, folder, eagle3)
    if dtype is not None:
        drafter = drafter.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    return drafter


def _public_state(folder: Path, raw: dict) -> tuple[dict[str, torch.Tensor], bool]:
    """A public checkpoint's weights under this package's names (``model.`` dropped, EAGLE-3's ``layers.0.*`` as
    ``midlayer.*``, an all-zero ``fc.bias`` dropped) and whether it is EAGLE-3."""
    state = {
        k.removeprefix("model.") if k.startswith("model.") and not k.startswith("model.embed") else k: v
        for k, v in _read_state_dict(folder).items()
    }
    eagle3 = any(k.startswith("midlayer.") for k in state) or "layers.0.hidden_norm.weight" in state
    if eagle3:
        state = {
            "midlayer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k: v for k, v in state.items()
        }
    elif not any(k.startswith("layers.0.") for k in state):
        raise ValueError(
            f"{folder} is not an EAGLE checkpoint: no midlayer.* (EAGLE-3) nor layers.0.* (EAGLE-1/2) weights"
        )
    if raw.get("norm_before_residual"):
        raise ValueError(f"{folder}: norm_before_residual (a residual taken after hidden_norm) is not EAGLE-3's layer")
    if "fc.bias" in state and not bool(state["fc.bias"].ne(0).any()):
        del state["fc.bias"]
    return state, eagle3


def _public_config_fields(raw: dict, state: dict[str, torch.Tensor], eagle3: bool) -> dict:
    """`EagleConfig` fields from a public ``config.json`` and the weights' shapes; adds EAGLE-3's ``d2t`` / ``t2d``
    to ``state`` (identity) when absent and the draft vocabulary is the full one."""
    server_only = ("eagle_config", "eagle_aux_hidden_state_layer_ids", "norm_before_residual")
    fields = {
        k: v
        for k, v in raw.items()
        if k
        not in ("model_type", "architectures", "transformers_version", "torch_dtype", "dtype", "auto_map", *server_only)
    }
    layer = "midlayer" if eagle3 else "layers.0"
    fields["fc_bias"] = "fc.bias" in state
    fields["qkv_bias"] = f"{layer}.self_attn.q_proj.bias" in state
    fields["attention_bias"] = f"{layer}.self_attn.o_proj.bias" in state
    fields["num_hidden_layers"] = 1
    if eagle3:
        fields["draft_vocab_size"] = int(state["lm_head.weight"].shape[0])
        fields["target_hidden_size"] = int(raw.get("target_hidden_size") or state["fc.weight"].shape[1] // 3)
        if fields["target_hidden_size"] == fields.get("hidden_size"):
            fields["target_hidden_size"] = None
        fields["target_layers"] = _public_feature_layers(raw)
        if "d2t" not in state and fields["draft_vocab_size"] == fields.get("vocab_size"):
            state["d2t"] = torch.zeros(fields["draft_vocab_size"], dtype=torch.long)
        if "t2d" not in state and "d2t" in state:
            state["t2d"] = torch.zeros(fields["vocab_size"], dtype=torch.bool)
            state["t2d"][torch.arange(state["d2t"].numel()) + state["d2t"]] = True
    else:
        fields.pop("draft_vocab_size", None)
    return fields


def _load_public_state(drafter: EagleDrafter, state: dict[str, torch.Tensor], folder: Path, eagle3: bool) -> None:
    """Load ``state`` into ``drafter`` (strict), the ignored keys dropped; a layout mismatch is a clear error."""
    for key in _IGNORED_PUBLIC_KEYS:
        state.pop(key, None)
    if not eagle3:
        state.pop("layers.0.input_layernorm.weight", None)  # EAGLE-1's layer 0 has none (some exports carry one)
    expected = drafter.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise ValueError(
            f"{folder}: weights do not match the EAGLE layout (missing {missing[:6]}, unexpected {unexpected[:6]})"
        )
    mismatched = [
        f"{k} {tuple(v.shape)} (expected {tuple(expected[k].shape)})"
        for k, v in state.items()
        if v.shape != expected[k].shape
    ]
    if mismatched:
        raise ValueError(f"{folder}: weights do not match the EAGLE layout's shapes: {', '.join(mismatched[:6])}")
    # every tensor in the drafter's dtype: floating weights stored in another precision, d2t / t2d as int64 / bool
    drafter.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)
