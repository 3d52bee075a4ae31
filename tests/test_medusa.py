"""Medusa heads: init, drafting in the tree loop, loss, tree calibration, save/load, acceptance settings."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_LAYERS, random_tree, tiny_model
from test_drafter_protocol import begin_one, propose_one
from transformers import AutoConfig, AutoModel

import hf_speculative as hfs
from hf_speculative.drafters.medusa import MedusaDrafter
from hf_speculative.drafters.medusa.modeling_medusa import final_hidden_state
from hf_speculative.drafters.medusa.training_medusa import medusa_head_losses, medusa_labels, medusa_loss
from hf_speculative.drafters.medusa.tree_calibration import calibrate_tree, expected_acceptance_length, head_accuracies
from hf_speculative.engine.acceptance import AcceptanceSettings
from hf_speculative.training.trainer import HiddenStates


def _perturb(heads, scale: float = 0.3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return heads


# --------------------------------------------------------------------------- model


@pytest.mark.parametrize("share_lm_head", [True, False])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_zero_init_heads_reproduce_base_predictions(arch, share_lm_head, num_layers):
    model = tiny_model(arch)
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=3, num_layers=num_layers, share_lm_head=share_lm_head)
    for head in heads.heads:
        for block in head.blocks:
            assert block.weight.abs().max() == 0 and block.bias.abs().max() == 0
    ids = torch.tensor([[3, 17, 4, 60, 2, 9]])
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        logits = heads(final_hidden_state(out)).logits
    assert logits.shape == (1, 6, 3, model.config.vocab_size)
    for k in range(3):
        torch.testing.assert_close(logits[:, :, k], out.logits, **FP32_LAYERS)
    n_params = sum(p.numel() for p in heads.parameters())
    H, V = model.config.hidden_size, model.config.vocab_size
    assert n_params == 3 * (num_layers * (H * H + H) + (0 if share_lm_head else V * H))


def test_final_hidden_state_is_the_lm_head_input(arch):
    model = tiny_model(arch)
    with torch.no_grad():
        out = model(torch.tensor([[1, 2, 3, 4]]), output_hidden_states=True)
        torch.testing.assert_close(model.lm_head(final_hidden_state(out)), out.logits, **FP32_LAYERS)


def test_heads_are_independent_blocks_not_one_shared_module():
    heads = hfs.MedusaHeadsModel.from_base_model(tiny_model(), num_heads=2, num_layers=3)
    params = [id(b.weight) for h in heads.heads for b in h.blocks]
    assert len(set(params)) == 6


def test_drafter_settings_come_from_the_config():
    model = tiny_model()
    heads = hfs.MedusaHeadsModel.from_base_model(
        model,
        num_heads=3,
        medusa_choices=[[0], [1], [0, 0]],
        acceptance="typical",
        posterior_threshold=0.2,
        posterior_alpha=0.5,
    )
    drafter = heads.get_tree_drafter(model)
    assert isinstance(drafter, MedusaDrafter) and drafter.needs_target_hidden_states
    assert drafter.max_depth == 3 and drafter.vocab_size == model.config.vocab_size
    assert drafter.default_tree == hfs.TreeSpec.from_choices([[0], [1], [0, 0]])
    # acceptance is the call's: the heads' config gives its default, the call's speculative_acceptance wins
    settings = AcceptanceSettings.resolve(None, heads.config)
    assert (settings.mode, settings.posterior_threshold, settings.posterior_alpha) == ("typical", 0.2, 0.5)
    assert AcceptanceSettings.resolve("exact", heads.config).mode == "exact"
    assert not hasattr(drafter, "acceptance")


def test_bad_input_is_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="deep"):
        hfs.MedusaConfig(num_heads=2, medusa_choices=[[0], [0, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="acceptance"):
        hfs.MedusaConfig(acceptance="fast")
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=2)
    other = tiny_model(vocab_size=64)
    with pytest.raises(ValueError, match="vocab_size"):
        hfs.enable(other).generate(torch.tensor([[1, 2]]), assistant_model=heads, max_new_tokens=3)
    with pytest.raises(ValueError, match="deep"):
        hfs.enable(model).generate(
            torch.tensor([[1, 2]]), assistant_model=heads, max_new_tokens=3, speculative_tree=hfs.TreeSpec.chain(3)
        )
    detached = hfs.MedusaHeadsModel(heads.config)
    with pytest.raises(ValueError, match="not attached"):
        detached(torch.zeros(model.config.hidden_size))


# --------------------------------------------------------------------------- drafting


def test_drafts_from_the_hidden_state_of_the_token_before_the_root():
    """Every step drafts from h at the position whose lm_head output is the root, taken from the previous
    verification forward (no extra forward): it equals a plain forward's hidden state there."""
    model = hfs.enable(tiny_model(seed=3))
    heads = _perturb(hfs.MedusaHeadsModel.from_base_model(model, num_heads=3), 0.05)
    seen = []
    real = MedusaDrafter.propose_batch

    def spy(self, sequences, rows, tree, options):
        seen.extend((seq.clone(), self.row_hidden[r].clone()) for seq, r in zip(sequences, rows))
        return real(self, sequences, rows, tree, options)

    MedusaDrafter.propose_batch = spy
    try:
        model.generate(torch.tensor([[5, 6, 7]]), assistant_model=heads, max_new_tokens=25, do_sample=False)
    finally:
        MedusaDrafter.propose_batch = real
    assert len(seen) > 3
    for sequence, hidden in seen:
        with torch.no_grad():
            ref = final_hidden_state(model(sequence[:, :-1], output_hidden_states=True))[0, -1]
        torch.testing.assert_close(hidden, ref, **FP32_LAYERS)


