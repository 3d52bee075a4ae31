"""Speculative Streaming (Bhendawade et al., 2024, https://arxiv.org/abs/2402.11131): the target drafts for itself.

The top N_s decoder layers of a Llama-family model become multi-stream attention (MSA) layers (Sec. 3.1.1).
At layer ``N - N_s`` every position t gets gamma speculative streams ``S_tj = f_eta(M_t) + P_j`` (``M_t`` the
main stream's hidden state there, ``P_j`` a learned stream identifier embedding, ``f_eta`` the identity or a
rank-eta adapter). In each MSA layer (Eq. 2) stream j at position t attends to the main stream's keys/values
at positions ``<= t`` (the KV cache) and to the streams ``<= j`` at t; the streams never write to the cache.
After the last layer the final norm and the base ``lm_head`` give stream j's logits for the token at
``t + 1 + j`` (the main stream predicts ``t + 1``).

Lossless mode: the base is frozen and the main stream never attends to the streams, so the main stream *is*
the base model's forward, bit for bit, and the cache holds exactly the base model's keys/values. The streams
only read them, which is also why they can be evaluated after the verification forward for the one node that
needs them (the last accepted node, whose main-stream keys and values are exactly the compacted cache):
computing them for every tree node inside the forward (the paper's fused GPU layout,
`forward(output_streams=True)`) gives the same numbers for that node.

Shared mode: in the MSA layers the main stream at t also attends to its own gamma streams at t (Eq. 1), so the
main stream depends on the streams and every forward (prefill, tree verification, training) runs main and
streams jointly (`msa_layer` with a main row); the cache still holds main-stream keys/values only. The base is
fine-tuned with LoRA injected through PEFT (alpha_0 = 1, alpha_j = 0.1). The verification forward computes
every node's streams, and the drafter takes them at the last accepted node.

The MSA layers reuse the base layers' own projections, norms and MLPs (shared modules, no copy); the
trainable parameters are the stream embeddings, the optional stream-init adapter and LoRA-style low-rank
adapters on the MSA layers' projections that act on the stream rows only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, LlamaForCausalLM, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask, eager_mask
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaPreTrainedModel, rotate_half

from ..._compat import cache_arg, get_cache, takes_cache
from ...engine.generation import SpeculativeGenerationMixin
from ...engine.hooks import this_thread_only
from ...engine.logits import vocab_logits
from ...engine.placement import match_target
from ...engine.protocol import OneRowDrafter
from ...engine.trees import DraftingOptions, DraftTree, TreeSpec
from ...hub import resolve_name_or_path
from ..draft_vocab import DraftVocabMixin, draft_vocab_logits
from ..modeling_drafter import DepthTreeDrafter, DrafterModel
from .configuration_speculative_streaming import LORA_TARGET_MODULES, SpeculativeStreamingConfig

__all__ = [
    "StreamAdapter",
    "SpeculativeStreams",
    "SpeculativeStreamingOutput",
    "LlamaForSpeculativeStreaming",
    "SpeculativeStreamingDrafter",
]

ADAPTED_PROJECTIONS = LORA_TARGET_MODULES
REFERENCE_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
LORA_SUBFOLDER = "lora"  # not the folder's root: transformers would take a root adapter_config.json for its own
LORA_WEIGHTS_NAME = "adapter_model.safetensors"


class StreamAdapter(nn.Module):
    """Low-rank update ``x -> (alpha / r) * B A x`` (LoRA), added to a frozen projection on stream rows only.
    Owns A and B directly so `_init_weights` reaches it (A random, B = 0: the adapter starts at zero)."""

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float):
        super().__init__()
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, in_features))
        self.lora_B = nn.Parameter(torch.empty(out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale


class StreamEmbeddings(nn.Module):
    """The stream identifier embeddings P_j ``(gamma, H)`` (Sec. 3.1.1)."""

    def __init__(self, num_streams: int, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_streams, hidden_size))


def _layer_shapes(config: SpeculativeStreamingConfig) -> dict[str, tuple[int, int]]:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q, kv, h, m = (
        config.num_attention_heads * head_dim,
        config.num_key_value_heads * head_dim,
        config.hidden_size,
        config.intermediate_size,
    )
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, m),
        "up_proj": (h, m),
        "down_proj": (m, h),
    }


#: token ids of the probe that measures the residual stream's scale (any ids of the vocabulary; position 0, the
#: attention sink, is left out)
PROBE_LENGTH = 32


@torch.no_grad()
def token_embedding_streams(
    model: PreTrainedModel, num_streams: int, num_msa_layers: int, noise_like: torch.Tensor
) -> torch.Tensor:
    """``(gamma, H)`` stream embeddings P_j from ``model``'s input token embeddings: their mean, scaled to the median
    norm of the residual stream entering layer N - N_s on a probe of `PROBE_LENGTH` tokens, plus normal noise of
    1% of that norm per stream (the streams must differ). A P_j of the residual stream's own scale makes the streams
    differ from the main stream from the first step; a random P_j of std 0.02 is about 0.1% of it."""
    embeddings = model.get_input_embeddings().weight
    if embeddings.device.type == "meta":  # nothing to measure: the random start stays
        return noise_like
    mean = embeddings.float().mean(0)
    vocab = embeddings.shape[0]
    ids = (torch.arange(PROBE_LENGTH, device=embeddings.device) * 7919 + 13) % vocab
    decoder = getattr(model, model.base_model_prefix)
    out = decoder(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    entry = out.hidden_states[len(decoder.layers) - num_msa_layers][0, 1:].float()
    scale = float(entry.norm(dim=-1).median())
    direction = mean / mean.norm().clamp_min(1e-6)
    noise = torch.randn(num_streams, mean.numel(), device=mean.device) * (0.01 * scale / mean.numel() ** 0.5)
    return (direction * scale + noise).to(noise_like.dtype)


class SpeculativeStreams(nn.Module):
    """Everything Speculative Streaming adds to the base model: P_j, f_eta and the MSA-layer adapters."""

    def __init__(self, config: SpeculativeStreamingConfig):
        super().__init__()
        if config.stream_design != "embeddings":
            raise NotImplementedError(
                f"stream_design={config.stream_design!r} (Appendix C.3) is not implemented; use 'embeddings'"
            )
        self.stream_embeddings = StreamEmbeddings(config.num_streams, config.hidden_size)
        eta = config.stream_init_rank
        self.stream_init = StreamAdapter(config.hidden_size, config.hidden_size, eta, eta) if eta > 0 else None
        self.adapters = None
        if config.adapter_rank > 0:
            shapes = _layer_shapes(config)
            r, a = config.adapter_rank, config.adapter_alpha
            self.adapters = nn.ModuleList(
                nn.ModuleDict({name: StreamAdapter(*shapes[name], r, a) for name in ADAPTED_PROJECTIONS})
                for _ in range(config.num_msa_layers)
            )
        self.pruning = None
        if config.pruning_layer is not None:  # Sec. 3.1.3: the early exit's rank-theta adapter
            self.pruning = StreamAdapter(
                config.hidden_size, config.hidden_size, config.pruning_rank, config.pruning_rank
            )

    def init_streams(self, main_hidden: torch.Tensor) -> torch.Tensor:
        """``(..., H)`` main-stream states entering layer N - N_s -> ``(..., gamma, H)`` streams f_eta(M_t) + P_j."""
        h = main_hidden.to(self.stream_embeddings.weight.dtype)
        if self.stream_init is not None:
            h = h + self.stream_init(h)
        return h[..., None, :] + self.stream_embeddings.weight


@dataclass
class SpeculativeStreamingOutput(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` (the main stream: in lossless mode exactly the base model's outputs) plus

    ``stream_inputs`` ``(B, T, H)``: the main stream entering layer N - N_s (where the streams start);
    ``stream_logits`` ``(B, T, gamma, V)``: with ``output_streams=True``, stream j's logits for ``t + 1 + j``;
    ``stream_states`` ``(B, T, gamma, H)``: shared mode, the final-normed streams of every position (the joint
    forward computes them anyway; the drafter projects only the last accepted node's).
    """

    stream_inputs: torch.Tensor | None = None
    stream_logits: torch.Tensor | None = None
    stream_states: torch.Tensor | None = None


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def _project(linear: nn.Linear, adapters, name: str, x: torch.Tensor, num_main: int = 0) -> torch.Tensor:
    """``linear(x)`` plus the stream adapter ``name`` on the stream rows (dim -2 from ``num_main`` on; the first
    ``num_main`` rows are main-stream rows, which only the base's own projection sees)."""
    out = linear(x)
    if adapters is None:
        return out
    if not num_main:
        return out + adapters[name](x)
    streams = out[..., num_main:, :] + adapters[name](x[..., num_main:, :])
    return torch.cat([out[..., :num_main, :], streams], dim=-2)


