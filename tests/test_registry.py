"""A drafter registers where it lives (`hf_speculative.registry`): this module registers a toy drafter of its own,
and without any change to a file of the package it decodes in ``generate()``, loads through ``AutoModel``, is a
public name of ``hf_speculative`` and lists its training command under ``hf-speculative train``."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel

import hf_speculative as hfs
from hf_speculative import registry
from hf_speculative.auto import register_auto_classes
from hf_speculative.cli import build_parser


class ToyRepeatConfig(PretrainedConfig):
    """The toy drafter's config: how many times it proposes the last token again."""

    model_type = "hfs_toy_repeat"

    def __init__(self, depth: int = 3, **kwargs):
        self.depth = depth
        super().__init__(**kwargs)


class ToyRepeatTreeDrafter(hfs.OneRowDrafter):
    def __init__(self, depth: int):
        self.default_tree = hfs.TreeSpec.chain(depth)
        self.proposals = 0

    def propose(self, sequence, tree, options):
        self.proposals += 1
        root = sequence[0, -1]
        return hfs.DraftTree(tokens=root.repeat(tree.depth + 1), parents=tuple(range(-1, tree.depth)))


class ToyRepeatDrafter(PreTrainedModel):
    """A drafter model with no weights worth the name: it proposes the last token ``depth`` times."""

    config_class = ToyRepeatConfig

    def __init__(self, config: ToyRepeatConfig):
        super().__init__(config)
        self.scale = torch.nn.Parameter(torch.ones(1))
        self.post_init()

    def get_tree_drafter(self, target):
        return ToyRepeatTreeDrafter(self.config.depth)


# the toy's ``train`` command: a module with add_parser / run, as every training command is
def add_parser(subparsers) -> None:
    p = subparsers.add_parser("toy-repeat", help="train the toy drafter (nothing to learn)")
    p.set_defaults(func=run)


def run(args) -> int:
    return 0


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))  # the registration ends with the test
    entry = registry.register_drafter(
        "toy-repeat",
        __name__,
        config="ToyRepeatConfig",
        model="ToyRepeatDrafter",
        public={"ToyRepeatDrafter": __name__},
        train_commands=(__name__,),
    )
    register_auto_classes()
    return entry


def test_a_toy_drafter_registered_in_its_own_module_works_everywhere(toy_registered, tmp_path):
    # generate(): exactly plain greedy decoding
    model = hfs.enable(tiny_model("llama", seed=3))
    prompt = torch.tensor([[4, 9, 9, 9, 2, 7]])
    plain = model.generate(prompt, max_new_tokens=20, do_sample=False)
    drafter = ToyRepeatDrafter(ToyRepeatConfig(depth=2))
    out = model.generate(
        prompt, assistant_model=drafter, max_new_tokens=20, do_sample=False, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, plain)
    assert max(out.speculative_stats.tree_sizes) > 1  # the engine verified the toy's chains
    # AutoConfig / AutoModel: a saved folder loads as the toy
    drafter.save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), ToyRepeatConfig)
    loaded = AutoModel.from_pretrained(tmp_path)
    assert type(loaded) is ToyRepeatDrafter and loaded.config.depth == 2
    # a public name of the package
    assert hfs.ToyRepeatDrafter is ToyRepeatDrafter and "ToyRepeatDrafter" in dir(hfs)
    # the CLI's train list
    parser = build_parser()
    args = parser.parse_args(["train", "toy-repeat"])
    assert args.func is run


def test_the_engine_drafts_through_a_registered_assistant_adapter(monkeypatch):
    """``generate(assistant_model=X)`` for an X that is no drafter asks the registered adapters."""
    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))

    class Hint:  # not a model, not a TreeDrafter
        depth = 2

    registry.register_drafter("toy-hint", __name__, assistant=f"{__name__}.hint_adapter")
    model = hfs.enable(tiny_model("llama", seed=4))
    prompt = torch.tensor([[3, 3, 3, 8]])
    plain = model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(model.generate(prompt, assistant_model=Hint(), max_new_tokens=12, do_sample=False), plain)
    with pytest.raises(TypeError, match="assistant_model must be"):
        model.generate(prompt, assistant_model=object(), max_new_tokens=4, do_sample=False)


def hint_adapter(target, assistant_model):
    return ToyRepeatTreeDrafter(assistant_model.depth) if hasattr(assistant_model, "depth") else None


def test_public_names_cannot_be_claimed_twice(monkeypatch):
    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))
    with pytest.raises(ValueError, match="MedusaHeadsModel"):
        registry.register_drafter("medusa-again", __name__, public={"MedusaHeadsModel": __name__})
