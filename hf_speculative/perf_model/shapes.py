"""Model shapes for the analytic cost model: named target shapes (`SHAPES`: published configs, each built in its
family's config class by `shape_config`) and `ModelShape`, which counts a decoder's
parameters, and the FLOPs and bytes of one forward, from its config alone (no weights, no torch).

The counts are those of a Llama-style decoder (Llama, Mistral, Qwen2, SmolLM2, and the drafters built on them): per
layer grouped-query attention (q, k, v, o projections; k and v with ``num_key_value_heads`` heads of ``head_dim``), a
gated MLP (gate, up, down) and two RMSNorms; a final norm; the token embedding; the LM head, tied to the embedding or
not.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

#: Llama 3's rotary embedding (rope_type "llama3"; ``factor`` 8 for 3.1, 32 for 3.2)
_LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=500000.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)

#: the ``config.json`` fields of a `_shape` row, in its order
_SHAPE_FIELDS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
)


def _shape(*row, **published) -> dict:
    """One shape's config keyword arguments: a row of the `_SHAPE_FIELDS` (None: not published, the config class's
    default), then the other published fields."""
    fields = {name: value for name, value in zip(_SHAPE_FIELDS, row, strict=True) if value is not None}
    return dict(fields, **published)


def _llama3(rope_factor: float, tied: bool) -> dict:
    """The fields Llama 3.1 and 3.2 publish beyond `_SHAPE_FIELDS`."""
    rope = dict(_LLAMA3_ROPE, factor=rope_factor)
    return dict(rope_parameters=rope, rms_norm_eps=1e-5, tie_word_embeddings=tied)


def _default_rope(theta: float, rms_norm_eps: float, tied: bool, **more) -> dict:
    """The fields a config with the default rotary embedding of base ``theta`` publishes beyond `_SHAPE_FIELDS`."""
    rope = dict(rope_type="default", rope_theta=theta)
    return dict(rope_parameters=rope, rms_norm_eps=rms_norm_eps, tie_word_embeddings=tied, **more)


#: Config keyword arguments of common target (and draft) shapes: ``model_type`` names the family's config class
#: (`shape_config`), the rest are the published ``config.json`` fields that decide a forward's cost (token ids and
#: generation settings left out). A row: model_type, hidden_size, intermediate_size, num_hidden_layers,
#: num_attention_heads, num_key_value_heads, head_dim, vocab_size, max_position_embeddings (`_SHAPE_FIELDS`), then
#: the other fields.
SHAPES: dict[str, dict] = {
    "llama-2-7b": _shape("llama", 4096, 11008, 32, 32, 32, None, 32000, 4096),
    "vicuna-7b": _shape("llama", 4096, 11008, 32, 32, 32, None, 32000, 4096),
    "llama-2-13b": _shape("llama", 5120, 13824, 40, 40, 40, None, 32000, 4096),
    "llama-3-8b": _shape("llama", 4096, 14336, 32, 32, 8, None, 128256, 8192),
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": _shape("llama", 4096, 14336, 32, 32, 8, 128, 128256, 131072, **_llama3(8.0, tied=False)),
    # meta-llama/Llama-3.2-1B and -3B: tied embeddings
    "llama-3.2-1b": _shape("llama", 2048, 8192, 16, 32, 8, 64, 128256, 131072, **_llama3(32.0, tied=True)),
    "llama-3.2-3b": _shape("llama", 3072, 8192, 28, 24, 8, 128, 128256, 131072, **_llama3(32.0, tied=True)),
    # Qwen/Qwen2.5-0.5B: Qwen2Config (q, k and v projections with biases), tied embeddings
    "qwen2.5-0.5b": _shape(
        "qwen2", 896, 4864, 24, 14, 2, None, 151936, 32768, **_default_rope(1e6, 1e-6, True, use_sliding_window=False)
    ),
    # mistralai/Mistral-7B-v0.3: MistralConfig, 32768-token vocabulary, no sliding window, untied
    "mistral-7b": _shape(
        "mistral", 4096, 14336, 32, 32, 8, 128, 32768, 32768, **_default_rope(1e6, 1e-5, False, sliding_window=None)
    ),
    "smollm2-135m": _shape("llama", 576, 1536, 30, 9, 3, None, 49152, 8192, tie_word_embeddings=True),
    "tiny": _shape("llama", 64, 128, 2, 4, 2, None, 256, 1024),
}

#: bytes per element of the dtypes a config may name
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}


def check_shape_name(shape: str) -> None:
    """A `ValueError` listing the known shapes when ``shape`` is none of them."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(sorted(SHAPES))}")


