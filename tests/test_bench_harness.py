"""The bench harness on a tiny random Llama (no network, no reference model)."""

import importlib.metadata
import json

import pytest
from conftest import tiny_chat_model

import hf_speculative as hfs
from hf_speculative.bench.harness import (
    METHODS,
    BenchMethod,
    BenchOptions,
    machine_info,
    parse_tree,
    register_method,
    run_benchmark,
)
from hf_speculative.bench.report import markdown_table
from hf_speculative.training.data import Record


@pytest.fixture(scope="module")
def tiny():
    return tiny_chat_model(num_layers=4)


RECORDS = [
    Record("1", ["write a short poem about the cat"], "writing"),
    Record("2", ["what is one and two ?"], "math"),
    Record("3", ["tell me a story about the dog and the cat"], "writing"),
]


def test_builtin_methods_registered():
    for name in ("plain", "hf-assisted", "hf-prompt-lookup", "tree-layercut", "chain-layercut", "magicdec"):
        assert name in METHODS


def test_machine_info_names_the_installed_versions(monkeypatch):
    def fake_version(name):
        if name == "hf-speculative":
            return "9.9.9"
        raise importlib.metadata.PackageNotFoundError(name)

    info = machine_info("cpu")
    assert info["torch"] and info["transformers"]
    monkeypatch.setattr("hf_speculative.bench.harness.version", fake_version)
    assert machine_info("cpu")["hf_speculative"] == "9.9.9"
    monkeypatch.setattr("hf_speculative.bench.harness.version", lambda name: fake_version("not-installed"))
    assert machine_info("cpu")["hf_speculative"] is None  # runs from a source tree


def test_parse_tree():
    assert parse_tree(None) is None
    assert parse_tree("cartesian:2,2").num_nodes == 6
    assert parse_tree("chain:3").num_nodes == 3
    assert parse_tree("dynamic:16,4,3") == hfs.DynamicTree(total_tokens=16, depth=4, top_k=3)
    assert parse_tree("[[0], [1], [0, 0]]").num_nodes == 3
    with pytest.raises(ValueError):
        parse_tree("nonsense")


def test_run_benchmark_transformers_methods(tiny):
    model, tok = tiny
    opts = BenchOptions(draft_layers=2, assistant_tokens=3)
    result = run_benchmark(
        model,
        tok,
        RECORDS,
        ["hf-prompt-lookup", "plain", "hf-assisted"],
        opts,
        max_new_tokens=12,
        progress=False,
        save_text=True,
    )
    json.dumps(result)
    assert set(result) == {"setting", "methods", "prompts", "numerics_floor"}
    s = result["setting"]
    assert s["n_prompts"] == 3 and s["max_new_tokens"] == 12 and s["temperature"] == 0.0
    assert {"platform", "cpu_count", "torch", "transformers"} <= set(s["machine"])
    assert s["methods"]["hf-assisted"]["num_assistant_tokens"] == 3
    methods = result["methods"]
    assert list(methods) == ["plain", "hf-prompt-lookup", "hf-assisted"]  # plain first (baseline)
    assert methods["plain"]["tau"] == 1.0 and methods["plain"]["speedup"] == pytest.approx(1.0)
    for name in ("hf-assisted", "hf-prompt-lookup"):
        m = methods[name]
        assert m["lossless_rate"] == 1.0  # greedy transformers speculation is exact in float32
        assert m["tau"] is not None and m["tau"] >= 1.0  # forwards counted by the hook
        assert m["target_forwards"] <= methods["plain"]["target_forwards"]
        assert set(m["per_category"]) == {"writing", "math"}
    assert len(result["prompts"]) == 3
    assert "text" in result["prompts"][0]["results"]["plain"]
    assert "| hf-assisted |" in markdown_table(methods)


def test_sampling_has_no_lossless_rate(tiny):
    model, tok = tiny
    result = run_benchmark(
        model, tok, RECORDS[:2], ["plain", "hf-prompt-lookup"], max_new_tokens=6, temperature=0.8, progress=False
    )
    assert result["methods"]["hf-prompt-lookup"]["lossless_rate"] is None
    assert result["setting"]["greedy"] is False
    assert "numerics_floor" not in result  # greedy only


