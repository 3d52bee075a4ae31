"""``hf-speculative export``: Medusa heads re-imported the way vLLM's loader reads them (its key names, shapes and
config fields, re-implemented here from ``vllm/model_executor/models/medusa.py`` and
``vllm/transformers_utils/configs/medusa.py``), logits compared; plain statements for what has no counterpart."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_chat_model, tiny_model
from safetensors.torch import load_file
from test_interop_medusa import write_reference_heads

import hf_speculative as hfs
from hf_speculative.cli import main


def vllm_load_medusa(folder):
    """What vLLM's Medusa loader does with a folder: config keys renamed as its ``MedusaConfig.from_pretrained``
    renames them, one ``blocks[h].layers[l]`` Linear per (head, layer) with bias iff ``medusa_fc_bias``, one
    ``lm_heads[h]`` of ``(truncated_vocab_size, hidden_size)``; every parameter must be loaded. Returns a function
    hidden -> (..., num_heads, vocab) logits computed as vLLM computes them."""
    config = json.loads((folder / "config.json").read_text())
    for k in list(config):
        if "num" in k and "heads" in k:
            config["num_heads"] = config.pop(k)
        elif "num" in k and "layers" in k:
            config["num_hidden_layers"] = config.pop(k)
    assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
    H, V, K, L = config["hidden_size"], config["vocab_size"], config["num_heads"], config["num_hidden_layers"]
    truncated = config.get("truncated_vocab_size") or V
    bias = config.get("medusa_fc_bias", False)
    assert truncated == V  # no token_map in the export
    weights = {k.replace("medusa_heads.", ""): v for k, v in load_file(str(folder / "model.safetensors")).items()}
    params = {f"blocks.{h}.layers.{l}.weight": (H, H) for h in range(K) for l in range(L)}
    params |= {f"blocks.{h}.layers.{l}.bias": (H,) for h in range(K) for l in range(L) if bias}
    params |= {f"lm_heads.{h}.weight": (truncated, H) for h in range(K)}
    assert set(weights) == set(params)
    assert all(tuple(weights[k].shape) == shape for k, shape in params.items())

    def logits(hidden):
        out = []
        for h in range(K):
            x = hidden
            for l in range(L):
                x = x + F.silu(
                    F.linear(x, weights[f"blocks.{h}.layers.{l}.weight"], weights.get(f"blocks.{h}.layers.{l}.bias"))
                )
            out.append(F.linear(x, weights[f"lm_heads.{h}.weight"]))
        return torch.stack(out, dim=-2)

    return logits


def _trained_like(heads, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return heads


@pytest.mark.parametrize("share_lm_head,num_layers", [(True, 1), (False, 2)])
def test_medusa_to_vllm_round_trip(tmp_path, share_lm_head, num_layers):
    model, tokenizer = tiny_chat_model(4)
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    heads = _trained_like(
        hfs.MedusaHeadsModel.from_base_model(model, num_heads=3, num_layers=num_layers, share_lm_head=share_lm_head)
    )
    heads.save_pretrained(tmp_path / "heads")
    argv = ["export", str(tmp_path / "heads"), "--format", "vllm", "--output", str(tmp_path / "vllm")]
    assert main(argv + ["--model", str(tmp_path / "target")]) == 0
    vllm_logits = vllm_load_medusa(tmp_path / "vllm")
    hidden = torch.randn(2, 5, model.config.hidden_size)
    torch.testing.assert_close(vllm_logits(hidden), heads(hidden).logits, rtol=1e-4, atol=1e-4)


def test_fasterdecoding_heads_to_vllm(tmp_path):
    model = tiny_model()
    state = write_reference_heads(tmp_path / "fd", model, num_heads=2, num_layers=1, fmt="pt")
    assert main(["export", str(tmp_path / "fd"), "--format", "vllm", "--output", str(tmp_path / "vllm")]) == 0
    exported = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    assert torch.equal(exported["blocks.1.layers.0.weight"], state["1.0.linear.weight"])
    assert torch.equal(exported["lm_heads.0.weight"], state["0.1.weight"])
    hidden = torch.randn(3, model.config.hidden_size)
    heads = hfs.MedusaHeadsModel.from_pretrained(tmp_path / "fd")
    torch.testing.assert_close(vllm_load_medusa(tmp_path / "vllm")(hidden), heads(hidden).logits, rtol=1e-4, atol=1e-4)


def test_shared_heads_without_a_target_say_what_to_pass(tmp_path):
    from hf_speculative.drafters.medusa.serving import vllm_medusa_state_dict

    heads = hfs.MedusaHeadsModel.from_base_model(tiny_model(), num_heads=2)
    heads.save_pretrained(tmp_path / "heads")
    with pytest.raises(ValueError, match="base_model=target"):
        vllm_medusa_state_dict(hfs.MedusaHeadsModel.from_pretrained(tmp_path / "heads"))


def test_sglang_medusa_and_methods_without_counterpart_say_so(tmp_path, capsys):
    model = tiny_model()
    hfs.MedusaHeadsModel.from_base_model(model, num_heads=2, share_lm_head=False).save_pretrained(tmp_path / "heads")
    assert main(["export", str(tmp_path / "heads"), "--format", "sglang", "--output", str(tmp_path / "o")]) == 2
    assert "SGLang has no Medusa loader" in capsys.readouterr().err
    hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=2).save_pretrained(tmp_path / "pd")
    assert main(["export", str(tmp_path / "pd"), "--format", "vllm", "--output", str(tmp_path / "o")]) == 2
    assert "ParallelDrafter (ParallelSpec) has no serving-engine counterpart" in capsys.readouterr().err
    ss = hfs.LlamaForSpeculativeStreaming.from_base_model(model, num_streams=2, num_msa_layers=2)
    ss.save_pretrained(tmp_path / "ss")
    assert main(["export", str(tmp_path / "ss"), "--format", "sglang", "--output", str(tmp_path / "o")]) == 2
    assert "Speculative Streaming has no serving-engine counterpart" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_plain_draft_model_for_sglang_standalone(tmp_path):
    """SGLang's STANDALONE algorithm (and vLLM's draft_model) load a plain causal LM folder: exported as is."""
    from transformers import AutoModelForCausalLM

    draft = tiny_model(num_layers=2, seed=3)
    draft.save_pretrained(tmp_path / "draft")
    assert main(["export", str(tmp_path / "draft"), "--format", "sglang", "--output", str(tmp_path / "sg")]) == 0
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "sg")
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(again(ids).logits, draft(ids).logits, rtol=1e-4, atol=1e-4)
