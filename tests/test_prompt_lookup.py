"""The model-free n-gram (prompt lookup) tree drafter: matching, trie budget, greedy equality, exact sampling."""

import random

import numpy as np
import pytest
import torch
from conftest import tiny_model
from test_sampling import ALPHA, NEW, SETTINGS, _batched_sample_counts, _exact_generate, chi_square_pvalue

import hf_speculative as hfs
from hf_speculative.drafters.prompt_lookup import build_trie, ngram_continuations


def test_ngram_continuations_longest_first_most_recent_first_no_repeats():
    seq = np.array([5, 1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3])
    # "1 2 3" occurs at 1 (then 9 ...) and 5 (then 7 ...): the most recent first; the 2-gram and 1-gram
    # matches of the same occurrences are not repeated
    assert ngram_continuations(seq, 3, 1, 4, 8) == [[7, 8, 1, 2], [9, 1, 2, 3]]
    assert ngram_continuations(seq, 3, 1, 4, 1) == [[7, 8, 1, 2]]
    assert ngram_continuations(seq, 3, 1, 2, 8) == [[7, 8], [9, 1]]
    # only shorter n-grams match: "0 3" never occurred before, "3" did (followed by 9 and 7)
    seq2 = np.array([3, 9, 4, 3, 7, 0, 3])
    assert ngram_continuations(seq2, 2, 1, 2, 8) == [[7, 0], [9, 4]]
    assert ngram_continuations(seq2, 2, 2, 2, 8) == []
    # the final n-gram itself never matches; a one-token sequence has nothing to look up
    assert ngram_continuations(np.array([4]), 3, 1, 4, 8) == []
    assert ngram_continuations(np.array([4, 4]), 3, 1, 4, 8) == [[4]]


def test_build_trie_shares_prefixes_and_respects_the_budget():
    tokens, parents = build_trie(3, [[7, 8, 1], [7, 9], [2]], num_nodes=10)
    assert tokens == [3, 7, 8, 1, 9, 2]
    assert parents == [-1, 0, 1, 2, 1, 0]
    tokens, parents = build_trie(3, [[7, 8, 1], [7, 9], [2]], num_nodes=4)
    assert tokens == [3, 7, 8, 1, 9] and parents == [-1, 0, 1, 2, 1]
    assert build_trie(3, [], num_nodes=4) == ([3], [-1])


def test_propose_respects_the_call_tree_budget():
    drafter = hfs.PromptLookupDrafter(max_ngram_size=2)
    seq = torch.tensor([[1, 2, 3, 4, 5, 6, 1, 2, 3, 9, 9, 1, 2]])
    draft = drafter.propose(seq, hfs.TreeSpec.cartesian([2, 1]), hfs.DraftingOptions())
    # "1 2" occurred twice, followed by "3 9" and "3 4": one shared first level, two leaves
    assert draft.tokens.tolist() == [2, 3, 9, 4]
    assert draft.parents == (-1, 0, 1, 1)
    assert draft.depths.tolist() == [0, 1, 2, 2]
    small = drafter.propose(seq, hfs.TreeSpec.chain(1), hfs.DraftingOptions())
    assert small.tokens.tolist() == [2, 3]


def test_bad_arguments():
    with pytest.raises(ValueError, match="min_ngram_size"):
        hfs.PromptLookupDrafter(max_ngram_size=1, min_ngram_size=2)
    with pytest.raises(ValueError, match="max_candidates"):
        hfs.PromptLookupDrafter(max_candidates=0)


def _repetitive_prompt(rng: random.Random, vocab: int = 96) -> torch.Tensor:
    phrase = [rng.randrange(vocab) for _ in range(rng.randint(2, 6))]
    ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 4))]
    for _ in range(rng.randint(1, 3)):
        ids += phrase + [rng.randrange(vocab) for _ in range(rng.randint(0, 3))]
    return torch.tensor([ids])


def test_greedy_equals_plain_generate(arch):
    target = hfs.enable(tiny_model(arch, seed=11))
    rng = random.Random(5)
    trees = [None, hfs.TreeSpec.chain(3), hfs.TreeSpec.cartesian([3, 1, 1]), hfs.TreeSpec.cartesian([2, 2, 2, 1])]
    accepted = []
    for case in range(12):
        prompt = _repetitive_prompt(rng)
        drafter = hfs.PromptLookupDrafter(
            max_ngram_size=rng.randint(1, 3), min_ngram_size=1, max_candidates=rng.randint(1, 6)
        )
        kwargs = {"do_sample": False, "max_new_tokens": rng.randint(1, 40)}
        if case % 4 == 3:  # an EOS the model really emits: plain generation stops there, and so must we
            free = target.generate(prompt, **kwargs)[0, prompt.shape[1] :].tolist()
            if len(free) > 2:
                kwargs["eos_token_id"] = free[len(free) // 2]
        expected = target.generate(prompt, **kwargs)
        out = target.generate(
            prompt,
            assistant_model=drafter,
            speculative_tree=trees[case % len(trees)],
            return_dict_in_generate=True,
            **kwargs,
        )
        assert out.sequences.tolist() == expected.tolist(), f"case {case}"
        accepted += out.speculative_stats.accepted_lengths
    # tiny random models repeat themselves, so lookups really hit and draft tokens are accepted
    assert max(accepted) > 1


def test_sampling_matches_target_distribution():
    target = hfs.enable(tiny_model("llama", seed=21, vocab_size=8, num_layers=2))
    kw = SETTINGS["temperature-1"]
    prompt = torch.tensor([[1, 5, 2, 1, 5, 2, 1, 5]])  # repeated n-grams: the drafter always has candidates
    exact = _exact_generate(target, prompt, **kw)
    drafter = hfs.PromptLookupDrafter(max_ngram_size=2)
    spec = hfs.TreeSpec.cartesian([3, 1, 1])
    assert len(drafter.propose(prompt, spec, hfs.DraftingOptions(do_sample=True))) > 2
    torch.manual_seed(2024)
    n = 3000
    counts = _batched_sample_counts(
        lambda ids, mask: target.generate(
            ids, attention_mask=mask, assistant_model=drafter, speculative_tree=spec, do_sample=True, max_new_tokens=NEW
        ),
        prompt,
        n,
    )
    assert chi_square_pvalue(counts, exact, n) > ALPHA
