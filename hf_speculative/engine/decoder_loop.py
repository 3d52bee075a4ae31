"""The engine's own loop over a Llama-style decoder: the verification forward without transformers' per-layer plumbing.

A one-token step of SmolLM2-135M on two CPU cores spends a sizable share of its time outside the products: every
decoder layer and attention module goes through decorators (``deprecate_kwarg``, ``capture_outputs``,
``merge_with_config_defaults``), keyword plumbing, the attention-interface lookup and the output-capturing hooks.
`DecoderLoop` runs the same modules' weights through the same operations in the same order as transformers'
``LlamaForCausalLM.forward`` (embedding, ``create_causal_mask``, the rotary embedding, per layer the input norm,
``q/k/v_proj``, ``apply_rotary_pos_emb``, ``cache.update``, the attention function the config names, ``o_proj``,
the residual, the post-attention norm, the MLP, the residual; the final norm and the LM head on the kept rows), so its
outputs are bitwise those of the model's forward. Leaf modules (linear layers, norms, the MLP, the embedding, the
rotary embedding) are still called as modules: their hooks, PEFT's LoRA layers and the speed policy's kernels
(`hf_speculative.engine.policy.EngineLinearForward`) run as they do in the model's forward.

It serves only what it reproduces exactly: ``LlamaForCausalLM`` (every layer full attention), ``MistralForCausalLM``
and ``Qwen2ForCausalLM`` themselves, whose decoder layers are Llama's and whose attention also passes a layer's
sliding window to the attention function (Mistral: the config's, one mask for every layer; Qwen2: the sliding layers'
of its ``layer_types``, a mask per kind), with ``sdpa`` or ``eager`` attention, no hook on the modules it does not
call (the model, its decoder, the decoder layers, their attention) but transformers' own output-capturing ones, no
gradient. `DecoderLoop.check` compares it with the model's forward bitwise (the speed policy runs it
once per model, `hf_speculative.engine.policy.SpeedPolicy.decoder_loop`); a model that fails runs its own forward.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from .cache import prepare_tree_cache
from .trees import tree_attention_mask

__all__ = ["DecoderLoop", "LoopOutput"]

#: the models this loop serves, by class name and the module transformers defines them in
SUPPORTED = {
    "LlamaForCausalLM": "transformers.models.llama.modeling_llama",
    "MistralForCausalLM": "transformers.models.mistral.modeling_mistral",
    "Qwen2ForCausalLM": "transformers.models.qwen2.modeling_qwen2",
}
#: the attention implementations whose functions the loop calls as the model's attention does
ATTENTION = ("sdpa", "eager")
#: the layer type of layers without a sliding window (False) and with one (True), as a mask mapping names them
WINDOWED = {False: "full_attention", True: "sliding_attention"}
#: the function the model's forward makes the mask of layers without a window (False) and with one (True) with
MASK_FUNCTIONS = {False: "create_causal_mask", True: "create_sliding_window_causal_mask"}
OUTPUT_CAPTURING = "transformers.utils.output_capturing"


@dataclass
class LoopOutput:
    """What the engine reads of a verification forward: the kept rows' logits, every layer's hidden state (as the
    model's ``output_hidden_states`` gives them: the embeddings, each layer's output, the last one normed) when asked,
    the final normed hidden state (`hf_speculative.engine.logits.FinalState` reads it) and the cache."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None
    final_state: torch.Tensor
    cache: object = None

    @property
    def past_key_values(self):
        """The cache, under the name transformers before 5.24 gives it."""
        return self.cache


