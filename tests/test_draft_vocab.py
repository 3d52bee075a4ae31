"""FR-Spec draft vocabulary: the frequency helper, the projection, Medusa heads drafting on it losslessly."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import random_tree, tiny_model
from test_drafter_protocol import begin_one, propose_one
from transformers import AutoModel

import hf_speculative as hfs
from hf_speculative.drafters.draft_vocab import draft_vocab_logits, draft_vocab_weight, frequent_tokens
from hf_speculative.engine.trees import DraftingOptions


def test_frequent_tokens_by_hand():
    ids = torch.tensor([5, 5, 5, 2, 2, 7, -100, 1, 1, 1])  # counts: 1 -> 3, 5 -> 3, 2 -> 2, 7 -> 1 (-100 skipped)
    assert frequent_tokens(ids, 2).tolist() == [1, 5]  # the two most frequent, ascending ids
    assert frequent_tokens(ids, 3).tolist() == [1, 2, 5]
    assert frequent_tokens([[5, 5], [2], [7, 7, 7]], 2).tolist() == [5, 7]  # an iterable of sequences
    # ties go to the smaller id; too few distinct ids: the smallest unseen ids fill up
    assert frequent_tokens(torch.tensor([3, 3, 4, 4]), 1).tolist() == [3]
    assert frequent_tokens(torch.tensor([3, 3]), 3, vocab_size=5).tolist() == [0, 1, 3]
    with pytest.raises(ValueError, match="larger than the vocabulary"):
        frequent_tokens(torch.tensor([1]), 6, vocab_size=5)


def test_draft_vocab_logits_and_weight_cache():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(10, 4, generator=g)
    d2t = torch.tensor([1, 4, 7])
    states = torch.randn(3, 4, generator=g)
    out = draft_vocab_logits(states, weight, d2t)
    full = states @ weight.T
    assert out.shape == (3, 10)
    torch.testing.assert_close(out[:, d2t], full[:, d2t], rtol=1e-5, atol=1e-5)
    others = torch.ones(10, dtype=torch.bool)
    others[d2t] = False
    assert torch.isneginf(out[:, others]).all()
    # the sliced weight is computed once and refreshed when the weight changes in place
    assert draft_vocab_weight(weight, d2t) is draft_vocab_weight(weight, d2t)
    weight.mul_(2)
    torch.testing.assert_close(draft_vocab_weight(weight, d2t), weight[d2t])


def _heads(model, share_lm_head: bool):
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=3, share_lm_head=share_lm_head)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return heads


@pytest.mark.parametrize("share_lm_head", [True, False])
def test_medusa_greedy_output_does_not_change_with_a_draft_vocabulary(share_lm_head):
    model = hfs.enable(tiny_model("llama", seed=2))
    heads = _heads(model, share_lm_head)
    rng = random.Random(1)
    prompts = [torch.tensor([[rng.randrange(96) for _ in range(rng.randint(1, 6))]]) for _ in range(6)]
    # the draft vocabulary: the 24 most frequent tokens of the target's own greedy continuations
    refs = [model.generate(p, max_new_tokens=24, do_sample=False) for p in prompts]
    heads.set_draft_vocab(frequent_tokens([r[0] for r in refs], 24))
    assert heads.config.draft_vocab_size == 24
    d2t = set(heads.draft_to_target.tolist())
    for i, (prompt, ref) in enumerate(zip(prompts, refs)):
        tree = random_tree(rng, max_nodes=12, max_depth=3) if i % 2 else hfs.DynamicTree(10, 3, 3)
        out = model.generate(prompt, assistant_model=heads, speculative_tree=tree, max_new_tokens=24, do_sample=False)
        assert torch.equal(out, ref), (i, tree)
    # every drafted token is a draft-vocabulary token
    drafter = heads.get_tree_drafter(model)
    with torch.no_grad():
        begin_one(drafter, prompts[0], model(prompts[0], output_hidden_states=True))
    draft = propose_one(drafter, prompts[0], hfs.TreeSpec.cartesian([4, 2, 2]))
    assert set(draft.tokens[1:].tolist()) <= d2t
    # sampling drafts from the truncated distribution: q is zero outside the draft vocabulary
    draft = propose_one(drafter, prompts[0], hfs.TreeSpec.cartesian([3, 2]), DraftingOptions(do_sample=True))
    outside = torch.ones(96, dtype=torch.bool)
    outside[list(d2t)] = False
    assert draft.draft_probs[:, outside].abs().max() == 0 and set(draft.tokens[1:].tolist()) <= d2t


def test_draft_vocabulary_is_saved_with_the_weights(tmp_path):
    model = tiny_model("llama")
    heads = _heads(model, share_lm_head=True)
    heads.set_draft_vocab(torch.tensor([3, 9, 40, 41, 77]))
    heads.save_pretrained(tmp_path)
    loaded = hfs.MedusaHeadsModel.from_pretrained(tmp_path, base_model=model)
    assert loaded.config.draft_vocab_size == 5 and loaded.draft_to_target.tolist() == [3, 9, 40, 41, 77]
    assert AutoModel.from_pretrained(tmp_path).draft_to_target.tolist() == [3, 9, 40, 41, 77]
    loaded.set_draft_vocab(None)  # back to the full vocabulary
    assert loaded.draft_to_target is None and loaded.config.draft_vocab_size is None
    for bad in ([3, 3], [96], [-1]):
        with pytest.raises(ValueError, match="distinct token ids"):
            heads.set_draft_vocab(torch.tensor(bad))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        hfs.MedusaConfig(vocab_size=10, draft_vocab_size=11)


@pytest.mark.parametrize("method", ["medusa", "parallel-drafter"])
def test_train_commands_take_a_draft_vocabulary_size(method):
    from hf_speculative.cli import build_parser

    args = build_parser().parse_args(["train", method, "--data", "x.jsonl", "--out", "o", "--draft-vocab-size", "8192"])
    assert args.draft_vocab_size == 8192
    assert build_parser().parse_args(["train", method, "--data", "x.jsonl", "--out", "o"]).draft_vocab_size is None


def test_parallel_drafter_with_a_draft_vocabulary(tmp_path):
    model = hfs.enable(tiny_model("llama", seed=3))
    drafter = hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=2)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    prompt = torch.tensor([[4, 8, 15, 16]])
    ref = model.generate(prompt, max_new_tokens=24, do_sample=False)
    drafter.set_draft_vocab(frequent_tokens(ref[0], 16, vocab_size=96))
    assert drafter.draft_vocab_share == pytest.approx(16 / 96)
    for tree in (hfs.TreeSpec.cartesian([3, 2, 1]), hfs.DynamicTree(8, 3, 3)):
        assert torch.equal(
            model.generate(prompt, assistant_model=drafter, speculative_tree=tree, max_new_tokens=24, do_sample=False),
            ref,
        )
    tree_drafter = drafter.get_tree_drafter(model)
    tree_drafter.begin(prompt, None)
    logits = tree_drafter.draft_logits(prompt)  # (k + 1, V) rows of the draft vocabulary only
    # the sliced lm_head is computed once and reused by every drafting step (not re-sliced per step)
    sliced = draft_vocab_weight(drafter.base_lm_head.weight, drafter.draft_to_target)
    calls = []
    original = torch.Tensor.index_select
    try:
        torch.Tensor.index_select = lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
        tree_drafter.draft_logits(torch.cat([prompt, prompt], dim=1))
    finally:
        torch.Tensor.index_select = original
    assert not calls and draft_vocab_weight(drafter.base_lm_head.weight, drafter.draft_to_target) is sliced
    outside = torch.ones(96, dtype=torch.bool)
    outside[drafter.draft_to_target] = False
    assert torch.isneginf(logits[:, outside]).all() and torch.isfinite(logits[:, ~outside]).all()
    drafter.save_pretrained(tmp_path)
    loaded = hfs.ParallelDrafter.from_pretrained(tmp_path, base_model=model)
    assert torch.equal(loaded.draft_to_target, drafter.draft_to_target) and loaded.config.draft_vocab_size == 16
