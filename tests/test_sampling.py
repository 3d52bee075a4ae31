"""Sampling exactness: tree rejection sampling reproduces the target's own distribution.

Method: sample many short continuations, compare their empirical distribution with the EXACT distribution
of the target (enumerated over a small vocabulary, with the same temperature / top-k / top-p warpers)
by Pearson's chi-square goodness-of-fit test. Cells with an expected count below 5 are pooled.
Significance level: alpha = 1e-3 per test. A wrong acceptance rule shifts probability mass by far more than this
test's resolution (see the negative control). Under the shipped speed policy, step pricing decides from wall-clock
timings which steps draft, so a speculative test's draws (not their distribution) vary from run to run even with its
seed fixed: such a test draws once more with another seed when the first draw fails (`assert_like_exact`), and
fails only when both do.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from conftest import speed_policy_as_shipped, tiny_model
from scipy.stats import chisquare
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import hf_speculative as hfs
from hf_speculative.engine.acceptance import accept_sampling
from hf_speculative.engine.trees import DraftingOptions, fill_children


@pytest.fixture(scope="module", autouse=True)
def _policy_as_shipped():
    """This suite runs under the speed policy a user gets (`conftest.speed_policy_as_shipped`)."""
    with speed_policy_as_shipped():
        yield


ALPHA = 1e-3


def assert_like_exact(draw, exact: dict, n: int, seed: int) -> None:
    """``draw()``'s ``n`` samples follow ``exact``: the chi-square p-value above `ALPHA` for a draw seeded ``seed``,
    or, when that one falls below (a false alarm in 1,000 runs whose timings differ), for a second draw seeded
    ``seed + 1`` (both below: 1 in a million by chance; a wrong acceptance rule fails every draw)."""
    torch.manual_seed(seed)
    first = chi_square_pvalue(draw(), exact, n)
    if first > ALPHA:
        return
    torch.manual_seed(seed + 1)
    second = chi_square_pvalue(draw(), exact, n)
    assert second > ALPHA, (first, second)


def chi_square_pvalue(counts: dict, expected_probs: dict, n: int) -> float:
    keys = list(expected_probs)
    observed = [counts.get(k, 0) for k in keys]
    expected = [expected_probs[k] * n for k in keys]
    extra = sum(v for k, v in counts.items() if k not in expected_probs)
    big = [i for i, e in enumerate(expected) if e >= 5]
    obs = [observed[i] for i in big]
    exp = [expected[i] for i in big]
    pooled_obs = sum(observed) - sum(obs) + extra
    pooled_exp = n - sum(exp)
    if pooled_exp > 1e-9:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    elif pooled_obs > 0:
        return 0.0  # mass where the target has none
    return float(chisquare(obs, exp).pvalue)


# --------------------------------------------------------------------------- model-free emulation of the loop
V, LENGTH = 6, 3


@functools.lru_cache(maxsize=None)
def _logits(context: tuple, salt: int) -> torch.Tensor:
    """The synthetic model's logits after ``context`` (a pure function of it: cached; callers never write to it)."""
    g = torch.Generator().manual_seed(hash((context, salt)) % (2**31))
    return 2.0 * torch.randn(V, generator=g)


def _exact_synthetic() -> dict:
    probs = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        p = 1.0
        for i in range(LENGTH):
            p *= float(torch.softmax(_logits(seq[:i], 0), -1)[seq[i]])
        probs[seq] = p
    return probs


def _sample_synthetic(scheme: str, spec: hfs.TreeSpec, claimed: str | None = None) -> tuple:
    """One continuation of LENGTH tokens by draft -> verify steps with a synthetic target (salt 0) and draft
    (salt 1). ``claimed`` is the scheme the verifier is told (a wrong claim is the negative control)."""
    options = DraftingOptions(do_sample=True, temperature=1.0)
    seq: tuple = ()
    while len(seq) < LENGTH:
        tokens = torch.zeros(spec.num_nodes + 1, dtype=torch.long)  # node 0 stands for the context
        probs = torch.zeros(spec.num_nodes + 1, V)
        draft = hfs.DraftTree.from_spec(spec, tokens, draft_probs=probs, sampling=claimed or scheme)

        def context(node, seq=seq, tokens=tokens, draft=draft):
            return seq + tuple(tokens[draft.path_to(node)[1:]].tolist())

        for node, kids in enumerate(spec.children):
            if kids:
                logits = _logits(context(node), 1)
                chosen, _ = fill_children(logits, len(kids), scheme, options)
                tokens[list(kids)] = chosen
                probs[node] = torch.softmax(logits, -1)
        result = accept_sampling(draft, lambda node, context=context: _logits(context(node), 0))
        seq = seq + tuple(result.tokens)
    return seq[:LENGTH]


