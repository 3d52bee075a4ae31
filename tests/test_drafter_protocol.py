"""The drafter protocol page's example drafter runs as written: greedy output equals plain `generate()` at batch 1
and in a left-padded batch, it learns from the verified top-k, and only the engine runs the target."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from conftest import tiny_model
from test_batch import ROWS, left_padded

import hf_speculative as hfs

PAGE = Path(__file__).resolve().parents[1] / "docs" / "drafter_protocol.md"


def _example_drafter():
    code = re.search(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S).group(1)
    assert len(code.strip().splitlines()) <= 40
    namespace: dict = {}
    exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace["BigramDrafter"]


def test_the_example_drafter_is_exact_and_learns():
    model = hfs.enable(tiny_model("llama", seed=3))
    drafter = _example_drafter()()
    prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7] * 3])
    plain = model.generate(prompt, max_new_tokens=24, do_sample=False)
    out = model.generate(
        prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, plain)
    assert len(drafter.successor) >= len(set(prompt[0].tolist()))  # learned from the prefill's top-k at least
    again = model.generate(
        prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False, return_dict_in_generate=True
    )
    assert torch.equal(again.sequences, plain)
    assert again.speculative_stats.mean_accepted_length > 1.0  # the table drafts the continuation it saw verified


def test_the_example_drafter_in_a_batch():
    model = hfs.enable(tiny_model("llama", seed=3))
    ids, mask = left_padded(ROWS)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    out = model.generate(
        ids,
        attention_mask=mask,
        assistant_model=_example_drafter()(),
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(out, plain)
