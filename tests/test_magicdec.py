"""MagicDec baseline: the target drafting for itself over a StreamingLLM sparse KV cache. Greedy equality past the
window on Llama, Mistral and Qwen2 for both position modes (chain and a small tree), the sink + window columns by
hand, the re-rotation of sink keys against keys recomputed at the new positions, drafting against a literal
sparse-cache implementation, batched ragged rows, clear errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import FP32_LAYERS, tiny_model
from test_drafter_protocol import begin_one, propose_one
from transformers import DynamicCache

import hf_speculative as hfs
from hf_speculative._compat import cache_arg, get_cache
from hf_speculative.drafters.magicdec import rerotate_keys
from hf_speculative.drafters.sparse_cache import streaming_slots
from hf_speculative.drafters.spire import chain_with_alternatives
from hf_speculative.engine.rows import TargetRows, cache_columns
from hf_speculative.engine.trees import DraftingOptions

WINDOW = 8  # small enough that 12 prompt + 30 new tokens go well past it


def _target(arch: str = "llama", seed: int = 1, **overrides):
    return hfs.enable(tiny_model(arch, seed=seed, **overrides))


def _prompts(n: int = 2, length: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (1, length), generator=g) for _ in range(n)]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_greedy_equality_past_the_window(arch):
    model = _target(arch)
    accepted = []
    for positions in ("cache", "original"):
        drafter = hfs.MagicDecDrafter(model, sliding_window=WINDOW, num_sink_tokens=1, positions=positions)
        assert drafter.default_tree == hfs.TreeSpec.chain(4)
        # the default chain, and a small tree (the chain with its next candidates as leaves)
        for ids, tree in zip(_prompts(), (None, chain_with_alternatives(3, 2))):
            plain = model.generate(ids, max_new_tokens=30, do_sample=False)
            out = model.generate(
                ids,
                assistant_model=drafter,
                speculative_tree=tree,
                max_new_tokens=30,
                do_sample=False,
                return_dict_in_generate=True,
            )
            assert torch.equal(out.sequences, plain), (positions, tree)
            accepted += out.speculative_stats.accepted_lengths[1:]
    assert min(accepted) == 1 and max(accepted) > 1  # the sparse draft is accepted sometimes, rejected sometimes


def test_full_window_drafts_exactly_the_target():
    """With a window longer than the text the sparse cache is the whole cache: every drafted token is accepted."""
    model = _target()
    ids = _prompts(1)[0]
    drafter = hfs.MagicDecDrafter(model, sliding_window=64, num_draft_tokens=3)
    out = model.generate(ids, assistant_model=drafter, max_new_tokens=17, do_sample=False, return_dict_in_generate=True)
    assert out.speculative_stats.accepted_lengths == [1, 4, 4, 4, 4]


def test_sink_and_window_columns_by_hand():
    # 10 cached tokens, W = 4, S = 1: the sink 0 and the last W - 1 = 3 positions 7, 8, 9
    positions, valid = streaming_slots(10, window=4, sinks=1)
    assert positions.tolist() == [0, 7, 8, 9] and valid.all()
    # 3 cached tokens: no gap; the first window slot would repeat the sink, so it is empty
    positions, valid = streaming_slots(3, window=4, sinks=1)
    assert positions[valid].tolist() == [0, 1, 2] and valid.tolist() == [True, False, True, True]
    # 2 sinks, window 1: the sinks only; a single token fills one sink slot
    assert streaming_slots(9, window=1, sinks=2)[0].tolist() == [0, 1]
    assert streaming_slots(1, window=3, sinks=2)[1].tolist() == [True, False, False, False]
    # no sinks: the window alone
    assert streaming_slots(6, window=3, sinks=0)[0].tolist() == [4, 5]

    # the columns of a cache: column c of every layer holds the value c (+ 100 * layer)
    cache = DynamicCache()
    for layer in range(2):
        keys = (torch.arange(10.0) + 100 * layer)[None, None, :, None].expand(1, 2, 10, 3).clone()
        cache.update(keys, -keys, layer)
    kv = cache_columns(cache, torch.tensor([0, 7, 8, 9]))
    assert [k[0, 0, :, 0].tolist() for k, _ in kv] == [[0, 7, 8, 9], [100, 107, 108, 109]]
    assert kv[1][1][0, 1, :, 2].tolist() == [-100, -107, -108, -109]

    # a row of a batched cache with left padding and holes: indices count the row's real tokens
    batched = DynamicCache()
    keys = torch.arange(20.0).reshape(2, 1, 10, 1)  # row 1 = 10 .. 19
    batched.update(keys, keys, 0)
    real = torch.tensor([[True] * 10, [False, False, True, True, False, True, True, True, True, True]])

    out = SimpleNamespace(logits=torch.zeros(2, 1, 5), **cache_arg(batched))
    row = TargetRows(out, columns=real).row(1)
    assert get_cache(row).get_seq_length() == 7
    ((k, _),) = cache_columns(get_cache(row), torch.tensor([0, 4, 5, 6]))
    assert k[0, 0, :, 0].tolist() == [12, 17, 18, 19]

    # the drafter copies exactly those columns out of the target's cache
    model = _target()
    ids = _prompts(1, length=20)[0]
    out = model(ids, use_cache=True)
    drafter = hfs.MagicDecDrafter(model, sliding_window=WINDOW, num_sink_tokens=2)
    drafter.begin(ids, out)
    assert drafter.slot_positions.tolist() == [0, 1, 13, 14, 15, 16, 17, 18, 19]
    for (k, v), layer in zip(drafter.kv, get_cache(out).layers):
        assert torch.equal(k, layer.keys[:, :, [0, 1, 13, 14, 15, 16, 17, 18, 19]])
        assert torch.equal(v, layer.values[:, :, [0, 1, 13, 14, 15, 16, 17, 18, 19]])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sink_rerotation_equals_keys_recomputed_at_new_positions(arch):
    """Two sink tokens cached at positions 0, 1 and re-rotated by delta equal the keys a forward computes for them at
    positions delta, delta + 1 (their hidden states depend on relative positions only), in every layer."""
    model = _target(arch)
    sinks = torch.tensor([[5, 17]])
    at_zero = get_cache(model(sinks, position_ids=torch.tensor([[0, 1]]), use_cache=True))
    inv_freq = model.model.rotary_emb.inv_freq
    for delta in (1, 7, 300):
        moved = get_cache(model(sinks, position_ids=torch.tensor([[delta, delta + 1]]), use_cache=True))
        for layer, ref in zip(at_zero.layers, moved.layers):
            rotated = rerotate_keys(layer.keys, torch.tensor([delta]), inv_freq)
            torch.testing.assert_close(rotated, ref.keys, rtol=1e-5, atol=1e-5)
            assert not torch.allclose(layer.keys, ref.keys, atol=1e-3)  # the rotation really moved them
    # per row: row b moves by delta[b]
    both = rerotate_keys(torch.cat([at_zero.layers[0].keys] * 2), torch.tensor([0, 7]), inv_freq)
    torch.testing.assert_close(both[0], at_zero.layers[0].keys[0])
    torch.testing.assert_close(
        rerotate_keys(both[1:], torch.tensor([-7]), inv_freq), at_zero.layers[0].keys, rtol=1e-5, atol=1e-5
    )


def _literal_chain_probs(
    model, cache, tokens, root: int, window: int, sinks: int, cache_positions: bool
) -> list[torch.Tensor]:
    """A literal StreamingLLM draft: per depth, the visible entries (sinks, then the last W - 1 positions) in a fresh
    cache, every key rotated at its index within that cache (``cache_positions``) or its text position, the query at
    its cache index (or text position). Returns each depth's next-token distribution."""
    inv_freq = model.model.rotary_emb.inv_freq
    entries = {
        p: [(layer.keys[:, :, p : p + 1], layer.values[:, :, p : p + 1]) for layer in cache.layers] for p in range(root)
    }
    probs = []
    for d, token in enumerate(tokens):
        query = root + d
        visible = [p for p in sorted(entries) if p < sinks or query - p < window]
        fresh = DynamicCache()
        for i in range(len(cache.layers)):
            keys = []
            for idx, p in enumerate(visible):
                k = entries[p][i][0]
                keys.append(rerotate_keys(k, torch.tensor([idx - p]), inv_freq) if cache_positions else k)
            fresh.update(torch.cat(keys, 2), torch.cat([entries[p][i][1] for p in visible], 2), i)
        position = len(visible) if cache_positions else query
        out = model(
            input_ids=torch.tensor([[token]]),
            position_ids=torch.tensor([[position]]),
            **cache_arg(fresh),
            use_cache=True,
        )
        probs.append(torch.softmax(out.logits[0, -1].float(), -1))
        # the drafted token's key, stored at its text position
        new = [(layer.keys[:, :, -1:], layer.values[:, :, -1:]) for layer in fresh.layers]
        if cache_positions:
            new = [(rerotate_keys(k, torch.tensor([query - position]), inv_freq), v) for k, v in new]
        entries[query] = new
    return probs


