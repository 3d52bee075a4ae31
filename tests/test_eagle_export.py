"""``hf-speculative export`` of EAGLE drafters: the public EAGLE / EAGLE-3 layout that vLLM and SGLang load, and
vllm-project/speculators' EAGLE-3 layout that vLLM serves (``--format speculators``).

The config fields and tensor names asserted here are the ones their loaders read (vLLM
``vllm/model_executor/models/llama_eagle.py``, ``llama_eagle3.py``, ``vllm/transformers_utils/configs/eagle.py``;
SGLang ``python/sglang/srt/models/llama_eagle.py``, ``llama_eagle3.py``); each engine's renaming of the checkpoint
names onto its module's parameters is re-implemented in `engine_parameters`. The speculators layout is checked against
speculators' ``Eagle3SpeculatorConfig`` / ``SpeculatorsConfig`` fields and its EAGLE-3 module's tensor names, and
against vLLM's reading of it (``vllm/transformers_utils/configs/speculators/``), re-implemented in `vllm_view`. The
exported folder is loaded back through our public-layout loader (`EagleDrafter.from_pretrained`): identical weights,
outputs and greedy generation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import load_file

import hf_speculative as hfs
from hf_speculative.cli import main
from hf_speculative.drafters.eagle import EagleDrafter

FORMATS = ["vllm", "sglang"]
VARIANTS = ["eagle", "eagle3"]
NUM_LAYERS = 6
DRAFT_VOCAB = 40
ROPE_THETA = 50000.0  # not Llama's default: a lost rope_theta would change the drafter
LAYER = [
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_attention_layernorm.weight",
]
EAGLE1_KEYS = {"fc.weight", *(f"layers.0.{k}" for k in LAYER)}
EAGLE3_KEYS = {
    "fc.weight",
    *(f"midlayer.{k}" for k in LAYER),
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
}
EXPECTED_KEYS = {
    ("vllm", "eagle"): EAGLE1_KEYS,  # vLLM's EAGLE fc has no bias
    ("sglang", "eagle"): EAGLE1_KEYS | {"fc.bias"},  # SGLang's EAGLE fc always has one
    ("vllm", "eagle3"): EAGLE3_KEYS,
    ("sglang", "eagle3"): EAGLE3_KEYS,
}
ARCHITECTURES = {
    ("vllm", "eagle"): "EagleLlamaForCausalLM",
    ("sglang", "eagle"): "LlamaForCausalLMEagle",
    ("vllm", "eagle3"): "LlamaForCausalLMEagle3",
    ("sglang", "eagle3"): "LlamaForCausalLMEagle3",
}
# the parameters each engine's drafter module holds (fused q/k/v and gate/up), shared embeddings and heads left out
_FUSED = [
    "self_attn.qkv_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_up_proj.weight",
    "mlp.down_proj.weight",
    "post_attention_layernorm.weight",
]
ENGINE_PARAMETERS = {
    ("vllm", "eagle"): {"model.fc.weight", *(f"model.layers.0.{k}" for k in _FUSED)},
    ("sglang", "eagle"): {"model.fc.weight", "model.fc.bias", *(f"model.layers.0.{k}" for k in _FUSED)},
    ("vllm", "eagle3"): {
        "model.fc.weight",
        *(f"model.layers.0.{k}" for k in _FUSED),
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.hidden_norm.weight",
        "model.norm.weight",
        "lm_head.weight",
        "draft_id_to_target_id",
    },
    ("sglang", "eagle3"): {
        "model.fc.weight",
        *(f"model.midlayer.{k}" for k in _FUSED),
        "model.midlayer.input_layernorm.weight",
        "model.midlayer.hidden_norm.weight",
        "model.norm.weight",
        "lm_head.weight",
        "hot_token_id",
    },
}


def engine_parameters(fmt: str, variant: str, keys) -> set[str]:
    """Where each engine's ``load_weights`` puts the checkpoint's tensors: t2d skipped; d2t to vLLM's
    ``draft_id_to_target_id`` / SGLang's ``hot_token_id``; ``model.`` before everything but ``lm_head``; vLLM's
    EAGLE-3 ``midlayer.`` to ``layers.0.``; q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``. SGLang's EAGLE-1
    loader drops ``lm_head`` (the target's is shared)."""
    names = set()
    for key in keys:
        if key == "t2d" or (fmt == "sglang" and variant == "eagle" and key.startswith("lm_head")):
            continue
        if key == "d2t":
            names.add("draft_id_to_target_id" if fmt == "vllm" else "hot_token_id")
            continue
        if fmt == "vllm":
            key = key.replace("midlayer.", "layers.0.")
        for shard, fused in (
            (".q_proj", ".qkv_proj"),
            (".k_proj", ".qkv_proj"),
            (".v_proj", ".qkv_proj"),
            (".gate_proj", ".gate_up_proj"),
            (".up_proj", ".gate_up_proj"),
        ):
            key = key.replace(shard, fused)
        names.add(key if key.startswith("lm_head") else f"model.{key}")
    return names


def _target(seed=3):
    return hfs.enable(tiny_model("llama", seed=seed, num_layers=NUM_LAYERS, rope_theta=ROPE_THETA))


def _trained_like(drafter, seed=0):
    """Every float weight moved off its initialisation (so a dropped or swapped tensor shows)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return drafter


def _drafter(model, variant, **kwargs):
    eagle3 = variant == "eagle3"
    drafter = EagleDrafter.from_base_model(
        model, variant=variant, draft_vocab_size=DRAFT_VOCAB if eagle3 else None, **kwargs
    )
    if eagle3:
        g = torch.Generator().manual_seed(1)
        drafter.set_draft_vocab(torch.randperm(model.config.vocab_size, generator=g)[:DRAFT_VOCAB])
    return _trained_like(drafter)


def _export(folder, fmt, out) -> int:
    return main(["export", str(folder), "--format", fmt, "--output", str(out)])


def _assert_same_drafter(a, b, model):
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k].to(sa[k].dtype)), k
    seq = torch.tensor([[4, 8, 15, 16, 23, 42, 7]])
    with torch.no_grad():
        hs = model(seq, output_hidden_states=True).hidden_states
        oa = a(seq[:, 1:], target_features=a.target_features(hs)[:, :-1])
        ob = b(seq[:, 1:], target_features=b.target_features(hs)[:, :-1])
    assert torch.equal(oa.logits, ob.logits) and torch.equal(oa.hidden_states, ob.hidden_states)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_export_round_trip(fmt, variant, tmp_path):
    model = _target()
    c = model.config
    drafter = _drafter(model, variant)
    drafter.save_pretrained(tmp_path / "ours")
    assert _export(tmp_path / "ours", fmt, tmp_path / "out") == 0

    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[fmt, variant]]
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 1
    assert (config["hidden_size"], config["vocab_size"], config["intermediate_size"]) == (
        c.hidden_size,
        c.vocab_size,
        c.intermediate_size,
    )
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (
        4,
        2,
        c.hidden_size // 4,
    )
    assert (
        config["rope_theta"] == ROPE_THETA
        and config["rope_scaling"] is None
        and config["rms_norm_eps"] == c.rms_norm_eps
    )
    assert (
        config["tie_word_embeddings"] is False and config["attention_bias"] is False and config["hidden_act"] == "silu"
    )
    assert (
        "eagle_aux_hidden_state_layer_ids" not in config and "eagle_config" not in config
    )  # the engines' default layers
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(weights) == EXPECTED_KEYS[fmt, variant]
    assert engine_parameters(fmt, variant, weights) == ENGINE_PARAMETERS[fmt, variant]
    H = c.hidden_size
    if variant == "eagle3":
        assert config["draft_vocab_size"] == DRAFT_VOCAB and config["target_hidden_size"] == H
        assert weights["fc.weight"].shape == (H, 3 * H) and weights["midlayer.self_attn.q_proj.weight"].shape == (
            H,
            2 * H,
        )
        assert weights["lm_head.weight"].shape == (DRAFT_VOCAB, H)
        assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
        assert torch.equal(torch.arange(DRAFT_VOCAB) + weights["d2t"], drafter.draft_target_ids)
        assert torch.equal(weights["t2d"].nonzero().flatten(), drafter.draft_target_ids.sort().values)
        assert config.get("norm_before_residual", False) is False
    else:
        assert "draft_vocab_size" not in config and weights["fc.weight"].shape == (H, 2 * H)
        if fmt == "sglang":
            assert torch.equal(weights["fc.bias"], torch.zeros(H))

    loaded = EagleDrafter.from_pretrained(tmp_path / "out", base_model=model)
    assert loaded.config.is_eagle3 == (variant == "eagle3") and not loaded.config.fc_bias
    assert loaded.config.rope_parameters["rope_theta"] == ROPE_THETA
    _assert_same_drafter(drafter, loaded, model)
    for prompt in (torch.tensor([[1, 5, 7, 9, 11]]), torch.tensor([[3]])):
        ref = model.generate(prompt, max_new_tokens=20, do_sample=False)
        outs = [
            model.generate(prompt, assistant_model=d, max_new_tokens=20, do_sample=False, return_dict_in_generate=True)
            for d in (drafter, loaded)
        ]
        assert torch.equal(outs[0].sequences, ref) and torch.equal(outs[1].sequences, ref)
        assert outs[0].speculative_stats.accepted_lengths == outs[1].speculative_stats.accepted_lengths


def test_public_folders_export_again(tmp_path):
    """A public EAGLE folder (vLLM's export, or the EAGLE repository's ``LlamaForCausalLM`` + ``pytorch_model.bin``,
    architectures that end in ForCausalLM) is read as EAGLE, not as a plain draft model, and converts unchanged."""
    model = _target()
    _drafter(model, "eagle").save_pretrained(tmp_path / "ours")
    assert _export(tmp_path / "ours", "vllm", tmp_path / "vllm") == 0
    assert _export(tmp_path / "vllm", "sglang", tmp_path / "sglang") == 0
    assert json.loads((tmp_path / "sglang" / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle"]
    (tmp_path / "repo").mkdir()
    config = json.loads((tmp_path / "vllm" / "config.json").read_text()) | {"architectures": ["LlamaForCausalLM"]}
    (tmp_path / "repo" / "config.json").write_text(json.dumps(config))
    torch.save(load_file(str(tmp_path / "vllm" / "model.safetensors")), tmp_path / "repo" / "pytorch_model.bin")
    assert _export(tmp_path / "repo", "vllm", tmp_path / "again") == 0
    assert json.loads((tmp_path / "again" / "config.json").read_text())["architectures"] == ["EagleLlamaForCausalLM"]
    a = EagleDrafter.from_pretrained(tmp_path / "vllm", base_model=model)
    for folder in ("sglang", "again"):
        _assert_same_drafter(a, EagleDrafter.from_pretrained(tmp_path / folder, base_model=model), model)


def test_fc_bias_goes_where_the_engine_has_one(tmp_path, capsys):
    model = _target()
    drafter = _drafter(model, "eagle", fc_bias=True)
    assert bool(drafter.fc.bias.ne(0).any())
    drafter.save_pretrained(tmp_path / "ours")
    assert _export(tmp_path / "ours", "sglang", tmp_path / "sglang") == 0
    assert torch.equal(load_file(str(tmp_path / "sglang" / "model.safetensors"))["fc.bias"], drafter.fc.bias.detach())
    loaded = EagleDrafter.from_pretrained(tmp_path / "sglang", base_model=model)
    assert loaded.config.fc_bias
    _assert_same_drafter(drafter, loaded, model)
    assert _export(tmp_path / "ours", "vllm", tmp_path / "vllm") == 2
    assert "non-zero fc bias" in capsys.readouterr().err and not (tmp_path / "vllm").exists()


def test_eagle3_other_target_layers_in_each_engines_convention(tmp_path):
    model = _target()
    drafter = _drafter(model, "eagle3", target_layers=[1, 3, 4])
    drafter.save_pretrained(tmp_path / "ours")
    for fmt in FORMATS:
        assert _export(tmp_path / "ours", fmt, tmp_path / fmt) == 0
    vllm = json.loads((tmp_path / "vllm" / "config.json").read_text())
    sglang = json.loads((tmp_path / "sglang" / "config.json").read_text())
    assert vllm["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # the layer whose input is taken
    assert sglang["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}  # whose output: SGLang adds 1
    for fmt in FORMATS:
        loaded = EagleDrafter.from_pretrained(tmp_path / fmt, base_model=model)
        assert loaded.config.feature_layers() == [1, 3, 4]
        _assert_same_drafter(drafter, loaded, model)
    assert _export(tmp_path / "sglang", "vllm", tmp_path / "again") == 0  # layers read from SGLang's field, kept
    assert json.loads((tmp_path / "again" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]


def test_what_the_engines_cannot_load_is_refused(tmp_path, capsys):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert _export(tmp_path / "other", "vllm", tmp_path / "o") == 2
    assert "is not an EAGLE or Medusa drafter (model_type 'bert')" in capsys.readouterr().err
    assert _export(tmp_path / "missing", "sglang", tmp_path / "o") == 2
    assert "no config.json" in capsys.readouterr().err
    qwen = hfs.enable(tiny_model("qwen2", seed=2, num_layers=NUM_LAYERS))
    EagleDrafter.from_base_model(qwen, variant="eagle3").save_pretrained(tmp_path / "qwen")
    assert _export(tmp_path / "qwen", "vllm", tmp_path / "o") == 2
    assert "q/k/v biases without an o_proj bias" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


CARD = Path(__file__).resolve().parents[1] / "model_cards" / "eagle-smollm2-135m-instruct"


@pytest.fixture(scope="module")
def card_shaped(tmp_path_factory):
    """A drafter of the reference EAGLE-3 card's shape: its committed config.json with random weights (the card's
    trained weights are not in the repository), saved in the card's dtype."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(CARD)
    torch.manual_seed(0)
    drafter = EagleDrafter(config).to(torch.bfloat16)
    folder = tmp_path_factory.mktemp("eagle-card")
    drafter.save_pretrained(folder)
    return folder


