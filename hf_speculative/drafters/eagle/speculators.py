"""EAGLE-3 drafters in the layout of vllm-project/speculators, which vLLM serves as it is: ``vllm serve FOLDER``
(the verifier the config names, with this drafter) or ``vllm serve TARGET --speculative-config '{"model": FOLDER,
"num_speculative_tokens": N}'``.

The layout, as speculators writes it (``src/speculators/models/eagle3/config.py``: ``Eagle3SpeculatorConfig``;
``src/speculators/config.py``: ``SpeculatorsConfig``, ``VerifierConfig``; ``src/speculators/proposals/greedy.py``)
and vLLM reads it (``vllm/transformers_utils/configs/speculators/``: the first proposal method's
``speculative_tokens`` and the verifier's ``name_or_path`` are required, ``transformer_layer_config`` becomes the
drafter's config, the EAGLE-3 fields are copied over it; ``vllm/model_executor/models/llama_eagle3.py`` loads the
weights):

    config.json     speculators_model_type "eagle3", architectures ["Eagle3Speculator"]
                    speculators_config: algorithm "eagle3"; proposal_methods: one greedy proposal
                        (speculative_tokens N, verifier_accept_k 1, accept_tolerance 0.0);
                        default_proposal_method "greedy"; verifier {name_or_path, architectures}
                    transformer_layer_config: the Llama config of the one decoder layer (vocab_size the target's)
                    draft_vocab_size, target_hidden_size
                    norm_before_residual false (written: vLLM reads an absent key as true; the residual of this
                        package's midlayer is fc's output before hidden_norm), norm_before_fc / fc_norm /
                        norm_output false
                    eagle_aux_hidden_state_layer_ids: the target layers whose inputs are read (this package's
                        ``target_layers``, the numbers vLLM uses), when known
    weights         fc.weight (H, 3 * target_hidden_size); layers.0.self_attn.{q,k,v}_proj.weight (input width 2H),
                    layers.0.self_attn.o_proj.weight, layers.0.mlp.{gate,up,down}_proj.weight,
                    layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight; norm.weight;
                    lm_head.weight (draft_vocab_size rows); d2t (int64: target id = draft id + d2t[draft id]);
                    t2d (bool over the target vocabulary); embed_tokens.weight, the target's embeddings (which the
                    drafter uses unchanged), when the target is attached, else left out: speculators and vLLM then
                    take the verifier's

What vLLM's EAGLE-3 layer cannot hold is refused as for ``--format vllm`` (`serving.check_exportable`).
`public_fields` reads the layout back, for `load_public_checkpoint`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..serving import save_server_folder
from .configuration_eagle import eagle3_feature_layers
from .serving import check_exportable, rope_fields

__all__ = [
    "SPECULATORS_ARCHITECTURE",
    "speculators_config",
    "speculators_state_dict",
    "save_for_speculators",
    "public_fields",
]

SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
#: EAGLE-3 variants of speculators this package's midlayer is not (each a norm it does not have)
_OTHER_NORMS = ("norm_before_fc", "fc_norm", "norm_output")


def _check(drafter) -> None:
    if not drafter.config.is_eagle3:
        raise ValueError(
            f"the speculators layout written here is EAGLE-3's; this is an {drafter.config.variant} drafter: export it "
            "with --format vllm or --format sglang"
        )
    check_exportable(drafter, "vllm")


def _layer_config(drafter) -> dict:
    """``transformer_layer_config``: the Llama config of the drafter's decoder layer, every field written (vLLM builds
    a plain config from it, with no Llama defaults), RoPE as transformers 4 (``rope_theta``, ``rope_scaling``) and 5
    (``rope_parameters``) read it."""
    c = drafter.config
    rope = rope_fields(c)
    return {
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": c.hidden_act,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        **rope,
        "rope_parameters": {**(rope["rope_scaling"] or {"rope_type": "default"}), "rope_theta": rope["rope_theta"]},
        "attention_bias": bool(c.attention_bias),
        "mlp_bias": bool(c.mlp_bias),
        "tie_word_embeddings": False,
        "torch_dtype": str(drafter.fc.weight.dtype).removeprefix("torch."),
    }


def _feature_layers(drafter) -> list[int] | None:
    """The target layers the drafter reads, or None while the target's depth is unknown."""
    c = drafter.config
    n = c.target_num_layers or drafter.__dict__.get("num_target_layers")
    if c.target_layers is not None:
        return list(c.target_layers)
    return None if n is None else eagle3_feature_layers(n)


