"""Token Recycling and hybrid trees: the matrix update and BFS drafting by hand, the merge by hand, online
acceptance, save/load, learning across calls, greedy equality (batch 1 and ragged batches with an EOS mid-batch) on
Llama, Mistral and Qwen2, and exact sampling."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from test_batch import PAD, _eos_mid_batch, left_padded
from test_sampling import ALPHA, NEW, SETTINGS, _batched_sample_counts, _exact_generate, chi_square_pvalue

import hf_speculative as hfs
from hf_speculative.drafters.hybrid import best_nodes, budget_tree, merge_drafts
from hf_speculative.drafters.online_accuracy import OnlineAccuracy


def _recycling(**kwargs):
    return hfs.TokenRecyclingDrafter(cost_curve=lambda n: 1.0, **kwargs)


def _hybrid(model, **kwargs):
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=3)
    parts = [hfs.PromptLookupDrafter(min_ngram_size=1), _recycling(), heads]
    return hfs.HybridDrafter(parts, cost_curve=lambda n: 1.0, **kwargs)


def _repetitive_prompt(vocab: int = 96, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (1, 16), generator=g)
    return torch.cat([ids, ids, ids[:, :5]], 1)


# ----------------------------------------------------------------------------- by hand on a toy vocabulary


def test_bfs_drafting_over_the_matrix_by_hand():
    tr = hfs.TokenRecyclingDrafter(num_successors=2)
    tr._ensure_matrix(6, torch.device("cpu"))
    tr.update(torch.tensor([1, 2]), torch.tensor([[2, 3], [4, 5]]))  # row 3 stays empty
    draft = tr.draft(1, hfs.TreeSpec.cartesian([2, 2]))
    # root 1; its successors 2 (rank 0) and 3 (rank 1); 2's successors 4 and 5; 3 has no row: no children
    assert draft.tokens.tolist() == [1, 2, 3, 4, 5]
    assert draft.parents == (-1, 0, 0, 1, 1)
    # a root with no row drafts nothing: the step is a plain decoding step
    assert tr.draft(0, hfs.TreeSpec.cartesian([2, 2])).tokens.tolist() == [0]


def test_update_overwrites_rows_with_the_newest_top_k():
    tr = hfs.TokenRecyclingDrafter(num_successors=2)
    tr._ensure_matrix(6, torch.device("cpu"))
    tr.update(torch.tensor([1, 4]), torch.tensor([[5, 0], [1, 2]]))
    tr.update(torch.tensor([1]), torch.tensor([[3, 2]]))
    assert tr.adjacency[1].tolist() == [3, 2] and tr.adjacency[4].tolist() == [1, 2]
    assert tr.adjacency[0].tolist() == [-1, -1] and tr.filled_rows == 2


def test_prefill_fills_the_rows_of_the_prompt_with_the_targets_top_k():
    model = hfs.enable(tiny_model("llama"))
    prompt = torch.tensor([[3, 9, 27, 14, 51, 60, 8]])  # distinct tokens: each row is written once
    tr = _recycling(num_successors=4)
    model.generate(prompt, assistant_model=tr, max_new_tokens=1, do_sample=False)
    with torch.no_grad():
        top = torch.topk(model(prompt).logits[0], 4, dim=-1).indices
    assert torch.equal(tr.adjacency[prompt[0]], top)


def test_verification_updates_every_node_accepted_or_not():
    """After a step, the row of each tree node's token holds the top-k of the logits the target computed there."""
    model = hfs.enable(tiny_model("llama"))
    tr = _recycling(num_successors=3)
    seen = {}
    original = tr.advance_batch

    def spy(sequences, rows, drafts, results, target_outputs):
        if not seen and len(drafts[0]) > len(results[0].path) + 1:  # the first step with a rejected node
            seen.update(
                draft=drafts[0], top=target_outputs.top_k[0], sequence=sequences[0][0].tolist(), result=results[0]
            )
        original(sequences, rows, drafts, results, target_outputs)

    tr.advance_batch = spy
    model.generate(_repetitive_prompt(), assistant_model=tr, max_new_tokens=24, do_sample=False)
    draft, top = seen["draft"], seen["top"]
    assert top.shape == (len(draft), 3) and len(draft) > 2
    root_at = len(seen["sequence"]) - len(seen["result"].tokens) - 1  # the step's root, then what it committed
    rejected = [n for n in range(1, len(draft)) if n not in seen["result"].path]
    assert rejected  # a rejected node is checked too
    for node in (0, rejected[-1]):
        context = seen["sequence"][:root_at] + draft.tokens[draft.path_to(node)].tolist()
        with torch.no_grad():
            expect = torch.topk(model(torch.tensor([context])).logits[0, -1], 3).indices
        assert torch.equal(top[node], expect), node


