"""`generate()` does no hidden work: one target forward per decoding step and nothing written, for a calibrated
drafter on a machine with no cached cost curve."""

from __future__ import annotations

import torch

import hf_speculative as hfs

from conftest import tiny_model


def test_calibrated_drafter_on_a_fresh_cache_writes_nothing_and_runs_one_forward_per_step(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_SPECULATIVE_COST_AWARE", "1")
    model = hfs.enable(tiny_model("llama"))
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=3)
    heads.config.calibration = {"head_top_i_accuracy": [[0.6, 0.2], [0.4, 0.1], [0.3, 0.1]]}
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7] * 2])
        for drafter in (heads, hfs.TokenRecyclingDrafter(), hfs.HybridDrafter([hfs.PromptLookupDrafter(), hfs.TokenRecyclingDrafter()])):
            calls.clear()
            out = model.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False, return_dict_in_generate=True)
            assert len(calls) == out.speculative_stats.num_target_forwards, type(drafter).__name__
    finally:
        handle.remove()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))
