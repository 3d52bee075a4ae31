"""The dynamic tree (EAGLE-2, Sec. 4): the builder on a hand example, exactness in the loop, clear errors."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import tiny_model

import hf_speculative as hfs
from hf_speculative.engine.acceptance import accept_sampling

# Per-depth draft distributions over a 5-token vocabulary (row d drafts depth d + 1, whatever the parent).
PROBS = torch.tensor(
    [
        [0.5, 0.3, 0.1, 0.06, 0.04],  # depth 1: top-2 = token 0 (.5), token 1 (.3)
        [0.1, 0.6, 0.2, 0.05, 0.05],  # depth 2: top-2 = token 1 (.6), token 2 (.2)
        [0.05, 0.05, 0.15, 0.7, 0.05],  # depth 3: top-2 = token 3 (.7), token 2 (.15)
    ]
)
ROOT = 9


def _build(total_tokens, depth, top_k):
    tree = hfs.DynamicTree(total_tokens=total_tokens, depth=depth, top_k=top_k).build(PROBS.log(), ROOT)
    return tree.tokens.tolist(), tree.parents


def test_builder_on_a_hand_example():
    # top_k = 2. Path confidences of the expanded candidates (A = token 0, B = token 1 at depth 1):
    #   depth 1: A .5, B .3
    #   depth 2 (both expanded): A1 .5*.6 = .3, A2 .5*.2 = .1, B1 .3*.6 = .18, B2 .3*.2 = .06
    #   depth 3 expands the 2 best of depth 2, A1 and B1: A13 .3*.7 = .21, A12 .3*.15 = .045,
    #                                                     B13 .18*.7 = .126, B12 .18*.15 = .027
    # Rerank to 5 nodes: A .5, B .3, A1 .3 (tie with B: the earlier node first), A13 .21, B1 .18;
    # output depth by depth: A, B, A1, B1, A13.
    assert _build(5, 3, 2) == ([ROOT, 0, 1, 1, 1, 3], (-1, 0, 0, 1, 2, 3))
    # 7 nodes add B13 .126 and A2 .1: A, B, A1, A2, B1, A13 (child of node 3), B13 (child of node 5)
    assert _build(7, 3, 2) == ([ROOT, 0, 1, 1, 2, 1, 3, 3], (-1, 0, 0, 1, 1, 2, 3, 5))
    # depth limit 2: all six candidates of depths 1-2 fit in a budget of 10
    assert _build(10, 2, 2) == ([ROOT, 0, 1, 1, 2, 1, 2], (-1, 0, 0, 1, 1, 2, 2))
    # top_k = 1: one chain of argmaxes, shorter than the budget
    assert _build(5, 3, 1) == ([ROOT, 0, 1, 3], (-1, 0, 1, 2))
    # more depths asked than rows given: the rows bound the depth
    assert _build(3, 8, 1) == ([ROOT, 0, 1, 3], (-1, 0, 1, 2))


def test_spec_object():
    spec = hfs.DynamicTree(total_tokens=12, depth=3, top_k=4)
    assert not isinstance(spec, hfs.TreeSpec) and spec.depth == 3 and spec.num_nodes == 12
    assert spec == hfs.DynamicTree(12, 3, 4) and spec != hfs.DynamicTree(12, 3, 5) and spec != hfs.TreeSpec.chain(3)
    assert hash(spec) == hash(hfs.DynamicTree(12, 3, 4))
    assert repr(spec) == "DynamicTree(total_tokens=12, depth=3, top_k=4)"
    for name in ("parents", "children", "ancestors", "depths", "ranks", "to_list"):  # no shape of its own
        assert not hasattr(spec, name)
    with pytest.raises(ValueError, match=">= 1"):
        hfs.DynamicTree(total_tokens=0)


def _perturb(module, scale, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return module


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_equality_with_medusa_heads_and_a_dynamic_tree(arch):
    model = hfs.enable(tiny_model(arch, seed=2))
    heads = _perturb(hfs.MedusaHeadsModel.from_base_model(model, num_heads=3, share_lm_head=arch == "llama"), 0.05)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    for case in range(8):
        prompt = torch.tensor([[rng.randrange(vocab) for _ in range(rng.randint(1, 8))]])
        spec = hfs.DynamicTree(total_tokens=rng.randint(1, 12), depth=rng.randint(1, 3), top_k=rng.randint(1, 4))
        new = rng.randint(1, 30)
        ref = model.generate(prompt, max_new_tokens=new, do_sample=False)
        out = model.generate(
            prompt,
            assistant_model=heads,
            speculative_tree=spec,
            max_new_tokens=new,
            do_sample=False,
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, ref), (arch, case, spec)
        assert max(out.speculative_stats.tree_sizes, default=1) <= spec.total_tokens + 1


def test_greedy_equality_with_parallel_drafter_and_streams():
    model = hfs.enable(tiny_model("llama", seed=3))
    drafter = _perturb(hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=2), 0.05)
    prompt = torch.tensor([[4, 8, 15, 16]])
    ref = model.generate(prompt, max_new_tokens=24, do_sample=False)
    spec = hfs.DynamicTree(total_tokens=8, depth=3, top_k=3)
    assert torch.equal(
        model.generate(prompt, assistant_model=drafter, speculative_tree=spec, max_new_tokens=24, do_sample=False), ref
    )
    # Speculative Streaming (lossless) drafting for itself; random non-zero streams (their init is zero)
    ss = hfs.LlamaForSpeculativeStreaming.from_base_model(tiny_model("llama", seed=3), num_streams=3, num_msa_layers=2)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ss.streams.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    assert torch.equal(ss.generate(prompt, speculative_tree=spec, max_new_tokens=24, do_sample=False), ref)


def test_unsupported_drafters_and_too_deep_trees_are_refused():
    model = hfs.enable(tiny_model("llama", seed=2))
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=2)
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="deep"):
        model.generate(prompt, assistant_model=heads, speculative_tree=hfs.DynamicTree(8, depth=3), max_new_tokens=4)
    with pytest.raises(TypeError, match="no fixed shape"):  # a two-model drafter fills static trees only
        model.generate(
            prompt,
            assistant_model=tiny_model("llama", seed=4),
            speculative_tree=hfs.DynamicTree(4, 2),
            max_new_tokens=4,
        )


def test_sampling_with_a_dynamic_tree_is_exact():
    """Model-free emulation of the loop (as in test_sampling): depth-d draft distributions that depend on the
    committed context only, a dynamic tree from them, tree rejection sampling against a synthetic target.
    The candidates are fixed choices (one-hot proposals), so the committed tokens follow the target exactly."""
    from test_sampling import ALPHA, LENGTH, _exact_synthetic, _logits, chi_square_pvalue

    torch.manual_seed(0)
    spec = hfs.DynamicTree(total_tokens=5, depth=2, top_k=2)
    n, counts = 4000, {}
    for _ in range(n):
        seq: tuple = ()
        while len(seq) < LENGTH:
            rows = torch.stack([torch.log_softmax(_logits(seq, 10 + d), -1) for d in range(2)])
            draft = spec.build(rows, 0)
            assert draft.sampling == "deterministic"

            def target_logits(node, seq=seq, draft=draft):
                return _logits(seq + tuple(draft.tokens[draft.path_to(node)[1:]].tolist()), 0)

            seq = seq + tuple(accept_sampling(draft, target_logits).tokens)
        counts[seq[:LENGTH]] = counts.get(seq[:LENGTH], 0) + 1
    assert chi_square_pvalue(counts, _exact_synthetic(), n) > ALPHA
