"""FasterDecoding/Medusa heads folders (the reference layout) load as `MedusaHeadsModel`: logits checked by hand
against the reference maths (x + SiLU(W1 x + b1), then each head's own W2), exact greedy generation."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

import hf_speculative as hfs


def write_reference_heads(folder, model, num_heads=3, num_layers=1, fmt="safetensors", shared_blocks=False, seed=0):
    """A heads folder as FasterDecoding/Medusa saves it; returns its state dict (their key names)."""
    g = torch.Generator().manual_seed(seed)
    H, V = model.config.hidden_size, model.config.vocab_size
    state = {}
    for h in range(num_heads):
        block = None
        for l in range(num_layers):
            if block is None or not shared_blocks:
                block = (0.2 * torch.randn(H, H, generator=g), 0.2 * torch.randn(H, generator=g))
            state[f"{h}.{l}.linear.weight"], state[f"{h}.{l}.linear.bias"] = block[0].clone(), block[1].clone()
        state[f"{h}.{num_layers}.weight"] = model.lm_head.weight.detach().clone() + 0.3 * torch.randn(V, H, generator=g)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "medusa_num_heads": num_heads,
        "medusa_num_layers": num_layers,
        "base_model_name_or_path": "tiny/llama",
        "transformers_version": "4.34.0",
    }
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(folder / "medusa_lm_head.safetensors"))
    else:
        torch.save(state, folder / "medusa_lm_head.pt")
    return state


def reference_head_logits(state, hidden, num_heads, num_layers):
    """The reference maths, written out: for each head, L residual blocks then its own projection."""
    out = []
    for h in range(num_heads):
        x = hidden
        for l in range(num_layers):
            x = x + F.silu(x @ state[f"{h}.{l}.linear.weight"].T + state[f"{h}.{l}.linear.bias"])
        out.append(x @ state[f"{h}.{num_layers}.weight"].T)
    return torch.stack(out, dim=-2)


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
@pytest.mark.parametrize("num_layers,shared_blocks", [(1, False), (2, True), (2, False)])
def test_reference_layout_logits_by_hand(tmp_path, fmt, num_layers, shared_blocks):
    model = tiny_model()
    state = write_reference_heads(
        tmp_path / "heads", model, num_layers=num_layers, fmt=fmt, shared_blocks=shared_blocks
    )
    heads = hfs.MedusaHeadsModel.from_pretrained(tmp_path / "heads")
    assert heads.config.share_lm_head is False and heads.config.num_heads == 3 and heads.config.num_layers == num_layers
    assert heads.config.base_model_name_or_path == "tiny/llama" and heads.config.vocab_size == model.config.vocab_size
    hidden = torch.randn(2, 5, model.config.hidden_size)
    torch.testing.assert_close(
        heads(hidden).logits, reference_head_logits(state, hidden, 3, num_layers), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_reference_layout_generates_exactly(tmp_path, fmt):
    model = hfs.enable(tiny_model())
    write_reference_heads(tmp_path / "heads", model, num_heads=3, fmt=fmt)
    heads = hfs.MedusaHeadsModel.from_pretrained(tmp_path / "heads", base_model=model)
    ids = torch.tensor([[5, 17, 3, 42, 8]])
    plain = model.generate(ids, max_new_tokens=24, do_sample=False)
    out = model.generate(ids, assistant_model=heads, max_new_tokens=24, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    assert len(out.speculative_stats.accepted_lengths) <= 24


def test_reloaded_in_our_format_keeps_the_logits(tmp_path):
    model = tiny_model()
    write_reference_heads(tmp_path / "heads", model, num_layers=1)
    heads = hfs.MedusaHeadsModel.from_pretrained(tmp_path / "heads")
    heads.save_pretrained(tmp_path / "ours")
    again = hfs.MedusaHeadsModel.from_pretrained(tmp_path / "ours")
    hidden = torch.randn(4, model.config.hidden_size)
    torch.testing.assert_close(again(hidden).logits, heads(hidden).logits, rtol=0, atol=0)


@pytest.mark.parametrize("safe", [True, False])
def test_medusa2_full_model_folder(tmp_path, safe):
    """The reference's Medusa-2 checkpoint: one causal LM folder (the changed base) whose weights also hold
    ``medusa_head.{h}.{l}.linear.*`` / ``medusa_head.{h}.{L}.weight``; the heads load, the folder is their target."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    model = tiny_model(seed=4)
    model.config.medusa_num_heads, model.config.medusa_num_layers = 2, 1
    model.save_pretrained(tmp_path / "m2")
    heads_state = write_reference_heads(tmp_path / "heads", model, num_heads=2)
    weights = load_file(str(tmp_path / "m2" / "model.safetensors"))
    weights.update({f"medusa_head.{k}": v for k, v in heads_state.items()})
    (tmp_path / "m2" / "model.safetensors").unlink()
    if safe:
        save_file(weights, str(tmp_path / "m2" / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(weights, tmp_path / "m2" / "pytorch_model.bin")
    heads = hfs.MedusaHeadsModel.from_pretrained(tmp_path / "m2")
    assert heads.config.base_model_name_or_path == str(tmp_path / "m2") and not heads.config.share_lm_head
    hidden = torch.randn(3, model.config.hidden_size)
    torch.testing.assert_close(
        heads(hidden).logits, reference_head_logits(heads_state, hidden, 2, 1), rtol=1e-4, atol=1e-4
    )
    target = hfs.enable(AutoModelForCausalLM.from_pretrained(tmp_path / "m2").eval())
    ids = torch.tensor([[4, 9, 16, 25]])
    assert torch.equal(
        target.generate(ids, assistant_model=heads, max_new_tokens=16, do_sample=False),
        target.generate(ids, max_new_tokens=16, do_sample=False),
    )


def test_folder_without_heads_gets_a_clear_error(tmp_path):
    model = tiny_model()
    model.config.medusa_num_heads, model.config.medusa_num_layers = 3, 1  # names heads, holds none
    model.save_pretrained(tmp_path / "m2")
    with pytest.raises(ValueError, match="holds no Medusa heads.*medusa_lm_head.safetensors"):
        hfs.MedusaHeadsModel.from_pretrained(tmp_path / "m2")


def test_mismatched_weights_name_the_keys(tmp_path):
    model = tiny_model()
    write_reference_heads(tmp_path / "heads", model, num_layers=1)
    config = json.loads((tmp_path / "heads" / "config.json").read_text())
    config["medusa_num_heads"] = 4
    (tmp_path / "heads" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing.*heads.3"):
        hfs.MedusaHeadsModel.from_pretrained(tmp_path / "heads")
