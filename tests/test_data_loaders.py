"""Loaders of every supported format on small fixture files, and chat formatting."""

import csv
import json
import zipfile

import pytest

from hf_speculative.bench.prompts import prepare_prompts
from hf_speculative.bench.tiny import tiny_chat_tokenizer
from hf_speculative.training.data import (
    Record,
    encode_chat,
    encode_chat_batch,
    format_chat,
    load_alpaca,
    load_chat_jsonl,
    load_dialogsum,
    load_e2e_nlg,
    load_questions,
    load_records,
    load_sharegpt,
    load_wikisql,
    tokenize_conversation,
)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def questions(tmp_path):
    return write_jsonl(
        tmp_path / "question.jsonl",
        [
            {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
            {"question_id": 82, "category": "math", "turns": ["What is 2+2?"], "reference": ["4"]},
        ],
    )


def test_questions(questions):
    recs = load_questions(questions)
    assert [r.id for r in recs] == ["81", "82"]
    assert recs[0].category == "writing" and recs[0].turns == ["Write a poem.", "Now shorter."]
    assert recs[0].messages == [{"role": "user", "content": "Write a poem."}]
    assert recs[0].prompt == "Write a poem."
    assert recs[1].reference == ["4"]
    assert [r.id for r in load_questions(questions, categories=["math"])] == ["82"]
    assert len(load_records(questions, limit=1)) == 1


def test_questions_with_an_id_or_none(tmp_path):
    """A prompt file of ``turns`` whose lines name themselves ``id`` (or nothing: the line number) loads too."""
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": "a", "turns": ["Hi."]}\n{"turns": "Bye."}\n')
    recs = load_records(path)
    assert [(r.id, r.turns) for r in recs] == [("a", ["Hi."]), ("2", ["Bye."])]


def test_record_conversation_all_turns(questions):
    rec = load_questions(questions)[0]
    conv = rec.conversation(answers=["A poem."])
    assert [m["role"] for m in conv] == ["user", "assistant", "user"]
    with pytest.raises(ValueError, match="no assistant answer"):
        rec.conversation()


def test_sharegpt(tmp_path):
    rows = [
        {
            "id": "x1",
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello!"},
                {"from": "human", "value": "Bye"},
            ],
        },
        {"id": "x2", "conversations": [{"from": "gpt", "value": "orphan"}]},
        {"id": "x3", "conversations": [{"from": "human", "value": "Only a question"}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(rows))
    recs = load_sharegpt(path)
    assert [r.id for r in recs] == ["x1", "x3"]  # no user turn -> dropped
    assert recs[0].system == "Be brief." and recs[0].turns == ["Hi", "Bye"] and recs[0].answers == ["Hello!"]
    assert recs[0].messages[0] == {"role": "system", "content": "Be brief."}
    assert [m["role"] for m in recs[0].conversation()] == ["system", "user", "assistant", "user"]
    assert load_records(path)[1].prompt == "Only a question"
    jl = write_jsonl(tmp_path / "sg.jsonl", rows)
    assert [r.id for r in load_records(jl)] == ["x1", "x3"]


def test_alpaca(tmp_path):
    path = tmp_path / "alpaca.json"
    path.write_text(
        json.dumps(
            [
                {"instruction": "Add.", "input": "2 and 3", "output": "5"},
                {"instruction": "Say hi.", "input": "", "output": "hi"},
            ]
        )
    )
    recs = load_records(path)
    assert recs[0].prompt == "Add.\n\n2 and 3" and recs[0].reference == "5"
    assert recs[1].prompt == "Say hi." and recs[1].id == "1"
    assert len(load_alpaca(path, limit=1)) == 1


def test_dialogsum_zip_and_jsonl(tmp_path):
    test_rows = [
        {
            "fname": "test_0",
            "dialogue": "#Person1#: Hi.\n#Person2#: Hello.",
            "summary1": "They greet.",
            "topic1": "greeting",
            "summary2": "Hello.",
            "topic2": "g",
            "summary3": "Hi.",
            "topic3": "g",
        }
    ]
    dev_rows = [{"fname": "dev_0", "dialogue": "#Person1#: Bye.", "summary": "Leaving.", "topic": "farewell"}]
    zpath = tmp_path / "DialogSum_Data.zip"
    with zipfile.ZipFile(zpath, "w") as zf:  # Python dict literals, one per line, as in the release
        zf.writestr("DialogSum_Data/dialogsum.test.jsonl", "\n".join(repr(r) for r in test_rows) + "\n")
        zf.writestr("DialogSum_Data/dialogsum.dev.jsonl", "\n".join(repr(r) for r in dev_rows) + "\n")
        zf.writestr("__MACOSX/DialogSum_Data/._dialogsum.test.jsonl", "junk")
    recs = load_records(zpath)
    assert recs[0].id == "test_0" and recs[0].reference == ["They greet.", "Hello.", "Hi."]
    assert recs[0].category == "greeting" and "#Person1#: Hi." in recs[0].prompt
    dev = load_dialogsum(zpath, split="dev")
    assert dev[0].reference == "Leaving." and dev[0].category == "farewell"
    jl = tmp_path / "dialogsum.dev.jsonl"
    jl.write_text(repr(dev_rows[0]) + "\n")
    assert load_records(jl)[0].id == "dev_0"
    with pytest.raises(ValueError):
        load_dialogsum(zpath, split="train")


def test_e2e_nlg(tmp_path):
    path = tmp_path / "devset.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mr", "ref"])
        w.writerow(["name[A], area[city centre]", "A is in the centre."])
        w.writerow(["name[A], area[city centre]", "In the centre: A."])
        w.writerow(["name[B]", "B, a place."])
    recs = load_records(path)
    assert len(recs) == 2
    assert recs[0].reference == ["A is in the centre.", "In the centre: A."]
    assert "name[A], area[city centre]" in recs[0].prompt
    assert load_e2e_nlg(path, limit=1)[0].id == "0"


