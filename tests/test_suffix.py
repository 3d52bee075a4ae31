"""SuffixDecoding: the match and the speculation tree by hand on a toy corpus, the suffix array against a plain sort,
the memory cap and eviction, save/load (and `AutoModel`), learning across calls, greedy equality (batch 1 and ragged
batches with an EOS mid-batch) on Llama, Mistral and Qwen2, alone and in a hybrid with prompt lookup, exact sampling,
and the warm-suffix command."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_model
from test_batch import PAD, _eos_mid_batch, left_padded
from test_sampling import ALPHA, NEW, SETTINGS, _batched_sample_counts, _exact_generate, chi_square_pvalue
from test_token_recycling import _repetitive_prompt

import hf_speculative as hfs
from hf_speculative.drafters.suffix.speculation_tree import expand_speculation_tree
from hf_speculative.drafters.suffix.suffix_index import SuffixIndex, match_in_sequence, suffix_array

TOY_CORPUS = [[1, 2, 3, 4, 7], [1, 2, 3, 5], [2, 3, 4, 6]]


def _suffix(**kwargs):
    return hfs.SuffixDrafter(cost_curve=lambda n: 1.0, **kwargs)  # a fixed cost curve: nothing measured in a test


def _hybrid(**kwargs):
    return hfs.HybridDrafter([hfs.PromptLookupDrafter(min_ngram_size=1), _suffix(**kwargs)], cost_curve=lambda n: 1.0)


# ----------------------------------------------------------------------------- by hand on a toy corpus


def test_longest_match_in_the_global_structure_by_hand():
    index = SuffixIndex(key_length=8)
    index.add(TOY_CORPUS)
    # codes are token + 1, a 0 after each output
    assert index.codes.tolist() == [2, 3, 4, 5, 8, 0, 2, 3, 4, 6, 0, 3, 4, 5, 7, 0]
    length, lo, hi = index.longest_match(np.array([9, 1, 2, 3]), 8)
    assert length == 3 and sorted(index.suffixes[lo:hi].tolist()) == [0, 6]  # "1 2 3" starts outputs 0 and 1
    length, lo, hi = index.longest_match(np.array([7, 3, 4]), 8)
    assert length == 2 and sorted(index.suffixes[lo:hi].tolist()) == [2, 12]  # "3 4" in outputs 0 and 2
    assert index.longest_match(np.array([8, 9]), 8)[0] == 0  # never seen
    assert index.longest_match(np.array([4, 7, 1]), 8)[0] == 1  # a match never crosses two outputs ("4 7 | 1")


def test_speculation_tree_by_hand():
    """From "1 2 3": 4 (then 7) and 5, each seen once in two occurrences: scores 1/2, 1/2, then 1/2 * 1."""
    drafter = _suffix(min_probability=0.0).warm(TOY_CORPUS)
    draft = drafter.draft(torch.tensor([9, 1, 2, 3]), drafter.default_tree)
    assert draft.tokens.tolist() == [3, 4, 5, 7]
    assert draft.parents == (-1, 0, 0, 1)
    # adaptive length: a 1-token match ("9 3": only "3") drafts at most ceil(alpha * 1) = 1 node with alpha = 1
    short = _suffix(min_probability=0.0, alpha=1.0).warm(TOY_CORPUS).draft(torch.tensor([9, 3]), hfs.TreeSpec.chain(8))
    assert short.tokens.tolist() == [3, 4] and short.parents == (-1, 0)  # "3 -> 4" twice, "3 -> 5" once
    # min_probability drops the unlikely: 5 after "3" has 1/3
    tokens, parents, scores = expand_speculation_tree(
        np.array([4, 5, 0, 4, 5, 0, 4, 6, 0]), np.array([1, 4, 7]), 3, 8, 4, 0.5
    )
    assert tokens == [3, 4] and parents == [-1, 0] and scores == pytest.approx([1.0, 2 / 3])


def test_per_request_match_by_hand():
    seq = np.array([5, 1, 2, 3, 8, 2, 3, 9, 1, 2, 3])
    length, follow = match_in_sequence(seq, 64)
    assert length == 3 and follow.tolist() == [4]  # "1 2 3" once before, followed by 8 at position 4
    assert match_in_sequence(seq, 2)[0] == 2 and match_in_sequence(seq, 2)[1].tolist() == [4, 7]
    assert match_in_sequence(np.array([1, 2, 3]), 64)[0] == 0
    # the per-request tree drafts what followed in the row itself, merged with the global one
    drafter = _suffix(min_probability=0.0)
    draft = drafter.draft(torch.tensor(seq), drafter.default_tree)
    assert draft.tokens.tolist()[:4] == [3, 8, 2, 3]


def test_incremental_inserts_keep_the_suffix_array_sorted():
    rng = np.random.default_rng(0)
    outputs = [rng.integers(0, 6, int(rng.integers(1, 30))).tolist() for _ in range(60)]
    index = SuffixIndex(key_length=6)
    index.add(outputs[:40])  # a large batch: sorted from scratch
    for out in outputs[40:]:  # small batches: binary-searched in
        index.add([out])
    codes = index.codes.tolist()

    def key(p):  # the codes up to the output's end, at most key_length of them
        window = codes[p : p + 6] + [0]
        return tuple(window[: window.index(0)])

    assert [key(p) for p in index.suffixes.tolist()] == sorted(key(p) for p in range(len(codes)) if codes[p])
    assert len(index.suffixes) == sum(len(o) for o in outputs)
    reference = suffix_array(index.codes, np.flatnonzero(index.codes != 0), 6)
    assert [key(p) for p in reference.tolist()] == [key(p) for p in index.suffixes.tolist()]


def test_memory_cap_is_honoured_and_the_oldest_outputs_go_first():
    cap = 2000
    drafter = _suffix(max_cache_bytes=cap)
    outputs = [[10 + i] * 20 + [i] for i in range(30)]  # 21 tokens: 8 * 21 + 8 = 176 bytes each
    drafter.warm(outputs[:20])  # one batch beyond the cap: only the newest that fit are kept
    assert drafter.index.nbytes <= cap and len(drafter.index) == 11
    for out in outputs[20:]:  # one at a time: each evicts the oldest
        drafter.warm([out])
        assert drafter.index.nbytes <= cap
    kept = len(drafter.index)
    assert drafter.index.longest_match(np.array(outputs[-1][-3:]), 8)[0] == 3  # the newest is there
    assert drafter.index.longest_match(np.array([10, 10]), 8)[0] == 0  # the oldest is gone
    assert drafter.index.longest_match(np.array(outputs[30 - kept][:2]), 8)[0] == 2
    assert drafter.index.longest_match(np.array(outputs[29 - kept][:2]), 8)[0] < 2


def test_texts_need_a_tokenizer_and_ids_must_fit_the_vocabulary():
    with pytest.raises(TypeError, match="tokenizer"):
        _suffix().warm(["some text"])
    with pytest.raises(ValueError, match="token ids"):
        _suffix(vocab_size=8).warm([[1, 9]])


# ----------------------------------------------------------------------------- saving, learning


def test_save_and_load_round_trip_and_automodel(tmp_path):
    from transformers import AutoConfig, AutoModel

    model = hfs.enable(tiny_model("llama"))
    drafter = _suffix(alpha=3.0)
    prompt = _repetitive_prompt()
    model.generate(prompt, assistant_model=drafter, max_new_tokens=16, do_sample=False)
    drafter.warm(TOY_CORPUS)
    drafter.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "suffix_decoding"
    for loaded in (
        hfs.SuffixDrafter.from_pretrained(tmp_path, cost_curve=lambda n: 1.0),
        AutoModel.from_pretrained(tmp_path),
    ):
        assert isinstance(loaded, hfs.SuffixDrafter) and loaded.config.alpha == 3.0
        assert np.array_equal(loaded.index.codes, drafter.index.codes)
        assert (
            np.array_equal(loaded.index.suffixes, drafter.index.suffixes)
            and loaded.index.lengths == drafter.index.lengths
        )
        for context in ([9, 1, 2, 3], prompt[0].tolist()):
            a, b = (
                drafter.draft(torch.tensor(context), drafter.default_tree),
                loaded.draft(torch.tensor(context), drafter.default_tree),
            )
            assert a.tokens.tolist() == b.tokens.tolist() and a.parents == b.parents
    loaded = hfs.SuffixDrafter.from_pretrained(tmp_path, cost_curve=lambda n: 1.0)
    a = model.generate(
        prompt, assistant_model=drafter, max_new_tokens=16, do_sample=False, return_dict_in_generate=True
    )
    b = model.generate(prompt, assistant_model=loaded, max_new_tokens=16, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(a.sequences, b.sequences)
    assert a.speculative_stats.accepted_lengths == b.speculative_stats.accepted_lengths
    with pytest.raises(TypeError, match="unknown SuffixDrafter argument"):
        hfs.SuffixDrafter.from_pretrained(tmp_path, alhpa=2.0)


def test_a_second_pass_over_the_same_prompts_drafts_and_accepts_more():
    model = hfs.enable(tiny_model("llama", seed=2))
    drafter = _suffix()
    prompts = [torch.tensor([[5, 17, 33, 2, 9, 41, 7, 12]]), torch.tensor([[8, 8, 21, 60, 4, 70]])]
    passes = []
    for _ in range(2):
        drafted, accepted, forwards = 0, 0, 0
        for prompt in prompts:
            out = model.generate(
                prompt, assistant_model=drafter, max_new_tokens=32, do_sample=False, return_dict_in_generate=True
            )
            stats = out.speculative_stats
            drafted += sum(stats.tree_sizes[1:]) - len(stats.tree_sizes[1:])  # drafted nodes, roots excluded
            accepted, forwards = accepted + sum(stats.accepted_lengths), forwards + len(stats.accepted_lengths)
        passes.append((drafted / forwards, accepted / forwards))  # per target forward: nodes drafted, tau
    assert len(drafter.index) == 4  # each call's output was learned
    assert passes[1][0] > passes[0][0] and passes[1][1] > passes[0][1] and passes[1][1] > 3.0


def test_a_drafter_of_another_vocabulary_is_refused():
    model = hfs.enable(tiny_model("llama"))
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        model.generate(_repetitive_prompt(), assistant_model=_suffix(vocab_size=50), max_new_tokens=4)


# ----------------------------------------------------------------------------- through generate()


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("make", ["suffix", "hybrid"])
def test_greedy_equals_plain_generate(arch, make):
    model = hfs.enable(tiny_model(arch, seed=2))
    drafter = _suffix() if make == "suffix" else _hybrid()
    prompt = _repetitive_prompt()
    plain = model.generate(prompt, max_new_tokens=40, do_sample=False)
    for tree in (None, hfs.TreeSpec.cartesian([3, 2, 1]), hfs.TreeSpec.chain(4), None):  # the last call is warm
        kwargs = {} if tree is None else {"speculative_tree": tree}
        out = model.generate(
            prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False, return_dict_in_generate=True, **kwargs
        )
        assert torch.equal(out.sequences, plain), (arch, make, tree)
    assert out.speculative_stats.mean_accepted_length > 2.0


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("make", ["suffix", "hybrid"])
def test_ragged_batch_with_eos_mid_batch(arch, make):
    model = hfs.enable(tiny_model(arch, seed=2))
    ids, mask = left_padded()
    new = 24
    eos = _eos_mid_batch(model, ids, mask, new)
    drafter = _suffix() if make == "suffix" else _hybrid()
    for kwargs in ({}, {"eos_token_id": eos}, {}):
        plain = model.generate(
            ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=PAD, **kwargs
        )
        out = model.generate(
            ids,
            attention_mask=mask,
            assistant_model=drafter,
            max_new_tokens=new,
            do_sample=False,
            pad_token_id=PAD,
            return_dict_in_generate=True,
            **kwargs,
        )
        assert torch.equal(out.sequences, plain), (arch, make, kwargs)
    suffix = drafter if make == "suffix" else drafter.parts[1]
    assert len(suffix.index) == 3 * ids.shape[0]  # the rows share one global structure
    assert out.speculative_stats.mean_accepted_length > 2.0


@pytest.mark.slow
@pytest.mark.parametrize("make", ["suffix", "hybrid"])
def test_sampling_matches_target_distribution(make):
    """Drafts are fixed candidates (point-mass proposals): tree rejection sampling keeps the target's distribution,
    with the global structure learning between samples."""
    vocab = 8
    target = hfs.enable(tiny_model("llama", seed=21, vocab_size=vocab, num_layers=2))
    drafter = _suffix(min_probability=0.0) if make == "suffix" else _hybrid(min_probability=0.0)
    kw = SETTINGS["temperature-0.7-top-k-4"]
    prompt = torch.tensor([[1, 5, 2, 1, 5]])
    exact = _exact_generate(target, prompt, **kw)
    torch.manual_seed(1234)
    n = 2000
    gen_kwargs = dict(do_sample=True, max_new_tokens=NEW, top_k=kw["top_k"], temperature=kw["temperature"])
    sizes = []

    def batch(ids, mask):
        out = target.generate(
            ids, attention_mask=mask, assistant_model=drafter, return_dict_in_generate=True, **gen_kwargs
        )
        for row in out.speculative_stats.rows:  # each row's own trees (a batch's tree_sizes sum the rows')
            sizes.extend(row.tree_sizes[1:])
        return out.sequences

    counts = _batched_sample_counts(batch, prompt, n)
    assert chi_square_pvalue(counts, exact, n) > ALPHA
    assert max(sizes) > 2  # trees were really drafted


# ----------------------------------------------------------------------------- the command


def test_warm_suffix_and_bench_methods(tmp_path, capsys):
    import json

    from hf_speculative.bench.tiny import tiny_chat_tokenizer, tiny_llama
    from hf_speculative.cli import main

    model_dir, prompts, texts = tmp_path / "model", tmp_path / "q.jsonl", tmp_path / "t.txt"
    tok = tiny_chat_tokenizer()
    tiny_llama(tokenizer=tok, num_layers=2).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    prompts.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["write a poem"]}) + "\n")
    texts.write_text("one and two\nwhat is one and two ?\n")
    common = ["--model", str(model_dir), "--threads", "1", "--device", "cpu"]
    out = tmp_path / "sfx"
    assert (
        main(
            [
                "warm-suffix",
                *common,
                "--texts",
                str(texts),
                "--prompts",
                str(prompts),
                "--max-new-tokens",
                "8",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["outputs"] == 3 and report["tokens"] > 0 and report["bytes"] <= report["max_cache_bytes"]
    warmed = hfs.SuffixDrafter.from_pretrained(out)
    assert len(warmed.index) == 3 and warmed.index.num_tokens == report["tokens"]
    result = tmp_path / "b.json"
    assert (
        main(
            [
                "bench",
                *common,
                "--prompts",
                str(prompts),
                "--methods",
                "plain,suffix,hybrid:pl+sx",
                "--suffix",
                str(out),
                "--max-new-tokens",
                "6",
                "--no-numerics-floor",
                "--output",
                str(result),
            ]
        )
        == 0
    )
    data = json.loads(result.read_text())
    assert data["setting"]["methods"]["suffix"]["warm_outputs"] >= 3  # the warmed outputs, and the run's own
    assert data["setting"]["methods"]["hybrid:pl+sx"]["parts"] == ["pl", "sx"]
    for name in ("suffix", "hybrid:pl+sx"):
        assert data["methods"][name]["lossless_rate"] == 1.0, name


def test_scores_never_grow_along_a_path_rounding_included():
    """A child whose token follows every occurrence of its parent scores exactly its parent's score, never one ulp
    above it (``s * c / t`` rounds up for some s): the best-first cut keeps each kept node's ancestors."""
    from hf_speculative.drafters.hybrid import best_nodes

    for seed in range(300):
        rng = np.random.default_rng(seed)
        codes = rng.integers(1, 4, size=400)
        positions = np.flatnonzero(codes == 1)[: int(rng.integers(3, 40))] + 1
        tokens, parents, scores = expand_speculation_tree(codes, positions, 0, 64, 8, 0.0)
        assert all(scores[i] <= scores[parents[i]] for i in range(1, len(tokens))), seed
        depths = [0] * len(tokens)
        for i in range(1, len(tokens)):
            depths[i] = depths[parents[i]] + 1
        for n in range(1, len(tokens)):  # every cut of the best-first order is a tree
            keep = set(best_nodes(scores, depths, n, 8, lambda k: 1.0 + 0.01 * k))
            assert all(parents[i] in keep for i in keep if i), (seed, n)
