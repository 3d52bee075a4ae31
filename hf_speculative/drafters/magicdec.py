"""MagicDec (Chen et al., "MagicDec: Breaking the Latency-Throughput Tradeoff for Long Context Generation with
Speculative Decoding", 2024) as the SPIRe paper compares against it: self-speculation by the target with a
StreamingLLM sparse KV cache, no training.

The draft model is the target itself. It reads only the target's own KV cache, restricted to a StreamingLLM cache
(Xiao et al., "Efficient Streaming Language Models with Attention Sinks"): the first S positions (attention sinks) and
the last W - 1 positions before the query (the query itself is the window's last entry), so drafting costs the same
whatever the context length. Per step the drafter copies those ``S + W - 1`` columns of every layer out of the target's
cache (`cache_columns`; a constant-size copy, nothing else is kept between steps) and drafts a chain of k tokens with
k one-token target forwards over that copy; the drafted tokens' keys join the copy as the chain grows and the window
slides with the query. The tree is filled from the chain like SPIRe's (`ChainTreeFiller`): a chain by default,
``chain_with_alternatives`` trees with each chain node's next candidates as leaves, other shapes from the chain's
per-depth distributions. All rows of a batch draft together, one batched forward per depth.

**Positions.** ``positions="cache"`` (default; StreamingLLM, and the SPIRe paper's MagicDec): rotary positions are
indices *within the sparse cache*: the sinks at 0 .. S - 1, the visible window after them, the query last (at
``S + W - 1`` once the window is full). RoPE attention depends only on the difference of the query's and the key's
positions, so this is computed as: the query and the window keep their text positions, and each sink key moves to sit
right before the window's first visible key, i.e. from position i to ``i + delta`` with ``delta = max(0, t - W + 1 - S)``
for a query at text position t. RoPE rotations compose (rotating by a then by b is rotating by a + b), so a sink key
cached rotated at i is re-rotated by ``delta`` (`rerotate_keys`): S keys per layer and drafted token instead of all
S + W - 1. ``positions="original"`` keeps text positions everywhere (sinks far behind the query), as SPIRe's own
drafter does.

The verification forward is the target's ordinary one over the full cache, so the output is exactly the target's
(greedy: token for token; sampling: its distribution, with the draft's q for tree rejection sampling).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.models.llama.modeling_llama import rotate_half

from .._compat import cache_arg, get_cache
from ..engine.cache import attention_window
from ..engine.rows import cache_columns
from ..engine.trees import DraftingOptions, DraftTree, TreeSpec
from .base import output_embeddings, require_mask_attention
from .chain import ChainDrafting, ChainTreeFiller
from .draft_lm import windowed_mask
from .sparse_cache import sparse_visibility, streaming_slots

__all__ = ["MagicDecDrafter", "rerotate_keys"]

POSITIONS = ("cache", "original")
DRAFT_SAMPLING = ("without_replacement", "with_replacement", "deterministic")


def rerotate_keys(keys: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Move RoPE-rotated ``keys`` ``(B, heads, T, head_dim)`` by ``delta`` ``(B,)`` positions (per row): a key rotated at
    position p becomes the key rotated at ``p + delta``, since the rotations compose. ``inv_freq`` ``(head_dim / 2,)``:
    the rotary embedding's frequencies (half-split layout, transformers' ``rotate_half``)."""
    angles = delta.to(inv_freq.device, torch.float32)[:, None] * inv_freq.float()[None]  # (B, head_dim / 2)
    emb = torch.cat([angles, angles], dim=-1)[:, None, None].to(keys.device)  # (B, 1, 1, head_dim)
    cos, sin = emb.cos().to(keys.dtype), emb.sin().to(keys.dtype)
    return keys * cos + rotate_half(keys) * sin