def test_wikisql(tmp_path):
    q = write_jsonl(
        tmp_path / "dev.jsonl",
        [
            {
                "phase": 1,
                "table_id": "1-1",
                "question": "Who?",
                "sql": {"sel": "Name", "conds": [], "agg": ""},
                "question_id": 1,
            },
            {"phase": 1, "table_id": "1-1", "question": "How many?", "sql": {}, "question_id": 2},
        ],
    )
    write_jsonl(
        tmp_path / "dev_results.jsonl", [{"question_id": 1, "table_id": "1-1", "query": 'SELECT "Name" FROM "1-1";'}]
    )
    recs = load_records(q)
    assert recs[0].reference == 'SELECT "Name" FROM "1-1";' and recs[1].reference is None
    assert "Who?" in recs[0].prompt and "1-1" in recs[0].prompt
    other = write_jsonl(tmp_path / "other.jsonl", [{"question_id": 1, "query": "SELECT 1"}])
    assert load_wikisql(q, results_path=other)[0].reference == "SELECT 1"


def test_chat_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "chat.jsonl",
        [{"id": "a", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}],
    )
    rec = load_records(path)[0]
    assert rec.id == "a" and rec.prompt == "Hi" and rec.answers == ["Hello"]
    assert load_chat_jsonl(path)[0].reference == "Hello"


def test_unknown_formats(tmp_path):
    bad = write_jsonl(tmp_path / "x.jsonl", [{"foo": 1}])
    with pytest.raises(ValueError, match="unknown jsonl format"):
        load_records(bad)
    with pytest.raises(ValueError, match="unsupported"):
        load_records(tmp_path / "x.txt")


def test_chat_formatting():
    tok = tiny_chat_tokenizer()
    msgs = [{"role": "user", "content": "hello world"}]
    text = format_chat(tok, msgs)
    assert text.startswith("<|im_start|>user\nhello world<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    ids = encode_chat(tok, msgs)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and ids.count(tok.bos_token_id) == 2
    batch = encode_chat_batch(tok, [msgs, [{"role": "user", "content": "the cat sat on the mat"}]])
    assert batch["input_ids"].shape[0] == 2
    assert batch["attention_mask"][0, 0] == 0 and batch["attention_mask"][0, -1] == 1  # left padding
    assert tok.padding_side == "right"  # restored
    prompts = prepare_prompts([Record("1", ["hello world"])], tok)
    assert prompts[0].input_ids.tolist() == [ids]


def test_chat_formatting_needs_template():
    tok = tiny_chat_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        format_chat(tok, [{"role": "user", "content": "hi"}])


def test_tokenize_conversation_masks_prompt():
    tok = tiny_chat_tokenizer()
    msgs = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "yes no"}]
    out = tokenize_conversation(tok, msgs)
    toks = tok.convert_ids_to_tokens(out["input_ids"])
    trained = [t for t, l in zip(toks, out["labels"]) if l != -100]
    assert trained == ["yes", "no", "<|im_end|>"]
    assert len(out["input_ids"]) == len(out["labels"]) == len(out["attention_mask"])
    assert tokenize_conversation(tok, msgs, train_on_prompt=True)["labels"] == out["input_ids"]
    assert len(tokenize_conversation(tok, msgs, max_length=4)["input_ids"]) == 4
