"""``hfs.enable`` keeps Python's contracts: an enabled model pickles, unpickles and deep-copies as an enabled model that
decodes the same tokens; ``type(model)`` says what it is while ``save_pretrained`` writes the original architecture;
``hfs.disable`` restores the original class."""

from __future__ import annotations

import copy
import json
import pickle

import torch
from conftest import tiny_model

import hf_speculative as hfs
from hf_speculative.engine.policy import EngineLinearForward, speed_policy

PROMPT = torch.tensor([[3, 9, 4, 7, 3, 9, 4, 7, 3]])


def _speculative(model):
    return model.generate(PROMPT, assistant_model=hfs.PromptLookupDrafter(), do_sample=False, max_new_tokens=10)


def test_an_enabled_model_pickles_and_decodes_the_same_tokens():
    # pickled before any forward that asks for hidden states: from then on transformers 5 holds local hook functions
    # in the modules that no model pickles with, enabled or not (deep copies are fine, below)
    model = hfs.enable(tiny_model("llama", seed=2))
    restored = pickle.loads(pickle.dumps(model))
    assert hfs.is_enabled(restored) and type(restored) is type(model)
    before = _speculative(model)
    assert torch.equal(_speculative(restored), before)
    assert torch.equal(restored.generate(PROMPT, do_sample=False, max_new_tokens=10), before)  # plain, same tokens
    assert any(isinstance(m.__dict__.get("forward"), EngineLinearForward) for m in restored.modules())
    again = pickle.loads(pickle.dumps(hfs.enable(tiny_model("llama", seed=2))))
    assert torch.equal(_speculative(again), before)


def test_an_enabled_model_deep_copies_with_its_own_policy():
    model = hfs.enable(tiny_model("llama", seed=2))
    before = _speculative(model)
    twin = copy.deepcopy(model)
    assert hfs.is_enabled(twin) and speed_policy(twin) is not speed_policy(model)
    forwards = [m.forward for m in twin.modules() if isinstance(m.__dict__.get("forward"), EngineLinearForward)]
    assert all(f.policy is speed_policy(twin) and f.module.forward is f for f in forwards)
    assert torch.equal(_speculative(twin), before)


def test_type_names_the_enabled_class_and_save_pretrained_the_original(tmp_path):
    model = tiny_model("llama", seed=2)
    original = type(model)
    hfs.enable(model)
    assert type(model).__name__ == "SpeculativeLlamaForCausalLM" and isinstance(model, original)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_disable_restores_the_original_class():
    model = tiny_model("llama", seed=2)
    original = type(model)
    plain = model.generate(PROMPT, do_sample=False, max_new_tokens=10)
    hfs.enable(model)
    _speculative(model)
    assert hfs.disable(model) is model
    assert type(model) is original and not hfs.is_enabled(model)
    assert "_hfs_policy" not in model.__dict__
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert torch.equal(model.generate(PROMPT, do_sample=False, max_new_tokens=10), plain)
    assert hfs.disable(model) is model  # a model never enabled (or disabled twice) is left as it is