def test_online_accuracy_counts_only_nodes_below_the_committed_path():
    acc = OnlineAccuracy(max_depth=3, max_rank=2, prior=[0.5, 0.5], prior_weight=0.0)
    # root 9 -> a (rank 0), b (rank 1); a -> c (rank 0); b -> d (rank 0)
    draft = hfs.DraftTree(tokens=torch.tensor([9, 1, 2, 3, 4]), parents=(-1, 0, 0, 1, 2))
    acc.observe_tree(draft, committed=[2, 4, 7])  # the target went b, then d, then the bonus 7
    assert acc.trials.tolist() == [[1, 1], [1, 0], [0, 0]]  # depth 1: a and b tried; depth 2: only d (below b)
    assert acc.hits.tolist() == [[0, 1], [1, 0], [0, 0]]
    values = OnlineAccuracy(3, 2, prior=[0.5, 0.25], prior_weight=1.0).node_values(draft)
    assert values == pytest.approx([1.0, 0.5, 0.25, 0.25, 0.125])


def test_merge_two_sources_into_one_trie_by_hand():
    a = hfs.DraftTree(tokens=torch.tensor([7, 1, 3, 2]), parents=(-1, 0, 0, 1))  # 7 -> 1 -> 2, 7 -> 3
    b = hfs.DraftTree(tokens=torch.tensor([7, 1, 5, 4]), parents=(-1, 0, 0, 1))  # 7 -> 1 -> 4, 7 -> 5
    tokens, parents, scores, depths = merge_drafts([a, b], [[1, 0.5, 0.2, 0.25], [1, 0.6, 0.3, 0.1]])
    assert tokens == [7, 1, 3, 2, 5, 4]  # the shared prefix 7 -> 1 appears once
    assert parents == [-1, 0, 0, 1, 0, 1]
    assert scores == [1, 0.6, 0.2, 0.25, 0.3, 0.1]  # a node from both sources keeps the larger score
    assert depths == [0, 1, 1, 2, 1, 2]
    # the budget: best scores first, ancestors always before their children
    assert best_nodes(scores, depths, 3, 8, lambda n: 1.0) == [0, 1, 3, 4]
    assert best_nodes(scores, depths, 8, 1, lambda n: 1.0) == [0, 1, 2, 4]  # depth budget 1
    # a step that costs n plain steps for n tokens never pays: the root alone
    assert best_nodes(scores, depths, 8, 8, lambda n: float(n)) == [0]
    assert budget_tree(6, 3).num_nodes == 6 and budget_tree(6, 3).depth == 3


def test_save_and_load_round_trip(tmp_path):
    model = hfs.enable(tiny_model("llama"))
    tr = _recycling()
    prompt = _repetitive_prompt()
    model.generate(prompt, assistant_model=tr, max_new_tokens=16, do_sample=False)
    tr.save_pretrained(tmp_path)
    loaded = hfs.TokenRecyclingDrafter.from_pretrained(tmp_path, cost_curve=lambda n: 1.0)
    assert torch.equal(loaded.adjacency, tr.adjacency)
    assert torch.equal(loaded.hit_rates.hits, tr.hit_rates.hits) and torch.equal(
        loaded.hit_rates.trials, tr.hit_rates.trials
    )
    a = model.generate(prompt, assistant_model=tr, max_new_tokens=16, do_sample=False, return_dict_in_generate=True)
    b = model.generate(prompt, assistant_model=loaded, max_new_tokens=16, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(a.sequences, b.sequences)
    assert a.speculative_stats.accepted_lengths == b.speculative_stats.accepted_lengths
    with pytest.raises(FileNotFoundError, match="does not exist"):
        hfs.TokenRecyclingDrafter.from_pretrained(tmp_path / "missing")


def test_a_matrix_of_another_vocabulary_is_refused():
    model = hfs.enable(tiny_model("llama"))
    tr = _recycling()
    tr._ensure_matrix(50, torch.device("cpu"))
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        model.generate(_repetitive_prompt(), assistant_model=tr, max_new_tokens=4)


@pytest.mark.parametrize("make", ["recycling", "hybrid"])
def test_a_second_call_drafts_at_least_as_well(make):
    model = hfs.enable(tiny_model("llama"))
    drafter = _recycling() if make == "recycling" else _hybrid(model)
    prompt = _repetitive_prompt()
    taus = []
    for _ in range(2):
        out = model.generate(
            prompt, assistant_model=drafter, max_new_tokens=32, do_sample=False, return_dict_in_generate=True
        )
        taus.append(out.speculative_stats.mean_accepted_length)
    assert taus[1] >= taus[0] and taus[1] > 1.0


# ----------------------------------------------------------------------------- through generate()


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("make", ["recycling", "hybrid"])
def test_greedy_equals_plain_generate(arch, make):
    model = hfs.enable(tiny_model(arch, seed=2))
    drafter = _recycling() if make == "recycling" else _hybrid(model)
    prompt = _repetitive_prompt()
    plain = model.generate(prompt, max_new_tokens=40, do_sample=False)
    for tree in (None, hfs.TreeSpec.cartesian([3, 2, 1]), hfs.TreeSpec.chain(4)):
        kwargs = {} if tree is None else {"speculative_tree": tree}
        out = model.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False, **kwargs)
        assert torch.equal(out, plain), (arch, make, tree)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("make", ["recycling", "hybrid"])
