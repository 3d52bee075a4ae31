"""SPIRe (Neelam et al., "SPIRe: Boosting LLM Inference Throughput with Speculative Decoding", 2025): a drafter built
for throughput at large batch and long context.

* **Pruned initialization** (Sec. 3.2): the drafter's ``n`` decoder layers are copies of target layers (by default
  its last ``n``), its final norm is the target's; token embeddings and ``lm_head`` are the target's, shared and
  frozen (so the checkpoint holds only the layers).
* **Static sparse attention** (Sec. 3.1): a StreamingLLM KV cache, a sliding window of W positions plus S attention
  sinks, in training and in inference. Keys keep their positions in the original text (Sec. 3.1, footnote 4), so a
  query at position t sees the keys at s with ``t - s < W`` or ``s < S``; the drafter's cache stays S + W - 1
  entries whatever the context length.
* **Feedback memory** (Sec. 3.3): layer i does not attend to its own input activations but to memory vectors
  ``m_t^i = sum_l softmax(w_i)_l x_t^l`` over all the drafter's activations at that position (``l = 0`` the
  embedding, ``l = i`` layer i's output), ``w`` of shape ``(n, n + 1)``; each layer has its own key and value
  projections (those of the target layer it was pruned from). At positions the target has verified the memory is the
  target's own activation at the layer that initialised drafter layer i (``output_hidden_states[target_layers[i]]``,
  the input of that layer); drafted positions use the drafter's feedback memory. A query always sees its own key and
  value from its input activation (its memory is not complete before all layers ran).

The tree engine calls `SpireTreeDrafter`: per step ``k`` one-token drafter forwards from the root draft a chain,
with the chain's next candidates at every depth as leaves (`chain_with_alternatives`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.utils import ModelOutput

from ...engine.logits import vocab_logits
from ...engine.trees import DraftingOptions, DraftTree, TreeSpec
from ..base import rope
from ..chain import ChainDrafting, ChainTreeFiller
from ..cost_aware import cost_aware_tree
from ..draft_vocab import DraftVocabMixin, draft_vocab_logits
from ..modeling_drafter import DrafterModel, decoder_layer_fields, text_config
from ..sparse_cache import sparse_visibility, streaming_keep
from .configuration_spire import SpireConfig, chain_with_alternatives

__all__ = ["SpireDrafter", "SpireTreeDrafter", "SpireOutput", "SpirePreTrainedModel"]


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, torch.finfo(dtype).min)


class SpireAttention(nn.Module):
    """The target layer's attention projections (same parameter names), queried by the layer's input and keyed by
    memory vectors (`SpireLayer.memory_kv`)."""

    def __init__(self, config: SpireConfig):
        super().__init__()
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        H, bias = config.hidden_size, config.qkv_bias or bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(H, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(H, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(H, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, H, bias=bool(getattr(config, "attention_bias", False)))

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(*x.shape[:-1], n, self.head_dim).transpose(1, 2)


class SpireLayer(nn.Module):
    """One drafter decoder layer (pre-norm attention + MLP, the target family's parameter names)."""

    def __init__(self, config: SpireConfig):
        super().__init__()
        self.self_attn = SpireAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def memory_kv(
        self, memory: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(B, kv_heads, T, d)`` of memory vectors ``(B, T, H)`` at the positions of ``cos, sin``."""
        attn = self.self_attn
        h = self.input_layernorm(memory)
        k = rope(attn._heads(attn.k_proj(h), attn.num_kv_heads), cos, sin)
        return k, attn._heads(attn.v_proj(h), attn.num_kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """``x (B, T, H)``: the layer's input at T query positions; ``keys, values (B, kv_heads, M, d)`` memory entries
        and ``mask (B, 1, T, M)`` (additive) their visibility. Each query also sees its own key (appended last)."""
        attn = self.self_attn
        h = self.input_layernorm(x)
        q = rope(attn._heads(attn.q_proj(h), attn.num_heads), cos, sin)
        k_self = rope(attn._heads(attn.k_proj(h), attn.num_kv_heads), cos, sin)
        v_self = attn._heads(attn.v_proj(h), attn.num_kv_heads)
        T = x.shape[1]
        keys, values = torch.cat([keys, k_self], 2), torch.cat([values, v_self], 2)
        own = _additive(torch.eye(T, dtype=torch.bool, device=x.device), mask.dtype).expand(*mask.shape[:2], T, T)
        mask = torch.cat([mask, own], -1)
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, enable_gqa=attn.num_heads != attn.num_kv_heads
        )
        x = x + attn.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class SpireOutput(ModelOutput):
    """``hidden_states``: the drafter's final normed states ``(B, T, H)``; ``logits`` when asked for."""

    hidden_states: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class SpirePreTrainedModel(DrafterModel):
    config_class = SpireConfig
    base_model_prefix = "spire"
    supports_gradient_checkpointing = False
    _supports_sdpa = True

    def _init_weights(self, module):
        if isinstance(module, SpireDrafter):
            init.copy_(module.memory_logits, module.initial_memory_logits())
        else:
            super()._init_weights(module)


class SpireDrafter(DraftVocabMixin, SpirePreTrainedModel):
    """A SPIRe drafter; use as ``model.generate(input_ids, assistant_model=drafter)``.

    Build one with `from_base_model` (pruned init), train it with ``hf-speculative train spire``, load it with
    ``SpireDrafter.from_pretrained(folder, base_model=model)`` or ``AutoModel.from_pretrained(folder)`` (the target
    is attached when drafting starts).
    """

    def __init__(self, config: SpireConfig):
        super().__init__(config)
        n = config.num_hidden_layers
        self.layers = nn.ModuleList(SpireLayer(config) for _ in range(n))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.memory_logits = nn.Parameter(self.initial_memory_logits())
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self._init_draft_vocab()
        self.post_init()

    def initial_memory_logits(self) -> torch.Tensor:
        """``w (n, n + 1)``: ``memory_init_logit`` on layer i's own input activation (``l = i``), 0 elsewhere."""
        n = self.config.num_hidden_layers
        return torch.eye(n, n + 1) * self.config.memory_init_logit

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_base_model(
        cls,
        model: PreTrainedModel,
        num_layers: int = 2,
        layers: list[int] | None = None,
        **config_kwargs,
    ) -> "SpireDrafter":
        """SPIRe's pruned initialization (Sec. 3.2): copies of the target's decoder ``layers`` (default its last
        ``num_layers``) and final norm; the target's embeddings and ``lm_head`` are shared. ``config_kwargs``:
        `SpireConfig` fields (``sliding_window``, ``num_sink_tokens``, ...)."""
        tc = text_config(model)
        L = tc.num_hidden_layers
        layers = list(range(L - num_layers, L)) if layers is None else [int(i) for i in layers]
        if not layers or any(not 0 <= i < L for i in layers):
            raise ValueError(f"layers must be target layer indices in 0..{L - 1}, got {layers}")
        qkv_bias = getattr(model, model.base_model_prefix).layers[0].self_attn.q_proj.bias is not None
        config = SpireConfig(
            target_layers=layers,
            target_num_layers=L,
            num_hidden_layers=len(layers),
            qkv_bias=qkv_bias,
            attention_bias=bool(getattr(tc, "attention_bias", False)),
            initializer_range=getattr(tc, "initializer_range", 0.02),
            **cls._base_model_fields(model),
            **decoder_layer_fields(model),
            **config_kwargs,
        )
        return cls._from_base_config(model, config)

    def _init_from_base_model(self, model: PreTrainedModel) -> None:
        base = getattr(model, model.base_model_prefix)
        for mine, i in zip(self.layers, self.config.target_layers):
            mine.load_state_dict(base.layers[i].state_dict(), strict=False)
        self.norm.load_state_dict(base.norm.state_dict())

    def _shape_checks(self, model: PreTrainedModel) -> dict[str, tuple[int, int]]:
        checks = super()._shape_checks(model)
        if self.config.target_num_layers is not None:
            checks["num_hidden_layers"] = (self.config.target_num_layers, text_config(model).num_hidden_layers)
        return checks

    def _tree_drafter(self, target: PreTrainedModel) -> "SpireTreeDrafter":
        return SpireTreeDrafter(self, target=target)

    # ------------------------------------------------------------------ building blocks
    def memory_weights(self) -> torch.Tensor:
        """``softmax(w_i)`` over the ``n + 1`` activations, per layer: ``(n, n + 1)``, rows sum to 1 (Sec. 3.3)."""
        return torch.softmax(self.memory_logits.float(), dim=-1)

    def feedback_memory(self, activations: list[torch.Tensor]) -> list[torch.Tensor]:
        """The memory vectors ``m^i = sum_l softmax(w_i)_l x^l`` of every layer from the activations
        ``[x^0 (embedding), x^1, ..., x^n]``, each ``(B, T, H)``."""
        stacked = torch.stack(activations, dim=0)  # (n + 1, B, T, H)
        weights = self.memory_weights().to(stacked.dtype)
        return list(torch.einsum("il,lbth->ibth", weights, stacked).unbind(0))

    def embed(self, input_ids: torch.LongTensor) -> torch.Tensor:
        self._require_base()
        return self.base_embeddings(input_ids).to(self.norm.weight.dtype)

    def rope(self, x: torch.Tensor, position_ids: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary_emb(x, position_ids)

    def target_memory_kv(
        self, memories: list[torch.Tensor], position_ids: torch.LongTensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, keys and values of memory vectors ``(B, T, H)`` (the target's activations, or the drafter's
        feedback memory) at ``position_ids (B, T)``."""
        cos, sin = self.rope(memories[0], position_ids)
        return [layer.memory_kv(m.to(self.norm.weight.dtype), cos, sin) for layer, m in zip(self.layers, memories)]

    def step(
        self,
        x: torch.Tensor,
        position_ids: torch.LongTensor,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One drafter pass at T query positions: ``x (B, T, H)`` the embeddings, ``kv`` per layer the visible memory
        entries, ``mask (B, 1, T, M)``. Returns the final normed state and the activations ``[x^0, ..., x^n]``."""
        cos, sin = self.rope(x, position_ids)
        acts = [x]
        for layer, (k, v) in zip(self.layers, kv):
            acts.append(layer(acts[-1], cos, sin, k, v, mask))
        return self.norm(acts[-1]), acts

    def compute_logits(self, hidden: torch.Tensor, full_vocab: bool = True) -> torch.Tensor:
        """Logits of the shared ``lm_head``: over the draft vocabulary when there is one (scattered back to the
        target's vocabulary with -inf outside when ``full_vocab``), else over the vocabulary."""
        self._require_base()
        weight = self.base_lm_head.weight
        if self.draft_to_target is None:
            return vocab_logits(hidden, weight)
        if full_vocab:
            return draft_vocab_logits(hidden, weight, self.draft_to_target)
        return F.linear(hidden.to(weight.dtype), weight.index_select(0, self.draft_to_target))

    # ------------------------------------------------------------------ training forward (Sec. 3.3)
    def forward(
        self,
        input_ids: torch.LongTensor,
        target_memory: list[torch.Tensor],
        position_ids: torch.LongTensor | None = None,
        num_passes: int | None = None,
        prefix_rows: int = 0,
        compute_logits: bool = False,
        full_vocab: bool = False,
    ) -> SpireOutput:
        """The parallel training forward: ``k = num_passes`` (default ``num_draft_tokens``) passes over blocks of k
        rows. Row r of block ``[b k, b k + k)`` is drafted at pass ``r - b k``, as depth ``r - b k`` of a drafting
        step whose root is row ``b k``: it sees the target's memory (``target_memory[i] (B, T, H)``, the activation
        of the target layer that initialised drafter layer i) at rows before its block, within the window or among
        the sinks, the drafter's own feedback memory at the earlier rows of its block, and itself. ``position_ids
        (B, T)``: positions in the original text (default ``0..T-1``). The first ``prefix_rows`` rows are memory only
        (e.g. the sinks of a chunk cut from the middle of a text): blocks start after them and their outputs are zeros.
        Returns the final normed states ``(B, T, H)`` (and logits over the draft vocabulary when ``compute_logits``)."""
        k = num_passes or self.config.num_draft_tokens
        B, T = input_ids.shape
        P = int(prefix_rows)
        pad = (-(T - P)) % k
        if pad:  # whole blocks: padded rows come last, see only rows before their block and are dropped at the end
            input_ids = F.pad(input_ids, (0, pad))
            target_memory = [F.pad(m, (0, 0, 0, pad)) for m in target_memory]
            if position_ids is not None:
                position_ids = torch.cat(
                    [position_ids, position_ids[:, -1:] + torch.arange(1, pad + 1, device=position_ids.device)], 1
                )
        Tp = T + pad
        if position_ids is None:
            position_ids = torch.arange(Tp, device=input_ids.device).expand(B, Tp)
        W, S = self.config.sliding_window, self.config.num_sink_tokens
        dtype = self.norm.weight.dtype
        x0 = self.embed(input_ids)
        target_kv = self.target_memory_kv(target_memory, position_ids)
        rows = torch.arange(Tp, device=input_ids.device)
        own_block = torch.eye((Tp - P) // k, dtype=torch.bool, device=input_ids.device)
        drafted_kv: list[list[tuple[torch.Tensor, torch.Tensor]]] = []  # per pass, per layer
        out = x0.new_zeros(B, Tp, self.config.hidden_size)
        for j in range(k):
            q_rows = rows[P + j :: k]  # (nb,)
            q_pos = position_ids[:, P + j :: k]
            visible = sparse_visibility(q_pos, position_ids, W, S) & (rows[None, None, :] < (q_rows - j)[None, :, None])
            parts = [visible]
            for jp in range(j):  # the block's earlier rows (drafted at pass jp), within the window
                parts.append(own_block.expand(B, -1, -1) & (j - jp < W))
            mask = _additive(torch.cat(parts, -1), dtype)[:, None]
            kv = []
            for i in range(len(self.layers)):
                ks = [target_kv[i][0]] + [drafted_kv[jp][i][0] for jp in range(j)]
                vs = [target_kv[i][1]] + [drafted_kv[jp][i][1] for jp in range(j)]
                kv.append((torch.cat(ks, 2), torch.cat(vs, 2)))
            hidden, acts = self.step(x0[:, P + j :: k], q_pos, kv, mask)
            out[:, P + j :: k] = hidden
            if j + 1 < k:
                drafted_kv.append(self.target_memory_kv(self.feedback_memory(acts), q_pos))
        out = out[:, :T]
        logits = self.compute_logits(out, full_vocab=full_vocab) if compute_logits else None
        return SpireOutput(hidden_states=out, logits=logits)


class SpireTreeDrafter(ChainDrafting):
    """Per-call SPIRe state: the sparse cache of the target's memory (S sinks + the last W - 1 verified positions,
    keys and values per drafter layer) and the drafting loop.

    Per step: from the root (the last committed token, not yet verified) ``k`` one-token drafter forwards draft a
    chain; depth d's candidates are the chain node's top-i (greedy) or draws from its distribution (sampling, the
    chain goes on with the first draw), kept with their distribution for exact tree rejection sampling. After the
    verification the accepted path's target activations replace the drafted memory (`advance`).
    """

    needs_target_hidden_states = True

    def __init__(
        self, drafter: SpireDrafter, draft_sampling: str = "without_replacement", target: PreTrainedModel | None = None
    ):
        config = drafter.config
        self.drafter = drafter
        self.draft_sampling = draft_sampling
        self.max_depth = config.num_draft_tokens
        self.batch_tree = functools.partial(
            cost_aware_tree,
            config.tree,
            config,
            "depth_top_i_accuracy",
            target,
            self.draft_cost,
            self.max_depth,
            accuracies=self.rank_accuracies(),
            candidates=self.candidate_trees,
        )
        self.default_tree = self.batch_tree(batch_size=1)
        self.vocab_size = config.vocab_size
        self.window, self.sinks = config.sliding_window, config.num_sink_tokens
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.positions: torch.Tensor | None = None

    # ------------------------------------------------------------------ the cost-aware default tree
    def rank_accuracies(self) -> list[list[float]] | None:
        """The calibration's cumulative top-i acceptance per depth as per-rank accuracies (`TreeSpec.optimize`'s
        form): the chance that the i-th candidate of the chain node at depth d is the target's token."""
        cumulative = (self.drafter.config.calibration or {}).get("depth_top_i_accuracy")
        if not cumulative:
            return None
        return [[b - a for a, b in zip([0.0] + list(row), row)] for row in cumulative]

    def candidate_trees(self, max_depth: int, max_nodes: int) -> list[TreeSpec]:
        """The trees this drafter conditions exactly: `chain_with_alternatives` of every depth and width that fits."""
        width = len((self.drafter.config.calibration or {}).get("depth_top_i_accuracy", [[0]])[0])
        shapes = [chain_with_alternatives(d, i) for d in range(1, max_depth + 1) for i in range(1, width + 1)]
        return [t for t in shapes if t.num_nodes <= max_nodes]

    def draft_cost(self, curve) -> list[float]:
        """Drafting cost per tree depth d in plain steps: d one-token drafter forwards, each its ``n`` layers' share
        of a target step plus one row through the shared ``lm_head`` (the draft vocabulary's share of it)."""
        config = self.drafter.config
        layers = config.num_hidden_layers / max(config.target_num_layers or config.num_hidden_layers, 1)
        one = layers * curve(1) + curve.projection_cost(1, self.drafter.draft_vocab_share)
        return [d * one for d in range(1, self.max_depth + 1)]

    # ------------------------------------------------------------------ the target's memory
    def _append_target(self, hidden_states, rows: torch.Tensor | slice, positions: torch.Tensor) -> None:
        """Add the target's activations of ``rows`` (of a batch-1 output) at ``positions`` and trim to the window."""
        drafter = self.drafter
        layers = drafter.config.target_layers
        memories = [hidden_states[i][0, rows][None] for i in layers]
        # keep only what a later query can see: the sinks and the last W - 1 positions before the next root
        next_root = int(positions[-1]) + 1
        keep = streaming_keep(positions, next_root, self.window, self.sinks)
        if self.kv is not None:
            old = streaming_keep(self.positions, next_root, self.window, self.sinks)
            self.kv = [(k[:, :, old], v[:, :, old]) for k, v in self.kv]
            self.positions = self.positions[old]
        if bool(keep.any()):
            pos = positions[keep]
            new = drafter.target_memory_kv(
                [m[:, keep.to(m.device)] for m in memories], pos[None].to(memories[0].device)
            )
            if self.kv is None:
                self.kv, self.positions = new, pos
            else:
                self.kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(self.kv, new)]
                self.positions = torch.cat([self.positions, pos])

    @torch.no_grad()
    def begin(self, prompt_ids, target_outputs) -> None:
        hs = target_outputs.hidden_states
        n = hs[0].shape[1]
        L = prompt_ids.shape[1]
        self.kv, self.positions = None, None
        self._append_target(hs, slice(None), torch.arange(L - n, L))

    @torch.no_grad()
    def advance(self, sequence, draft, result, target_outputs) -> None:
        path = list(result.path)
        start = sequence.shape[1] - 1 - len(path)  # the root's position (the new bonus token is not verified yet)
        self._append_target(target_outputs.hidden_states, torch.tensor(path), torch.arange(start, start + len(path)))

    def end(self) -> None:
        self.kv, self.positions = None, None

    # ------------------------------------------------------------------ drafting
    @torch.no_grad()
    def _draft_chains(self, states: list["SpireTreeDrafter"], sequences, fillers: list[ChainTreeFiller]) -> None:
        """``fillers[j].num_forwards`` one-token drafter forwards from every row's root, all rows in one forward per
        depth: row j's sparse memory (its sinks and window, padded to the longest row's and masked there) plus its
        drafted feedback memory. ``fillers[j](d, logits)`` gets row j's chain node's distribution at depth d and
        returns the chain's token at depth d + 1."""
        drafter = self.drafter
        device, dtype = drafter.norm.weight.device, drafter.norm.weight.dtype
        B = len(states)
        kv, key_pos, key_ok = self._stacked_memory(states, device)
        query = torch.tensor([[seq.shape[1] - 1] for seq in sequences], device=device)  # (B, 1): the roots' positions
        tokens = torch.stack([seq[0, -1] for seq in sequences]).to(device)
        num_forwards = fillers[0].num_forwards
        for d in range(num_forwards):
            visible = key_ok[:, None] & sparse_visibility(query, key_pos, self.window, self.sinks)  # (B, 1, M + d)
            hidden, acts = drafter.step(drafter.embed(tokens[:, None]), query, kv, _additive(visible, dtype)[:, None])
            logits = drafter.compute_logits(hidden)[:, 0].float()
            next_tokens = [fill(d, logits[j]) for j, fill in enumerate(fillers)]
            if d + 1 < num_forwards:  # the drafted position's feedback memory joins every row's keys
                new = drafter.target_memory_kv(drafter.feedback_memory(acts), query)
                kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(kv, new)]
                key_pos = torch.cat([key_pos, query], 1)
                key_ok = torch.cat([key_ok, key_ok.new_ones(B, 1)], 1)
                tokens = torch.stack(next_tokens).reshape(B).to(device)
                query = query + 1

    @staticmethod
    def _stacked_memory(states: list["SpireTreeDrafter"], device):
        """The rows' sparse memories as one batch: per layer keys and values ``(B, kv_heads, M, d)``, key positions and
        validity ``(B, M)``; shorter rows are padded at the end and masked there (a single row is used as it is)."""
        if len(states) == 1:
            positions = states[0].positions.to(device)[None]
            return list(states[0].kv), positions, torch.ones_like(positions, dtype=torch.bool)
        sizes = [st.positions.numel() for st in states]
        B, M = len(states), max(sizes)
        key_pos = torch.zeros(B, M, dtype=torch.long, device=device)
        key_ok = torch.zeros(B, M, dtype=torch.bool, device=device)
        kv = []
        for i, (k0, _) in enumerate(states[0].kv):
            keys = k0.new_zeros(B, k0.shape[1], M, k0.shape[3])
            values = keys.clone()
            for j, (st, m) in enumerate(zip(states, sizes)):
                keys[j, :, :m], values[j, :, :m] = st.kv[i][0][0], st.kv[i][1][0]
            kv.append((keys, values))
        for j, (st, m) in enumerate(zip(states, sizes)):
            key_pos[j, :m], key_ok[j, :m] = st.positions.to(device), True
        return kv, key_pos, key_ok

    def _propose(
        self, states: list["SpireTreeDrafter"], sequences, tree: TreeSpec, options: DraftingOptions
    ) -> list[DraftTree]:
        if tree.depth > self.max_depth:
            raise ValueError(
                f"this SpireDrafter drafts {self.max_depth} tokens per step; the tree has depth {tree.depth}"
            )
        scheme = options.scheme(self.draft_sampling)
        fillers = [ChainTreeFiller(seq, tree, scheme, options, self.vocab_size) for seq in sequences]
        self._draft_chains(states, sequences, fillers)
        return [f.draft_tree() for f in fillers]
