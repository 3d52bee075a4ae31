"""Greedy tree speculative decoding equals plain greedy generate, token for token (float32).

Per architecture, 60 random cases vary the prompt length, the tree (random shapes, chains, Cartesian),
max_new_tokens / max_length, and the drafter: an independent random model (low acceptance), a noisy
copy of the target (long but imperfect accepted paths), a layer-cut self-draft, and the target itself
(every path fully accepted, so EOS and max_length land inside accepted paths).
"""

import random

import pytest
import torch
from conftest import noisy_copy, random_tree, speed_policy_as_shipped, tiny_model

import hf_speculative as hfs


@pytest.fixture(scope="module", autouse=True)
def _policy_as_shipped():
    """This suite runs under the speed policy a user gets (`conftest.speed_policy_as_shipped`)."""
    with speed_policy_as_shipped():
        yield


CASES_PER_ARCH = 60


def _drafts(target, arch):
    return {
        "independent": tiny_model(arch, seed=123),
        "noisy": noisy_copy(target, noise=0.3),
        "layer_cut": hfs.layer_cut_draft(target, 2),
        "self": target,
    }


def _tree(rng):
    kind = rng.choice(["random", "random", "chain", "cartesian", "default"])
    if kind == "random":
        return random_tree(rng, max_nodes=24, max_depth=6)
    if kind == "chain":
        return hfs.TreeSpec.chain(rng.randint(1, 7))
    if kind == "cartesian":
        return hfs.TreeSpec.cartesian([rng.randint(1, 4) for _ in range(rng.randint(1, 4))])
    return None  # the drafter's default tree


@pytest.mark.slow
def test_greedy_equals_plain_generate(arch):
    target = tiny_model(arch, seed=7)
    drafts = _drafts(target, arch)
    hfs.enable(target)
    rng = random.Random(hash(arch) % 1000)
    eos_cases = length_cases = 0
    for case in range(CASES_PER_ARCH):
        prompt = torch.randint(0, 96, (1, rng.randint(1, 12)), generator=torch.Generator().manual_seed(case))
        name = rng.choice(sorted(drafts))
        tree = _tree(rng)
        kwargs = {"do_sample": False}
        if rng.random() < 0.25:
            kwargs["max_length"] = prompt.shape[1] + rng.randint(1, 30)
        else:
            kwargs["max_new_tokens"] = rng.randint(1, 40)
        if rng.random() < 0.4:
            # an EOS the model really emits mid-way: plain generation stops there, and so must we
            free = target.generate(prompt, **kwargs)
            new = free[0, prompt.shape[1] :].tolist()
            if len(new) > 2:
                eos = new[rng.randint(1, len(new) - 1)]
                kwargs["eos_token_id"] = eos if rng.random() < 0.5 else [eos, 95]
                eos_cases += 1
        expected = target.generate(prompt, **kwargs)
        out = target.generate(
            prompt, assistant_model=drafts[name], speculative_tree=tree, return_dict_in_generate=True, **kwargs
        )
        assert torch.equal(out.sequences, expected), f"case {case}: draft={name} tree={tree} kwargs={kwargs}"
        stats = out.speculative_stats
        assert sum(stats.accepted_lengths) == expected.shape[1] - prompt.shape[1]
        if "max_length" in kwargs or "max_new_tokens" in kwargs:
            length_cases += 1
    assert eos_cases >= 10 and length_cases == CASES_PER_ARCH


def test_self_draft_accepts_full_paths():
    target = hfs.enable(tiny_model("llama", seed=7))
    prompt = torch.randint(0, 96, (1, 5))
    tree = hfs.TreeSpec.cartesian([2, 2, 1, 1])
    out = target.generate(
        prompt,
        assistant_model=target,
        speculative_tree=tree,
        max_new_tokens=31,
        do_sample=False,
        return_dict_in_generate=True,
        speculative_pricing=False,  # every step drafts: a priced run may time a one-token step between them
    )
    lengths = out.speculative_stats.accepted_lengths
    assert lengths == [1] + [5] * 6  # prefill token, then depth 4 + bonus every step
    assert out.speculative_stats.mean_accepted_length == pytest.approx(31 / 7)


def test_eager_attention_equality():
    target = hfs.enable(tiny_model("llama", seed=11, attn_implementation="eager"))
    draft = noisy_copy(target, noise=0.3)
    for seed in range(5):
        prompt = torch.randint(0, 96, (1, 4 + seed), generator=torch.Generator().manual_seed(seed))
        expected = target.generate(prompt, max_new_tokens=25, do_sample=False)
        out = target.generate(prompt, assistant_model=draft, max_new_tokens=25, do_sample=False)
        assert torch.equal(out, expected)
