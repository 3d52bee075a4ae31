"""The drafter protocol: the page's example drafter runs as written (greedy output equals plain `generate()` at batch 1
and in a left-padded batch, it learns from the verified top-k, and only the engine runs the target); every drafter
declares what the engine and other drafters read of it (`TreeDrafter.capabilities`, read without running anything),
its getters change nothing, a `TreeSpec` stays immutable, and each drafter drafts through one path."""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import importlib
import pkgutil
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_model
from test_batch import DRAFTERS, ROWS, left_padded

import hf_speculative as hfs
from hf_speculative.engine.protocol import DrafterCapabilities, OneRowDrafter, TreeDrafter
from hf_speculative.engine.resolve import resolve_drafter
from hf_speculative.engine.rows import TargetRows
from hf_speculative.engine.trees import DraftingOptions
from hf_speculative.registry import drafter_entries

PAGE = Path(__file__).resolve().parents[1] / "docs" / "drafter_protocol.md"


def _example_drafter():
    code = re.search(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S).group(1)
    assert len(code.strip().splitlines()) <= 40
    namespace: dict = {}
    exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace["BigramDrafter"]


def test_the_example_drafter_is_exact_and_learns():
    model = hfs.enable(tiny_model("llama", seed=3))
    drafter = _example_drafter()()
    prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7] * 3])
    plain = model.generate(prompt, max_new_tokens=24, do_sample=False)
    out = model.generate(
        prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, plain)
    assert len(drafter.successor) >= len(set(prompt[0].tolist()))  # learned from the prefill's top-k at least
    again = model.generate(
        prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False, return_dict_in_generate=True
    )
    assert torch.equal(again.sequences, plain)
    assert again.speculative_stats.mean_accepted_length > 1.0  # the table drafts the continuation it saw verified


