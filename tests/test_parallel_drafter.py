"""ParallelSpec drafter: group-wise training layout, drafting in the tree loop (greedy equality, exact
sampling), its cache, loss, save/load."""

from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import FP32_LAYERS, random_tree, tiny_model
from safetensors import safe_open
from test_sampling import ALPHA, NEW, VOCAB, _batched_sample_counts, _exact_generate, chi_square_pvalue
from transformers import AutoConfig, AutoModel

import hf_speculative as hfs
from hf_speculative.drafters.medusa.modeling_medusa import final_hidden_state
from hf_speculative.drafters.parallel import ParallelTreeDrafter
from hf_speculative.drafters.parallel.training_parallel_drafter import (
    IGNORE_INDEX,
    ParallelGroupCollator,
    ParallelGroupDataset,
    group_layout,
    parallel_depth_losses,
    parallel_loss,
    train_parallel_drafter,
)
from hf_speculative.engine.trees import additive_mask
from hf_speculative.training.trainer import HiddenStates


def _perturb(drafter, scale: float = 0.05, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(scale * p.float().std().clamp_min(0.1) * torch.randn(p.shape, generator=g))
    return drafter


def _drafter(model, k=3, hidden=False, **kw):
    return _perturb(
        hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=k, use_target_hidden_states=hidden, **kw)
    )


# --------------------------------------------------------------------------- training layout