class DecoderLoop:
    """The verification forward of a Llama, Mistral or Qwen2 causal LM as one loop (see the module docstring)."""

    def __init__(self, model, windows: list[int | None]):
        self.model = model
        self.decoder = model.model
        self.layers = list(self.decoder.layers[: model.config.num_hidden_layers])
        self.windows = windows  # each layer's sliding window (None: full attention), as its attention passes it
        self.modeling = modeling = sys.modules[_supported_base(type(model)).__module__]
        # the mask of a layer with a window and of one without, each made once per forward, as the model makes them
        kinds = {window is not None for window in windows}
        self.mask_functions = {kind: getattr(modeling, MASK_FUNCTIONS[kind]) for kind in kinds}
        self.apply_rotary = modeling.apply_rotary_pos_emb
        self.bypassed = [model, self.decoder, *self.layers, *(layer.self_attn for layer in self.layers)]

    @classmethod
    def for_model(cls, model) -> "DecoderLoop | None":
        """The loop of ``model``, or None when it is not a model the loop reproduces (see the module docstring)."""
        base = _supported_base(type(model))
        if base is None or type(model).forward is not base.forward:  # a subclass with a forward of its own
            return None
        config = model.config
        if getattr(config, "_attn_implementation", None) not in ATTENTION:
            return None
        windows = _layer_windows(base.__name__, config)
        return None if windows is None else cls(model, windows)

    def usable(self) -> bool:
        """Whether the loop may run this forward: no gradient, no hook on a module it does not call."""
        if torch.is_grad_enabled() or _global_hooks():
            return False
        for module in self.bypassed:
            if module._forward_pre_hooks or any(not _records_outputs(h) for h in module._forward_hooks.values()):
                return False
            if "forward" in module.__dict__:  # a forward replaced on the instance (accelerate's hooks, a patch)
                return False
        return True

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.LongTensor,
        position_ids: torch.LongTensor,
        cache,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        logits_to_keep: int | torch.Tensor = 0,
    ) -> LoopOutput:
        decoder, config = self.decoder, self.model.config
        hidden = decoder.embed_tokens(input_ids)
        masks = self.masks(hidden, attention_mask, cache, position_ids)
        rotary = decoder.rotary_emb(hidden, position_ids=position_ids)
        attend = _attention_function(config._attn_implementation, self.modeling)
        states = [hidden] if output_hidden_states else None
        for layer, window in zip(self.layers, self.windows):
            hidden = self.layer(layer, hidden, (masks[window is not None], rotary, cache, attend, window))
            if states is not None:
                states.append(hidden)
        hidden = decoder.norm(hidden)
        if states is not None:
            states[-1] = hidden  # as transformers' output capturing ties the last hidden state to the normed one
        logits = self.model.lm_head(_kept_rows(hidden, logits_to_keep))
        return LoopOutput(logits, tuple(states) if states is not None else None, hidden, cache)

    def masks(self, hidden: torch.Tensor, attention_mask, cache, position_ids) -> dict:
        """The mask of the layers without a window (key False) and of those with one (True), as the model's forward
        makes them; a mapping of layer types to masks (the engine's, for a model with windowed and full layers) is
        taken as it is, as the model's forward takes it."""
        if isinstance(attention_mask, dict):
            return {kind: attention_mask[WINDOWED[kind]] for kind in self.mask_functions}
        config = self.model.config
        # positional: the cache's keyword is ``past_key_values`` before transformers 5.24 and ``cache`` from it
        return {
            kind: make(config, hidden, attention_mask, cache, position_ids)
            for kind, make in self.mask_functions.items()
        }

    def layer(self, layer, hidden: torch.Tensor, context: tuple) -> torch.Tensor:
        """``LlamaDecoderLayer.forward``: attention and MLP, each behind its norm and around its residual. ``context``:
        the layer's mask, the rotary embedding, the cache, the attention function and the layer's sliding window."""
        hidden = hidden + self.attention(layer.self_attn, layer.input_layernorm(hidden), *context)
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def attention(self, attn, hidden: torch.Tensor, mask, rotary, cache, attend, window) -> torch.Tensor:
        """``LlamaAttention.forward`` (Mistral's and Qwen2's: with the layer's sliding ``window``), with the attention
        function the config names (``attend``)."""
        shape = (*hidden.shape[:-1], -1, attn.head_dim)
        query = attn.q_proj(hidden).view(shape).transpose(1, 2)
        key = attn.k_proj(hidden).view(shape).transpose(1, 2)
        value = attn.v_proj(hidden).view(shape).transpose(1, 2)
        cos, sin = rotary
        query, key = self.apply_rotary(query, key, cos, sin)
        key, value = cache.update(key, value, attn.layer_idx)
        output, _ = attend(attn, query, key, value, mask, dropout=0.0, scaling=attn.scaling, sliding_window=window)
        return attn.o_proj(output.reshape(*hidden.shape[:-1], -1).contiguous())

    def check(self, vocab_size: int) -> str | None:
        """Compare the loop with the model's forward, each with a fresh cache: a 5-token prompt, one more token, then
        three tokens under a tree's 4D mask (the third sees the first, not the second). The logits of every position
        must be bitwise equal (the hidden states flow into them; the model's forward is not asked for its hidden
        states, which would leave transformers' output-capturing hooks on its layers). None when they are; else what
        differed."""
        from transformers import DynamicCache

        from .._compat import cache_arg

        device, dtype = self.model.device, self.model.dtype
        tokens = torch.randint(0, vocab_size, (1, 9), generator=torch.Generator().manual_seed(0)).to(device)
        ancestors = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # node 2 sees 0, not 1
        mask = tree_attention_mask(ancestors, 6, dtype, device)
        steps = [(0, 5, None, [0, 1, 2, 3, 4]), (5, 6, None, [5]), (6, 9, mask, [6, 7, 7])]
        caches = [DynamicCache(config=self.model.config), DynamicCache(config=self.model.config)]
        for cache in caches:  # as the engine holds them: a sliding-window layer keeps every key (the masks hide them)
            prepare_tree_cache(cache)
        with torch.no_grad():
            for start, end, attention_mask, positions in steps:
                ids, positions = tokens[:, start:end], torch.tensor([positions], device=device)
                inputs = dict(input_ids=ids, position_ids=positions, attention_mask=attention_mask)
                reference = self.model(**inputs, **cache_arg(caches[0]), use_cache=True)
                if not torch.equal(reference.logits, self(**inputs, cache=caches[1]).logits):
                    return f"the logits of a {end - start}-token forward differ from the model's"
        return None