def test_greedy_tree_fill_uses_each_heads_ranked_tokens():
    model = tiny_model()
    heads = _perturb(hfs.MedusaHeadsModel.from_base_model(model, num_heads=2), 0.2)
    drafter = heads.get_tree_drafter(model)
    hidden = torch.randn(model.config.hidden_size)
    begin_one(drafter, torch.tensor([[4]]), SimpleNamespace(hidden_states=(hidden[None, None],)))
    tree = hfs.TreeSpec.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [2, 0]])
    draft = propose_one(drafter, torch.tensor([[4, 8]]), tree)
    top = torch.topk(heads(hidden).logits, 3, dim=-1).indices
    expected = [8] + [int(top[len(p) - 1, p[-1]]) for p in tree.paths]
    assert draft.tokens.tolist() == expected and draft.sampling == "deterministic"


@pytest.fixture(scope="module")
def trained_tiny():
    """Heads trained (a few hundred steps, on cached hidden states) on the tiny Llama's own greedy text."""
    from hf_speculative.drafters.medusa.training_medusa import train_medusa

    torch.manual_seed(0)
    model = hfs.enable(tiny_model("llama", seed=5, vocab_size=48))
    seqs = []
    for i in range(24):
        prompt = torch.randint(0, 48, (1, 4), generator=torch.Generator().manual_seed(i))
        seqs.append(model.generate(prompt, max_new_tokens=40, do_sample=False)[0])
    with torch.no_grad():
        hidden = [final_hidden_state(model(s[None], output_hidden_states=True))[0] for s in seqs]
    labels = [torch.cat([torch.full((4,), -100), s[4:]]) for s in seqs]
    offsets = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)
    states = HiddenStates(
        torch.cat(hidden).half(), torch.cat(seqs), torch.cat(labels), offsets, [str(i) for i in range(24)]
    )
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=3, share_lm_head=False)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        train_medusa(
            heads, states, tmp, num_epochs=6, learning_rate=3e-3, batch_size=32, progress=False, logging_steps=1000
        )
    return model, heads, states


def test_trained_heads_accept_more_than_untrained(trained_tiny):
    model, heads, _ = trained_tiny
    prompt = torch.tensor([[7, 1, 30, 2]])
    out = model.generate(
        prompt, assistant_model=heads, max_new_tokens=40, do_sample=False, return_dict_in_generate=True
    )
    assert out.speculative_stats.mean_accepted_length > 1.5