def msa_layer(layer: nn.Module, adapters, rows, main_kv, key_mask, cos, sin, num_main: int = 0) -> torch.Tensor:
    """One MSA layer (Sec. 3.1.1) over the rows of every position t, with the decoder layer's own modules.

    ``rows`` ``(B, T, R, H)``: ``num_main`` main-stream rows (0: lossless, the streams alone; 1: shared mode)
    followed by the gamma stream rows. ``main_kv``: the main stream's ``(keys, values)`` ``(B, kv_heads, L, d)``
    (rotary applied, as cached), or a function ``(k, v) -> (keys, values)`` that stores the main row's new
    keys/values ``(B, kv_heads, T, d)`` (in the cache: the streams write nothing) and returns all of them.
    ``key_mask`` ``(B, T, L)`` additive (the main positions position t may see: its causal or tree-ancestor
    row) or None (all); ``cos``/``sin`` ``(B, T, d)``: rotary at each position t.

    Every row at t attends to those main keys and to the streams at t: the main row to all gamma of them
    (Eq. 1), stream j to the streams ``<= j`` (Eq. 2). Returns the rows after the layer.
    """
    attn = layer.self_attn
    if hasattr(attn, "q_norm") or getattr(attn, "sliding_window", None):
        raise NotImplementedError(
            "MSA layers support the Llama / Mistral / Qwen2 attention layout (no q/k norm, no sliding window)"
        )
    B, T, R, _ = rows.shape
    G = R - num_main
    rep, d = attn.num_key_value_groups, attn.head_dim
    x = layer.input_layernorm(rows)
    q = _project(attn.q_proj, adapters, "q_proj", x, num_main).view(B, T, R, -1, rep, d)
    k = _project(attn.k_proj, adapters, "k_proj", x, num_main).view(B, T, R, -1, d)
    v = _project(attn.v_proj, adapters, "v_proj", x, num_main).view(B, T, R, -1, d)
    q = _rope(q, cos[:, :, None, None, None, :], sin[:, :, None, None, None, :])
    k = _rope(k, cos[:, :, None, None, :], sin[:, :, None, None, :])
    keys, values = main_kv(k[:, :, 0].transpose(1, 2), v[:, :, 0].transpose(1, 2)) if callable(main_kv) else main_kv
    k_streams, v_streams = (k[:, :, num_main:], v[:, :, num_main:]) if num_main else (k, v)
    scores_main = torch.einsum("btgkrd,bksd->bkrtgs", q, keys.to(q.dtype)) * attn.scaling  # (B, kv, rep, T, R, L)
    if key_mask is not None:
        scores_main = scores_main + key_mask[:, None, None, :, None, :].to(scores_main.dtype)
    scores_self = torch.einsum("btgkrd,bthkd->bkrtgh", q, k_streams) * attn.scaling  # (B, kv, rep, T, R, G)
    later = torch.ones(R, G, dtype=torch.bool, device=q.device).triu(1 - num_main)  # stream j sees streams <= j
    later[:num_main] = False  # the main row sees every stream at t (Eq. 1)
    scores_self = scores_self.masked_fill(later, torch.finfo(scores_self.dtype).min)
    L = scores_main.shape[-1]
    weights = torch.softmax(torch.cat([scores_main, scores_self], dim=-1), dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.einsum("bkrtgs,bksd->btgkrd", weights[..., :L], values.to(q.dtype))
    out = out + torch.einsum("bkrtgh,bthkd->btgkrd", weights[..., L:], v_streams)
    rows = rows + _project(attn.o_proj, adapters, "o_proj", out.reshape(B, T, R, -1), num_main)
    x = layer.post_attention_layernorm(rows)
    mlp = layer.mlp
    gate = _project(mlp.gate_proj, adapters, "gate_proj", x, num_main)
    up = _project(mlp.up_proj, adapters, "up_proj", x, num_main)
    return rows + _project(mlp.down_proj, adapters, "down_proj", mlp.act_fn(gate) * up, num_main)


def msa_stream_layer(layer: nn.Module, adapters, streams, keys, values, key_mask, cos, sin) -> torch.Tensor:
    """`msa_layer` for the stream rows alone (Eq. 2; lossless mode): ``streams`` ``(B, T, G, H)`` read the main
    stream's cached ``keys``/``values`` ``(B, kv_heads, L, d)``. Returns the streams after the layer."""
    return msa_layer(layer, adapters, streams, (keys, values), key_mask, cos, sin)


def main_stream_layer(layer: nn.Module, hidden, key_mask, cos, sin):
    """The base decoder layer on the main stream alone (no cache), also returning its keys and values.

    Used by training from cached hidden states, where the main stream runs only through the top N_s layers.
    ``hidden`` ``(B, T, H)``, ``key_mask`` ``(B, 1, T, T)`` additive. Returns ``(hidden, keys, values)``."""
    attn = layer.self_attn
    B, T, _ = hidden.shape
    d = attn.head_dim
    x = layer.input_layernorm(hidden)
    q = attn.q_proj(x).view(B, T, -1, d).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, -1, d).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, -1, d).transpose(1, 2)
    q, k = _rope(q, cos[:, None], sin[:, None]), _rope(k, cos[:, None], sin[:, None])
    rep = attn.num_key_value_groups
    out = F.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=key_mask, scale=attn.scaling
    )
    hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))
    hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return hidden, k, v


