"""ParallelDrafter and Speculative Streaming trained on target-labelled shards: the stream KD loss by hand, the
teacher rows each stream reads, and ``train parallel-drafter|streaming --labelled`` end to end."""

import json

import torch
from conftest import tiny_chat_model
from test_labelling import _records

from hf_speculative.cli import main
from hf_speculative.drafters.parallel import ParallelDrafter
from hf_speculative.drafters.streaming import LlamaForSpeculativeStreaming
from hf_speculative.drafters.streaming.training_speculative_streaming import (
    IGNORE_INDEX,
    StreamCollator,
    StreamSegmentDataset,
    stream_kd_losses,
)
from hf_speculative.training.labelling import LabelledShards, label_conversations
from hf_speculative.training.trainer import HiddenStates


def test_stream_teacher_rows_by_hand():
    # one conversation of 5 tokens, answer tokens 2..4; stream j at row t reads the teacher row t + j
    topk = torch.arange(5)[:, None] * 10 + torch.arange(2)  # row r holds ids (10r, 10r + 1)
    states = HiddenStates(
        torch.zeros(5, 3),
        torch.arange(5),
        torch.tensor([-100, -100, 2, 3, 4]),
        torch.tensor([0, 5]),
        ["a"],
        topk,
        torch.zeros(5, 2),
    )
    ds = StreamSegmentDataset(states, num_streams=2, segment_length=8)
    item = ds[0]
    # targets[t, j-1] = labels[t + 1 + j]: stream 1 at t=0 targets token 2, its teacher is row 1 (predicts token 2)
    assert item["targets"][:, 0].tolist() == [2, 3, 4, IGNORE_INDEX, IGNORE_INDEX]
    assert item["targets"][:, 1].tolist() == [3, 4, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
    assert item["teacher_ids"][:3, 0, 0].tolist() == [10, 20, 30]  # rows 1, 2, 3
    assert item["teacher_ids"][:2, 1, 0].tolist() == [20, 30]  # rows 2, 3
    batch = StreamCollator()([item])
    assert batch["teacher_ids"].shape == (1, 5, 2, 2) and batch["teacher_logprobs"].dtype == torch.float32


def test_stream_kd_loss_by_hand():
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(4, 6, bias=False)
    states = torch.randn(3, 2, 4)  # 3 rows, 2 streams
    targets = torch.tensor([[1, 2], [3, IGNORE_INDEX], [IGNORE_INDEX, IGNORE_INDEX]])
    ids = torch.tensor([[[1, 0], [2, 5]], [[3, 4], [0, 1]], [[0, 1], [0, 1]]])
    logp = torch.log(torch.tensor([[[0.6, 0.2], [0.5, 0.5]], [[0.9, 0.1], [0.5, 0.5]], [[0.5, 0.5], [0.5, 0.5]]]))
    losses = stream_kd_losses(lm_head, states, targets, ids, logp)
    with torch.no_grad():
        logq = torch.log_softmax(lm_head(states), -1)
        # stream 1: rows 0 and 1; teacher renormalized over its stored 2 ids: (0.75, 0.25) and (0.9, 0.1)
        s1 = -(0.75 * logq[0, 0, 1] + 0.25 * logq[0, 0, 0] + 0.9 * logq[1, 0, 3] + 0.1 * logq[1, 0, 4]) / 2
        s2 = -(0.5 * logq[0, 1, 2] + 0.5 * logq[0, 1, 5])
    torch.testing.assert_close(losses, torch.stack([s1, s2]), rtol=1e-5, atol=1e-6)


def _labelled(tmp_path, num_layers=3):
    model, tok = tiny_chat_model(num_layers=num_layers)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    label_conversations(model, tok, _records(10), tmp_path / "shards", top_k=4, layers=(1, 2, -1), progress=False)
    return model


def test_cli_train_parallel_drafter_labelled(tmp_path):
    _labelled(tmp_path)
    argv = [
        "train",
        "parallel-drafter",
        "--model",
        str(tmp_path / "m"),
        "--labelled",
        str(tmp_path / "shards"),
        "--labelled-holdout",
        "3",
        "--out",
        str(tmp_path / "pd"),
        "--num-mask-tokens",
        "2",
        "--target-hidden-states",
        "--distill-weight",
        "1.0",
        "--max-steps",
        "3",
        "--batch-size",
        "2",
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
    drafter = ParallelDrafter.from_pretrained(tmp_path / "pd")
    training = drafter.config.training
    assert (
        training["conversations"] == 7 and training["held_out_conversations"] == 3 and "labelled" in training["method"]
    )
    assert drafter.config.draft_vocab_size == 16
    json.dumps(training)


def test_cli_train_streaming_labelled(tmp_path):
    model = _labelled(tmp_path)
    argv = [
        "train",
        "streaming",
        "--model",
        str(tmp_path / "m"),
        "--labelled",
        str(tmp_path / "shards"),
        "--labelled-holdout",
        "3",
        "--out",
        str(tmp_path / "ss"),
        "--num-streams",
        "2",
        "--num-msa-layers",
        "1",
        "--max-steps",
        "4",
        "--batch-size",
        "2",
        "--segment-length",
        "16",
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
    ss = LlamaForSpeculativeStreaming.from_pretrained(tmp_path / "ss", base_model=model)
    training = ss.config.training
    assert "KD" in training["method"] and training["held_out_conversations"] == 3 and training["steps_done"] == 4
    assert ss.config.calibration["stream_top_i_accuracy"]
    assert ss.config.draft_vocab_size == 16 and ss.draft_to_target.shape == (16,)
    # the cached layer the MSA layers start from is the labelled one (num_hidden_layers - num_msa_layers = 2)
    assert ss.config.first_msa_layer == 2 and 2 in LabelledShards(tmp_path / "shards").layers


def _eagle_labelled(tmp_path) -> list[str]:
    """A tiny 3-layer model saved in ``tmp_path/m``, 10 conversations labelled with EAGLE-3's feature layers in
    ``tmp_path/shards``; returns the start of a ``train eagle`` command line on them."""
    from hf_speculative.drafters.eagle import eagle3_feature_layers

    model, tok = tiny_chat_model(num_layers=3)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    layers = (*sorted(set(eagle3_feature_layers(3))), -1)
    label_conversations(model, tok, _records(10), tmp_path / "shards", top_k=4, layers=layers, progress=False)
    return ["train", "eagle", "--model", str(tmp_path / "m"), "--labelled", str(tmp_path / "shards")]


def test_cli_train_eagle_labelled_calibrates_its_tree(tmp_path):
    """``train eagle`` measures its drafter's accuracy per drafting step and rank on the first
    ``--calibrate-conversations`` held-out conversations of each folder: its default tree is then the cost-aware one."""
    from hf_speculative.drafters.eagle import EagleDrafter

    argv = _eagle_labelled(tmp_path)
    argv += ["--labelled-holdout", "3", "--calibrate-conversations", "2", "--out", str(tmp_path / "eagle")]
    argv += ["--draft-vocab-size", "16", "--max-steps", "2", "--batch-size", "2", "--threads", "1", "--device", "cpu"]
    assert main(argv) == 0
    drafter = EagleDrafter.from_pretrained(tmp_path / "eagle")
    calibration = drafter.config.calibration
    assert calibration["conversations"] == 2 and len(calibration["step_top_i_accuracy"]) == 6
    assert all(len(row) == 4 and all(0.0 <= a <= 1.0 for a in row) for row in calibration["step_top_i_accuracy"])
    assert drafter.config.training["conversations"] == 7
    assert main([*argv[:-6], "--calibrate-conversations", "0", "--out", str(tmp_path / "plain"), *argv[-6:]]) == 0
    assert not getattr(EagleDrafter.from_pretrained(tmp_path / "plain").config, "calibration", None)  # the control


def test_cli_train_eagle_continues_from_a_trained_folder(tmp_path):
    """``train eagle --init FOLDER`` starts from that drafter's weights and draft vocabulary (not a fresh drafter, not
    a new vocabulary) and keeps the earlier run's record under ``training["init"]``."""
    from safetensors.torch import load_file

    from hf_speculative.drafters.eagle import EagleDrafter

    argv = _eagle_labelled(tmp_path)
    argv += ["--labelled-holdout", "3", "--calibrate-conversations", "0", "--batch-size", "2", "--threads", "1"]
    argv += ["--device", "cpu", "--max-steps", "3"]
    assert main([*argv, "--draft-vocab-size", "16", "--out", str(tmp_path / "first")]) == 0
    # a learning rate too small to move a bfloat16 weight: the continued run saves the first run's weights
    more = [*argv, "--draft-vocab-size", "32", "--lr", "1e-12", "--init", str(tmp_path / "first")]
    assert main([*more, "--out", str(tmp_path / "second")]) == 0
    first, second = (
        load_file(tmp_path / "first" / "model.safetensors"),
        load_file(tmp_path / "second" / "model.safetensors"),
    )
    assert first.keys() == second.keys() and "d2t" in first
    for name in first:
        assert torch.equal(first[name], second[name]), name
    earlier = EagleDrafter.from_pretrained(tmp_path / "first").config.training
    record = EagleDrafter.from_pretrained(tmp_path / "second").config.training
    assert record["init"] == earlier and "continued from" in record["method"] and record["steps"] == 3
    assert EagleDrafter.from_pretrained(tmp_path / "second").config.draft_vocab_size == 16