def _synthetic_pvalue(scheme: str, n: int, claimed: str | None = None) -> float:
    torch.manual_seed(0)
    spec = hfs.TreeSpec.cartesian([3, 2, 1])
    counts: dict = {}
    for _ in range(n):
        s = _sample_synthetic(scheme, spec, claimed)
        counts[s] = counts.get(s, 0) + 1
    return chi_square_pvalue(counts, _exact_synthetic(), n)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["without_replacement", "with_replacement", "deterministic"])
def test_tree_rejection_sampling_is_exact(scheme):
    """6,000 samples: the negative control below fails at this size with a p-value that rounds to 0."""
    assert _synthetic_pvalue(scheme, 6000) > ALPHA


@pytest.mark.slow
def test_negative_control_top_k_siblings_are_not_iid_samples():
    """Top-k siblings verified as if they were i.i.d. draws of q (the classic mistake) must fail the test."""
    assert _synthetic_pvalue("deterministic", 6000, claimed="with_replacement") < ALPHA


# --------------------------------------------------------------------------- end to end through generate()
VOCAB, NEW = 8, 3


def _warpers(temperature, top_k, top_p):
    procs = LogitsProcessorList()
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    return procs


@torch.no_grad()
def _exact_generate(model, prompt, temperature, top_k, top_p) -> dict:
    procs = _warpers(temperature, top_k, top_p)
    probs = {(): 1.0}
    for _ in range(NEW):
        nxt = {}
        for prefix, p in probs.items():
            if p == 0.0:
                continue
            ids = torch.cat([prompt, torch.tensor([prefix], dtype=torch.long).reshape(1, -1)], dim=-1)
            scores = procs(ids, model(input_ids=ids).logits[:, -1].float())
            dist = torch.softmax(scores, -1)[0]
            for tok in range(VOCAB):
                if dist[tok] > 0:
                    nxt[prefix + (tok,)] = p * float(dist[tok])
        probs = nxt
    return probs


SETTINGS = {
    "temperature-1": dict(temperature=1.0, top_k=0, top_p=1.0),
    "temperature-0.7-top-k-4": dict(temperature=0.7, top_k=4, top_p=1.0),
    "top-p-0.8-temperature-1.3": dict(temperature=1.3, top_k=0, top_p=0.8),
}


@pytest.fixture(scope="module")
def sampling_models():
    target = hfs.enable(tiny_model("llama", seed=21, vocab_size=VOCAB, num_layers=2))
    draft = tiny_model("llama", seed=99, vocab_size=VOCAB, num_layers=1)  # its distribution differs from the target's
    return target, draft


def _sample_counts(generate, n):
    counts: dict = {}
    for _ in range(n):
        seq = tuple(generate()[0, -NEW:].tolist())
        counts[seq] = counts.get(seq, 0) + 1
    return counts


def _batched_sample_counts(generate, prompt, n, rows: int = 50):
    """`_sample_counts` drawn ``rows`` samples at a time: ``generate(ids, attention_mask)`` over the prompt repeated
    ``rows`` times. The rows of a batch sample independently (each row's output follows the model's distribution:
    the engine's per-row claim for batches), so a drafter's test covers its batched path and runs several times faster."""
    counts: dict = {}
    for start in range(0, n, rows):
        ids = prompt.repeat(min(rows, n - start), 1)
        for row in generate(ids, torch.ones_like(ids))[:, -NEW:].tolist():
            counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize(
    "setting, draft_sampling, tree, acceptance, rows",
    [
        ("temperature-1", "without_replacement", [3, 2, 1], "exact", 1),
        ("temperature-0.7-top-k-4", "with_replacement", [2, 2], "exact", 50),
        ("top-p-0.8-temperature-1.3", "deterministic", [3, 1, 1], "exact", 50),
        # tree rejection sampling over the drafter's own sampled siblings (its randomness depends on the steps)
        ("temperature-1", "without_replacement", [3, 2, 1], "rejection", 1),
        ("temperature-0.7-top-k-4", "with_replacement", [2, 2], "rejection", 50),
    ],
)
def test_generate_sampling_matches_target_distribution(
    sampling_models, setting, draft_sampling, tree, acceptance, rows
):
    """``rows``: samples drawn per ``generate()`` call (1: one prompt per call; 50: a batch of the prompt repeated,
    whose rows sample independently)."""
    target, draft = sampling_models
    kw = SETTINGS[setting]
    prompt = torch.tensor([[1, 5, 2]])
    exact = _exact_generate(target, prompt, **kw)
    drafter = hfs.CausalLMDrafter(draft, draft_sampling=draft_sampling)
    spec = hfs.TreeSpec.cartesian(tree)
    n = 3000
    gen_kwargs = dict(
        do_sample=True, max_new_tokens=NEW, top_k=kw["top_k"] or None, temperature=kw["temperature"], top_p=kw["top_p"]
    )
    draw = functools.partial(
        _batched_sample_counts,
        lambda ids, mask: target.generate(
            ids,
            attention_mask=mask,
            assistant_model=drafter,
            speculative_tree=spec,
            speculative_acceptance=acceptance,
            **gen_kwargs,
        ),
        prompt,
        n,
        rows,
    )
    assert_like_exact(draw, exact, n, seed=1234)
    # the draft really differs from the target (otherwise the test would prove little)
    with torch.no_grad():
        p = torch.softmax(target(prompt).logits[0, -1], -1)
        q = torch.softmax(draft(prompt).logits[0, -1], -1)
    assert 0.5 * (p - q).abs().sum() > 0.2