def test_the_example_drafter_in_a_batch():
    model = hfs.enable(tiny_model("llama", seed=3))
    ids, mask = left_padded(ROWS)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    out = model.generate(
        ids,
        attention_mask=mask,
        assistant_model=_example_drafter()(),
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(out, plain)


# --------------------------------------------------------------------------- one row through the batched protocol


def begin_one(drafter, prompt, prefill) -> None:
    """Start ``drafter`` on one row as the engine does at B = 1: `begin_batch` over ``prompt`` ``(1, L)`` and the
    target's prefill outputs."""
    drafter.begin_batch([prompt], TargetRows(prefill))


def propose_one(drafter, sequence, tree, options=None):
    """The draft of row 0 for its committed ``sequence`` ``(1, L)`` (`propose_batch`, as the engine asks at B = 1)."""
    return drafter.propose_batch([sequence], [0], tree, options or DraftingOptions())[0]


# --------------------------------------------------------------------------- what a drafter declares

#: every drafter the library registers, built for a target ``model`` (the registry's names)
MAKERS = {
    "causal-lm": DRAFTERS["draft_lm"],
    "prompt-lookup": DRAFTERS["prompt_lookup"],
    "magicdec": DRAFTERS["magicdec"],
    "hybrid": DRAFTERS["hybrid"],
    "medusa": DRAFTERS["medusa"],
    "parallel": DRAFTERS["parallel"],
    "eagle": DRAFTERS["eagle3"],
    "spire": DRAFTERS["spire"],
    "speculative-streaming": DRAFTERS["streaming"],
    "suffix": lambda model: hfs.SuffixDrafter(cost_curve=lambda n: 1.0),
    "token-recycling": DRAFTERS["token_recycling"],
}


def _attached(name: str):
    """The target and the attached `TreeDrafter` of drafter ``name``, with every module of the target and of the
    drafter's model counting its forwards (``calls``)."""
    model = hfs.enable(tiny_model("llama", seed=2))
    assistant = MAKERS[name](model)
    calls = []
    modules = [model] + ([assistant] if isinstance(assistant, torch.nn.Module) else [])
    for module in (m for root in modules for m in root.modules()):
        module.register_forward_pre_hook(lambda module, args: calls.append(type(module).__name__))
    drafter = resolve_drafter(model, assistant)
    drafter.attach_target(model)
    return model, drafter, calls


def test_every_registered_drafter_is_built_here():
    library = {entry.name for entry in drafter_entries() if entry.package.startswith("hf_speculative.")}
    assert library == set(MAKERS)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_every_drafter_declares_its_capabilities_without_running_anything(name):
    model, drafter, calls = _attached(name)
    declared = drafter.capabilities
    assert isinstance(declared, DrafterCapabilities) and declared == drafter.capabilities
    for field in dataclasses.fields(DrafterCapabilities):
        assert getattr(declared, field.name) == getattr(drafter, field.name), field.name
    assert declared.vocab_size in (None, model.config.vocab_size)
    assert callable(drafter.draft_cost) and callable(drafter.tree_for_batch)
    candidates = drafter.candidate_tree(8)
    assert candidates is None or isinstance(candidates, hfs.TreeSpec)
    assert not calls, f"reading what {name} declares ran {calls[:3]}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        declared.vocab_size = 1


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_tree_for_batch_changes_nothing(name):
    """A getter: asking twice for every batch size leaves the drafter as it was (same attributes, same objects)."""
    _, drafter, _ = _attached(name)
    before = dict(vars(drafter))
    contents = {k: copy.copy(v) for k, v in before.items() if isinstance(v, (dict, list))}
    trees = [drafter.tree_for_batch(b) for b in (1, 3, 3, 1)]
    assert trees[1] == trees[2] and trees[0] == trees[3]
    after = vars(drafter)
    assert after.keys() == before.keys()
    assert all(after[k] is before[k] for k in before)
    assert all(after[k] == v for k, v in contents.items())
    assert drafter.capabilities == drafter.capabilities


# --------------------------------------------------------------------------- an immutable TreeSpec


def test_a_tree_spec_refuses_mutation():
    spec = hfs.TreeSpec.cartesian([2, 2])
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.paths = ((0,),)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.levels = []
    with pytest.raises(dataclasses.FrozenInstanceError):
        del spec.paths
    assert spec == hfs.TreeSpec.cartesian([2, 2]) and hash(spec) == hash(hfs.TreeSpec.cartesian([2, 2]))


def test_token_recycling_keeps_its_tree_data_beside_the_spec():
    """Drafting along a spec writes nothing into it but the spec's own derived structure (its cached properties);
    the drafter's call tree is recognised by value: an equal spec passed by the call is refreshed like its own."""
    model = hfs.enable(tiny_model("llama", seed=2))
    drafter = hfs.TokenRecyclingDrafter(cost_curve=lambda n: 1.0, refresh_every=1)
    tree = hfs.TreeSpec.cartesian([2, 2])
    prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7] * 2])
    model.generate(prompt, assistant_model=drafter, speculative_tree=tree, max_new_tokens=8, do_sample=False)
    derived = {name for name, value in vars(hfs.TreeSpec).items() if isinstance(value, functools.cached_property)}
    assert set(vars(tree)) <= {"paths"} | derived

    own = drafter.tree_for_batch(1)
    equal = hfs.TreeSpec(own.paths)
    assert equal == own and equal is not own
    begin_one(drafter, prompt, SimpleNamespace(logits=torch.zeros(1, 1, 96)))
    for depth in range(1, drafter.tree_depth + 1):  # the hit rates move: the cost-aware tree changes
        for _ in range(64):
            drafter.hit_rates.observe_ranks(depth, 0)
    seq = prompt[:, -2:]
    propose_one(drafter, seq, equal)  # step 0 drafts along the call's tree; from step 1 on it is re-chosen
    assert drafter._template(equal, 1) == drafter.tree_for_batch(1) != own
    assert drafter._template(tree, 1) is tree  # another tree is used as it is
    drafter.end_batch()


# --------------------------------------------------------------------------- declared members only

PACKAGE = Path(hfs.__file__).resolve().parent
#: what the engine and other drafters may read of a drafter: the members `TreeDrafter` declares
PROTOCOL_NAMES = {name for cls in (TreeDrafter, OneRowDrafter) for name in vars(cls) if not name.startswith("_")} | {
    field.name for field in dataclasses.fields(DrafterCapabilities)
}