def causal_key_mask(
    batch: int,
    length: int,
    dtype: torch.dtype,
    device,
    past_length: int = 0,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(batch, length, past_length + length)`` additive causal mask (0 visible, dtype min hidden), with the
    padding of a 2D ``attention_mask`` over past + new tokens: transformers' ``masking_utils.eager_mask``."""
    if attention_mask is not None:
        attention_mask = attention_mask.to(device=device, dtype=torch.bool)
    mask = eager_mask(
        batch_size=batch,
        q_length=length,
        kv_length=past_length + length,
        q_offset=past_length,
        attention_mask=attention_mask,
        dtype=dtype,
        device=device,
    )
    return mask[:, 0]


def stream_key_mask(
    attention_mask: torch.Tensor | None, batch: int, length: int, past_length: int, dtype, device
) -> torch.Tensor:
    """The ``(B, T, L)`` additive rows of main positions each new position sees: a 4D (tree) mask's rows, or
    causal plus a 2D padding mask over past + new tokens."""
    if attention_mask is not None and attention_mask.dim() == 4:
        return attention_mask[:, 0].to(dtype)
    return causal_key_mask(batch, length, dtype, device, past_length, attention_mask)


class LlamaForSpeculativeStreaming(DrafterModel, DraftVocabMixin, SpeculativeGenerationMixin, LlamaForCausalLM):
    """An MSA-patched `LlamaForCausalLM` that drafts for itself: ``ss.generate(input_ids, max_new_tokens=...)``.

    Build with ``from_base_model(model, num_streams=3, num_msa_layers=4)`` (Llama, Mistral or Qwen2 layer
    layouts; the base's modules are shared, not copied), or ``from_pretrained(folder, base_model=model)``. The
    checkpoint holds the config and the streams' parameters (shared mode: plus the base's LoRA adapter in
    ``lora/``) and names its base model; the base's modules are not submodules of this model (not saved, not
    moved by ``.to()``; in shared mode only their LoRA weights train, see `trainable_parameters`).
    """

    config_class = SpeculativeStreamingConfig
    base_model_prefix = "speculative_streaming"
    _tied_weights_keys = {}
    _no_split_modules = []
    _keys_to_ignore_on_load_unexpected = [r"^model\.", r"^lm_head\."]

    def __init__(self, config: SpeculativeStreamingConfig):
        LlamaPreTrainedModel.__init__(self, config)
        self.streams = SpeculativeStreams(config)
        self.vocab_size = config.vocab_size
        self.__dict__["base"] = None
        self.__dict__["model"] = None
        self.__dict__["lm_head"] = None
        self.post_init()
        self._init_draft_vocab()  # FR-Spec draft vocabulary of the streams (config.draft_vocab_size)

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, StreamAdapter):
            init.normal_(module.lora_A, mean=0.0, std=1.0 / math.sqrt(module.lora_A.shape[1]))
            init.zeros_(module.lora_B)
        elif isinstance(module, StreamEmbeddings):
            init.normal_(module.weight, mean=0.0, std=std)

    @torch.no_grad()
    def _init_from_base_model(self, model: PreTrainedModel) -> None:
        """P_j from the target's token embeddings (``config.stream_embedding_init``, see the config)."""
        if self.config.stream_embedding_init == "token_embeddings":
            weight = self.streams.stream_embeddings.weight
            weight.copy_(token_embedding_streams(model, self.config.num_streams, self.config.num_msa_layers, weight))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_base_model(
        cls,
        model: PreTrainedModel,
        num_streams: int = 3,
        num_msa_layers: int = 4,
        mode: str = "lossless",
        **config_kwargs,
    ) -> "LlamaForSpeculativeStreaming":
        """Wrap ``model`` (a Llama / Mistral / Qwen2 causal LM) with fresh streams; its weights are shared."""
        base_config = model.config.to_dict()
        arch = base_config.pop("model_type", None)
        for key in ("architectures", "auto_map", "transformers_version", "dtype", "torch_dtype"):
            base_config.pop(key, None)
        config = SpeculativeStreamingConfig(
            num_streams=num_streams,
            num_msa_layers=num_msa_layers,
            mode=mode,
            base_architecture=arch,
            **{**base_config, **cls._base_model_fields(model), **config_kwargs},
        )
        return cls._from_base_config(model, config)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, base_model: PreTrainedModel | None = None, **kwargs):
        """Load the streams; attach them to ``base_model``, or else load the base named in the config
        (``"reference"`` / the SmolLM2-135M-Instruct Hub id: `hf_speculative.bench.load_reference_model`). A folder
        that does not exist raises `FileNotFoundError` at once (`hf_speculative.hub.resolve_name_or_path`)."""
        path = resolve_name_or_path(pretrained_model_name_or_path, what=cls.__name__)
        ss = cls._load_checkpoint(path, *args, **kwargs)
        ss.attach_base_model(
            base_model if base_model is not None else load_base_model(ss.config.base_model_name_or_path)
        )
        if ss.config.mode == "shared":
            ss._load_lora(path, **kwargs)
        return ss.eval()

    def attach_base_model(self, model: PreTrainedModel) -> None:
        """Use ``model``'s decoder and ``lm_head`` (frozen, shared) as this model's main stream. Shared mode also
        injects LoRA adapters into ``model`` in place (PEFT), unless it already has them: they are trainable. Moves
        the streams to ``model``'s dtype and device (`hf_speculative.engine.placement.match_target`)."""
        decoder = getattr(model, "model", None)
        layers = getattr(decoder, "layers", None)
        if layers is None or not hasattr(decoder, "rotary_emb") or not hasattr(decoder, "norm"):
            raise TypeError(
                f"{type(model).__name__} is not a Llama-family causal LM (needs .model.layers/.norm/.rotary_emb)"
            )
        self._check_base_model(model)
        for p in model.parameters():
            p.requires_grad_(False)
        if self.config.mode == "shared":
            self._inject_lora(model)
        self.__dict__["base"] = model
        self.__dict__["model"] = decoder
        self.__dict__["lm_head"] = model.get_output_embeddings()
        match_target(self, model)
        self.config._attn_implementation = model.config._attn_implementation
        self.generation_config = model.generation_config

    def _shape_checks(self, model: PreTrainedModel) -> dict[str, tuple[int, int]]:
        checks = super()._shape_checks(model)
        checks["num_hidden_layers"] = (self.config.num_hidden_layers, len(model.model.layers))
        return checks

    def add_pruning_head(self, layer: int, rank: int = 8, threshold: float = 0.0) -> None:
        """Give these streams parallel tree pruning (Sec. 3.1.3): an early exit after ``layer`` decoder layers
        through a fresh rank-``rank`` adapter (zero update: the plain early exit until trained, see
        `pruning.train_pruning_head`), pruning nodes below ``threshold``."""
        previous = self.config.pruning_layer, self.config.pruning_rank, self.config.pruning_threshold
        self.config.pruning_layer, self.config.pruning_rank, self.config.pruning_threshold = layer, rank, threshold
        try:
            self.config.validate_pruning()
        except ValueError:
            self.config.pruning_layer, self.config.pruning_rank, self.config.pruning_threshold = previous
            raise
        weight = self.streams.stream_embeddings.weight
        adapter = StreamAdapter(self.config.hidden_size, self.config.hidden_size, rank, rank).to(
            weight.device, weight.dtype
        )
        with torch.no_grad():
            adapter.lora_A.normal_(0.0, 1.0 / math.sqrt(adapter.lora_A.shape[1]))
            adapter.lora_B.zero_()
        self.streams.pruning = adapter

    def lora_config(self):
        """Shared mode: the PEFT `LoraConfig` of the base's adapters (Sec. 3.1.4, H.1: the base is fine-tuned)."""
        from peft import LoraConfig

        c = self.config
        return LoraConfig(
            r=c.lora_rank, lora_alpha=c.lora_alpha, lora_dropout=0.0, target_modules=list(c.lora_target_modules)
        )

    def _inject_lora(self, model: PreTrainedModel) -> None:
        from peft import inject_adapter_in_model

        if not any("lora_" in name for name, _ in model.named_parameters()):
            inject_adapter_in_model(self.lora_config(), model)
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)

    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        """Shared mode: the base's LoRA weights, PEFT-named (``get_peft_model_state_dict``)."""
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.base)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What training updates: the streams, plus in shared mode the base's LoRA adapters."""
        params = [p for p in self.streams.parameters() if p.requires_grad]
        if self.config.mode == "shared":
            params += [p for p in self.base.parameters() if p.requires_grad]
        return params

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Config + streams (``model.safetensors``); shared mode adds the base's LoRA adapter as a PEFT adapter
        folder ``lora/`` (``adapter_config.json`` + ``adapter_model.safetensors``; ``PeftModel.from_pretrained(base,
        folder, subfolder="lora")`` loads it too)."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        if self.config.mode == "shared":
            from pathlib import Path

            from safetensors.torch import save_file

            from ...paths import atomic_path

            folder = Path(save_directory) / LORA_SUBFOLDER
            self.lora_config().save_pretrained(folder)
            weights = {k: v.detach().contiguous() for k, v in self.lora_state_dict().items()}
            with atomic_path(folder / LORA_WEIGHTS_NAME) as tmp:
                save_file(weights, str(tmp), metadata={"format": "pt"})
        return out

    def _load_lora(self, folder, **kwargs) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file
        from transformers.utils import cached_file

        path = cached_file(
            folder,
            LORA_WEIGHTS_NAME,
            subfolder=LORA_SUBFOLDER,
            **{k: v for k, v in kwargs.items() if k in ("revision", "token", "cache_dir")},
        )
        result = set_peft_model_state_dict(self.base, load_file(path))
        if getattr(result, "unexpected_keys", None):
            raise ValueError(
                f"{LORA_WEIGHTS_NAME} holds weights the base has no LoRA layer for: {result.unexpected_keys[:5]}"
            )

    def get_input_embeddings(self):
        return None if self.model is None else self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def tie_weights(self, *args, **kwargs):  # the base's tying is the base's business
        return None

    def num_stream_parameters(self) -> int:
        """Parameters Speculative Streaming adds to the base model."""
        return sum(p.numel() for p in self.streams.parameters())

    def _check_attached(self) -> None:
        if self.model is None:
            raise ValueError(
                "no base model attached: use LlamaForSpeculativeStreaming.from_base_model(model), "
                "from_pretrained(folder, base_model=model) or ss.attach_base_model(model)"
            )

    # ------------------------------------------------------------------ forward
    @property
    def msa_layers(self) -> list[nn.Module]:
        return list(self.model.layers[self.config.first_msa_layer :])

    @takes_cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        output_streams: bool = False,
        **kwargs,
    ) -> SpeculativeStreamingOutput:
        """Lossless: the base model's forward (the main stream, unchanged), plus ``stream_inputs`` and, with
        ``output_streams=True``, the streams of every position (``stream_logits``). Shared: `_joint_forward`."""
        self._check_attached()
        forward = self._joint_forward if self.config.mode == "shared" else self._lossless_forward
        return forward(
            cache,
            output_streams,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )

    def _lossless_forward(self, cache, output_streams: bool, **inputs) -> SpeculativeStreamingOutput:
        """`forward` in lossless mode: the base model's forward, the states entering the first MSA layer captured
        by a pre-hook (``stream_inputs``); with ``output_streams`` the streams run on them (on a cache of their own
        when the call passes none). ``inputs``: the base model's other forward arguments."""
        captured = {}

        def capture(module, args, kw):
            captured["h"] = args[0] if args else kw["hidden_states"]

        own_cache = output_streams and cache is None
        if own_cache:
            cache, inputs["use_cache"] = DynamicCache(config=self.base.config), True
        past_length = cache.get_seq_length() if cache is not None else 0
        handle = self.model.layers[self.config.first_msa_layer].register_forward_pre_hook(
            this_thread_only(capture), with_kwargs=True
        )
        try:
            out = LlamaForCausalLM.forward(self, **cache_arg(cache), **inputs)
        finally:
            handle.remove()
        stream_logits = None
        if output_streams:
            h, position_ids, attention_mask = captured["h"], inputs["position_ids"], inputs["attention_mask"]
            B, T = h.shape[:2]
            if position_ids is None:
                position_ids = torch.arange(past_length, past_length + T, device=h.device)[None].expand(B, -1)
            key_mask = stream_key_mask(attention_mask, B, T, past_length, h.dtype, h.device)
            stream_logits = self.stream_logits(h, cache, key_mask, position_ids)
        return SpeculativeStreamingOutput(
            loss=out.loss,
            logits=out.logits,
            **cache_arg(None if own_cache else get_cache(out)),
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            stream_inputs=captured.get("h"),
            stream_logits=stream_logits,
        )

    def _joint_forward(
        self,
        cache,
        output_streams: bool,
        *,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.LongTensor | None,
        inputs_embeds: torch.FloatTensor | None,
        labels: torch.LongTensor | None,
        use_cache: bool | None,
        logits_to_keep: int | torch.Tensor,
        output_hidden_states: bool | None = None,
        **unused,
    ) -> SpeculativeStreamingOutput:
        """`forward` in shared mode (Sec. 3.1.1, Eqs. 1-2): the base layers below N - N_s as usual, then main and streams
        jointly through the MSA layers (`msa_layer` with one main row); the cache gets the main row's keys and
        values only. Works for the prefill, a tree-verification forward (4D additive tree mask and per-node
        ``position_ids``) and training (no cache). Returns the main logits (which depend on the streams) and
        ``stream_states`` of every position (``stream_logits`` too with ``output_streams=True``)."""
        decoder = self.model
        h = decoder.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = h.shape[:2]
        if cache is None and use_cache:
            cache = DynamicCache(config=self.base.config)
        past_length = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = (torch.arange(T, device=h.device) + past_length)[None].expand(B, -1)
        mask = create_causal_mask(
            config=self.base.config,
            inputs_embeds=h,
            attention_mask=attention_mask,
            **cache_arg(cache),
            position_ids=position_ids,
        )
        cos, sin = decoder.rotary_emb(h, position_ids)
        hidden = [h]
        h, received = self._plain_layers(h, mask, cos, sin, position_ids, cache, hidden)
        stream_inputs = h
        if received and received["attention_mask"] is not mask:
            # the engine pruned the trees inside this forward (`hf_speculative.engine.tree_forward`): the MSA layers run on
            # the kept nodes with the mask and rotary embeddings the plain layers above the pruning layer got
            key_mask, (cos, sin) = received["attention_mask"][:, 0], received["position_embeddings"]
        else:
            key_mask = stream_key_mask(attention_mask, B, T, past_length, h.dtype, h.device)
        rows = torch.cat([h[:, :, None], self.streams.init_streams(h).to(h.dtype)], dim=2)  # (B, T, 1 + gamma, H)
        rows = decoder.norm(self._msa_layers_forward(rows, cache, key_mask, cos, sin, hidden))
        main, streams = rows[:, :, 0], rows[:, :, 1:]
        hidden[-1] = main  # as transformers does: the last hidden state is the normed one
        logits, loss = self._main_logits_and_loss(main, logits_to_keep, labels)
        return SpeculativeStreamingOutput(
            loss=loss,
            logits=logits,
            **cache_arg(cache if use_cache else None),
            hidden_states=tuple(hidden) if output_hidden_states else None,
            stream_inputs=stream_inputs,
            stream_logits=self.stream_head(streams) if output_streams else None,
            stream_states=streams,
        )

    def _msa_layers_forward(self, rows, cache, key_mask, cos, sin, hidden: list) -> torch.Tensor:
        """Main row and streams ``(B, T, 1 + gamma, H)`` jointly through the MSA layers (`msa_layer`, one main row;
        the cache gets the main row's keys and values); each layer's main row appended to ``hidden``."""
        adapters = self.streams.adapters
        for i, layer in enumerate(self.msa_layers):
            store = _cache_writer(cache, layer.self_attn.layer_idx)
            rows = msa_layer(
                layer, adapters[i] if adapters is not None else None, rows, store, key_mask, cos, sin, num_main=1
            )
            hidden.append(rows[:, :, 0])
        return rows

    def _main_logits_and_loss(self, main, logits_to_keep, labels) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits of the (normed) main row's last ``logits_to_keep`` positions, and their loss with ``labels``."""
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(main[:, keep])
        loss = (
            self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size)
            if labels is not None
            else None
        )
        return logits, loss

    def _plain_layers(self, h, mask, cos, sin, position_ids, cache, hidden: list) -> tuple[torch.Tensor, dict]:
        """The base layers below the MSA layers, their outputs appended to ``hidden``; returns the last one's output
        and the keyword arguments the last plain layer was called with (after any pre-hook of the engine's tree
        pruning; empty without plain layers)."""
        decoder = self.model
        first = self.config.first_msa_layer
        received = {}  # what the last plain layer is called with, after any pre-hook of the engine (tree pruning)
        receive = this_thread_only(lambda module, args, kw: received.update(kw))
        handle = decoder.layers[first - 1].register_forward_pre_hook(receive, with_kwargs=True) if first else None
        try:
            for layer in decoder.layers[:first]:
                h = layer(
                    h,
                    attention_mask=mask,
                    position_embeddings=(cos, sin),
                    position_ids=position_ids,
                    **cache_arg(cache),
                    use_cache=cache is not None,
                )
                hidden.append(h)
        finally:
            if handle is not None:
                handle.remove()
        return h, received

    def stream_states(self, main_hidden, keys_values, key_mask, position_ids) -> torch.Tensor:
        """Streams through the MSA layers. ``main_hidden`` ``(B, T, H)`` enters layer N - N_s; ``keys_values``:
        per MSA layer the main stream's ``(keys, values)`` ``(B, kv, L, d)``; ``key_mask`` ``(B, T, L)`` additive
        or None; returns the final-normed streams ``(B, T, gamma, H)``."""
        streams = self.streams.init_streams(main_hidden)
        cos, sin = self.model.rotary_emb(streams, position_ids)
        adapters = self.streams.adapters
        for i, layer in enumerate(self.msa_layers):
            keys, values = keys_values[i]
            streams = msa_stream_layer(
                layer, adapters[i] if adapters is not None else None, streams, keys, values, key_mask, cos, sin
            )
        return self.model.norm(streams)

    def cached_keys_values(self, cache, main_hidden, position_ids=None) -> tuple[list, torch.LongTensor]:
        """Per MSA layer the main stream's ``(keys, values)`` in ``cache`` (the tensors themselves, read only), and
        the positions of ``main_hidden`` ``(B, T, H)``: given, else the last T cached ones."""
        B, T = main_hidden.shape[:2]
        if position_ids is None:
            length = cache.get_seq_length()
            position_ids = torch.arange(length - T, length, device=main_hidden.device)[None].expand(B, -1)
        keys_values = []
        for layer in self.msa_layers:
            cached = cache.layers[layer.self_attn.layer_idx]
            keys_values.append((cached.keys, cached.values))
        return keys_values, position_ids

    def stream_logits(self, main_hidden, cache, key_mask=None, position_ids=None) -> torch.Tensor:
        """Stream logits ``(B, T, gamma, V)`` reading the main stream's keys/values from ``cache`` (read only)."""
        keys_values, position_ids = self.cached_keys_values(cache, main_hidden, position_ids)
        return self.stream_head(self.stream_states(main_hidden, keys_values, key_mask, position_ids))

    def stream_head(self, states: torch.Tensor) -> torch.Tensor:
        """The base ``lm_head`` on final-normed stream states ``(..., H)`` (a few rows: `vocab_logits`). With a
        draft vocabulary and no autograd (drafting), only its rows are projected; the rest of the vocabulary
        gets -inf (verification still runs on the full vocabulary, so the output does not change)."""
        head = self.lm_head
        if type(head) is not nn.Linear or head.bias is not None:
            return head(states)
        if self.draft_to_target is not None and not torch.is_grad_enabled():
            return draft_vocab_logits(states, head.weight, self.draft_to_target)
        return vocab_logits(states, head.weight)

    def generate_autoregressive(self, input_ids: torch.LongTensor, **kwargs):
        """Plain transformers decoding (`GenerationMixin.generate`, one token per forward, no drafting) with this
        model's own forward: in shared mode the joint forward. ``ss.generate`` must match its greedy output
        token for token, and it is the baseline of shared mode's speedup."""
        return GenerationMixin.generate(self, input_ids, **kwargs)

    def streams_from_hidden(
        self, main_hidden: torch.Tensor, position_ids: torch.LongTensor | None = None
    ) -> torch.Tensor:
        """Training path: from the (cached) main-stream states entering layer N - N_s ``(B, T, H)`` run the top
        N_s layers on the main stream (frozen, for its keys/values) and on the streams; returns the final-normed
        streams ``(B, T, gamma, H)``. Causal; right padding is harmless (labels mask it)."""
        B, T, _ = main_hidden.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=main_hidden.device)[None].expand(B, -1)
        key_mask = causal_key_mask(B, T, main_hidden.dtype, main_hidden.device)
        streams = self.streams.init_streams(main_hidden)
        cos, sin = self.model.rotary_emb(streams, position_ids)
        adapters = self.streams.adapters
        main = main_hidden
        for i, layer in enumerate(self.msa_layers):
            with torch.no_grad():  # lossless: the base is frozen and the main stream never sees the streams
                main, keys, values = main_stream_layer(layer, main, key_mask[:, None], cos, sin)
            streams = msa_stream_layer(
                layer, adapters[i] if adapters is not None else None, streams, keys, values, key_mask, cos, sin
            )
        return self.model.norm(streams)

    # ------------------------------------------------------------------ drafting
    def get_tree_drafter(self, target: PreTrainedModel) -> "SpeculativeStreamingDrafter":
        """``base.generate(assistant_model=ss)``: the streams attach to ``target``, which must be the base model
        they were trained for (the streams read its hidden states entering layer N - N_s and its cache)."""
        if self.config.mode == "shared":
            raise ValueError(
                "a shared-mode Speculative Streaming model drafts and verifies for itself (its main stream attends to "
                "the streams, Eq. 1): call ss.generate(input_ids, ...) instead of base.generate(assistant_model=ss)"
            )
        if target is not self.base:
            self.attach_base_model(target)
        return SpeculativeStreamingDrafter(self, target=target)

    def get_self_drafter(self) -> "SpeculativeStreamingDrafter":
        """The per-call drafter `generate` uses when no ``assistant_model`` is given."""
        self._check_attached()
        return SpeculativeStreamingDrafter(self, target=self)