def test_identical_rate_and_numerics_floor_float32(tiny):
    """fp32: every method identical to plain, and plain itself unchanged as a row of a batch of 2 and with
    its prefill split in two (the floor is 100%); the fields are in the JSON per method and per prompt."""
    model, tok = tiny
    result = run_benchmark(model, tok, RECORDS, ["plain", "tree-prompt-lookup"], max_new_tokens=12, progress=False)
    m = result["methods"]["tree-prompt-lookup"]
    assert m["lossless_rate"] == 1.0 and m["first_divergence_min"] is None and "first_divergence_mean" in m
    floor = result["numerics_floor"]
    for variant in ("batch_of_two", "split_prefill", "any"):
        assert floor[variant]["identical_rate"] == 1.0 and floor[variant]["n"] == 3
    for row in result["prompts"]:
        assert row["numerics_floor"] == {"batch_of_two": None, "split_prefill": None}
        assert row["results"]["tree-prompt-lookup"]["first_divergence"] is None
    no_floor = run_benchmark(
        model, tok, RECORDS[:1], ["tree-prompt-lookup"], max_new_tokens=4, progress=False, numerics_floor=False
    )
    assert "numerics_floor" not in no_floor


def test_numerics_floor_bfloat16_runs(tiny):
    """bf16: the floor and the first divergence are reported (their values depend on the CPU's rounding)."""
    import copy

    import torch

    model, tok = tiny
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    result = run_benchmark(bf16, tok, RECORDS[:2], ["tree-prompt-lookup"], max_new_tokens=8, progress=False)
    assert result["setting"]["dtype"] == "torch.bfloat16"
    assert result["numerics_floor"]["batch_of_two"]["n"] == 2  # without a plain method: one untimed plain call
    assert set(result["prompts"][0]["numerics_floor"]) == {"batch_of_two", "split_prefill"}


def test_repeats_reported(tiny):
    model, tok = tiny
    result = run_benchmark(model, tok, RECORDS[:2], ["plain"], max_new_tokens=4, repeats=3, progress=False)
    rep = result["methods"]["plain"]["repeats"]
    assert len(rep["median_tokens_per_s_per_repeat"]) == 3
    assert len(result["prompts"][0]["results"]["plain"]["wall_s_repeats"]) == 3


def test_registry_is_extensible(tiny):
    model, tok = tiny

    @register_method
    class Greedy2(BenchMethod):
        name = "test-greedy-copy"
        description = "plain generate under another name"

        def generate(self, input_ids, attention_mask, **common):
            return self.model.generate(input_ids, attention_mask=attention_mask, **common)

    try:
        result = run_benchmark(model, tok, RECORDS[:2], ["plain", "test-greedy-copy"], max_new_tokens=5, progress=False)
        assert result["methods"]["test-greedy-copy"]["lossless_rate"] == 1.0
        assert result["methods"]["test-greedy-copy"]["tau"] is None  # no forward count: reported as n/a
    finally:
        METHODS.pop("test-greedy-copy")


def test_unknown_method(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="unknown method"):
        run_benchmark(model, tok, RECORDS[:1], ["plain", "nope"], max_new_tokens=2, progress=False)


def test_run_benchmark_engine_methods(tiny):
    model, tok = tiny
    opts = BenchOptions(draft_layers=2, tree="cartesian:2,2", chain_length=3)
    result = run_benchmark(
        model, tok, RECORDS[:2], ["plain", "tree-layercut", "chain-layercut"], opts, max_new_tokens=10, progress=False
    )
    for name in ("tree-layercut", "chain-layercut"):
        m = result["methods"][name]
        assert m["lossless_rate"] == 1.0
        assert m["tau"] >= 1.0
        assert "accepted_lengths" in result["prompts"][0]["results"][name]
    assert result["setting"]["methods"]["tree-layercut"]["tree_nodes"] == 6


