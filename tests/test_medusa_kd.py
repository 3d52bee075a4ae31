"""Medusa heads distilled from target-labelled shards: the teacher rows each head reads, teacher-greedy labels,
the KD loss lowering on a tiny random Llama, the draft vocabulary, and ``train medusa --labelled`` end to end."""

import json

import torch
from conftest import tiny_chat_model
from test_labelling import _records

from hf_speculative.cli import main
from hf_speculative.drafters.medusa import MedusaHeadsModel
from hf_speculative.drafters.medusa.training_medusa import (
    MedusaCollator,
    MedusaPositionDataset,
    medusa_kd_head_losses,
    teacher_rows,
)
from hf_speculative.training.labelling import LabelledShards, label_conversations
from hf_speculative.training.trainer import HiddenStates


def test_teacher_rows_by_hand():
    # two sequences: positions 0..3 and 4..6; head k at t reads row t + k + 1 inside its sequence, else -1
    offsets = torch.tensor([0, 4, 7])
    rows = teacher_rows(offsets, torch.tensor([0, 2, 3, 4, 5]), num_heads=2)
    assert rows.tolist() == [[1, 2], [3, -1], [-1, -1], [5, 6], [6, -1]]


def test_teacher_labels_by_hand():
    # labels[t] (answer tokens) become the teacher's top-1 of row t - 1; the first token of a sequence keeps -100
    ids = torch.arange(6)
    labels = torch.tensor([-100, 11, 12, -100, 14, 15])
    topk = torch.tensor([[20, 0], [21, 0], [22, 0], [23, 0], [24, 0], [25, 0]])
    states = HiddenStates(torch.zeros(6, 2), ids, labels, torch.tensor([0, 3, 6]), ["a", "b"], topk, torch.zeros(6, 2))
    assert states.with_teacher_labels().labels.tolist() == [-100, 20, 21, -100, 23, 24]
    assert states.labels.tolist() == [-100, 11, 12, -100, 14, 15]  # the original is unchanged


def test_kd_training_lowers_the_loss(tmp_path):
    model, tok = tiny_chat_model(num_layers=2)
    label_conversations(model, tok, _records(12), tmp_path, top_k=5, progress=False)
    states = LabelledShards(tmp_path).to_hidden_states()
    heads = MedusaHeadsModel.from_base_model(model, num_heads=2)
    batch = MedusaCollator()(
        [MedusaPositionDataset(states, 2)[i] for i in range(len(MedusaPositionDataset(states, 2)))]
    )
    assert batch["teacher_ids"].shape[1:] == (2, 5) and batch["teacher_valid"].dtype == torch.bool

    def loss():
        return medusa_kd_head_losses(
            heads, batch["hidden_states"], batch["teacher_ids"], batch["teacher_logprobs"], batch["teacher_valid"]
        )

    # by hand for head 0: cross-entropy of softmax(head logits) to the renormalized teacher top-k at row t + 1
    with torch.no_grad():
        logq = torch.log_softmax(heads(hidden_states=batch["hidden_states"]).logits[:, 0].float(), -1)
        p = torch.softmax(batch["teacher_logprobs"][:, 0], -1)
        ce = -(p * logq.gather(-1, batch["teacher_ids"][:, 0])).sum(-1)
        torch.testing.assert_close(loss()[0], ce[batch["teacher_valid"][:, 0]].mean(), rtol=1e-4, atol=1e-5)
    before = float(loss().sum().detach())
    opt = torch.optim.Adam(heads.parameters(), lr=3e-2)
    for _ in range(80):
        opt.zero_grad()
        loss().sum().backward()
        opt.step()
    after = float(loss().sum().detach())
    assert after < 0.9 * before, (before, after)  # 8.16 -> 6.99 here; the floor is the teacher top-k entropy
    # the base lm_head the heads share is not trained
    assert all(p.grad is None for p in model.lm_head.parameters())


