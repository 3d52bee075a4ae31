"""A drafter meets a target of another dtype: it moves to the target's dtype and device when it is attached
(`hf_speculative.engine.placement.match_target`), with one warning line; the target never changes. Every drafter
class x drafter dtype {float32, bfloat16} x target dtype {float32, bfloat16} runs, and with a float32 target the
greedy tokens equal plain `generate()` whatever dtype the drafter came in."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import noisy_copy, tiny_model
from transformers import AutoModel

import hf_speculative as hfs
from hf_speculative.engine.placement import match_target

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PROMPT = torch.tensor([[5, 17, 33, 2, 9, 41, 7, 5, 17, 33, 2]])
NEW = 10

#: drafters that are models of their own (they come in a dtype)
MODEL_DRAFTERS = {
    "medusa": lambda target: hfs.MedusaHeadsModel.from_base_model(target, num_heads=3),
    "parallel": lambda target: hfs.ParallelDrafter.from_base_model(target, num_mask_tokens=2),
    "streaming": lambda target: hfs.LlamaForSpeculativeStreaming.from_base_model(
        target, num_streams=2, num_msa_layers=1
    ),
    "spire": lambda target: hfs.SpireDrafter.from_base_model(target, num_layers=2, sliding_window=8),
    "eagle": lambda target: hfs.EagleDrafter.from_base_model(target, variant="eagle1"),
    "eagle3": lambda target: hfs.EagleDrafter.from_base_model(target, variant="eagle3"),
    "draft_lm": lambda target: noisy_copy(target, 0.3),
}
#: drafters without weights of their own (model-free, or the target itself): only the target's dtype varies
OTHER_DRAFTERS = {
    "prompt_lookup": lambda target: hfs.PromptLookupDrafter(min_ngram_size=1),
    "magicdec": lambda target: hfs.MagicDecDrafter(target, sliding_window=8),
    "hybrid": lambda target: hfs.HybridDrafter(
        [
            hfs.PromptLookupDrafter(min_ngram_size=1),
            hfs.MedusaHeadsModel.from_base_model(target, num_heads=3).to(torch.bfloat16),
        ],
        cost_curve=lambda n: 1.0,
    ),
}
CASES = [(n, d, t) for n in MODEL_DRAFTERS for d in DTYPES for t in DTYPES] + [
    (n, None, t) for n in OTHER_DRAFTERS for t in DTYPES
]


def _own_dtypes(module: torch.nn.Module) -> set[torch.dtype]:
    return {p.dtype for p in module.parameters() if p.is_floating_point()}


@pytest.mark.parametrize("name,drafter_dtype,target_dtype", CASES)
def test_every_drafter_meets_a_target_of_any_dtype(name, drafter_dtype, target_dtype, caplog):
    target = hfs.enable(tiny_model("llama", seed=2))
    if drafter_dtype is None:
        target.to(DTYPES[target_dtype])
        drafter = OTHER_DRAFTERS[name](target)
    else:
        drafter = MODEL_DRAFTERS[name](target).to(DTYPES[drafter_dtype])  # the drafter as saved / loaded
        target.to(DTYPES[target_dtype])
    target_before = {k: (v.dtype, v.data_ptr()) for k, v in target.state_dict().items()}
    plain = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    with caplog.at_level(logging.WARNING, logger="hf_speculative"):
        out = target.generate(PROMPT, assistant_model=drafter, max_new_tokens=NEW, do_sample=False)
    assert out.shape == (1, PROMPT.shape[1] + NEW)
    if target_dtype == "fp32":
        assert torch.equal(out, plain), (name, drafter_dtype)
    if drafter_dtype is not None:
        assert _own_dtypes(drafter) == {DTYPES[target_dtype]}  # the rule: the drafter now runs in the target's dtype
        moved = [r for r in caplog.records if "moved from" in r.getMessage()]
        assert len(moved) == (drafter_dtype != target_dtype), [r.getMessage() for r in moved]
    assert {
        k: (v.dtype, v.data_ptr()) for k, v in target.state_dict().items()
    } == target_before  # the target is untouched


@pytest.mark.parametrize("name", ["medusa", "parallel", "spire", "eagle", "eagle3", "streaming"])
def test_a_drafter_saved_in_bf16_loads_onto_an_fp32_target(name, tmp_path):
    """A drafter saved in bfloat16 and loaded as its card says (``AutoModel.from_pretrained(folder)`` gives the saved
    dtype; ``from_pretrained(folder, base_model=target)`` attaches at once) runs on a float32 target, exactly."""
    target = hfs.enable(tiny_model("llama", seed=2))
    MODEL_DRAFTERS[name](target).to(torch.bfloat16).save_pretrained(tmp_path)
    plain = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    cls = type(MODEL_DRAFTERS[name](target))
    attached = cls.from_pretrained(tmp_path, base_model=target)
    assert _own_dtypes(attached) == {torch.float32}
    if name == "streaming":  # drafts for itself
        out = attached.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    else:
        loaded = AutoModel.from_pretrained(tmp_path)
        assert isinstance(loaded, cls) and _own_dtypes(loaded) == {torch.bfloat16}
        out = target.generate(PROMPT, assistant_model=loaded, max_new_tokens=NEW, do_sample=False)
        assert torch.equal(out, plain)
        out = target.generate(PROMPT, assistant_model=attached, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(out, plain)


def test_match_target_moves_only_what_differs(caplog):
    target = tiny_model("llama", seed=2)
    same = tiny_model("llama", seed=3)
    with caplog.at_level(logging.WARNING, logger="hf_speculative"):
        assert match_target(same, target) is same
        assert match_target(target, target) is target
    assert not caplog.records
    other = tiny_model("llama", seed=3).to(torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="hf_speculative"):
        match_target(other, target)
    assert _own_dtypes(other) == {torch.float32}
    assert len(caplog.records) == 1 and "bfloat16 to float32" in caplog.records[0].getMessage()