def test_run_benchmark_magicdec(tiny):
    from hf_speculative.bench.batch import run_batch_benchmark

    model, tok = tiny
    opts = BenchOptions(magicdec_window=8, magicdec_sinks=1, chain_length=3)
    result = run_benchmark(model, tok, RECORDS[:2], ["plain", "magicdec"], opts, max_new_tokens=10, progress=False)
    m = result["methods"]["magicdec"]
    assert m["lossless_rate"] == 1.0 and m["tau"] >= 1.0
    assert "accepted_lengths" in result["prompts"][0]["results"]["magicdec"]
    setting = result["setting"]["methods"]["magicdec"]
    assert setting["sliding_window"] == 8 and setting["num_sink_tokens"] == 1 and setting["num_draft_tokens"] == 3
    assert setting["positions"] == "cache" and setting["tree_nodes"] == 3  # the chain of 3
    # batched, with --tree and text positions
    opts = BenchOptions(magicdec_window=8, magicdec_positions="original", tree="[[0], [1], [0, 0]]")
    batched = run_batch_benchmark(
        model, tok, RECORDS, ["plain", "magicdec"], [1, 2], opts, max_new_tokens=8, progress=False
    )
    assert batched["setting"]["methods"]["magicdec"]["positions"] == "original"
    for b in ("1", "2"):
        stats = batched["batches"][b]["magicdec"]
        assert stats["lossless_rate"] == 1.0 and len(stats["tau_per_row"]) == 3 and stats["tree_nodes"] == 3
        assert stats["verified_tokens_per_row"] == 4.0  # every forward carried each row's 3 nodes and its root
        assert batched["batches"][b]["plain"]["verified_tokens_per_row"] is None


def test_batch_bench_repeats_take_the_median_per_batch(tiny, monkeypatch):
    """``repeats``: every method decodes every batch that many times, in rounds of alternating order, and its time on a
    batch is the median of its rounds; the rows measured are the first round's (plain first). A drafter that learns
    across calls (SuffixDecoding) runs in the first round only: later it would draft from the answer it saw."""
    import hf_speculative.bench.batch as batch_bench

    model, tok = tiny
    calls, fake = [], iter([0.5, 1.0, 4.0, 9.0, 2.0, 3.0, 1.0] * 8)
    timed = batch_bench._timed_generate

    def counted(m, *args):
        out, _ = timed(m, *args)
        calls.append(m.name)
        return out, next(fake)

    monkeypatch.setattr(batch_bench, "_timed_generate", counted)
    result = batch_bench.run_batch_benchmark(
        model, tok, RECORDS[:2], ["engine", "suffix"], [2], max_new_tokens=4, progress=False, repeats=3
    )
    # one batch, three rounds, the order reversed in the second; suffix only in the first
    assert calls == ["plain", "engine", "suffix", "engine", "plain", "plain", "engine"]
    rows = result["batches"]["2"]
    # plain timed 0.5, 2.0, 3.0 and the engine 1.0, 9.0, 1.0 in those rounds: medians 2.0 and 1.0
    assert rows["plain"]["seconds"] == 2.0 and rows["engine"]["seconds"] == 1.0 and rows["suffix"]["seconds"] == 4.0
    assert rows["plain"]["round_seconds"] == [0.5, 2.0, 3.0] and rows["engine"]["round_seconds"] == [1.0, 9.0, 1.0]
    assert rows["suffix"]["round_seconds"] == [4.0]
    assert rows["engine"]["speedup"] == pytest.approx(2.0) and rows["engine"]["lossless_rate"] == 1.0
    assert rows["engine"]["new_tokens"] == rows["plain"]["new_tokens"] and result["setting"]["repeats"] == 3
    with pytest.raises(ValueError, match="repeats"):
        batch_bench.run_batch_benchmark(model, tok, RECORDS[:2], ["engine"], [2], progress=False, repeats=0)


def test_repeats_time_a_drafter_that_learns_across_calls_once(tiny):
    """Per prompt, ``repeats`` times every method that many times, except a drafter that keeps what it saw across
    calls (Token Recycling, SuffixDecoding, a hybrid with either), which a second call would time on a seen answer."""
    import hf_speculative as hfs
    from hf_speculative.bench.harness import learns_across_calls

    assert hfs.SuffixDrafter.learns_across_calls and hfs.TokenRecyclingDrafter.learns_across_calls
    assert not hfs.PromptLookupDrafter.learns_across_calls
    assert hfs.HybridDrafter([hfs.PromptLookupDrafter(), hfs.SuffixDrafter()]).learns_across_calls
    assert not hfs.HybridDrafter([hfs.PromptLookupDrafter()]).learns_across_calls
    model, tok = tiny
    result = run_benchmark(
        model, tok, RECORDS[:1], ["plain", "engine", "token-recycling"], max_new_tokens=4, progress=False, repeats=2
    )
    results = result["prompts"][0]["results"]
    assert len(results["plain"]["wall_s_repeats"]) == 2 and len(results["engine"]["wall_s_repeats"]) == 2
    assert "wall_s_repeats" not in results["token-recycling"] and results["token-recycling"]["wall_s"] > 0
    assert not learns_across_calls(object())