@pytest.mark.parametrize("positions", ["cache", "original"])
def test_drafting_equals_a_literal_sparse_cache(positions):
    model = _target("qwen2")
    ids = _prompts(1, length=20)[0]
    out = model(ids, use_cache=True)
    seq = torch.cat([ids, torch.tensor([[7]])], 1)
    for sinks in (1, 2):
        drafter = hfs.MagicDecDrafter(model, sliding_window=WINDOW, num_sink_tokens=sinks, positions=positions)
        begin_one(drafter, ids, out)
        tree = hfs.TreeSpec.chain(4)
        draft = propose_one(
            drafter, seq, tree, DraftingOptions(do_sample=True, generator=torch.Generator().manual_seed(0))
        )
        chain = draft.tokens[:4].tolist()  # the root and the drafted tokens each chain forward reads
        ref = _literal_chain_probs(model, get_cache(out), chain, ids.shape[1], WINDOW, sinks, positions == "cache")
        torch.testing.assert_close(draft.draft_probs[:4], torch.stack(ref), **FP32_LAYERS)
    # the two modes really differ once the window has left a gap after the sinks
    other = hfs.MagicDecDrafter(model, sliding_window=WINDOW, positions="original" if positions == "cache" else "cache")
    begin_one(other, ids, out)
    mine = hfs.MagicDecDrafter(model, sliding_window=WINDOW, positions=positions)
    begin_one(mine, ids, out)
    options = DraftingOptions(do_sample=True)
    p, q = (propose_one(d, seq, hfs.TreeSpec.chain(1), options).draft_probs[0] for d in (mine, other))
    assert (p - q).abs().max() > 1e-4