def _rotary_frequencies(model: PreTrainedModel) -> torch.Tensor:
    """The target's RoPE ``inv_freq``, checked to rotate every key dimension by an angle linear in the position."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    rotary = getattr(base, "rotary_emb", None)
    inv_freq = getattr(rotary, "inv_freq", None)
    if inv_freq is None:
        raise ValueError(
            f"positions='cache' re-rotates sink keys with the target's rotary embedding, but {type(model).__name__} has "
            "none (model.model.rotary_emb.inv_freq); use positions='original'"
        )
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type in ("dynamic", "longrope"):
        raise ValueError(
            f"positions='cache' needs RoPE frequencies that do not depend on the sequence length; rope_type={rope_type!r} "
            "changes them, use positions='original'"
        )
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if 2 * inv_freq.shape[0] != head_dim:
        raise ValueError(
            f"positions='cache' supports RoPE over the whole head ({head_dim} dimensions); this model rotates "
            f"{2 * inv_freq.shape[0]} (partial rotary), use positions='original'"
        )
    return inv_freq


class MagicDecDrafter(ChainDrafting):
    """Self-speculation by ``model`` with a StreamingLLM sparse KV cache (see the module docstring).

    Use as ``model.generate(input_ids, assistant_model=MagicDecDrafter(model), ...)``; ``model`` must be the target
    (the drafter reads the target's KV cache and drafts with its weights).

    Args:
        model: the target, a causal LM with ``attn_implementation`` "sdpa" or "eager".
        sliding_window: W: a draft query at text position t sees the cached keys at positions s with ``t - s < W``
            (itself included) ...
        num_sink_tokens: S: ... and the first S positions (attention sinks).
        num_draft_tokens: k, the depth of the default tree (a chain); a call's ``speculative_tree`` may be up to W deep.
        positions: ``"cache"``: rotary positions within the sparse cache (sink keys re-rotated); ``"original"``: text
            positions.
        tree: the default tree instead of ``TreeSpec.chain(num_draft_tokens)``.
        draft_sampling: how a chain node's candidates are drawn when sampling ("without_replacement",
            "with_replacement" or "deterministic" top-k); every choice is exact.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        sliding_window: int = 64,
        num_sink_tokens: int = 1,
        num_draft_tokens: int = 4,
        positions: str = "cache",
        tree: TreeSpec | None = None,
        draft_sampling: str = "without_replacement",
    ):
        if not isinstance(model, PreTrainedModel):
            raise TypeError(
                f"MagicDecDrafter drafts with the target model itself; got {type(model).__name__}, not a PreTrainedModel"
            )
        self.lm_head = output_embeddings(model, "a MagicDecDrafter")
        for name, value, least in (
            ("sliding_window", sliding_window, 1),
            ("num_sink_tokens", num_sink_tokens, 0),
            ("num_draft_tokens", num_draft_tokens, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        if draft_sampling not in DRAFT_SAMPLING:
            raise ValueError(f"draft_sampling must be one of {DRAFT_SAMPLING}, got {draft_sampling!r}")
        if num_draft_tokens > sliding_window:
            raise ValueError(
                f"num_draft_tokens={num_draft_tokens} is more than sliding_window={sliding_window}: the drafted chain must fit "
                "in the window"
            )
        if tree is not None and not isinstance(tree, TreeSpec):
            raise TypeError(f"tree must be a static hf_speculative.TreeSpec, got {tree!r}")
        require_mask_attention(model, "the target", "the sparse cache's attention mask", "model")
        self.model = model
        self.window, self.sinks = sliding_window, num_sink_tokens
        self.num_draft_tokens = num_draft_tokens
        self.positions = positions
        self.draft_sampling = draft_sampling
        self.default_tree = tree or TreeSpec.chain(num_draft_tokens)
        # deeper than W, drafted keys would leave the window (and could fall among the sinks)
        self.max_depth = sliding_window
        self.inv_freq = _rotary_frequencies(model) if positions == "cache" else None
        self.model_window, self.model_window_layout = attention_window(model.config)
        # per call (per row): the sparse cache copied out of the target's cache, in S + W - 1 fixed slots
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.slot_positions: torch.Tensor | None = None
        self.slot_valid: torch.Tensor | None = None

    @property
    def vocab_size(self) -> int:
        return self.lm_head.weight.shape[0]

    def __repr__(self) -> str:
        return (
            f"MagicDecDrafter(sliding_window={self.window}, num_sink_tokens={self.sinks}, "
            f"num_draft_tokens={self.num_draft_tokens}, positions={self.positions!r})"
        )

    # ------------------------------------------------------------------ the sparse cache
    def _read_cache(self, cache) -> None:
        """Copy the sink and window columns of the target's cache (all committed tokens but the root)."""
        if cache is None:
            raise ValueError("MagicDecDrafter reads the target's KV cache, but the target's forward returned none")
        self.slot_positions, self.slot_valid = streaming_slots(cache.get_seq_length(), self.window, self.sinks)
        self.kv = cache_columns(cache, torch.where(self.slot_valid, self.slot_positions, 0))

    @torch.no_grad()
    def begin(self, prompt_ids, target_outputs) -> None:
        self._read_cache(get_cache(target_outputs))

    @torch.no_grad()
    def advance(self, sequence, draft, result, target_outputs) -> None:
        self._read_cache(get_cache(target_outputs))

    def end(self) -> None:
        self.kv = self.slot_positions = self.slot_valid = None

    # ------------------------------------------------------------------ drafting
    def _propose(
        self, states: list["MagicDecDrafter"], sequences, tree: TreeSpec, options: DraftingOptions
    ) -> list[DraftTree]:
        scheme = options.scheme(self.draft_sampling)
        fillers = [ChainTreeFiller(seq, tree, scheme, options, self.vocab_size) for seq in sequences]
        self._draft_chains(states, sequences, fillers)
        return [f.draft_tree() for f in fillers]

    @torch.no_grad()
    def _draft_chains(self, states: list["MagicDecDrafter"], sequences, fillers: list[ChainTreeFiller]) -> None:
        """``fillers[j].num_forwards`` one-token target forwards per row over the rows' sparse caches, batched."""
        model, S, W = self.model, self.sinks, self.window
        device = self.lm_head.weight.device
        B = len(states)
        cache = DynamicCache()
        for i in range(len(states[0].kv)):
            keys = torch.cat([st.kv[i][0] for st in states]) if B > 1 else states[0].kv[i][0]
            values = torch.cat([st.kv[i][1] for st in states]) if B > 1 else states[0].kv[i][1]
            cache.update(keys, values, i)
        rerotate = self.positions == "cache" and S > 0
        if rerotate:
            sink_keys = [layer.keys[:, :, :S].clone() for layer in cache.layers]  # as cached: rotated at 0 .. S - 1
        key_pos = torch.stack([st.slot_positions for st in states]).to(device)  # (B, S + W - 1) text positions
        key_ok = torch.stack([st.slot_valid for st in states]).to(device)
        roots = torch.tensor([seq.shape[1] - 1 for seq in sequences], device=device)
        tokens = torch.stack([seq[0, -1] for seq in sequences]).to(device)
        num_forwards = fillers[0].num_forwards
        for d in range(num_forwards):
            query = roots + d  # (B,) text positions
            eff_pos = key_pos
            if rerotate:  # sinks right before the visible window: positions within the sparse cache, relatively
                delta = (query - W + 1 - S).clamp_min(0)
                for layer, keys in zip(cache.layers, sink_keys):
                    layer.keys[:, :, :S] = rerotate_keys(keys, delta, self.inv_freq)
                eff_pos = key_pos.clone()
                eff_pos[:, :S] += delta[:, None]
            visible = torch.cat(
                [key_ok & sparse_visibility(query[:, None], key_pos, W, S)[:, 0], key_ok.new_ones(B, 1)], 1
            )
            mask = windowed_mask(
                visible[:, None],
                query[:, None],
                torch.cat([eff_pos, query[:, None]], 1),
                self.model_window,
                self.model_window_layout,
                model.dtype,
            )
            logits = (
                model(
                    input_ids=tokens[:, None],
                    position_ids=query[:, None],
                    attention_mask=mask,
                    **cache_arg(cache),
                    use_cache=True,
                    logits_to_keep=1,
                )
                .logits[:, -1]
                .float()
            )
            next_tokens = [fill(d, logits[j]) for j, fill in enumerate(fillers)]
            if d + 1 < num_forwards:  # the drafted token's key joins the sparse cache at its text position
                tokens = torch.stack(next_tokens).reshape(B).to(device)
                key_pos = torch.cat([key_pos, query[:, None]], 1)
                key_ok = torch.cat([key_ok, key_ok.new_ones(B, 1)], 1)
