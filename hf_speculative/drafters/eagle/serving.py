"""EAGLE drafters in the public EAGLE / EAGLE-3 layout that vLLM and SGLang load as speculative drafters.

Both engines read the drafter as the EAGLE repository (SafeAILab/EAGLE) and SpecForge publish it: a Llama
``config.json`` (``model_type: llama``, one decoder layer, the target's vocabulary) and weights under the EAGLE
names. Both share the target's token embeddings (and, EAGLE-1/2, its ``lm_head``), so neither is written.

EAGLE-1/2 (vLLM ``vllm/model_executor/models/llama_eagle.py``; SGLang ``python/sglang/srt/models/llama_eagle.py``):

    architectures   vLLM ["EagleLlamaForCausalLM"], SGLang ["LlamaForCausalLMEagle"] (the class each registry picks)
    weights         fc.weight (H, 2H) over [embedding ; target feature], layers.0.self_attn.{q,k,v,o}_proj.weight,
                    layers.0.mlp.{gate,up,down}_proj.weight, layers.0.post_attention_layernorm.weight
                    (layer 0 has no input_layernorm in either engine)
    fc bias         vLLM builds ``fc`` without one (a non-zero bias cannot be exported); SGLang builds it with one,
                    so ``fc.bias`` is always written (zeros when the drafter has none)

EAGLE-3 (vLLM ``vllm/model_executor/models/llama_eagle3.py``; SGLang ``python/sglang/srt/models/llama_eagle3.py``):

    architectures   ["LlamaForCausalLMEagle3"] (registered in both)
    config          draft_vocab_size, target_hidden_size (always an integer: both engines use the key when present)
    weights         fc.weight (H, 3 * target_hidden_size), midlayer.self_attn.{q,k,v}_proj.weight (input width 2H),
                    midlayer.self_attn.o_proj.weight, midlayer.mlp.*, midlayer.{input_layernorm,hidden_norm,
                    post_attention_layernorm}.weight, norm.weight, lm_head.weight (draft_vocab_size rows),
                    d2t (int64: target id = draft id + d2t[draft id]), t2d (bool over the target vocabulary)
    target layers   both engines default to the inputs of target layers 2, L // 2 and L - 3, which is ours
                    (`eagle3_feature_layers`): nothing is written. Other layers are written as each engine reads
                    them: vLLM ``eagle_aux_hidden_state_layer_ids`` (the index of the layer whose input is taken, as
                    transformers' ``hidden_states``), SGLang ``eagle_config.eagle_aux_hidden_state_layer_ids`` (the
                    index of the layer whose output is taken: one less; its model adds 1)

What the engines' Llama layer cannot hold is refused with a `ValueError`: q/k/v biases without an ``o_proj`` bias,
attention biases in SGLang's EAGLE-3 midlayer (its q/k/v have none), MLP biases in SGLang, an activation other than
SiLU, EAGLE-1/2 reading another target state than the final one.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..serving import save_server_folder
from .configuration_eagle import eagle3_feature_layers

__all__ = [
    "server_architecture",
    "server_config",
    "server_state_dict",
    "save_for_server",
    "check_exportable",
    "rope_fields",
]

_ARCHITECTURES = {
    ("vllm", False): "EagleLlamaForCausalLM",
    ("sglang", False): "LlamaForCausalLMEagle",
    ("vllm", True): "LlamaForCausalLMEagle3",
    ("sglang", True): "LlamaForCausalLMEagle3",
}


def server_architecture(fmt: str, eagle3: bool) -> str:
    """The ``architectures`` entry that makes engine ``fmt`` build its EAGLE (or EAGLE-3) drafter class."""
    if (fmt, bool(eagle3)) not in _ARCHITECTURES:
        raise ValueError(f"unknown serving format {fmt!r}: expected 'vllm' or 'sglang'")
    return _ARCHITECTURES[fmt, bool(eagle3)]


def _custom_feature_layers(drafter) -> list[int] | None:
    """The target layers the drafter reads when they are not the engines' default (or the target's depth, which
    decides the default, is unknown), else None."""
    c = drafter.config
    n = c.target_num_layers or drafter.num_target_layers
    if c.target_layers is None:
        return None
    default = None if n is None else eagle3_feature_layers(n) if c.is_eagle3 else [int(n)]
    return None if list(c.target_layers) == default else list(c.target_layers)


def check_exportable(drafter, fmt: str) -> None:
    """A `ValueError` naming everything of ``drafter`` that engine ``fmt``'s EAGLE layer cannot hold (see above)."""
    server_architecture(fmt, drafter.config.is_eagle3)  # a known format
    c = drafter.config
    server = "vLLM" if fmt == "vllm" else "SGLang"
    qkv, o = c.use_qkv_bias, bool(c.attention_bias)
    problems = []
    if c.hidden_act != "silu":
        problems.append(f"hidden_act {c.hidden_act!r} (the engines' Llama MLP is SiLU-gated)")
    if qkv != o:
        problems.append(
            "q/k/v biases without an o_proj bias (Qwen2-style): the engines' Llama layer has one attention_bias for all four"
        )
    if o and fmt == "sglang" and c.is_eagle3:
        problems.append("attention biases (SGLang's EAGLE-3 midlayer builds q/k/v without a bias)")
    if c.mlp_bias and fmt == "sglang":
        problems.append("MLP biases (SGLang's Llama MLP has none)")
    bias = getattr(drafter.fc, "bias", None)
    if bias is not None and bool(bias.detach().ne(0).any()) and (fmt == "vllm" or c.is_eagle3):
        problems.append(f"a non-zero fc bias ({server}'s {'EAGLE-3' if c.is_eagle3 else 'EAGLE'} fc has no bias)")
    layers = _custom_feature_layers(drafter)
    if layers is not None and not c.is_eagle3:
        problems.append(f"target_layers {layers} (the engines feed EAGLE-1/2 the target's final hidden state)")
    if layers is not None and fmt == "sglang" and min(layers) < 1:
        problems.append(f"target_layers {layers} (SGLang names a layer by its output: the embeddings have no index)")
    if problems:
        raise ValueError(f"this EagleDrafter cannot be exported for {server}: " + "; ".join(problems))