def test_kd_in_draft_vocabulary_drops_missing_teacher_mass(tmp_path):
    model, tok = tiny_chat_model(num_layers=2)
    label_conversations(model, tok, _records(4), tmp_path, top_k=5, progress=False)
    states = LabelledShards(tmp_path).to_hidden_states()
    heads = MedusaHeadsModel.from_base_model(model, num_heads=2)
    ds = MedusaPositionDataset(states, 2)
    batch = MedusaCollator()([ds[i] for i in range(len(ds))])
    keep = torch.unique(batch["teacher_ids"][:, :, 0])[:8]  # a draft vocabulary holding some teacher top-1 tokens
    heads.set_draft_vocab(keep)
    losses = medusa_kd_head_losses(
        heads, batch["hidden_states"], batch["teacher_ids"], batch["teacher_logprobs"], batch["teacher_valid"]
    )
    assert torch.isfinite(losses).all()  # teacher tokens outside the draft vocabulary are dropped, not -inf


def test_cli_train_medusa_labelled(tmp_path, capsys):
    model, tok = tiny_chat_model(num_layers=2)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    label_conversations(model, tok, _records(10), tmp_path / "shards", top_k=4, progress=False)
    label_conversations(
        model, tok, _records(5), tmp_path / "shards2", top_k=4, progress=False
    )  # a second folder mixed in
    argv = [
        "train",
        "medusa",
        "--model",
        str(tmp_path / "m"),
        "--labelled",
        str(tmp_path / "shards"),
        "--labelled",
        str(tmp_path / "shards2"),
        "--labelled-holdout",
        "3",
        "--out",
        str(tmp_path / "heads"),
        "--num-heads",
        "2",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--calibrate-nodes",
        "4",
        "--draft-vocab-size",
        "16",
        "--threads",
        "1",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    heads = MedusaHeadsModel.from_pretrained(tmp_path / "heads")
    assert heads.config.draft_vocab_size == 16 and heads.config.training["conversations"] == 7 + 2
    assert "KD" in heads.config.training["method"] and heads.config.calibration["head_top_i_accuracy"]
    assert heads.config.training["held_out_conversations"] == 3 + 3
    json.dumps(heads.config.training)


def test_concat_hidden_states():
    a = HiddenStates(
        torch.ones(3, 2),
        torch.arange(3),
        torch.arange(3),
        torch.tensor([0, 1, 3]),
        ["a", "b"],
        torch.zeros(3, 1),
        torch.zeros(3, 1),
    )
    b = HiddenStates(
        torch.zeros(2, 2),
        torch.arange(2),
        torch.arange(2),
        torch.tensor([0, 2]),
        ["c"],
        torch.ones(2, 1),
        torch.ones(2, 1),
    )
    c = HiddenStates.concat([a, b])
    assert (
        c.offsets.tolist() == [0, 1, 3, 5] and c.ids == ["a", "b", "c"] and c.topk_ids[:, 0].tolist() == [0, 0, 0, 1, 1]
    )
    assert c.select([2]).hidden.tolist() == [[0, 0], [0, 0]]


def test_hidden_states_concat_release_joins_the_same_and_empties_the_parts():
    """``release=True`` (millions of labelled tokens): the same states as a plain concat, each part's tensors given
    up as they are joined, so the peak is not twice the states."""

    def part(n, value, ids):
        return HiddenStates(
            torch.full((n, 2), value),
            torch.arange(n),
            torch.arange(n),
            torch.tensor([0, n]),
            ids,
            torch.full((n, 1), int(value)),
            torch.full((n, 1), value),
            {2: torch.full((n, 2), value + 10), 5: torch.full((n, 2), value + 20)},
        )

    kept = HiddenStates.concat([part(1, 0.0, ["a"]), part(2, 1.0, ["b"])])
    parts = [part(1, 0.0, ["a"]), part(2, 1.0, ["b"])]
    released = HiddenStates.concat(parts, release=True)
    for name in ("hidden", "input_ids", "labels", "offsets", "topk_ids", "topk_logprobs"):
        assert torch.equal(getattr(kept, name), getattr(released, name)), name
    assert released.ids == ["a", "b"] and sorted(released.layers) == [2, 5]
    assert all(torch.equal(kept.layers[k], released.layers[k]) for k in (2, 5))
    assert released.layers[5][:, 0].tolist() == [20.0, 21.0, 21.0]
    assert all(p.hidden is None and p.topk_ids is None and not p.layers for p in parts)