def test_greedy_equality_with_heads_in_the_loop(arch, trained_tiny):
    """Tree output == plain greedy generate, token for token, over prompts, trees and lengths."""
    rng = random.Random(hash(arch) % 1000)
    if arch == "llama":
        model, heads, _ = trained_tiny
    else:
        model = hfs.enable(tiny_model(arch, seed=2))
        heads = _perturb(hfs.MedusaHeadsModel.from_base_model(model, num_heads=4, share_lm_head=arch == "qwen2"), 0.05)
    vocab = model.config.vocab_size
    for case in range(12):
        prompt = torch.tensor([[rng.randrange(vocab) for _ in range(rng.randint(1, 8))]])
        tree = random_tree(rng, max_nodes=20, max_depth=heads.config.num_heads)
        new = rng.randint(1, 40)
        ref = model.generate(prompt, max_new_tokens=new, do_sample=False)
        out = model.generate(prompt, assistant_model=heads, speculative_tree=tree, max_new_tokens=new, do_sample=False)
        assert torch.equal(out, ref), (arch, case, tree.to_list())
    # the config's own tree too
    out = model.generate(prompt, assistant_model=heads, max_new_tokens=30, do_sample=False)
    assert torch.equal(out, model.generate(prompt, max_new_tokens=30, do_sample=False))


# --------------------------------------------------------------------------- loss