def _cache_writer(cache, layer_idx: int):
    """``(k, v) -> (keys, values)``: append the main stream's new keys/values to ``cache`` (or none: training)."""
    if cache is None:
        return lambda k, v: (k, v)
    return lambda k, v: cache.update(k, v, layer_idx)


def load_base_model(name_or_path: str | None) -> PreTrainedModel:
    """The base model a checkpoint names (``"reference"`` and the SmolLM2-135M-Instruct id load the cached
    reference model)."""
    from ...bench.reference import is_reference, resolve_model

    if name_or_path is None:
        raise ValueError("the checkpoint names no base model: pass base_model=")
    if name_or_path == REFERENCE_HUB_ID or is_reference(name_or_path):
        name_or_path = "reference"
    model, _ = resolve_model(name_or_path)
    return model


class SpeculativeStreamingDrafter(OneRowDrafter, DepthTreeDrafter):
    """Sec. 3.1.2: the streams at the last accepted node fill the next tree; depth d holds stream d's top-k
    (greedy) or draws from stream d's distribution (sampling, verified by exact tree rejection sampling), so
    the tokens of stream n are the parents of those of stream n + 1.

    Lossless: the streams at a node need the main stream entering layer N - N_s there (``stream_inputs`` of the
    forward) and the main stream's keys/values at the positions up to it, which after the engine has kept the
    accepted path are exactly the target's cache: the streams are evaluated from the cache, read only.
    Shared: the (joint) verification forward computed every node's streams (``stream_states``); the drafter
    projects those of the last accepted node.
    """

    needs_target_hidden_states = True
    accuracy_key = "stream_top_i_accuracy"

    def __init__(
        self,
        model: LlamaForSpeculativeStreaming,
        draft_sampling: str = "without_replacement",
        target: PreTrainedModel | None = None,
    ):
        self.model = model
        self.logits: torch.Tensor | None = None
        self._pending: tuple | None = None  # what the next proposal's stream logits are computed from
        super().__init__(model.config, model.config.num_streams, draft_sampling, target)

    def draft_cost(self, curve) -> float:
        """Drafting cost per step in plain steps, whatever the tree: the gamma streams' vocabulary projection, and
        in lossless mode their N_s MSA layers (that share of c(gamma)); in shared mode the streams run inside the
        verification forward, whose measured curve (``curve`` of this model) already includes them."""
        config = self.model.config
        msa = (
            config.num_msa_layers / config.num_hidden_layers * curve(config.num_streams)
            if config.mode == "lossless"
            else 0.0
        )
        return msa + curve.projection_cost(config.num_streams, self.model.draft_vocab_share)

    def _streams_at(self, target_outputs, node: int) -> None:
        """Keeps what the streams at ``node`` are computed from; `_stream_logits` computes them when a tree is
        drafted. A one-token step (step pricing decoding without drafting) then costs no MSA layers, no stream
        projection and no gathering of a batch row's cache: only the main stream's forward, as plain decoding."""
        self.logits = None
        states = getattr(target_outputs, "stream_states", None)
        if states is not None:  # shared mode: the streams come from the verification forward itself
            self._pending = ("shared", states[0, node].clone())
            return
        # lossless: read when drafting. A row's view holds its cache's tensors as they are now (the engine may
        # select rows of the cache before the next proposal: that makes new tensors and leaves these as they are);
        # with one row the cache is the engine's own, which changes only in the next verification forward
        self._pending = ("lossless", target_outputs, node)

    def _lossless_inputs(self, target_outputs, node: int) -> tuple:
        """The main stream entering the first MSA layer at ``node``, and the cached keys/values and positions the
        streams there read."""
        hidden = getattr(target_outputs, "hidden_states", None)
        if hidden:  # hidden_states[i] is the input of decoder layer i: any forward of the base model will do
            inputs = hidden[self.model.config.first_msa_layer]
        else:
            inputs = getattr(target_outputs, "stream_inputs", None)
            if inputs is None:
                raise ValueError("Speculative Streaming needs the target's hidden states (output_hidden_states=True)")
        h = inputs[:, node:][:, :1]
        return (h, *self.model.cached_keys_values(get_cache(target_outputs), h))

    def _stream_logits(self) -> torch.Tensor:
        """The streams' logits ``(gamma, V)`` at the last accepted node (computed once, on the first proposal)."""
        if self._pending is not None:
            kind, *pending = self._pending
            if kind == "lossless":  # through the MSA layers first
                h, keys_values, positions = self._lossless_inputs(*pending)
                states = self.model.stream_states(h, keys_values, None, positions)[0, 0]
            else:
                states = pending[0]
            self.logits = self.model.stream_head(states).float()
            self._pending = None
        return self.logits

    def begin(self, prompt_ids, target_outputs) -> None:
        self._streams_at(target_outputs, -1)

    def advance(self, sequence, draft, result, target_outputs) -> None:
        self._streams_at(target_outputs, result.path[-1])

    @property
    def pruning_layer(self) -> int | None:
        """Parallel tree pruning (Sec. 3.1.3) reads the states entering this layer, when the streams have a pruning
        head and a positive ``pruning_threshold``."""
        config = self.model.config
        return config.pruning_layer if self.model.streams.pruning is not None and config.pruning_threshold > 0 else None

    def prune_batch(self, states: torch.Tensor, drafts: list[DraftTree]) -> list[list[int]] | None:
        """Each row's nodes whose estimated transition probability, and every ancestor's, reaches the threshold;
        greedy drafts only (removing sampled candidates by a rule on their tokens would bias tree rejection
        sampling). See `pruning`."""
        if any(d.sampling != "deterministic" for d in drafts):
            return None
        from .pruning import prune_tree, transition_probabilities

        threshold = self.model.config.pruning_threshold
        return [
            prune_tree(d, transition_probabilities(self.model, states[a, : len(d)], d), threshold)
            for a, d in enumerate(drafts)
        ]

    @torch.no_grad()
    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        return tree.fill(self._stream_logits(), sequence[0, -1], options.scheme(self.draft_sampling), options)

    def end(self) -> None:
        self.logits, self._pending = None, None