def shape_config(shape: str):
    """The config of a named shape (:data:`SHAPES`) in its family's own class (``LlamaConfig``, ``Qwen2Config``,
    ``MistralConfig``), built by transformers from its ``model_type``."""
    from transformers import AutoConfig

    check_shape_name(shape)
    fields = dict(SHAPES[shape])
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def _get(config: Any, name: str, default=None):
    value = config.get(name, default) if isinstance(config, Mapping) else getattr(config, name, default)
    return default if value is None else value


@dataclass(frozen=True)
class ModelShape:
    """What the cost of a decoder's forward depends on.

    Args:
        name: a label (the shape name, or the config's ``_name_or_path``).
        hidden: hidden size H.
        intermediate: MLP intermediate size (gated MLP: three H x intermediate matrices).
        layers: decoder layers.
        heads / kv_heads: query heads and key/value heads (grouped-query attention when fewer).
        head_dim: per-head width (``hidden // heads`` unless the config says otherwise).
        vocab: vocabulary size (embedding rows, LM-head rows).
        tied: the LM head shares the embedding matrix.
        dtype_bytes: bytes per weight and per KV-cache element (2 for bf16/fp16, 4 for fp32).
        qkv_bias / o_bias / mlp_bias: bias vectors on those projections (Qwen2: q, k, v; Llama ``attention_bias``:
            all four).
    """

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False
    dtype_bytes: int = 2
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self):
        for f in ("hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab", "dtype_bytes"):
            if int(getattr(self, f)) < 1:
                raise ValueError(f"ModelShape.{f} must be >= 1, got {getattr(self, f)}")
        if self.layers < 0:
            raise ValueError(f"ModelShape.layers must be >= 0, got {self.layers}")

    # ------------------------------------------------------------------ building
    @classmethod
    def from_config(cls, config: Any, dtype_bytes: int | None = None, name: str | None = None) -> "ModelShape":
        """From a transformers config or its dict (``config.json``); a multimodal config's ``text_config`` is used.
        ``dtype_bytes`` defaults to the config's ``dtype`` / ``torch_dtype``, else 2 (bf16)."""
        text = _get(config, "text_config")
        if text is not None:
            config = text
        hidden = int(_get(config, "hidden_size"))
        heads = int(_get(config, "num_attention_heads"))
        if dtype_bytes is None:
            dtype = _get(config, "dtype") or _get(config, "torch_dtype")
            dtype_bytes = DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 2) if dtype is not None else 2
        model_type = _get(config, "model_type", "")
        attention_bias = bool(_get(config, "attention_bias", False))
        return cls(
            name=name or str(_get(config, "_name_or_path", "") or model_type or "model"),
            hidden=hidden,
            intermediate=int(_get(config, "intermediate_size")),
            layers=int(_get(config, "num_hidden_layers")),
            heads=heads,
            kv_heads=int(_get(config, "num_key_value_heads", heads)),
            head_dim=int(_get(config, "head_dim", hidden // heads)),
            vocab=int(_get(config, "vocab_size")),
            tied=bool(_get(config, "tie_word_embeddings", False)),
            dtype_bytes=int(dtype_bytes),
            qkv_bias=attention_bias or model_type == "qwen2" or bool(_get(config, "qkv_bias", False)),
            o_bias=attention_bias,
            mlp_bias=bool(_get(config, "mlp_bias", False)),
        )

    @classmethod
    def from_name(cls, name: str, dtype_bytes: int = 2) -> "ModelShape":
        """A named shape of :data:`SHAPES` (e.g. ``"llama-3-8b"``)."""
        check_shape_name(name)
        return cls.from_config(SHAPES[name], dtype_bytes=dtype_bytes, name=name)

    @classmethod
    def from_json(cls, path: str | Path, dtype_bytes: int | None = None) -> "ModelShape":
        """From a ``config.json`` file, or a folder holding one."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_config(
            json.loads(path.read_text()), dtype_bytes=dtype_bytes, name=str(path.parent.name or path)
        )

    def truncated(self, layers: int, name: str | None = None) -> "ModelShape":
        """The first ``layers`` decoder layers of this shape with its embedding and LM head: a layer-cut draft, or
        SPIRe's pruned drafter (``spire:N``)."""
        return dataclasses.replace(self, layers=int(layers), name=name or f"{self.name}[:{layers} layers]")

    def with_dtype_bytes(self, dtype_bytes: int) -> "ModelShape":
        return dataclasses.replace(self, dtype_bytes=int(dtype_bytes))

    # ------------------------------------------------------------------ parameters
    @property
    def attention_params(self) -> int:
        """One layer's q, k, v, o projections (and biases)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        params = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        return params + (q + 2 * kv if self.qkv_bias else 0) + (self.hidden if self.o_bias else 0)

    @property
    def mlp_params(self) -> int:
        """One layer's gated MLP (gate, up, down; and biases)."""
        bias = 2 * self.intermediate + self.hidden if self.mlp_bias else 0
        return 3 * self.hidden * self.intermediate + bias

    @property
    def layer_params(self) -> int:
        """One decoder layer: attention, MLP, two norms."""
        return self.attention_params + self.mlp_params + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def num_parameters(self) -> int:
        """All parameters, as ``sum(p.numel() for p in model.parameters())`` counts them (a tied head once)."""
        head = 0 if self.tied else self.vocab * self.hidden
        return self.embedding_params + self.layers * self.layer_params + self.hidden + head

    @property
    def forward_params(self) -> int:
        """Parameters a forward reads in full and multiplies every token by: all layers, the final norm and the LM
        head. The embedding table is left out (a forward gathers only its tokens' rows), so a tied matrix counts
        once, as the LM head."""
        return self.layers * self.layer_params + self.hidden + self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one position of one row: keys and values of every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    # ------------------------------------------------------------------ one forward
    @staticmethod
    def attended(context: int, kv_window: int | None = None) -> int:
        """``L_eff``: cached positions a new token attends to: the context L (dense), or at most ``kv_window`` = S + W
        (StreamingLLM sinks + sliding window)."""
        return int(context) if kv_window is None else min(int(context), int(kv_window))

    def forward_flops(self, batch: int, new_tokens: int, context: int, kv_window: int | None = None) -> float:
        """FLOPs of a forward over ``new_tokens`` per row for ``batch`` rows after ``context`` cached positions:
        ``2 * forward_params`` per token (a multiply-add per weight) plus attention, ``4 * L_eff * heads * head_dim``
        per layer per token (q.k and p.v). The new tokens' attention to each other is left out (n << L)."""
        tokens = batch * new_tokens
        attention = 4 * self.attended(context, kv_window) * self.heads * self.head_dim * self.layers
        return float(tokens * (2 * self.forward_params + attention))

    def forward_bytes(self, batch: int, new_tokens: int, context: int, kv_window: int | None = None) -> float:
        """Bytes a forward moves: the weights once (``forward_params``; shared by every row and token) plus each
        row's KV cache read once, ``batch * L_eff * kv_bytes_per_token``. Activations are left out."""
        del new_tokens  # the weights and the cache are read once however many tokens a row brings
        weights = self.forward_params * self.dtype_bytes
        return float(weights + batch * self.attended(context, kv_window) * self.kv_bytes_per_token)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "num_parameters": self.num_parameters}