def speculators_config(drafter, speculative_tokens: int | None = None, verifier: dict | None = None) -> dict:
    """The speculators ``config.json`` of ``drafter`` (an EAGLE-3 `EagleDrafter`). ``speculative_tokens``: the greedy
    proposal's tokens per step (vLLM's ``num_speculative_tokens``; default the drafter's tree depth). ``verifier``:
    ``{"name_or_path", "architectures"}`` (default: the config's ``base_model_name_or_path``, no architectures)."""
    _check(drafter)
    c = drafter.config
    tokens = int(speculative_tokens or c.tree_depth)
    if tokens < 1:
        raise ValueError(f"speculative_tokens must be at least 1, got {tokens}")
    verifier = {"name_or_path": c.base_model_name_or_path, "architectures": [], **(verifier or {})}
    greedy = {"proposal_type": "greedy", "speculative_tokens": tokens, "verifier_accept_k": 1, "accept_tolerance": 0.0}
    return {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [greedy],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier["name_or_path"], "architectures": list(verifier["architectures"])},
        },
        "transformer_layer_config": _layer_config(drafter),
        "draft_vocab_size": int(drafter.lm_head.out_features),
        "target_hidden_size": int(c.target_hidden_size or c.hidden_size),
        "norm_before_residual": False,
        **dict.fromkeys(_OTHER_NORMS, False),
        "eagle_aux_hidden_state_layer_ids": _feature_layers(drafter),
    }


def speculators_state_dict(drafter) -> dict[str, torch.Tensor]:
    """The weights under speculators' names (see the module docstring)."""
    _check(drafter)
    state = {}
    for key, value in drafter.state_dict().items():
        if key != "fc.bias":  # a zero bias (checked): speculators' and vLLM's fc have none
            state["layers.0." + key.removeprefix("midlayer.") if key.startswith("midlayer.") else key] = value.detach()
    embeddings = drafter.__dict__.get("base_embeddings")
    if embeddings is not None:
        state["embed_tokens.weight"] = embeddings.weight.detach().to(drafter.fc.weight.dtype)
    return state


def save_for_speculators(drafter, output, speculative_tokens: int | None = None, verifier: dict | None = None) -> Path:
    """Write ``drafter`` (an EAGLE-3 `EagleDrafter`) as a speculators EAGLE-3 folder (`speculators_config`,
    `speculators_state_dict`); returns the folder."""
    config = speculators_config(drafter, speculative_tokens, verifier)
    return save_server_folder(output, config, speculators_state_dict(drafter))


def public_fields(raw: dict) -> dict:
    """A speculators EAGLE-3 ``config.json`` as the fields of a public EAGLE-3 one (what `load_public_checkpoint`
    reads): the layer's Llama fields, the EAGLE-3 fields and ``base_model_name_or_path`` (the verifier)."""
    if raw.get("speculators_model_type") != "eagle3":
        raise ValueError(f"a speculators {raw.get('speculators_model_type')!r} model is not an EAGLE-3 drafter")
    other = [key for key in _OTHER_NORMS if raw.get(key)]
    if other:
        raise ValueError(f"a speculators EAGLE-3 with {', '.join(other)} is not this package's EAGLE-3 layer")
    fields = dict(raw.get("transformer_layer_config") or {})
    fields.pop("architectures", None)
    for key in ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "eagle_aux_hidden_state_layer_ids"):
        if raw.get(key) is not None:
            fields[key] = raw[key]
    verifier = (raw.get("speculators_config") or {}).get("verifier") or {}
    fields.setdefault("base_model_name_or_path", verifier.get("name_or_path"))
    return fields