def test_loss_matches_hand_computation_and_lambda_weighting():
    logits = torch.tensor(
        [
            [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
            [[0.0, 0.0, 3.0], [1.0, 1.0, 1.0]],
        ]
    )  # (B=2, K=2, V=3)
    labels = torch.tensor([[0, 1], [1, -100]])

    def ce(row, y):
        return -(row[y] - math.log(sum(math.exp(v) for v in row)))

    head0 = (ce([2, 0, 0], 0) + ce([0, 0, 3], 1)) / 2
    head1 = ce([0, 1, 0], 1)  # the second position is ignored
    torch.testing.assert_close(medusa_head_losses(logits, labels), torch.tensor([head0, head1]))
    torch.testing.assert_close(medusa_loss(logits, labels), torch.tensor(head0 + 0.8 * head1))
    torch.testing.assert_close(medusa_loss(logits, labels, decay=0.5), torch.tensor(head0 + 0.5 * head1))
    # three heads: weights 1, 0.8, 0.64
    logits3 = torch.randn(5, 3, 7)
    labels3 = torch.randint(0, 7, (5, 3))
    per = [F.cross_entropy(logits3[:, k], labels3[:, k]) for k in range(3)]
    torch.testing.assert_close(medusa_loss(logits3, labels3), per[0] + 0.8 * per[1] + 0.64 * per[2])


def test_head_labels_shift_by_k_plus_two_within_each_sequence():
    # two sequences: [10 11 12 13 14] (answer from 12 on) and [20 21 22]
    token_labels = torch.tensor([-100, -100, 12, 13, 14, -100, 21, 22])
    offsets = torch.tensor([0, 5, 8])
    got = medusa_labels(token_labels, 2, offsets)
    expected = torch.tensor(
        [[12, 13], [13, 14], [14, -100], [-100, -100], [-100, -100], [22, -100], [-100, -100], [-100, -100]]
    )
    assert torch.equal(got, expected)


def test_trainer_compute_loss_is_the_medusa_loss(trained_tiny, tmp_path):
    from transformers import TrainingArguments

    from hf_speculative.drafters.medusa.training_medusa import MedusaCollator, MedusaPositionDataset, MedusaTrainer

    _, heads, states = trained_tiny
    ds = MedusaPositionDataset(states, heads.config.num_heads)
    batch = MedusaCollator()([ds[i] for i in range(16)])
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = MedusaTrainer(model=heads, args=args, data_collator=MedusaCollator())
    with torch.no_grad():
        loss = trainer.compute_loss(heads, batch)
        torch.testing.assert_close(
            loss, medusa_loss(heads(batch["hidden_states"]).logits, batch["labels"]), **FP32_LAYERS
        )
        torch.testing.assert_close(heads(**batch).loss, loss, **FP32_LAYERS)


# --------------------------------------------------------------------------- calibrated tree


def test_tree_builder_on_a_toy_accuracy_table():
    acc = [[0.6, 0.2], [0.5, 0.1]]
    # node values: (0)=.6 (1)=.2 (0,0)=.3 (0,1)=.06 (1,0)=.1 (1,1)=.02
    assert hfs.TreeSpec.optimize(acc, 3).to_list() == [[0], [1], [0, 0]]
    assert hfs.TreeSpec.optimize(acc, 4).to_list() == [[0], [1], [0, 0], [1, 0]]
    assert hfs.TreeSpec.optimize(acc, 6).to_list() == [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]
    assert expected_acceptance_length(hfs.TreeSpec.optimize(acc, 4), acc) == pytest.approx(1 + 0.6 + 0.2 + 0.3 + 0.1)


def test_head_accuracies_and_calibrated_tree(trained_tiny):
    model, heads, states = trained_tiny
    acc = head_accuracies(heads, states, top=4)
    labels = medusa_labels(states.labels, 3, states.offsets)
    with torch.no_grad():
        ranked = torch.topk(heads(states.hidden.float()).logits, 4, dim=-1).indices
    for k in range(3):
        valid = labels[:, k] != -100
        for i in range(4):
            manual = float((ranked[valid, k, i] == labels[valid, k]).float().mean())
            assert acc[k][i] == pytest.approx(manual)
    assert acc[0][0] > acc[0][1]
    heads_copy = hfs.MedusaHeadsModel(heads.config.__class__.from_dict(heads.config.to_dict()))
    heads_copy.load_state_dict(heads.state_dict())
    tree = calibrate_tree(heads_copy, states, num_nodes=10, top=4)
    assert tree == hfs.TreeSpec.optimize(acc, 10)
    assert heads_copy.config.medusa_choices == tree.to_list()
    assert heads_copy.config.calibration["head_top_i_accuracy"][0][0] == pytest.approx(acc[0][0], abs=1e-4)


# --------------------------------------------------------------------------- hub


@pytest.mark.parametrize("share_lm_head", [True, False])
def test_save_load_round_trip_and_auto_model(tmp_path, share_lm_head):
    model = hfs.enable(tiny_model(seed=4))
    heads = _perturb(
        hfs.MedusaHeadsModel.from_base_model(
            model, num_heads=3, num_layers=2, share_lm_head=share_lm_head, acceptance="typical"
        ),
        0.1,
    )
    heads.config.medusa_choices = [[0], [1], [0, 0], [0, 0, 0]]
    heads.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    stored = load_file(str(tmp_path / "model.safetensors"))
    assert all("lm_head" not in k for k in stored) == share_lm_head
    loaded = hfs.MedusaHeadsModel.from_pretrained(tmp_path, base_model=model)
    assert loaded.state_dict().keys() == heads.state_dict().keys()
    for k, v in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert loaded.config.medusa_choices == [[0], [1], [0, 0], [0, 0, 0]] and loaded.config.acceptance == "typical"
    auto = AutoModel.from_pretrained(tmp_path)  # no base model: attached at first use with a target
    assert isinstance(auto, hfs.MedusaHeadsModel) and isinstance(AutoConfig.from_pretrained(tmp_path), hfs.MedusaConfig)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    a = model.generate(prompt, assistant_model=heads, max_new_tokens=20, do_sample=False, return_dict_in_generate=True)
    b = model.generate(prompt, assistant_model=auto, max_new_tokens=20, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(a.sequences, b.sequences)
    assert a.speculative_stats.accepted_lengths == b.speculative_stats.accepted_lengths


# --------------------------------------------------------------------------- acceptance settings


def test_typical_acceptance_only_when_enabled_in_the_config(monkeypatch):
    import hf_speculative.engine.acceptance as acceptance

    model = hfs.enable(tiny_model(seed=6))
    calls = []
    real = acceptance.accept_typical
    monkeypatch.setattr(acceptance, "accept_typical", lambda *a, **k: calls.append(a[2:4]) or real(*a, **k))
    prompt = torch.tensor([[1, 5, 2]])
    exact = hfs.MedusaHeadsModel.from_base_model(model, num_heads=2)
    model.generate(prompt, assistant_model=exact, do_sample=True, max_new_tokens=8)
    assert calls == []
    typical = hfs.MedusaHeadsModel.from_base_model(
        model, num_heads=2, acceptance="typical", posterior_threshold=0.2, posterior_alpha=0.4
    )
    model.generate(prompt, assistant_model=typical, do_sample=False, max_new_tokens=8)
    assert calls == []  # greedy decoding stays exact
    model.generate(prompt, assistant_model=typical, do_sample=True, max_new_tokens=8)
    assert calls and all(c == (0.2, 0.4) for c in calls)
    calls.clear()
    model.generate(prompt, assistant_model=typical, do_sample=True, max_new_tokens=8, speculative_acceptance="exact")
    assert calls == []  # a per-call override wins


@pytest.mark.slow
def test_sampling_with_heads_matches_the_target_distribution():
    """Chi-square goodness of fit of sampled continuations against the target's exact distribution."""
    from test_sampling import ALPHA, NEW, SETTINGS, VOCAB, _batched_sample_counts, _exact_generate, chi_square_pvalue

    target = hfs.enable(tiny_model("llama", seed=21, vocab_size=VOCAB, num_layers=2))
    heads = _perturb(hfs.MedusaHeadsModel.from_base_model(target, num_heads=2, share_lm_head=False), 0.5, seed=3)
    kw = SETTINGS["temperature-0.7-top-k-4"]
    prompt = torch.tensor([[1, 5, 2]])
    exact = _exact_generate(target, prompt, **kw)
    tree = hfs.TreeSpec.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0]])
    torch.manual_seed(2024)
    n = 3000
    gen = dict(
        do_sample=True, max_new_tokens=NEW, top_k=kw["top_k"], temperature=kw["temperature"], speculative_tree=tree
    )
    counts = _batched_sample_counts(
        lambda ids, mask: target.generate(ids, attention_mask=mask, assistant_model=heads, **gen), prompt, n
    )
    assert chi_square_pvalue(counts, exact, n) > ALPHA
    # the heads' proposal really differs from the target's next-token distribution after the root
    with torch.no_grad():
        out = target(prompt, output_hidden_states=True)
        q = torch.softmax(heads(final_hidden_state(out)[0, -1]).logits[0], -1)
        p = torch.softmax(target(torch.cat([prompt, out.logits[:, -1:].argmax(-1)], 1)).logits[0, -1], -1)
    assert 0.5 * (p - q).abs().sum() > 0.2


