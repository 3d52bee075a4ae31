"""SPIRe drafter: greedy equality past the sparse window on Llama, Mistral and Qwen2, the StreamingLLM mask by hand,
feedback memory, target activations as memory at verified positions, the training forward against drafting,
MixedLoss by hand, training, save / load, sampling exactness, the train command."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import FP32_LAYERS, tiny_model
from test_drafter_protocol import begin_one, propose_one
from test_sampling import ALPHA, NEW, VOCAB, _batched_sample_counts, _exact_generate, chi_square_pvalue
from transformers import AutoModel

import hf_speculative as hfs
from hf_speculative.drafters.eagle.training_eagle import hidden_states_from_model
from hf_speculative.drafters.sparse_cache import sparse_visibility
from hf_speculative.drafters.spire import SpireTreeDrafter, chain_with_alternatives
from hf_speculative.drafters.spire.training_spire import (
    SpireCollator,
    SpireDataset,
    mixed_loss,
    spire_loss,
    train_spire,
)
from hf_speculative.engine.trees import DraftingOptions

WINDOW = 8  # small enough that 12 prompt + 40 new tokens go well past it


def _target(arch: str = "llama", seed: int = 1):
    model = hfs.enable(tiny_model(arch, seed=seed))
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _spire(model, seed: int = 0, **kwargs):
    """A drafter with its layers moved off the target's (an imperfect drafter, so that verification rejects)."""
    drafter = hfs.SpireDrafter.from_base_model(model, num_layers=2, sliding_window=WINDOW, num_sink_tokens=1, **kwargs)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.layers.parameters():
            p.add_(0.3 * p.std() * torch.randn(p.shape, generator=g))
    return drafter


def _prompts(n: int = 3, length: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (1, length), generator=g) for _ in range(n)]


def _check_greedy(model, drafter, max_new_tokens: int = 40):
    for ids in _prompts():
        plain = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        out = model.generate(
            ids, assistant_model=drafter, max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True
        )
        assert torch.equal(out.sequences, plain)
        assert out.speculative_stats.mean_accepted_length >= 1.0


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_greedy_equality_past_the_window(arch):
    model = _target(arch)
    drafter = _spire(model)
    assert drafter.config.target_layers == [2, 3]
    _check_greedy(model, drafter)
    # a tree of another shape (filled from the chain's per-depth distributions) and a plain chain
    for tree in (hfs.TreeSpec.cartesian([2, 2]), hfs.TreeSpec.chain(4)):
        ids = _prompts(1)[0]
        plain = model.generate(ids, max_new_tokens=30, do_sample=False)
        assert torch.equal(
            model.generate(ids, assistant_model=drafter, speculative_tree=tree, max_new_tokens=30, do_sample=False),
            plain,
        )


def test_batched_ragged_greedy_equality():
    model = _target("qwen2", seed=2)
    drafter = _spire(model)
    ids = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :2] = 0
    ids[mask == 0] = 0
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    out = model.generate(
        ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=30, do_sample=False, pad_token_id=0
    )
    assert torch.equal(out, ref)