@pytest.mark.slow
def test_magicdec_sampling_matches_target_distribution(sampling_models):
    """MagicDec: the target drafts for itself over a StreamingLLM cache of window 2 and one sink (from the 4th position
    on the draft skips context), a chain with alternatives, rotary positions within the sparse cache."""
    from test_drafter_protocol import begin_one, propose_one

    from hf_speculative.drafters.spire import chain_with_alternatives

    target, _ = sampling_models
    kw = SETTINGS["temperature-0.7-top-k-4"]
    prompt = torch.tensor([[1, 5, 2]])
    exact = _exact_generate(target, prompt, **kw)
    drafter = hfs.MagicDecDrafter(target, sliding_window=2, num_sink_tokens=1, num_draft_tokens=2)
    tree = chain_with_alternatives(2, 2)
    n = 3000
    gen_kwargs = dict(do_sample=True, max_new_tokens=NEW, top_k=kw["top_k"], temperature=kw["temperature"])
    draw = functools.partial(
        _batched_sample_counts,
        lambda ids, mask: target.generate(
            ids, attention_mask=mask, assistant_model=drafter, speculative_tree=tree, **gen_kwargs
        ),
        prompt,
        n,
    )
    assert_like_exact(draw, exact, n, seed=1234)
    # the sparse draft really differs from the target
    seq = torch.cat([prompt, torch.tensor([[3]])], 1)
    with torch.no_grad():
        begin_one(drafter, prompt, target(prompt, use_cache=True))
        q = propose_one(drafter, seq, hfs.TreeSpec.chain(1), DraftingOptions(do_sample=True)).draft_probs[0]
        p = torch.softmax(target(seq).logits[0, -1], -1)
    assert 0.5 * (p - q).abs().sum() > 0.3


@pytest.mark.slow
def test_reference_distribution_matches_plain_sampling(sampling_models):
    """Validates the exact-distribution computation itself against transformers' plain sampling."""
    target, _ = sampling_models
    kw = SETTINGS["temperature-0.7-top-k-4"]
    prompt = torch.tensor([[1, 5, 2]])
    exact = _exact_generate(target, prompt, **kw)
    torch.manual_seed(4321)
    n = 3000
    counts = _batched_sample_counts(
        lambda ids, mask: target.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=NEW,
            top_k=kw["top_k"],
            temperature=kw["temperature"],
        ),
        prompt,
        n,
    )
    assert chi_square_pvalue(counts, exact, n) > ALPHA


def test_typical_acceptance_only_when_asked(sampling_models, monkeypatch):
    import hf_speculative.engine.acceptance as acceptance

    target, draft = sampling_models
    calls = []
    real = acceptance.accept_typical
    monkeypatch.setattr(acceptance, "accept_typical", lambda *a, **k: calls.append(1) or real(*a, **k))
    prompt = torch.tensor([[1, 5, 2]])
    target.generate(prompt, assistant_model=draft, do_sample=True, max_new_tokens=6)
    assert calls == []
    target.generate(prompt, assistant_model=draft, do_sample=False, max_new_tokens=6, speculative_acceptance="typical")
    assert calls == []  # greedy stays exact: typical acceptance is a sampling rule
    target.generate(prompt, assistant_model=draft, do_sample=True, max_new_tokens=6, speculative_acceptance="typical")
    assert calls
    with pytest.raises(ValueError, match="speculative_acceptance"):
        target.generate(prompt, assistant_model=draft, do_sample=True, max_new_tokens=2, speculative_acceptance="fast")