# --------------------------------------------------------------------------- cli, curve, model card


def test_cli_registers_train_medusa_and_calibrate_tree():
    from hf_speculative.cli import build_parser

    args = build_parser().parse_args(["train", "medusa", "--data", "x.jsonl", "--out", "o", "--num-heads", "3"])
    assert (args.command, args.method, args.num_heads, args.num_layers) == ("train", "medusa", 3, 1)
    args = build_parser().parse_args(["calibrate-tree", "--heads", "h", "--data", "d.jsonl", "--num-nodes", "12"])
    assert args.num_nodes == 12 and callable(args.func)


def test_curve_callback_and_model_card(trained_tiny, tmp_path):
    from hf_speculative.drafters.medusa.training_medusa import train_medusa
    from hf_speculative.drafters.medusa.tree_calibration import MedusaCurveCallback
    from hf_speculative.model_card import drafter_card

    model, trained, states = trained_tiny
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=3)
    curve = MedusaCurveCallback(
        heads, states, num_nodes=8, num_points=2, save_dir=str(tmp_path / "curve"), batch_size=64
    )
    train_medusa(heads, states, str(tmp_path / "run"), num_epochs=1, batch_size=64, progress=False, callbacks=[curve])
    assert [p["step"] for p in curve.curve][0] == 0 and len(curve.curve) == 3
    assert all((tmp_path / "curve" / f"step{p['step']}" / "config.json").exists() for p in curve.curve)
    calibrate_tree(heads, states, num_nodes=8)
    card = str(drafter_card(heads, results="tau 9.9 (test)"))
    assert "medusa" in card and "tau 9.9 (test)" in card and "| 0 |" in card