def test_sink_plus_window_mask_by_hand():
    # window 3, 1 sink: position 6 sees 0 (sink) and 4, 5, 6; position 2 sees 0, 1, 2; nothing in the future
    vis = sparse_visibility(torch.tensor([6, 2]), torch.arange(8), window=3, sinks=1)
    assert vis.int().tolist() == [
        [1, 0, 0, 0, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
    ]
    # 2 sinks, window 1: only the sinks and the query itself
    assert sparse_visibility(torch.tensor([5]), torch.arange(6), window=1, sinks=2).int().tolist() == [
        [1, 1, 0, 0, 0, 1]
    ]
    # positions from the original text, not cache slots: keys given out of order keep their meaning
    assert sparse_visibility(torch.tensor([9]), torch.tensor([7, 0, 9, 8, 3]), window=3, sinks=1).int().tolist() == [
        [1, 1, 1, 1, 0]
    ]


def test_feedback_memory_weights_softmax_over_layers():
    model = _target()
    drafter = _spire(model)
    n = drafter.config.num_hidden_layers
    assert drafter.memory_logits.shape == (n, n + 1)
    with torch.no_grad():
        drafter.memory_logits.copy_(torch.randn(n, n + 1))
    w = drafter.memory_weights()
    torch.testing.assert_close(w.sum(-1), torch.ones(n))
    torch.testing.assert_close(w, torch.softmax(drafter.memory_logits, -1))
    acts = [torch.randn(1, 5, 32) for _ in range(n + 1)]
    memory = drafter.feedback_memory(acts)
    for i in range(n):
        torch.testing.assert_close(memory[i], sum(w[i, l] * acts[l] for l in range(n + 1)), **FP32_LAYERS)
    # the initial weights put almost all mass on layer i's own input (a plain transformer's keys)
    fresh = hfs.SpireDrafter.from_base_model(model, num_layers=2)
    assert all(fresh.memory_weights()[i, i] > 0.9 for i in range(n))


class _Outputs:
    def __init__(self, hidden_states):
        self.hidden_states = hidden_states


def test_target_activations_are_the_memory_of_verified_positions():
    model = _target()
    drafter = _spire(model)
    ids = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(3))
    hs = model(ids, output_hidden_states=True).hidden_states
    td = SpireTreeDrafter(drafter)
    td.begin(ids[:, :20], _Outputs([h[:, :20] for h in hs]))
    # the cache: the sink and the last W - 1 verified positions (the next root, 20, sees 13..20)
    assert td.positions.tolist() == [0, *range(13, 20)]
    positions = torch.tensor([[0, *range(13, 20)]])
    expected = drafter.target_memory_kv([hs[i][:, positions[0]] for i in drafter.config.target_layers], positions)
    for (k, v), (ek, ev) in zip(td.kv, expected):
        torch.testing.assert_close(k, ek, **FP32_LAYERS)
        torch.testing.assert_close(v, ev, **FP32_LAYERS)

    # a verification that accepted the root and 2 drafted tokens (tree rows 0, 1, 3): their target rows join
    class Result:
        path = (0, 1, 3)

    rows = torch.tensor([20, 21, 99, 22])  # row 2 is a rejected branch: never used
    td.advance(ids[:, :24], None, Result(), _Outputs([h[:, rows.clamp_max(29)] for h in hs]))
    assert td.positions.tolist() == [0, *range(16, 23)]
    positions = torch.tensor([[0, *range(16, 23)]])
    expected = drafter.target_memory_kv([hs[i][:, positions[0]] for i in drafter.config.target_layers], positions)
    for (k, v), (ek, ev) in zip(td.kv, expected):
        torch.testing.assert_close(k, ek, **FP32_LAYERS)
        torch.testing.assert_close(v, ev, **FP32_LAYERS)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_training_forward_matches_drafting(arch):
    # the k-pass training forward (Sec. 3.3) computes, row for row, what drafting computes with the same chain
    model = _target(arch)
    drafter = _spire(model)
    with torch.no_grad():
        drafter.memory_logits.copy_(
            torch.randn(drafter.memory_logits.shape, generator=torch.Generator().manual_seed(0))
        )
    ids = torch.randint(0, 96, (1, 31), generator=torch.Generator().manual_seed(1))
    hs = model(ids, output_hidden_states=True).hidden_states
    memory = [hs[i] for i in drafter.config.target_layers]
    logits = drafter(ids, memory, prefix_rows=1, compute_logits=True, full_vocab=True).logits[0]
    k = drafter.config.num_draft_tokens
    roots = list(range(1, 31 - k, k))  # every block's root; their sparse memories hold 1 to S + W - 1 entries
    states = []
    for b in roots:
        td = SpireTreeDrafter(drafter)
        td.begin(ids[:, :b], _Outputs([h[:, :b] for h in hs]))
        states.append(td)
    # one root at a time, then all roots in one batched forward per depth (memories padded to the longest)
    for group in [[i] for i in range(len(roots))] + [list(range(len(roots)))]:
        teachers = [_Teacher(ids[0, roots[i] + 1 : roots[i] + 1 + k]) for i in group]
        states[0]._draft_chains([states[i] for i in group], [ids[:, : roots[i] + 1] for i in group], teachers)
        for i, teacher in zip(group, teachers):
            for j, row in enumerate(teacher.rows):
                torch.testing.assert_close(row, logits[roots[i] + j].float(), **FP32_LAYERS)