@pytest.mark.skipif(not (CARD / "config.json").is_file(), reason="the reference EAGLE-3 card is not in this checkout")
@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_card_exports(fmt, card_shaped, tmp_path):
    assert _export(card_shaped, fmt, tmp_path / fmt) == 0
    config = json.loads((tmp_path / fmt / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 8192
    assert (config["hidden_size"], config["target_hidden_size"], config["rope_theta"]) == (576, 576, 100000.0)
    weights = load_file(str(tmp_path / fmt / "model.safetensors"))
    assert set(weights) == EAGLE3_KEYS and weights["fc.weight"].dtype == torch.bfloat16
    card, loaded = EagleDrafter.from_pretrained(card_shaped), EagleDrafter.from_pretrained(tmp_path / fmt)
    assert loaded.config.target_num_layers is None and card.config.target_num_layers == 30
    for k, v in card.state_dict().items():
        assert torch.equal(v.float(), loaded.state_dict()[k].float()), k


# ---------------------------------------------------------------------------------------------- speculators layout
SPECULATORS_KEYS = {
    "fc.weight",
    *(f"layers.0.{k}" for k in LAYER),
    "layers.0.input_layernorm.weight",
    "layers.0.hidden_norm.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
}
#: the top-level fields of speculators' ``Eagle3SpeculatorConfig`` this export writes
SPECULATORS_FIELDS = {
    "architectures",
    "speculators_model_type",
    "speculators_config",
    "transformer_layer_config",
    "draft_vocab_size",
    "target_hidden_size",
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "eagle_aux_hidden_state_layer_ids",
}


def vllm_view(config: dict) -> dict:
    """The drafter config vLLM builds from a speculators ``config.json``: the structure it requires, the first
    proposal's ``speculative_tokens`` as its lookahead, the verifier as the target, ``transformer_layer_config`` as the
    drafter's fields, then the EAGLE-3 fields (``norm_before_residual`` read as true when absent)."""
    spec = config["speculators_config"]
    assert isinstance(config["transformer_layer_config"], dict) and spec["verifier"].keys() >= {"name_or_path"}
    view = {
        "method": config["speculators_model_type"],
        "num_lookahead_tokens": spec["proposal_methods"][0]["speculative_tokens"],
        "target_model": spec["verifier"]["name_or_path"],
        **config["transformer_layer_config"],
        "draft_vocab_size": config.get("draft_vocab_size"),
        "norm_before_residual": config.get("norm_before_residual", True),
        "architectures": ["Eagle3LlamaForCausalLM"],
    }
    if config.get("target_hidden_size") is not None:
        view["target_hidden_size"] = config["target_hidden_size"]
    if config.get("eagle_aux_hidden_state_layer_ids"):
        view["eagle_aux_hidden_state_layer_ids"] = config["eagle_aux_hidden_state_layer_ids"]
    return view


def _speculators(folder, out, *extra) -> int:
    return main(["export", str(folder), "--format", "speculators", "--output", str(out), *extra])


def test_speculators_export_writes_the_eagle3_speculator_layout(tmp_path, capsys):
    from transformers import LlamaConfig

    model = _target()
    c, H = model.config, model.config.hidden_size
    drafter = _drafter(model, "eagle3")
    drafter.save_pretrained(tmp_path / "ours")
    assert _speculators(tmp_path / "ours", tmp_path / "out", "--speculative-tokens", "3") == 0
    assert "vllm serve" in capsys.readouterr().out
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert set(config) == SPECULATORS_FIELDS
    assert config["architectures"] == ["Eagle3Speculator"] and config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"] == {
        "algorithm": "eagle3",
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
        ],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": None, "architectures": []},  # a target built from a config has no name
    }
    assert (config["draft_vocab_size"], config["target_hidden_size"]) == (DRAFT_VOCAB, H)
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3]  # the inputs of layers 2, L // 2, L - 3
    assert not any(config[k] for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"))
    layer = LlamaConfig(**config["transformer_layer_config"])  # as speculators' validator builds it
    assert (layer.model_type, layer.num_hidden_layers, layer.vocab_size, layer.hidden_size) == (
        "llama",
        1,
        c.vocab_size,
        H,
    )
    assert (layer.num_attention_heads, layer.num_key_value_heads, layer.head_dim) == (4, 2, H // 4)
    assert layer.intermediate_size == c.intermediate_size and layer.rope_parameters["rope_theta"] == ROPE_THETA
    view = vllm_view(config)
    assert (view["method"], view["num_lookahead_tokens"], view["norm_before_residual"]) == ("eagle3", 3, False)
    assert (view["hidden_act"], view["rope_theta"], view["rms_norm_eps"]) == ("silu", ROPE_THETA, c.rms_norm_eps)

    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(weights) == SPECULATORS_KEYS  # no target attached: no embeddings, vLLM shares the verifier's
    assert engine_parameters("vllm", "eagle3", weights) == ENGINE_PARAMETERS["vllm", "eagle3"]
    assert weights["fc.weight"].shape == (H, 3 * H) and weights["layers.0.self_attn.q_proj.weight"].shape == (H, 2 * H)
    assert weights["lm_head.weight"].shape == (DRAFT_VOCAB, H) and weights["t2d"].shape == (c.vocab_size,)
    assert torch.equal(torch.arange(DRAFT_VOCAB) + weights["d2t"], drafter.draft_target_ids)
    assert torch.equal(weights["layers.0.hidden_norm.weight"], drafter.midlayer.hidden_norm.weight.detach())

    loaded = EagleDrafter.from_pretrained(tmp_path / "out", base_model=model)  # the layout reads back
    assert loaded.config.is_eagle3 and loaded.config.feature_layers() == [2, 3, 3]
    _assert_same_drafter(drafter, loaded, model)
    prompt = torch.tensor([[1, 5, 7, 9, 11]])
    ref = model.generate(prompt, max_new_tokens=16, do_sample=False)
    assert torch.equal(model.generate(prompt, assistant_model=loaded, max_new_tokens=16, do_sample=False), ref)


def test_speculators_export_with_the_target_writes_its_embeddings_and_verifier(tmp_path, monkeypatch):
    from hf_speculative.drafters.eagle.speculators import save_for_speculators
    from hf_speculative.drafters.streaming import modeling_speculative_streaming

    model = _target()
    drafter = _drafter(model, "eagle3", target_layers=[1, 3, 4])
    drafter.save_pretrained(tmp_path / "ours")
    monkeypatch.setattr(modeling_speculative_streaming, "load_base_model", lambda name: model)  # --model's loader
    assert _speculators(tmp_path / "ours", tmp_path / "cli", "--model", "org/tiny-llama") == 0
    config = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
    assert "embed_tokens.weight" in load_file(str(tmp_path / "cli" / "model.safetensors"))
    verifier = {"name_or_path": "org/tiny-llama", "architectures": ["LlamaForCausalLM"]}
    save_for_speculators(drafter, tmp_path / "out", verifier=verifier)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["speculators_config"]["verifier"] == verifier
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == drafter.config.tree_depth
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(weights) == SPECULATORS_KEYS | {"embed_tokens.weight"}
    assert torch.equal(weights["embed_tokens.weight"], model.get_input_embeddings().weight.detach())
    assert "model.embed_tokens.weight" in engine_parameters("vllm", "eagle3", weights)
    loaded = EagleDrafter.from_pretrained(tmp_path / "out", base_model=model)  # the embeddings are the target's
    assert loaded.config.base_model_name_or_path == "org/tiny-llama" and loaded.config.feature_layers() == [1, 3, 4]
    _assert_same_drafter(drafter, loaded, model)
    assert _export(tmp_path / "out", "sglang", tmp_path / "sglang") == 0  # and converts to the other layouts
    assert json.loads((tmp_path / "sglang" / "config.json").read_text())["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [0, 2, 3]
    }


def test_speculators_export_takes_eagle3_drafters_only(tmp_path, capsys):
    model = _target()
    _drafter(model, "eagle").save_pretrained(tmp_path / "eagle1")
    assert _speculators(tmp_path / "eagle1", tmp_path / "o") == 2
    assert "writes EAGLE-3 drafters" in capsys.readouterr().err
    hfs.MedusaHeadsModel.from_base_model(model, num_heads=2).save_pretrained(tmp_path / "medusa")
    assert _speculators(tmp_path / "medusa", tmp_path / "o") == 2
    assert "is not an EAGLE drafter (model_type 'medusa_heads')" in capsys.readouterr().err
    qwen = hfs.enable(tiny_model("qwen2", seed=2, num_layers=NUM_LAYERS))
    EagleDrafter.from_base_model(qwen, variant="eagle3").save_pretrained(tmp_path / "qwen")
    assert _speculators(tmp_path / "qwen", tmp_path / "o") == 2
    assert "q/k/v biases without an o_proj bias" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(not (CARD / "config.json").is_file(), reason="the reference EAGLE-3 card is not in this checkout")
def test_reference_card_exports_to_speculators(card_shaped, tmp_path):
    assert _speculators(card_shaped, tmp_path / "out") == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    verifier = config["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and isinstance(
        verifier["architectures"], list
    )
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5  # the card's tree depth
    assert (config["draft_vocab_size"], config["target_hidden_size"]) == (8192, 576)
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # the 30-layer target's
    layer = config["transformer_layer_config"]
    assert (layer["vocab_size"], layer["torch_dtype"], layer["rope_theta"]) == (49152, "bfloat16", 100000.0)
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(weights) == SPECULATORS_KEYS and weights["fc.weight"].dtype == torch.bfloat16
    card, loaded = EagleDrafter.from_pretrained(card_shaped), EagleDrafter.from_pretrained(tmp_path / "out")
    assert loaded.config.target_layers == [2, 15, 27]
    for k, v in card.state_dict().items():
        assert torch.equal(v.float(), loaded.state_dict()[k].float()), k