def rope_fields(config) -> dict:
    """``rope_theta`` and ``rope_scaling`` as a Llama config.json writes them (what the engines' transformers reads)."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    theta = rope.pop("rope_theta", getattr(config, "rope_theta", 10000.0))
    scaling = rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None
    return {"rope_theta": theta, "rope_scaling": scaling}


def server_config(drafter, fmt: str) -> dict:
    """The ``config.json`` engine ``fmt`` reads for ``drafter`` (an `EagleDrafter`)."""
    check_exportable(drafter, fmt)
    c = drafter.config
    dtype = drafter.fc.weight.dtype
    config = {
        "architectures": [server_architecture(fmt, c.is_eagle3)],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": c.hidden_act,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size,
        **rope_fields(c),
        "attention_bias": bool(c.attention_bias),
        "mlp_bias": bool(c.mlp_bias),
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if c.is_eagle3:
        config["draft_vocab_size"] = int(drafter.lm_head.out_features)
        config["target_hidden_size"] = int(c.target_hidden_size or c.hidden_size)
        layers = _custom_feature_layers(drafter)
        if fmt == "vllm":
            config["norm_before_residual"] = False  # the midlayer's residual is fc's output before hidden_norm
            if layers is not None:
                config["eagle_aux_hidden_state_layer_ids"] = layers
        elif layers is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers]}
    if c.base_model_name_or_path:
        config["base_model_name_or_path"] = c.base_model_name_or_path
    return config


def server_state_dict(drafter, fmt: str) -> dict[str, torch.Tensor]:
    """The weights under the names engine ``fmt`` loads (see the module docstring)."""
    check_exportable(drafter, fmt)
    state = {k: v.detach() for k, v in drafter.state_dict().items()}
    bias = state.pop("fc.bias", None)  # non-zero only where the engine has one (checked above)
    if fmt == "sglang" and not drafter.config.is_eagle3:
        state["fc.bias"] = bias if bias is not None else drafter.fc.weight.new_zeros(drafter.fc.out_features)
    return state


def save_for_server(drafter, output, fmt: str) -> Path:
    """Write ``drafter`` as a folder engine ``fmt`` (``"vllm"`` or ``"sglang"``) loads as its EAGLE / EAGLE-3 drafter;
    returns the folder."""
    return save_server_folder(output, server_config(drafter, fmt), server_state_dict(drafter, fmt))