class _Teacher:
    """A chain filler that follows the text (teacher forcing) and keeps each depth's logits."""

    def __init__(self, chain: torch.Tensor):
        self.chain, self.num_forwards, self.rows = chain, len(chain), []

    def __call__(self, d: int, logits: torch.Tensor) -> torch.Tensor:
        self.rows.append(logits)
        return self.chain[d]


def test_mixed_loss_by_hand():
    # q uniform over 3 tokens; the teacher's top-2: p = 0.6 (id 0), 0.3 (id 1)
    logits = torch.zeros(1, 3)
    ids = torch.tensor([[0, 1]])
    logp = torch.tensor([[math.log(0.6), math.log(0.3)]])
    loss, parts = mixed_loss(logits, ids, logp, omega=0.5)
    kd = math.log(3)  # cross-entropy of the renormalized top-2 (2/3, 1/3) to q = 1/3
    alpha = min(0.6, 1 / 3) + min(0.3, 1 / 3)
    assert parts["kd"].item() == pytest.approx(kd, abs=1e-5)
    assert parts["alpha"].item() == pytest.approx(alpha, abs=1e-5)
    assert loss.item() == pytest.approx(0.5 * kd - 0.5 * alpha, abs=1e-5)
    assert mixed_loss(logits, ids, logp, omega=1.0)[0].item() == pytest.approx(kd, abs=1e-5)
    assert mixed_loss(logits, ids, logp, omega=0.0)[0].item() == pytest.approx(-alpha, abs=1e-5)
    # a draft vocabulary without id 1: q is 0 there, so id 1 adds nothing to alpha; q = 1/2 over ids {0, 2}
    index = torch.tensor([0, -1, 1])
    _, parts = mixed_loss(torch.zeros(1, 2), ids, logp, omega=0.5, vocab_index=index)
    assert parts["alpha"].item() == pytest.approx(0.5, abs=1e-5)
    assert parts["kd"].item() == pytest.approx(math.log(2), abs=1e-5)


