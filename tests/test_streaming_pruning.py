"""Parallel tree pruning of Speculative Streaming (Sec. 3.1.3): exactly the subtrees below the threshold go,
the kept nodes and the cache are what an unpruned forward over the kept tree gives, greedy stays exact."""

from __future__ import annotations

import pytest
import torch
from conftest import FP32_LAYERS, tiny_chat_model, tiny_model
from transformers import DynamicCache

import hf_speculative as hfs
from hf_speculative._compat import cache_arg
from hf_speculative.drafters.streaming import LlamaForSpeculativeStreaming
from hf_speculative.drafters.streaming.pruning import prune_tree, transition_probabilities
from hf_speculative.drafters.streaming.training_pruning import early_exit_accuracy, train_pruning_head
from hf_speculative.drafters.streaming.training_speculative_streaming import IGNORE_INDEX
from hf_speculative.engine.tree_forward import verification_forward
from hf_speculative.engine.trees import DraftTree, tree_attention_mask
from hf_speculative.training.trainer import HiddenStates


def _pruned_ss(arch="llama", seed=0, layer=2, threshold=0.0, num_streams=3):
    base = tiny_model(arch, seed=seed, num_layers=4)
    ss = LlamaForSpeculativeStreaming.from_base_model(base, num_streams=num_streams, num_msa_layers=2)
    ss.add_pruning_head(layer, rank=4, threshold=threshold)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # random NON-ZERO streams and early-exit adapter
        for p in ss.streams.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return base, ss


def _assert_caches_equal(cache, reference, length: int) -> None:
    """Every layer of ``cache`` holds ``length`` columns, equal to ``reference``'s."""
    for a, b in zip(cache.layers, reference.layers):
        assert a.keys.shape[-2] == length
        torch.testing.assert_close(a.keys, b.keys, **FP32_LAYERS)
        torch.testing.assert_close(a.values, b.values, **FP32_LAYERS)


def _greedy_prompts():
    """(prompt, new tokens): a short and a longer random prompt."""
    for seed, (length, new) in enumerate([(3, 20), (10, 30)]):
        yield torch.randint(0, 96, (1, length), generator=torch.Generator().manual_seed(seed)), new


