"""The smoke run's stand-ins: a tiny random chat model and tiny files in the shapes the GPU run reads (ShareGPT
conversations, E2E NLG CSVs, a prompt set with categories)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

ANSWERS = [
    "the cat sat on the mat .",
    "a dog is big and red .",
    "one two three four five .",
    "hello world , how is it ?",
    "write me a short poem please .",
    "the blue cat was small .",
]


def write_tiny_model(folder: Path) -> Path:
    """A 4-layer random Llama and its word-level chat tokenizer, saved as a model folder."""
    from hf_speculative.bench.tiny import tiny_chat_tokenizer, tiny_llama

    tok = tiny_chat_tokenizer()
    tiny_llama(tokenizer=tok, num_layers=4, hidden_size=32, seed=0).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _e2e_csv(n_mr: int) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["mr", "ref"])
    for i in range(n_mr):
        for k in range(2):
            writer.writerow([f"name[cat {i}], food[red]", ANSWERS[(i + k) % len(ANSWERS)]])
    return buf.getvalue()


def write_smoke_data(data: Path) -> None:
    """``sharegpt/sharegpt.json``, ``e2e_nlg/{devset,testset_w_refs}.csv`` and ``prompts.jsonl`` under ``data``."""
    (data / "sharegpt").mkdir(parents=True, exist_ok=True)
    (data / "e2e_nlg").mkdir(parents=True, exist_ok=True)
    chats = [
        {
            "id": str(i),
            "conversations": [
                {"from": "human", "value": f"tell me about the cat {i % 3} ?"},
                {"from": "gpt", "value": ANSWERS[i % len(ANSWERS)]},
            ],
        }
        for i in range(8)
    ]
    (data / "sharegpt" / "sharegpt.json").write_text(json.dumps(chats))
    (data / "e2e_nlg" / "devset.csv").write_text(_e2e_csv(6))
    (data / "e2e_nlg" / "testset_w_refs.csv").write_text(_e2e_csv(3))
    prompts = [
        ("writing", "write a poem"),
        ("math", "what is one and two ?"),
        ("writing", "tell me a story"),
        ("math", "what is two and three ?"),
    ]
    rows = [{"question_id": i, "category": c, "turns": [t]} for i, (c, t) in enumerate(prompts)]
    (data / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
