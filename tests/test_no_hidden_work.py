"""`generate()` does no hidden work: one target forward per decoding step and nothing written, for a calibrated
drafter on a machine with no cached cost curve."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from conftest import tiny_model
from test_batch import DRAFTERS, ROWS, left_padded

import hf_speculative as hfs


def test_calibrated_drafter_on_a_fresh_cache_writes_nothing_and_runs_one_forward_per_step(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_SPECULATIVE_COST_AWARE", "1")
    model = hfs.enable(tiny_model("llama"))  # enable() may build this CPU's kernel into the cache: generate() may not
    before = sorted((tmp_path / "cache").rglob("*")) if (tmp_path / "cache").exists() else []
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=3)
    heads.config.calibration = {"head_top_i_accuracy": [[0.6, 0.2], [0.4, 0.1], [0.3, 0.1]]}
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7] * 2])
        for drafter in (
            heads,
            hfs.TokenRecyclingDrafter(),
            hfs.HybridDrafter([hfs.PromptLookupDrafter(), hfs.TokenRecyclingDrafter()]),
        ):
            calls.clear()
            out = model.generate(
                prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False, return_dict_in_generate=True
            )
            assert len(calls) == out.speculative_stats.num_target_forwards, type(drafter).__name__
    finally:
        handle.remove()
    after = sorted((tmp_path / "cache").rglob("*")) if (tmp_path / "cache").exists() else []
    assert after == before
    assert all("kernels" in p.parts for p in before)  # enable() wrote nothing but the compiled kernel


def _caller() -> tuple[str, str]:
    """The innermost hf_speculative frame calling the target (file name, function)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/hf_speculative/" in name:
            return os.path.basename(name), frame.f_code.co_name
        frame = frame.f_back
    return "", ""


ENGINE_CALLS = {("decoding.py", "_prefill"), ("tree_forward.py", "verification_forward")}


def _pruning_streams(model):
    ss = hfs.LlamaForSpeculativeStreaming.from_base_model(model, num_streams=2, num_msa_layers=1)
    ss.add_pruning_head(2, rank=4, threshold=0.012)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in ss.streams.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return ss


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", sorted([*DRAFTERS, "streaming_pruned"]))
def test_only_the_engine_runs_the_target_once_per_step(name, batch):
    """A forward hook on the target: every call comes from the engine (the prefill and one verification forward
    per decoding step), for every drafter at batch 1 and 2; Speculative Streaming with pruning prunes at batch 2.
    MagicDec's draft model IS the target (self-speculation over a sparse cache): its drafting forwards are the only
    other calls, and they come from its drafter."""
    model = hfs.enable(tiny_model("llama", num_layers=4))
    drafter = _pruning_streams(model) if name == "streaming_pruned" else DRAFTERS[name](model)
    ids, mask = left_padded(ROWS[:batch])
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(_caller()))
    try:
        out = model.generate(
            ids,
            attention_mask=mask,
            assistant_model=drafter,
            max_new_tokens=10,
            do_sample=False,
            pad_token_id=0,
            return_dict_in_generate=True,
        )
    finally:
        handle.remove()
    stats = out.speculative_stats
    engine = [c for c in calls if c in ENGINE_CALLS]
    assert len(engine) == stats.num_target_forwards
    others = {c for c in calls if c not in ENGINE_CALLS}
    assert others == (set() if name != "magicdec" else {("magicdec.py", "_draft_chains")}), others
    if name == "streaming_pruned":
        full = len(drafter.config.tree.parents)
        assert all(min(r.tree_sizes[1:]) < full for r in stats.rows)  # pruning was active in every row
