"""Self-distillation on a tiny random Llama: output format, resume, torn lines, batching, multi-turn."""

import json

import pytest
from conftest import tiny_chat_model

from hf_speculative.training.data import Record, load_records
from hf_speculative.training.distill import order_by_length, read_done_ids, self_distill


@pytest.fixture(scope="module")
def tiny():
    return tiny_chat_model(num_layers=2)


RECORDS = [
    Record(str(i), [p, "now say it short"], "test")
    for i, p in enumerate(
        ["hello world", "write a poem about the cat", "what is one and two ?", "tell me a story", "red blue green"]
    )
]


def read(path):
    return [json.loads(l) for l in path.read_text().splitlines()]


def test_distill_format_and_resume(tiny, tmp_path):
    model, tok = tiny
    out = tmp_path / "d.jsonl"
    stats = self_distill(model, tok, RECORDS, out, max_new_tokens=6, limit=2, progress=False)
    assert stats.written == 2 and stats.skipped == 0
    rows = read(out)
    assert [r["id"] for r in rows] == ["0", "1"]
    msgs = rows[0]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant"] and msgs[0]["content"] == "hello world"
    assert isinstance(msgs[1]["content"], str) and rows[0]["num_new_tokens"] <= 6
    assert rows[0]["finish_reason"] in ("stop", "length")

    # resume: the first two are skipped, the rest appended
    stats = self_distill(model, tok, RECORDS, out, max_new_tokens=6, progress=False)
    assert stats.skipped == 2 and stats.written == 3
    assert [r["id"] for r in read(out)] == ["0", "1", "2", "3", "4"]
    assert self_distill(model, tok, RECORDS, out, max_new_tokens=6, progress=False).written == 0
    # the output loads back as chat records
    assert load_records(out)[1].answers == [rows[1]["messages"][1]["content"]]


def test_torn_last_line_is_dropped_and_redone(tiny, tmp_path):
    model, tok = tiny
    out = tmp_path / "d.jsonl"
    self_distill(model, tok, RECORDS[:2], out, max_new_tokens=4, progress=False)
    good = out.read_text()
    out.write_text(good + '{"id": "2", "messages": [{"ro')  # interrupted mid-write
    assert read_done_ids(out) == {"0", "1"}
    assert out.read_text() == good  # torn tail cut off
    self_distill(model, tok, RECORDS[:3], out, max_new_tokens=4, progress=False)
    assert [r["id"] for r in read(out)] == ["0", "1", "2"]


def test_batched_greedy_matches_unbatched(tiny, tmp_path):
    model, tok = tiny
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    self_distill(model, tok, RECORDS, a, max_new_tokens=6, batch_size=1, progress=False)
    self_distill(model, tok, RECORDS, b, max_new_tokens=6, batch_size=3, progress=False)
    assert [r["messages"] for r in read(a)] == [r["messages"] for r in read(b)]


def test_all_turns_and_sampling(tiny, tmp_path):
    model, tok = tiny
    out = tmp_path / "m.jsonl"
    self_distill(
        model, tok, RECORDS[:2], out, max_new_tokens=4, all_turns=True, temperature=0.9, seed=1, progress=False
    )
    rows = read(out)
    assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant", "user", "assistant"]
    assert rows[0]["messages"][2]["content"] == "now say it short"


def test_time_budget(tiny, tmp_path):
    model, tok = tiny
    stats = self_distill(model, tok, RECORDS, tmp_path / "t.jsonl", max_new_tokens=4, time_budget_s=0.0, progress=False)
    assert stats.written == 0


def test_time_budget_starts_no_batch_that_would_end_after_it(tiny, tmp_path, monkeypatch):
    """A batch that took 0.3 s leaves 0.2 s of a 0.5 s budget: the next one, as long, would end after it."""
    import time

    import hf_speculative.training.distill as distill

    def slow_batch(model, tokenizer, batch, all_turns, gen_kwargs):
        time.sleep(0.3)
        return [["ok"] for _ in batch], [1] * len(batch), ["stop"] * len(batch)

    model, tok = tiny
    monkeypatch.setattr(distill, "_answer_batch", slow_batch)
    stats = self_distill(model, tok, RECORDS, tmp_path / "t.jsonl", batch_size=2, time_budget_s=0.5, progress=False)
    assert stats.written == 2


def test_speculative_answers_equal_plain_ones(tiny, tmp_path):
    """Batched answering through the engine with a drafter gives the answers plain batched decoding gives."""
    import hf_speculative as hfs

    model, tok = tiny
    plain, fast = tmp_path / "plain.jsonl", tmp_path / "fast.jsonl"
    self_distill(model, tok, RECORDS, plain, max_new_tokens=12, batch_size=3, progress=False)
    texts = [r["messages"][1]["content"] for r in read(plain)[:2]]
    drafter = hfs.SuffixDrafter().warm([tok(t, add_special_tokens=False)["input_ids"] for t in texts])
    hfs.enable(model)
    self_distill(model, tok, RECORDS, fast, max_new_tokens=12, batch_size=3, progress=False, assistant_model=drafter)
    assert [r["messages"] for r in read(fast)] == [r["messages"] for r in read(plain)]
    assert drafter.index.num_tokens > sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)


def test_prompts_of_similar_lengths_batch_together_and_too_long_ones_are_left_out(tiny, tmp_path):
    """Each window of records is answered shortest prompt first; prompts over the cap are left out and counted; the
    answers are the ones of the given order (greedy, batch 1 against batch 2)."""
    model, tok = tiny
    lengths = [len(tok(r.prompt, add_special_tokens=False)["input_ids"]) for r in RECORDS]
    order, left_out = order_by_length(RECORDS, tok, sort_window=3)
    assert left_out == 0 and sorted(r.id for r in order) == [r.id for r in RECORDS]
    for w in (order[:3], order[3:]):
        assert [lengths[int(r.id)] for r in w] == sorted(lengths[int(r.id)] for r in w)
    assert {r.id for r in order[:3]} == {"0", "1", "2"}  # windows keep their records
    cap = sorted(lengths)[2]
    kept, left_out = order_by_length(RECORDS, tok, max_prompt_tokens=cap)
    assert [r.id for r in kept] == [r.id for r in RECORDS if lengths[int(r.id)] <= cap] and left_out == 5 - len(kept)

    plain, sorted_out = tmp_path / "plain.jsonl", tmp_path / "sorted.jsonl"
    self_distill(model, tok, RECORDS, plain, max_new_tokens=6, progress=False)
    stats = self_distill(
        model,
        tok,
        RECORDS,
        sorted_out,
        max_new_tokens=6,
        batch_size=2,
        sort_window=3,
        max_prompt_tokens=cap,
        progress=False,
    )
    assert stats.too_long == left_out and stats.written == len(kept) and "left out as too long" in str(stats)
    by_id = {r["id"]: r["messages"] for r in read(plain)}
    rows = read(sorted_out)
    assert {r["id"] for r in rows} == {r.id for r in kept}
    assert all(r["messages"] == by_id[r["id"]] for r in rows)