def _labelled(model, layers, n=12, length=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    return hidden_states_from_model(
        model, [torch.randint(0, 96, (length,), generator=g) for _ in range(n)], layers=layers, top_k=8
    )


def test_dataset_prepends_the_sinks_to_chunks():
    model = _target()
    drafter = _spire(model)
    states = _labelled(model, drafter.config.target_layers, n=2, length=40)
    ds = SpireDataset(states, drafter.config.target_layers, sinks=1, max_length=16)
    first, second = ds[0], ds[1]
    assert first["position_ids"].tolist() == list(range(16))
    assert second["position_ids"].tolist() == [0, *range(16, 31)]  # the conversation's sink, then the chunk
    assert not second["predict"][0] and second["predict"][1:].all()
    torch.testing.assert_close(second["memory"][:, 0], first["memory"][:, 0])
    with pytest.raises(KeyError, match="lacks the target layers"):
        SpireDataset(states, [0, 1], sinks=1)


def test_training_lowers_the_loss_saves_and_reloads(tmp_path):
    model = _target()
    drafter = _spire(model)
    states = _labelled(model, drafter.config.target_layers)
    ds = SpireDataset(states, drafter.config.target_layers, sinks=1, max_length=24)
    batch = SpireCollator()([ds[i] for i in range(len(ds))])
    before = spire_loss(drafter, batch)[0].item()
    train_spire(
        drafter,
        states,
        str(tmp_path / "run"),
        num_epochs=4,
        batch_size=4,
        max_length=24,
        learning_rate=3e-3,
        progress=False,
    )
    with torch.no_grad():
        after = spire_loss(drafter, batch)[0].item()
    assert after < before - 0.05
    _check_greedy(model, drafter)
    drafter.save_pretrained(tmp_path / "spire")
    for loaded in (
        hfs.SpireDrafter.from_pretrained(tmp_path / "spire", base_model=model),
        AutoModel.from_pretrained(tmp_path / "spire"),
    ):
        assert type(loaded).__name__ == "SpireDrafter"
        for (name, p), q in zip(drafter.state_dict().items(), loaded.state_dict().values()):
            torch.testing.assert_close(p, q, msg=name)
        assert loaded.config.sliding_window == WINDOW and loaded.config.target_layers == [2, 3]
        _check_greedy(model, loaded, max_new_tokens=24)


def test_draft_vocabulary_and_clear_errors():
    model = _target()
    drafter = _spire(model)
    drafter.set_draft_vocab(torch.arange(0, 96, 2))
    _check_greedy(model, drafter, max_new_tokens=24)
    with pytest.raises(ValueError, match="sliding_window"):
        hfs.SpireConfig(sliding_window=0)
    with pytest.raises(ValueError, match="layers"):
        hfs.SpireDrafter.from_base_model(model, layers=[7])
    with pytest.raises(ValueError, match="at most 4 levels"):
        model.generate(
            _prompts(1)[0], assistant_model=drafter, speculative_tree=hfs.TreeSpec.chain(6), max_new_tokens=4
        )
    other_small = hfs.enable(tiny_model("llama", seed=3, vocab_size=64))
    with pytest.raises(ValueError, match="vocab_size"):
        other_small.generate(_prompts(1)[0].clamp_max(63), assistant_model=drafter, max_new_tokens=4)
    assert chain_with_alternatives(3, 2).num_nodes == 6


@pytest.mark.slow
@pytest.mark.parametrize(  # one case a tree: the two pytest-xdist workers share them
    "tree",
    [chain_with_alternatives(3, 2), hfs.TreeSpec.cartesian([2, 2])],
    ids=["chain-with-alternatives", "cartesian"],
)
def test_sampling_matches_target_distribution(tree):
    target = hfs.enable(tiny_model("llama", seed=21, vocab_size=VOCAB, num_layers=2))
    drafter = hfs.SpireDrafter.from_base_model(
        target, num_layers=1, sliding_window=2, num_sink_tokens=1, num_draft_tokens=3
    )
    with torch.no_grad():  # a drafter far from the target but not degenerate
        for p in drafter.layers.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    prompt = torch.tensor([[1, 5, 2]])
    kw = dict(temperature=0.7, top_k=4, top_p=1.0)
    exact = _exact_generate(target, prompt, **kw)
    n = 3000
    torch.manual_seed(1234)
    gen = dict(do_sample=True, max_new_tokens=NEW, top_k=4, temperature=0.7)
    counts = _batched_sample_counts(
        lambda ids, mask: target.generate(
            ids, attention_mask=mask, assistant_model=drafter, speculative_tree=tree, **gen
        ),
        prompt,
        n,
    )
    assert chi_square_pvalue(counts, exact, n) > ALPHA, tree


def test_drafting_options_sampling_fills_the_chain_from_its_draws():
    model = _target()
    drafter = _spire(model)
    td = drafter.get_tree_drafter(model)
    ids = _prompts(1)[0]
    begin_one(td, ids, model(ids, output_hidden_states=True))
    seq = torch.cat([ids, torch.tensor([[5]])], 1)
    tree = chain_with_alternatives(4, 2)
    draft = propose_one(td, seq, tree, DraftingOptions(do_sample=True, generator=torch.Generator().manual_seed(0)))
    assert draft.draft_probs is not None and draft.tokens.shape[0] == tree.num_nodes + 1
    inner = [i for i, kids in enumerate(tree.children) if kids]
    torch.testing.assert_close(draft.draft_probs[inner].sum(-1), torch.ones(len(inner)))