def _kept_rows(hidden: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    """The positions whose logits the forward computes, as ``LlamaForCausalLM.forward`` slices them: the last
    ``logits_to_keep`` (0: all of them), or the positions a 1D tensor names."""
    index = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    return hidden[:, index, :]


def _layer_windows(name: str, config) -> list[int | None] | None:
    """Each layer's sliding window as the model's attention passes it (None: full attention); None for a config the
    model's forward would treat otherwise than the loop (a Llama with layers that are not full attention)."""
    n, window = config.num_hidden_layers, getattr(config, "sliding_window", None)
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * n)[:n]
    if name == "MistralForCausalLM":  # one mask for every layer: the sliding one when the config has a window
        return [window] * n
    if name == "Qwen2ForCausalLM":
        return [window if t == "sliding_attention" else None for t in types]
    return [None] * n if all(t == "full_attention" for t in types) else None


def _supported_base(kind: type) -> type | None:
    """The class of `SUPPORTED` that ``kind`` is or derives from (``hfs.enable`` gives a model a subclass of its own)."""
    return next((c for c in kind.__mro__ if SUPPORTED.get(c.__name__) == c.__module__), None)


def _attention_function(implementation: str, modeling):
    """The function transformers' attention calls for ``implementation`` (the model's own eager one for eager)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation == "eager":
        return modeling.eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


def _records_outputs(hook) -> bool:
    """Whether ``hook`` is transformers' own output-capturing hook (it records hidden states and attentions only for a
    forward that asks for them; the loop returns the hidden states itself)."""
    return getattr(hook, "__module__", None) == OUTPUT_CAPTURING


def _global_hooks() -> bool:
    """Whether torch has global module forward hooks (they would run for the modules the loop does not call)."""
    from torch.nn.modules import module

    return bool(module._global_forward_hooks or module._global_forward_pre_hooks)