@pytest.mark.parametrize("hidden", [False, True])
def test_group_layout_reproduces_separate_inference_passes(arch, hidden):
    """Each group's rows equal the inference forward over [x_0 .. x_t, MASK_1 .. MASK_k] (causal, positions 0..t+k)."""
    model = tiny_model(arch)
    k, H = 3, model.config.hidden_size
    drafter = _drafter(model, k, hidden)
    ids = torch.randint(0, model.config.vocab_size, (14,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        h = final_hidden_state(model(ids[None], output_hidden_states=True))[0]
    anchors = torch.tensor([0, 2, 3, 8, 13])
    lay = group_layout(ids, anchors, k, model.config.vocab_size)
    prev = torch.zeros(lay["input_ids"].shape[0], H)
    pi = lay["prev_index"]
    prev[pi >= 0] = h[pi[pi >= 0]]
    with torch.no_grad():
        out = drafter(
            lay["input_ids"][None],
            position_ids=lay["position_ids"][None],
            attention_mask=additive_mask(lay["visible"], torch.float32),
            target_hidden_states=prev[None] if hidden else None,
            logits_rows=lay["rows"][None],
        ).logits[0]
        for g, t in enumerate(anchors.tolist()):
            x = torch.cat([ids[: t + 1], drafter.mask_token_ids()])
            p = torch.cat([torch.zeros(1, H), h[:t], torch.zeros(k, H)])[None] if hidden else None
            ref = drafter(x[None], position_ids=torch.arange(t + k + 1)[None], target_hidden_states=p).logits[
                0, -(k + 1) :
            ]
            torch.testing.assert_close(out[g * (k + 1) : (g + 1) * (k + 1)], ref, **FP32_LAYERS)
    # labels: depth d of group t is x_{t+d+1} (or ignored past the end)
    for g, t in enumerate(anchors.tolist()):
        for d in range(k + 1):
            want = int(ids[t + d + 1]) if t + d + 1 < 14 else IGNORE_INDEX
            assert int(lay["row_labels"][g * (k + 1) + d]) == want


def test_group_layout_mask_structure():
    N, k = 6, 2
    lay = group_layout(torch.arange(N), torch.tensor([1, 4]), k, vocab_size=10)
    vis = lay["visible"]
    assert lay["input_ids"].tolist() == [0, 1, 2, 3, 4, 5, 10, 11, 10, 11]
    assert lay["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 2, 3, 5, 6]
    assert not vis[:N, N:].any()  # context never sees a mask
    assert (
        vis[N : N + 2, N + 2 :].sum() == 0 and vis[N + 2 :, N : N + 2].sum() == 0
    )  # no token sees another group's masks
    assert vis[N].tolist() == [1, 1, 0, 0, 0, 0, 1, 0, 0, 0]  # MASK_1 of group 1: x_0, x_1 and itself
    assert vis[N + 3].tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 1, 1]  # MASK_2 of group 4: x_0..x_4, MASK_1, itself


# --------------------------------------------------------------------------- drafting


@pytest.mark.parametrize("hidden", [False, True])
def test_greedy_equality_with_the_drafter(arch, hidden):
    model = hfs.enable(tiny_model(arch, seed=2))
    drafter = _drafter(model, k=3, hidden=hidden)
    rng = random.Random(0)
    trees = [None, hfs.TreeSpec.chain(4), hfs.TreeSpec.cartesian([3, 2, 1]), random_tree(rng, 14, 4)]
    for i, tree in enumerate(trees):
        prompt = torch.randint(0, model.config.vocab_size, (1, 2 + 3 * i), generator=torch.Generator().manual_seed(i))
        ref = model.generate(prompt, max_new_tokens=23, do_sample=False)
        out = model.generate(prompt, assistant_model=drafter, speculative_tree=tree, max_new_tokens=23, do_sample=False)
        assert torch.equal(out, ref)


@pytest.mark.parametrize("hidden", [False, True])
def test_a_drafter_that_predicts_well_commits_several_tokens_per_step(arch, hidden):
    """A one-layer target and a drafter copied from it: the first distribution is the target's own, so every
    step accepts at least the depth-1 token (tau >= 2 up to the last step); outputs stay exact."""
    model = hfs.enable(tiny_model(arch, seed=5, num_layers=1))
    drafter = hfs.ParallelDrafter.from_base_model(
        model, num_mask_tokens=2, init_layer=0, use_target_hidden_states=hidden
    )
    prompt = torch.tensor([[4, 8, 15, 16, 23]])
    ref = model.generate(prompt, max_new_tokens=30, do_sample=False)
    out = model.generate(
        prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, ref)
    assert all(n >= 2 for n in out.speculative_stats.accepted_lengths[1:-1])


@pytest.mark.parametrize("hidden", [False, True])
def test_mask_tokens_never_stay_in_the_drafter_cache(hidden):
    """After every drafter forward its cache holds exactly the committed tokens (minus none), with the keys a
    plain forward over the committed tokens alone gives: no mask token's entry is left."""
    model = hfs.enable(tiny_model("llama", seed=3))
    drafter = _drafter(model, k=4, hidden=hidden)
    checks = []
    real = ParallelTreeDrafter.propose

    def spy(self, sequence, tree, options):
        draft = real(self, sequence, tree, options)
        assert self.cache.get_seq_length() == sequence.shape[1]
        checks.append((sequence.clone(), self.cache.layers[0].keys.clone(), self.target_hidden))
        return draft

    ParallelTreeDrafter.propose = spy
    try:
        model.generate(torch.tensor([[5, 6, 7]]), assistant_model=drafter, max_new_tokens=20, do_sample=False)
    finally:
        ParallelTreeDrafter.propose = real
    assert len(checks) > 3
    sequence, keys, target_hidden = checks[-1]
    L, H = sequence.shape[1], model.config.hidden_size
    from transformers import DynamicCache

    fresh = DynamicCache(config=drafter.decoder.config)
    prev = torch.cat([torch.zeros(1, H), target_hidden[: L - 1]])[None] if hidden else None
    with torch.no_grad():
        drafter(sequence, position_ids=torch.arange(L)[None], target_hidden_states=prev, cache=fresh, use_cache=True)
    torch.testing.assert_close(keys, fresh.layers[0].keys, **FP32_LAYERS)
    if hidden:  # the drafter's record of the target's states equals a plain target forward's
        with torch.no_grad():
            h = final_hidden_state(model(sequence, output_hidden_states=True))[0]
        torch.testing.assert_close(target_hidden[: L - 1], h[: L - 1], **FP32_LAYERS)


@pytest.mark.slow
def test_sampling_with_the_drafter_matches_the_target_distribution():
    target = hfs.enable(tiny_model("llama", seed=21, vocab_size=VOCAB, num_layers=2))
    drafter = _perturb(hfs.ParallelDrafter.from_base_model(target, num_mask_tokens=2), scale=0.3)
    prompt = torch.tensor([[1, 5, 2]])
    kw = dict(temperature=0.8, top_k=0, top_p=1.0)
    exact = _exact_generate(target, prompt, **kw)
    torch.manual_seed(7)
    n = 2500
    counts = _batched_sample_counts(
        lambda ids, mask: target.generate(
            ids,
            attention_mask=mask,
            assistant_model=drafter,
            speculative_tree=hfs.TreeSpec.cartesian([2, 2]),
            do_sample=True,
            max_new_tokens=NEW,
            temperature=0.8,
        ),
        prompt,
        n,
    )
    assert chi_square_pvalue(counts, exact, n) > ALPHA
    # the drafter's q really differs from the target's p (otherwise the test proves little)
    with torch.no_grad():
        p = torch.softmax(target(prompt).logits[0, -1] / 0.8, -1)
        tree_drafter = drafter.get_tree_drafter(target)
        tree_drafter.begin(prompt, None)
        q = torch.softmax(tree_drafter.draft_logits(prompt)[0] / 0.8, -1)
    assert 0.5 * (p - q).abs().sum() > 0.1


# --------------------------------------------------------------------------- loss and training


def test_loss_by_hand():
    V = 5
    logits = torch.tensor(
        [[2.0, 0.0, -1.0, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 3.0, 0.0, -2.0], [0.0, 0.0, 0.0, 0.0, 4.0]]
    )
    labels = torch.tensor([0, 3, 2, IGNORE_INDEX])
    depth = torch.tensor([0, 1, 1, 2])

    def ce(row, y):
        return math.log(sum(math.exp(v) for v in logits[row].tolist())) - float(logits[row, y])

    per = parallel_depth_losses(logits, labels, depth, 3)
    expected = [ce(0, 0), (ce(1, 3) + ce(2, 2)) / 2, 0.0]
    torch.testing.assert_close(per, torch.tensor(expected), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(parallel_loss(per), torch.tensor(expected[0] + 0.8 * expected[1] + 0.64 * expected[2]))
    # distillation: (1 - a) CE + a KL(p || q) per row
    teacher = torch.zeros(4, V)
    teacher[:, 1] = 2.0
    a = 0.25
    per_kd = parallel_depth_losses(logits, labels, depth, 3, teacher, a)
    p = torch.softmax(teacher[0], -1)
    kl0 = float((p * (p.log() - torch.log_softmax(logits[0], -1))).sum())
    torch.testing.assert_close(per_kd[0], torch.tensor((1 - a) * expected[0] + a * kl0), rtol=1e-5, atol=1e-6)


def _states(model, num=6, length=30):
    hs, xs, ys, off = [], [], [], [0]
    for s in range(num):
        ids = model.generate(torch.tensor([[s + 1, 2 * s + 3]]), max_new_tokens=length, do_sample=False)[0]
        with torch.no_grad():
            h = final_hidden_state(model(ids[None], output_hidden_states=True))[0]
        y = ids.clone()
        y[:2] = IGNORE_INDEX
        hs.append(h.half()), xs.append(ids), ys.append(y), off.append(off[-1] + len(ids))
    return HiddenStates(torch.cat(hs), torch.cat(xs), torch.cat(ys), torch.tensor(off), [str(i) for i in range(num)])


def test_collator_batches_reproduce_the_single_sequence_layout():
    model = tiny_model("llama", seed=4)
    states = _states(model, num=2, length=12)
    drafter = _drafter(model, k=2, hidden=True)
    data = ParallelGroupDataset(states)
    batch = ParallelGroupCollator(2, model.config.vocab_size, groups_per_sequence=5, seed=3)([data[0], data[1]])
    with torch.no_grad():
        out = drafter(
            batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=batch["attention_mask"],
            target_hidden_states=batch["target_hidden_states"],
            logits_rows=batch["logits_rows"],
        ).logits
        # the teacher rows are the target's own distributions of the labelled tokens
        teacher = drafter.project(batch["teacher_hidden"])
    valid = batch["row_labels"] != IGNORE_INDEX
    assert valid.sum() > 10 and torch.isfinite(out).all()
    agree = (teacher.argmax(-1) == batch["row_labels"])[valid].float().mean()
    assert agree == 1.0  # the data are the target's greedy outputs


def test_training_lowers_the_loss_and_only_trains_the_drafter():
    model = tiny_model("llama", seed=4)
    for p in model.parameters():
        p.requires_grad_(False)
    before_lm = model.lm_head.weight.clone()
    states = _states(model)
    drafter = hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=2, use_target_hidden_states=True)
    trainer = train_parallel_drafter(
        drafter,
        states,
        "/tmp/hfs_parallel_test",
        num_epochs=12,
        batch_size=3,
        groups_per_sequence=12,
        learning_rate=3e-3,
        distill_weight=0.5,
        progress=False,
        logging_steps=4,
    )
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < 0.8 * losses[0]
    assert torch.equal(model.lm_head.weight, before_lm)
    names = {n.split(".")[0] for n, _ in drafter.named_parameters()}
    assert names == {"decoder", "mask_embeddings", "fuse"}


# --------------------------------------------------------------------------- hub


@pytest.mark.parametrize("hidden", [False, True])
def test_save_load_round_trip(tmp_path, hidden):
    model = hfs.enable(tiny_model("qwen2", seed=6))
    drafter = _drafter(model, k=3, hidden=hidden, parallel_choices=[[0], [1], [0, 0], [0, 0, 0]])
    drafter.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert not any("embed_tokens" in k or "lm_head" in k for k in keys)
    assert "mask_embeddings.weight" in keys and ("fuse.weight" in keys) == hidden
    assert AutoConfig.from_pretrained(tmp_path).model_type == "parallel_drafter"
    loaded = AutoModel.from_pretrained(tmp_path)
    assert isinstance(loaded, hfs.ParallelDrafter) and loaded.base_lm_head is None
    assert loaded.config.parallel_choices == [[0], [1], [0, 0], [0, 0, 0]]
    state, ref = loaded.state_dict(), drafter.state_dict()
    assert state.keys() == ref.keys() and all(torch.equal(state[k], ref[k]) for k in ref)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    a = model.generate(
        prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False, return_dict_in_generate=True
    )
    b = model.generate(prompt, assistant_model=loaded, max_new_tokens=12, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(a.sequences, b.sequences)
    assert a.speculative_stats.accepted_lengths == b.speculative_stats.accepted_lengths
    again = hfs.ParallelDrafter.from_pretrained(tmp_path, base_model=model)
    assert again.base_lm_head is model.lm_head and again.base_embeddings is model.get_input_embeddings()


def test_the_drafter_is_built_on_its_targets_device():
    """Built from a target off the CPU (the meta device stands in for a GPU here), every tensor the construction
    makes meets the target's on that device: a CPU-made one mixed in (the mask embeddings' noise) would raise."""
    model = tiny_model().to("meta")
    drafter = hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=3, use_target_hidden_states=True)
    assert {p.device.type for p in drafter.parameters()} == {"meta"}


def test_bad_input_is_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="deep"):
        hfs.ParallelDrafterConfig(num_mask_tokens=1, parallel_choices=[[0], [0, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="acceptance"):
        hfs.ParallelDrafterConfig(acceptance="fast")
    drafter = hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=1)
    with pytest.raises(ValueError, match="vocab_size"):
        hfs.enable(tiny_model(vocab_size=64)).generate(
            torch.tensor([[1, 2]]), assistant_model=drafter, max_new_tokens=3
        )
    with pytest.raises(ValueError, match="deep"):
        hfs.enable(model).generate(
            torch.tensor([[1, 2]]), assistant_model=drafter, max_new_tokens=3, speculative_tree=hfs.TreeSpec.chain(3)
        )
    with pytest.raises(ValueError, match="not attached"):
        hfs.ParallelDrafter(drafter.config)(torch.tensor([[1, 2]]))