def test_ragged_batch_with_eos_mid_batch(arch, make):
    model = hfs.enable(tiny_model(arch, seed=2))
    ids, mask = left_padded()
    new = 24
    eos = _eos_mid_batch(model, ids, mask, new)
    drafter = _recycling() if make == "recycling" else _hybrid(model)
    for kwargs in ({}, {"eos_token_id": eos}):
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
        assert out.speculative_stats.mean_accepted_length >= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("make", ["recycling", "hybrid"])
def test_sampling_matches_target_distribution(make):
    """Drafts are fixed candidates (point-mass proposals): tree rejection sampling keeps the target's distribution,
    with the matrix learning between samples."""
    vocab = 8
    target = hfs.enable(tiny_model("llama", seed=21, vocab_size=vocab, num_layers=2))
    drafter = (
        _recycling(num_successors=3)
        if make == "recycling"
        else hfs.HybridDrafter(
            [hfs.PromptLookupDrafter(min_ngram_size=1), _recycling(num_successors=3)], cost_curve=lambda n: 1.0
        )
    )
    kw = SETTINGS["temperature-0.7-top-k-4"]
    prompt = torch.tensor([[1, 5, 2, 1, 5]])
    exact = _exact_generate(target, prompt, **kw)
    target.generate(prompt, assistant_model=drafter, max_new_tokens=8, do_sample=False)  # rows to draft from
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
    assert max(sizes) > 1  # trees were really drafted


# ----------------------------------------------------------------------------- the commands


def test_warm_recycling_and_bench_methods(tmp_path, capsys):
    import json

    from hf_speculative.bench.tiny import tiny_chat_tokenizer, tiny_llama
    from hf_speculative.cli import main

    model_dir, prompts = tmp_path / "model", tmp_path / "q.jsonl"
    tok = tiny_chat_tokenizer()
    tiny_llama(tokenizer=tok, num_layers=2).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rows = [
        {"question_id": i, "category": c, "turns": [t]}
        for i, (c, t) in enumerate([("writing", "write a poem"), ("math", "what is one and two ?")])
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--model", str(model_dir), "--threads", "1", "--device", "cpu"]
    assert (
        main(
            [
                "warm-recycling",
                *common,
                "--prompts",
                str(prompts),
                "--max-new-tokens",
                "8",
                "--out",
                str(tmp_path / "tr"),
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["filled_rows"] > 0 and report["prompts"] == 2
    warmed = hfs.TokenRecyclingDrafter.from_pretrained(tmp_path / "tr")
    assert warmed.filled_rows == report["filled_rows"]
    out = tmp_path / "b.json"
    assert (
        main(
            [
                "bench",
                *common,
                "--prompts",
                str(prompts),
                "--methods",
                "plain,token-recycling,hybrid,hybrid:pl+tr",
                "--recycling",
                str(tmp_path / "tr"),
                "--max-new-tokens",
                "6",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert data["setting"]["methods"]["hybrid:pl+tr"]["parts"] == ["pl", "tr"]
    for name in ("token-recycling", "hybrid", "hybrid:pl+tr"):
        assert data["methods"][name]["lossless_rate"] == 1.0, name


def test_model_free_drafters_refuse_unknown_keywords_by_name():
    """A misspelled setting is a TypeError naming the settings the drafter takes, not a stray config attribute."""
    from hf_speculative import SuffixDrafter, TokenRecyclingDrafter

    with pytest.raises(TypeError, match="max_node;.*max_nodes"):
        TokenRecyclingDrafter(max_node=3)
    with pytest.raises(TypeError, match="alpah;.*alpha"):
        SuffixDrafter(alpah=1.0)
    with pytest.raises(TypeError, match="alpah"):
        SuffixDrafter(SuffixDrafter().config, alpah=1.0)
    assert TokenRecyclingDrafter(4, max_nodes=12).max_nodes == 12
    assert SuffixDrafter(max_nodes=10).config.max_nodes == 10