def _by_name_reads(source: str) -> list[str]:
    """``getattr(x, "member", ...)`` / ``hasattr(x, "member")`` calls whose member is a protocol name, on anything
    but a model's config (``model.config.vocab_size`` is the model's, not a drafter's)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            owner, name = (node.args + [None, None])[:2]
            config = isinstance(owner, ast.Attribute) and owner.attr == "config"
            if isinstance(name, ast.Constant) and name.value in PROTOCOL_NAMES and not config:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_engine_and_the_hybrid_read_drafters_through_declared_members():
    """No ``getattr`` / ``hasattr`` by name for a protocol member: what a drafter offers is declared on
    `TreeDrafter` (with a default), so it is read as an attribute."""
    files = sorted((PACKAGE / "engine").rglob("*.py")) + [PACKAGE / "drafters" / "hybrid.py"]
    found = [f"{path.relative_to(PACKAGE)}:{hit}" for path in files for hit in _by_name_reads(path.read_text())]
    assert not found, "protocol members read by name: " + "; ".join(found)
    assert {"vocab_size", "candidate_tree", "draft_cost", "pruning_layer", "tree_for_batch"} <= PROTOCOL_NAMES
    spelled = (
        'getattr(d, "vocab_size", None)\nhasattr(self.drafter, "candidate_tree")\ngetattr(d, "config", None)\n'
        'getattr(model.config, "vocab_size", None)\n'
    )
    assert [hit.split(":")[0] for hit in _by_name_reads(spelled)] == ["1", "2"]


def _drafter_classes() -> list[type]:
    """Every `TreeDrafter` class of the package (its drafters' modules imported, their training modules not)."""
    import hf_speculative.drafters as drafters

    for info in pkgutil.walk_packages(drafters.__path__, drafters.__name__ + "."):
        leaf = info.name.rpartition(".")[2]
        if leaf.startswith("modeling_") or leaf in ("chain", "draft_lm", "magicdec", "prompt_lookup", "hybrid"):
            importlib.import_module(info.name)
    found, todo = [], [TreeDrafter]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("hf_speculative.drafters."):
            found.append(cls)
    return found


ONE_ROW = {"begin": "begin_batch", "propose": "propose_batch", "advance": "advance_batch", "end": "end_batch"}


def test_every_drafter_drafts_through_one_path():
    """A drafter implements each step once: the one-row method (run per row by `OneRowDrafter`, B = 1 included) or
    the batched one, never both; a drafter that is no `OneRowDrafter` has no one-row methods at all."""
    classes = _drafter_classes()
    assert {"MedusaDrafter", "SpireTreeDrafter", "MagicDecDrafter", "TokenRecyclingDrafter", "HybridDrafter"} <= {
        cls.__name__ for cls in classes
    }
    both = []
    for cls in classes:
        own = [c for c in cls.__mro__ if c not in (OneRowDrafter, TreeDrafter) and issubclass(c, TreeDrafter)]
        defined = {name for c in own for name in vars(c)}
        for one, batched in ONE_ROW.items():
            if one in defined and (batched in defined or not issubclass(cls, OneRowDrafter)):
                both.append(f"{cls.__name__}.{one}")
    assert not both, "drafters with a second path: " + ", ".join(both)


def test_the_hybrid_prices_each_parts_declared_drafting_cost():
    """`TreeDrafter.draft_cost` as a number (Speculative Streaming) or one per depth (Medusa heads), at the depth of
    the part's own tree; a part that states none costs nothing."""

    class Costly(TreeDrafter):
        def __init__(self, cost, tree):
            self.cost, self.default_tree = cost, tree

        def draft_cost(self, curve):
            return self.cost

    chain = hfs.TreeSpec.chain(2)
    parts = [Costly(0.25, chain), Costly([0.1, 0.2, 0.3], chain), Costly(0.0, None), TreeDrafter()]
    hybrid = hfs.HybridDrafter(parts)
    hybrid.drafters, hybrid._curve = parts, SimpleNamespace(projection_cost=None)  # as attach_target leaves them
    hybrid._part_trees = hybrid._part_trees_for(1)
    assert hybrid._drafting_cost() == pytest.approx(0.25 + 0.2)