def test_checkpoint_after_each_prompt(tiny):
    model, tok = tiny
    seen = []
    run_benchmark(model, tok, RECORDS, ["plain"], max_new_tokens=2, progress=False, checkpoint=seen.append)
    assert [c["setting"]["n_prompts"] for c in seen] == [1, 2]
    assert all(c["setting"]["partial"] for c in seen)


def test_floor_outputs_equal_plain_in_float32(tiny):
    """Both floor shapes reproduce plain batch-of-one greedy decoding in fp32, a one-token prompt included."""
    import torch
    import transformers

    from hf_speculative.bench.numerics import floor_outputs

    model, tok = tiny
    common = dict(max_new_tokens=10, do_sample=False, eos_token_id=model.generation_config.eos_token_id)
    for ids in (tok("tell me a story about the dog", return_tensors="pt").input_ids, torch.tensor([[5]])):
        plain = transformers.GenerationMixin.generate(model, ids, **common)[0, ids.shape[1] :].tolist()
        outputs = floor_outputs(model, ids, common)
        assert outputs == {"batch_of_two": plain, "split_prefill": plain}


def test_engine_with_nothing_drafted(tiny):
    """``engine``: the engine's loop with a drafter that proposes nothing (every draft the root alone) gives plain's
    tokens in one-token steps, runs right after plain wherever it is listed, and its row is in both reports with
    every other method's speculation's own share (tokens/s over the engine's)."""
    from hf_speculative.bench.batch import batch_table, run_batch_benchmark
    from hf_speculative.bench.report import speedup_lines

    model, tok = tiny
    assert "engine" in METHODS and METHODS["engine"].label == "engine, nothing drafted"
    result = run_benchmark(
        model, tok, RECORDS[:2], ["tree-prompt-lookup", "engine", "plain"], max_new_tokens=10, progress=False
    )
    methods = result["methods"]
    assert list(methods) == ["plain", "engine", "tree-prompt-lookup"]
    engine = methods["engine"]
    assert engine["lossless_rate"] == 1.0 and engine["tau"] == 1.0  # plain's tokens, one per target forward
    assert engine["new_tokens"] == methods["plain"]["new_tokens"]
    assert all(n == 1 for row in result["prompts"] for n in row["results"]["engine"]["accepted_lengths"])
    assert engine["speculation_share"] == pytest.approx(1.0) and methods["plain"]["speculation_share"] is None
    assert methods["tree-prompt-lookup"]["speculation_share"] > 0
    assert result["setting"]["methods"]["engine"]["speculative_pricing"] is False
    table = markdown_table(methods)
    assert "| engine, nothing drafted | 1.00 |" in table and "speculation's share" in table
    assert "tree-prompt-lookup: " in speedup_lines(methods) and "speculation's own share" in speedup_lines(methods)

    batched = run_batch_benchmark(
        model, tok, RECORDS, ["tree-prompt-lookup", "engine"], [2], max_new_tokens=6, progress=False
    )
    rows = batched["batches"]["2"]
    assert list(rows) == ["plain", "engine", "tree-prompt-lookup"]
    assert (
        rows["engine"]["lossless_rate"] == 1.0 and rows["engine"]["tau"] == 1.0 and rows["engine"]["tree_nodes"] is None
    )
    assert rows["tree-prompt-lookup"]["speculation_share"] == pytest.approx(
        rows["tree-prompt-lookup"]["tokens_per_s"] / rows["engine"]["tokens_per_s"]
    )
    assert "| 2 | engine, nothing drafted | - |" in batch_table(batched)