def _ragged_batch():
    """Two random prompts (4 and 9 tokens) and their left-padded batch with its attention mask."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 96, (n,), generator=g) for n in (4, 9)]
    ids = torch.zeros(2, 9, dtype=torch.long)
    attention_mask = torch.zeros(2, 9, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, 9 - len(p) :], attention_mask[b, 9 - len(p) :] = p, 1
    return prompts, ids, attention_mask


def _subtree_rule(draft: DraftTree, probs, threshold) -> list[int]:
    """Independent statement of the rule: a node stays iff it and all its ancestors reach the threshold."""
    return [i for i in range(len(draft)) if all(float(probs[a]) >= threshold for a in draft.path_to(i))]


def test_prune_tree_by_hand():
    #        0
    #      1   2
    #     3 4   5
    #     6
    draft = DraftTree(tokens=torch.arange(7), parents=(-1, 0, 0, 1, 1, 2, 3))
    probs = torch.tensor([1.0, 0.5, 0.05, 0.2, 0.09, 0.9, 0.3])
    assert prune_tree(draft, probs, 0.1) == [0, 1, 3, 6]  # 2 goes with its child 5 (0.9); 4 is below
    assert prune_tree(draft, probs, 0.0) == list(range(7))
    assert prune_tree(draft, probs, 0.6) == [0]
    kept = draft.select([0, 1, 3, 6])
    assert kept.parents == (-1, 0, 1, 2) and kept.tokens.tolist() == [0, 1, 3, 6]
    with pytest.raises(ValueError):
        draft.select([0, 3])  # 3's parent 1 is missing


def test_pruned_forward_removes_exactly_the_subtrees_below_the_threshold(arch):
    base, ss = _pruned_ss(arch, seed=3, layer=2)
    prefix = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(4))
    spec = hfs.TreeSpec.cartesian([3, 2, 2])
    tokens = torch.randint(0, 96, (len(spec.parents),), generator=torch.Generator().manual_seed(5))
    draft = DraftTree.from_spec(spec, tokens)
    past = prefix.shape[1]
    mask = tree_attention_mask(draft.ancestors, past, base.dtype, "cpu")
    positions = (past + draft.depths)[None]

    def prefilled():
        cache = DynamicCache(config=base.config)
        with torch.no_grad():
            base(prefix, **cache_arg(cache), use_cache=True)
        return cache

    with torch.no_grad():  # the unpruned forward: transition probabilities from the state after layer 2
        full = base(
            tokens[None],
            attention_mask=mask,
            position_ids=positions,
            **cache_arg(prefilled()),
            use_cache=True,
            output_hidden_states=True,
        )
        layer_state = full.hidden_states[2][0]
        inner_logits = base.lm_head(ss.model.norm(layer_state + ss.streams.pruning(layer_state)))
        probs = torch.ones(len(draft))
        for i in range(1, len(draft)):
            probs[i] = torch.softmax(inner_logits[draft.parents[i]], -1)[tokens[i]]
    torch.testing.assert_close(transition_probabilities(ss, layer_state, draft), probs, **FP32_LAYERS)
    # halfway between the two middle probabilities: no node sits at the threshold, where another BLAS's last bits
    # could tip it either way (the median itself is one node's probability)
    middle = probs[1:].sort().values[(len(draft) - 1) // 2 - 1 : (len(draft) - 1) // 2 + 1]
    threshold = float(middle.mean())
    expected = _subtree_rule(draft, probs, threshold)
    assert 1 < len(expected) < len(draft)

    cache = prefilled()
    ss.config.pruning_threshold = threshold
    drafter = ss.get_self_drafter()
    assert drafter.pruning_layer == 2
    mask_for = lambda drafts, positions: tree_attention_mask(drafts[0].ancestors, past, base.dtype, "cpu")  # noqa: E731
    with torch.no_grad():  # the engine's one forward of the target, the drafter's hook pruning inside it
        out, (kept,) = verification_forward(
            base,
            drafter,
            [draft],
            mask_for,
            input_ids=tokens[None],
            attention_mask=mask,
            position_ids=positions,
            **cache_arg(cache),
            use_cache=True,
            output_hidden_states=True,
        )
    assert kept.tokens.tolist() == tokens[expected].tolist()
    assert kept.parents == draft.select(expected).parents
    index = torch.tensor(expected)
    torch.testing.assert_close(out.logits[0], full.logits[0, index], **FP32_LAYERS)
    torch.testing.assert_close(
        out.hidden_states[ss.config.first_msa_layer][0],
        full.hidden_states[ss.config.first_msa_layer][0, index],
        **FP32_LAYERS,
    )
    # every layer caches the prefix plus exactly the kept nodes, as an unpruned forward over the kept tree would
    reference = prefilled()
    with torch.no_grad():
        base(
            kept.tokens[None],
            attention_mask=tree_attention_mask(kept.ancestors, past, base.dtype, "cpu"),
            position_ids=(past + kept.depths)[None],
            **cache_arg(reference),
            use_cache=True,
        )
    _assert_caches_equal(cache, reference, past + len(expected))


@pytest.mark.parametrize("layer", [1, 2])
def test_greedy_equality_with_pruning(arch, layer):
    base, ss = _pruned_ss(arch, seed=7, layer=layer, threshold=0.012)  # vocab 96: about uniform
    sizes = []
    for ids, new in _greedy_prompts():
        ref = base.generate(ids, max_new_tokens=new, do_sample=False)
        out = ss.generate(ids, max_new_tokens=new, do_sample=False, return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        sizes += out.speculative_stats.tree_sizes
        # as the assistant of its base model too
        assert torch.equal(hfs.enable(base).generate(ids, assistant_model=ss, max_new_tokens=new, do_sample=False), ref)
    full = len(ss.config.tree.parents)
    assert min(sizes) < full  # the trees were pruned


def test_pruning_is_active_and_exact_in_a_batch(arch):
    """Two left-padded rows: each row's tree is pruned by its own early exit inside the engine's one forward,
    and each row equals its own plain greedy decoding."""
    base, ss = _pruned_ss(arch, seed=7, layer=2, threshold=0.012)
    prompts, ids, attention_mask = _ragged_batch()
    calls = []
    hfs.enable(base)  # before the hook: enable checks the engine's decoder loop against the model's forward
    handle = base.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        out = base.generate(
            ids,
            attention_mask=attention_mask,
            assistant_model=ss,
            max_new_tokens=16,
            do_sample=False,
            return_dict_in_generate=True,
        )
    finally:
        handle.remove()
    stats = out.speculative_stats
    assert len(calls) == stats.num_target_forwards  # the engine's forwards only, one per step
    full = len(ss.config.tree.parents)
    assert all(min(r.tree_sizes[1:]) < full for r in stats.rows)  # both rows' trees were pruned
    for b, p in enumerate(prompts):
        ref = base.generate(p[None], max_new_tokens=16, do_sample=False)
        assert out.sequences[b, 9 - len(p) : 9 - len(p) + ref.shape[1]].tolist() == ref[0].tolist()


def test_no_pruning_when_sampling_or_threshold_zero():
    base, ss = _pruned_ss("llama", seed=9, layer=2, threshold=1.0)  # greedy: every node but the root goes
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    full = len(ss.config.tree.parents)
    greedy = ss.generate(ids, max_new_tokens=8, do_sample=False, return_dict_in_generate=True).speculative_stats
    assert set(greedy.tree_sizes) == {1} and greedy.mean_accepted_length == 1.0
    # exact sampling keyed by position drafts top-k candidates and commits the keyed draw whatever was drafted:
    # pruning them is safe, as in greedy decoding
    sampled = ss.generate(ids, max_new_tokens=8, do_sample=True, return_dict_in_generate=True).speculative_stats
    assert set(sampled.tree_sizes) == {1}
    rejection = ss.generate(
        ids, max_new_tokens=8, do_sample=True, speculative_acceptance="rejection", return_dict_in_generate=True
    ).speculative_stats
    assert set(rejection.tree_sizes) == {full}  # pruning sampled candidates would bias tree rejection sampling: off
    ss.config.pruning_threshold = 0.0
    off = ss.generate(ids, max_new_tokens=8, do_sample=False, return_dict_in_generate=True).speculative_stats
    assert set(off.tree_sizes) == {full}


def test_pruning_config_is_checked_and_saved(tmp_path):
    base, ss = _pruned_ss("llama", seed=11, layer=2, threshold=0.05)
    with pytest.raises(ValueError, match="pruning_layer"):
        ss.add_pruning_head(3)  # layer 3 is an MSA layer of this 4-layer model
    with pytest.raises(ValueError, match="pruning_layer"):
        type(ss.config)(num_hidden_layers=4, num_msa_layers=2, pruning_threshold=0.1)
    ss.save_pretrained(tmp_path)
    loaded = LlamaForSpeculativeStreaming.from_pretrained(tmp_path, base_model=base)
    assert loaded.config.pruning_layer == 2 and loaded.config.pruning_threshold == 0.05
    for (name, a), (_, b) in zip(ss.streams.state_dict().items(), loaded.streams.state_dict().items()):
        assert torch.equal(a, b), name
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(2))
    assert torch.equal(
        loaded.generate(ids, max_new_tokens=10, do_sample=False), ss.generate(ids, max_new_tokens=10, do_sample=False)
    )


def test_training_the_early_exit_raises_its_accuracy():
    base, ss = _pruned_ss("llama", seed=12, layer=2)
    with torch.no_grad():
        ss.streams.pruning.lora_B.zero_()
    ids = torch.randint(0, 96, (1, 4), generator=torch.Generator().manual_seed(13))
    text = base.generate(ids, max_new_tokens=60, do_sample=False)[0]
    with torch.no_grad():
        h = base(text[None], output_hidden_states=True).hidden_states[2][0].half()
    labels = text.clone()
    labels[:4] = IGNORE_INDEX
    states = HiddenStates(h, text, labels, torch.tensor([0, len(text)]), ["a"])
    streams_before = [p.clone() for n, p in ss.streams.named_parameters() if not n.startswith("pruning.")]
    before = early_exit_accuracy(ss, states)
    train_pruning_head(
        ss, states, output_dir="/tmp/ss_pruning_test", max_steps=40, learning_rate=3e-2, batch_size=1, progress=False
    )
    assert early_exit_accuracy(ss, states) > max(before, 0.5)
    streams_after = [p for n, p in ss.streams.named_parameters() if not n.startswith("pruning.")]
    assert all(torch.equal(a, b) for a, b in zip(streams_before, streams_after))  # only the early exit trained
    assert all(p.requires_grad for p in ss.streams.parameters())


# --------------------------------------------------------------------------- shared mode (the paper's downstream mode)


def _pruned_shared(arch="llama", seed=0, layer=2, threshold=0.0):
    """Shared mode on a 5-layer base (MSA layers 3-4): random NON-ZERO streams, LoRA and early-exit adapter."""
    base = tiny_model(arch, seed=seed, num_layers=5)
    ss = LlamaForSpeculativeStreaming.from_base_model(base, num_streams=3, num_msa_layers=2, mode="shared", lora_rank=4)
    ss.add_pruning_head(layer, rank=4, threshold=threshold)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in ss.trainable_parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return base, ss


def test_shared_pruned_forward_equals_the_joint_forward_over_the_kept_tree(arch):
    """Inside the engine's one (joint) forward the hook prunes at layer l; the main logits, the streams of every
    kept node and every layer's cache equal those of an unpruned joint forward over the kept tree."""
    _, ss = _pruned_shared(arch, seed=3, layer=2)
    prefix = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(4))
    spec = hfs.TreeSpec.cartesian([3, 2, 2])
    tokens = torch.randint(0, 96, (len(spec.parents),), generator=torch.Generator().manual_seed(5))
    draft = DraftTree.from_spec(spec, tokens)
    past = prefix.shape[1]
    dtype = ss.base.dtype

    def prefilled():
        cache = DynamicCache(config=ss.base.config)
        with torch.no_grad():
            ss(prefix, cache=cache, use_cache=True)
        return cache

    def tree_inputs(d):
        return dict(
            input_ids=d.tokens[None],
            attention_mask=tree_attention_mask(d.ancestors, past, dtype, "cpu"),
            position_ids=(past + d.depths)[None],
            use_cache=True,
            output_hidden_states=True,
        )

    with torch.no_grad():
        full = ss(**tree_inputs(draft), cache=prefilled())
        probs = transition_probabilities(ss, full.hidden_states[2][0], draft)
    middle = probs[1:].sort().values[(len(draft) - 1) // 2 - 1 : (len(draft) - 1) // 2 + 1]
    ss.config.pruning_threshold = float(middle.mean())  # no node sits at the threshold
    expected = _subtree_rule(draft, probs, ss.config.pruning_threshold)
    assert 1 < len(expected) < len(draft)

    cache = prefilled()
    mask_for = lambda drafts, positions: tree_attention_mask(drafts[0].ancestors, past, dtype, "cpu")  # noqa: E731
    with torch.no_grad():
        out, (kept,) = verification_forward(
            ss, ss.get_self_drafter(), [draft], mask_for, **tree_inputs(draft), cache=cache
        )
    assert kept.tokens.tolist() == tokens[expected].tolist() and kept.parents == draft.select(expected).parents
    reference = prefilled()
    with torch.no_grad():
        alone = ss(**tree_inputs(kept), cache=reference)
    torch.testing.assert_close(out.logits, alone.logits, **FP32_LAYERS)
    torch.testing.assert_close(out.stream_states, alone.stream_states, **FP32_LAYERS)
    _assert_caches_equal(cache, reference, past + len(expected))


@pytest.mark.parametrize("layer", [1, 2])
def test_shared_greedy_equality_with_pruning(arch, layer):
    """Shared mode with pruning: speculative greedy output equals the same model's own plain greedy decoding."""
    _, ss = _pruned_shared(arch, seed=7, layer=layer, threshold=0.012)  # vocab 96: about uniform
    sizes = []
    for ids, new in _greedy_prompts():
        want = ss.generate_autoregressive(ids, max_new_tokens=new, do_sample=False)
        out = ss.generate(ids, max_new_tokens=new, do_sample=False, return_dict_in_generate=True)
        assert torch.equal(out.sequences, want)
        sizes += out.speculative_stats.tree_sizes
    assert min(sizes) < len(ss.config.tree.parents)  # the trees were pruned


def test_shared_pruning_is_active_and_exact_in_a_ragged_batch():
    _, ss = _pruned_shared("llama", seed=7, layer=2, threshold=0.012)
    prompts, ids, attention_mask = _ragged_batch()
    out = ss.generate(
        ids, attention_mask=attention_mask, max_new_tokens=16, do_sample=False, return_dict_in_generate=True
    )
    full = len(ss.config.tree.parents)
    assert all(min(r.tree_sizes[1:]) < full for r in out.speculative_stats.rows)  # both rows' trees were pruned
    for b, p in enumerate(prompts):
        want = ss.generate_autoregressive(p[None], max_new_tokens=16, do_sample=False)
        assert out.sequences[b, 9 - len(p) : 9 - len(p) + want.shape[1]].tolist() == want[0].tolist()


def test_shared_pruning_layer_is_a_plain_layer_and_reads_the_adapted_states():
    from hf_speculative.drafters.streaming.training_pruning import pruning_states
    from hf_speculative.training.data import Record

    base, tok = tiny_chat_model(num_layers=5)
    ss = LlamaForSpeculativeStreaming.from_base_model(base, num_streams=2, num_msa_layers=2, mode="shared", lora_rank=4)
    with pytest.raises(ValueError, match=r"pruning_layer=3 must be in 1\.\.2"):
        ss.add_pruning_head(3)  # the last plain layer: shared mode's MSA layers are not decoder-layer calls
    assert ss.config.pruning_layer is None  # the refused call changed nothing
    ss.add_pruning_head(2, rank=4)
    with torch.no_grad():  # non-zero LoRA: the early exit must read the adapted model's states, not the base's
        for name, p in base.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    states = pruning_states(
        ss, tok, [Record("a", ["hello there"], answers=["general kenobi"])], max_length=64, progress=False
    )
    with torch.no_grad():
        expected = ss(states.input_ids[None], output_hidden_states=True).hidden_states[2][0]
        for name, p in base.named_parameters():
            if "lora_B" in name:
                p.zero_()
        unadapted = ss(states.input_ids[None], output_hidden_states=True).hidden_states[2][0]
    torch.testing.assert_close(states.hidden.float(), expected, rtol=2e-3, atol=2e-3)  # stored in fp16
    assert not torch.allclose(states.hidden.float(), unadapted, rtol=2e-3, atol=2e-3)