@pytest.mark.parametrize("positions", ["cache", "original"])
def test_batched_ragged_greedy_equality(positions):
    model = _target("qwen2", seed=2)
    drafter = hfs.MagicDecDrafter(model, sliding_window=WINDOW, positions=positions)
    ids = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :2] = 0
    ids[mask == 0] = 0
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    out = model.generate(
        ids,
        attention_mask=mask,
        assistant_model=drafter,
        max_new_tokens=24,
        do_sample=False,
        pad_token_id=0,
        speculative_tree=chain_with_alternatives(3, 2),
    )
    assert torch.equal(out, ref)


def test_model_sliding_window_is_honoured():
    """A Mistral with its own sliding window (shorter than the text): the draft's mask applies it too."""
    model = _target("mistral", seed=3, sliding_window=6)
    ids = _prompts(1)[0]
    plain = model.generate(ids, max_new_tokens=20, do_sample=False)
    for positions in ("cache", "original"):
        drafter = hfs.MagicDecDrafter(model, sliding_window=4, num_sink_tokens=2, positions=positions)
        assert torch.equal(model.generate(ids, assistant_model=drafter, max_new_tokens=20, do_sample=False), plain)


def test_clear_errors():
    model = _target()
    ids = _prompts(1)[0]
    for kwargs, match in (
        (dict(sliding_window=0), "sliding_window"),
        (dict(num_sink_tokens=-1), "num_sink_tokens"),
        (dict(num_draft_tokens=0), "num_draft_tokens"),
        (dict(num_draft_tokens=2.5), "num_draft_tokens"),
        (dict(positions="text"), "positions"),
        (dict(draft_sampling="greedy"), "draft_sampling"),
        (dict(sliding_window=4, num_draft_tokens=6), "fit in the window"),
    ):
        with pytest.raises(ValueError, match=match):
            hfs.MagicDecDrafter(model, **kwargs)
    with pytest.raises(TypeError, match="PreTrainedModel"):
        hfs.MagicDecDrafter("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(TypeError, match="static"):
        hfs.MagicDecDrafter(model, tree=hfs.DynamicTree())
    drafter = hfs.MagicDecDrafter(model, sliding_window=WINDOW)
    with pytest.raises(ValueError, match="at most 8 levels"):
        model.generate(ids, assistant_model=drafter, speculative_tree=hfs.TreeSpec.chain(9), max_new_tokens=4)
    with pytest.raises(TypeError, match="DynamicTree has no fixed shape and MagicDecDrafter fills static trees only"):
        model.generate(ids, assistant_model=drafter, speculative_tree=hfs.DynamicTree(8, 3, 2), max_new_tokens=4)
    other = _target(seed=3, vocab_size=64)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        other.generate(ids.clamp_max(63), assistant_model=drafter, max_new_tokens=4)
    # positions="cache" re-rotates keys: it needs RoPE frequencies fixed whatever the length
    dynamic = _target(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="rope_type='dynamic'"):
        hfs.MagicDecDrafter(dynamic)
    hfs.MagicDecDrafter(dynamic, positions="original")
    eager = _target()
    eager.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        hfs.MagicDecDrafter(eager)
