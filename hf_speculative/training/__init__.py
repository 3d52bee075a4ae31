"""What the training of every drafter shares: data loading, chat formatting, self-distillation."""

from .data import (
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
from .distill import DistillStats, read_done_ids, self_distill

__all__ = [
    "Record",
    "encode_chat",
    "encode_chat_batch",
    "format_chat",
    "load_alpaca",
    "load_chat_jsonl",
    "load_dialogsum",
    "load_e2e_nlg",
    "load_questions",
    "load_records",
    "load_sharegpt",
    "load_wikisql",
    "tokenize_conversation",
    "DistillStats",
    "read_done_ids",
    "self_distill",
]
