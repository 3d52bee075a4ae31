"""Benchmark arithmetic, JSON summary schema, markdown tables and the plot (no model needed)."""

import json

import pytest

from hf_speculative.bench.numerics import first_divergence, summarize_floor
from hf_speculative.bench.report import (
    Measurement,
    category_table,
    floor_lines,
    lossless_rate,
    markdown_table,
    plot_results,
    prompts_json,
    speedup,
    step_overhead,
    summarize,
    tau,
)


def M(pid, method, tokens, wall, fwd=None, ids=None, cat="writing", walls=None):
    return Measurement(pid, cat, method, tokens, walls or [wall], target_forwards=fwd, output_ids=ids)


@pytest.fixture
def runs():
    plain = [M("a", "plain", 10, 1.0, 10, [1] * 10), M("b", "plain", 20, 4.0, 20, [2] * 20, cat="math")]
    fast = [M("a", "fast", 10, 0.5, 4, [1] * 10), M("b", "fast", 20, 1.0, 8, [3] * 20, cat="math")]
    return plain, fast


def test_speedup_is_mean_of_per_prompt_ratios(runs):
    plain, fast = runs
    # prompt a: 20 vs 10 tok/s -> 2x; prompt b: 20 vs 5 tok/s -> 4x; mean 3x (not total-time ratio 5/1.5)
    assert speedup(fast, plain) == pytest.approx(3.0)
    assert speedup(plain, plain) == pytest.approx(1.0)


def test_speedup_matches_prompts_by_id(runs):
    plain, fast = runs
    assert speedup(list(reversed(fast)), plain) == pytest.approx(3.0)
    assert speedup(fast[:1], plain) == pytest.approx(2.0)


def test_tau_and_step_overhead(runs):
    plain, fast = runs
    assert tau(plain) == pytest.approx(1.0)
    assert tau(fast) == pytest.approx(30 / 12)
    # plain step = 5 s / 30 tokens; fast step = 1.5 s / 12 forwards
    assert step_overhead(fast, plain) == pytest.approx((1.5 / 12) / (5 / 30))
    assert step_overhead(plain, plain) == pytest.approx(1.0)
    unknown = [M("a", "x", 10, 1.0, None)]
    assert tau(unknown) is None and step_overhead(unknown, plain) is None


def test_speedup_is_about_tau_over_overhead_for_uniform_prompts():
    plain = [M(str(i), "plain", 100, 10.0, 100) for i in range(3)]
    spec = [M(str(i), "spec", 100, 5.0, 40) for i in range(3)]
    assert speedup(spec, plain) == pytest.approx(tau(spec) / step_overhead(spec, plain))


def test_lossless_rate(runs):
    plain, fast = runs
    assert lossless_rate(fast, plain) == pytest.approx(0.5)
    assert lossless_rate(plain, plain) == 1.0
    assert lossless_rate(fast, plain, greedy=False) is None


def test_summary_json_schema(runs):
    plain, fast = runs
    summary = summarize(plain + fast)
    assert list(summary) == ["plain", "fast"]
    for s in summary.values():
        for key in ("tau", "tokens_per_s", "speedup", "step_overhead", "lossless_rate", "per_category"):
            assert key in s
        assert set(s["per_category"]) == {"writing", "math"}
        for c in s["per_category"].values():
            assert set(c) >= {"tau", "speedup", "tokens_per_s"}
    assert summary["fast"]["per_category"]["math"]["speedup"] == pytest.approx(4.0)
    assert summary["fast"]["tokens_per_s"] == pytest.approx(30 / 1.5)
    assert summary["plain"]["repeats"] is None
    json.dumps(summary)  # serializable
    sampled = summarize(plain + fast, greedy=False)
    assert sampled["fast"]["lossless_rate"] is None


def test_speculation_share_is_the_speedup_over_the_engine_row(runs):
    """With an ``engine`` row (the engine with nothing drafted), each method's tokens/s over the engine's on the same
    prompt (median over prompts) is its speculation's own share; plain has none, the engine's own is 1."""
    plain, fast = runs
    engine = [M("a", "engine", 10, 0.8, 10, [1] * 10), M("b", "engine", 20, 2.0, 20, [2] * 20, cat="math")]
    summary = summarize(plain + engine + fast)
    # prompt a: 20 vs 12.5 tok/s -> 1.6x; prompt b: 20 vs 10 tok/s -> 2x
    assert summary["fast"]["speculation_share"] == pytest.approx(1.8)
    assert summary["engine"]["speculation_share"] == pytest.approx(1.0)
    assert summary["plain"]["speculation_share"] is None
    assert summarize(plain + fast)["fast"]["speculation_share"] is None  # no engine row
    assert "| fast | 2.50 | 20.0 | 3.00x | 1.80x |" in markdown_table(summary)


def test_repeats_use_median_and_report_spread():
    plain = [M("a", "plain", 10, None, 10, walls=[1.0, 2.0, 1.2]), M("b", "plain", 10, None, 10, walls=[1.0, 1.0, 1.0])]
    assert plain[0].wall == pytest.approx(1.2)
    s = summarize(plain)["plain"]["repeats"]
    assert len(s["median_tokens_per_s_per_repeat"]) == 3
    assert s["min"] <= s["max"] and s["relative_spread"] >= 0


def test_prompts_json(runs):
    plain, fast = runs
    rows = prompts_json(plain + fast)
    assert [r["id"] for r in rows] == ["a", "b"]
    assert rows[0]["results"]["fast"]["matches_plain"] is True
    assert rows[1]["results"]["fast"]["matches_plain"] is False
    assert rows[0]["results"]["fast"]["tau"] == pytest.approx(2.5)
    assert rows[0]["results"]["fast"]["first_divergence"] is None
    assert rows[1]["results"]["fast"]["first_divergence"] == 0


def test_first_divergence_summary():
    plain = [M(p, "plain", 6, 1.0, 6, [1, 2, 3, 4, 5, 6]) for p in "abcd"]
    spec = [
        M("a", "spec", 6, 1.0, 3, [1, 2, 3, 4, 5, 6]),
        M("b", "spec", 6, 1.0, 3, [1, 2, 9, 9, 9, 9]),
        M("c", "spec", 6, 1.0, 3, [1, 2, 3, 4, 5, 7]),
        M("d", "spec", 4, 1.0, 2, [1, 2, 3, 4]),
    ]
    s = summarize(plain + spec)
    assert s["spec"]["lossless_rate"] == pytest.approx(0.25)
    # b leaves at 2, c at 5, d stops early at 4: mean over the three diverging prompts
    assert (s["spec"]["first_divergence_min"], s["spec"]["first_divergence_max"]) == (2, 5)
    assert s["spec"]["first_divergence_mean"] == pytest.approx(11 / 3)
    assert s["plain"]["first_divergence_min"] is None
    assert "| 25% | 4 / 2 |" in markdown_table(s)
    assert "first_divergence_min" not in summarize(plain + spec, greedy=False)["spec"]


def test_numerics_floor_helpers():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 5, 3], [1, 2, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    floor = summarize_floor(
        {
            "a": {"batch_of_two": None, "split_prefill": None},
            "b": {"batch_of_two": 7, "split_prefill": None},
            "c": {"batch_of_two": 30, "split_prefill": 12},
        }
    )
    assert floor["batch_of_two"]["identical"] == 1 and floor["batch_of_two"]["first_divergence_mean"] == pytest.approx(
        18.5
    )
    assert floor["split_prefill"]["identical_rate"] == pytest.approx(2 / 3)
    assert floor["any"]["identical"] == 1 and floor["any"]["first_divergence_min"] == 7
    assert floor["any"]["first_divergence_max"] == 12  # per prompt, the earliest of its variants
    text = floor_lines(floor)
    assert "as one row of a batch of 2 identical rows: identical to batch-of-one on 1/3 prompts" in text
    assert (
        "with its prefill split in two forwards: identical to batch-of-one on 2/3 prompts; first divergence mean 12, min 12"
        in text
    )


def test_markdown_tables(runs):
    plain, fast = runs
    summary = summarize(plain + fast)
    table = markdown_table(summary)
    lines = table.splitlines()
    assert lines[0] == (
        "| method | tau | tokens/s | speedup | speculation's share | step overhead | identical to plain | "
        "first divergence (mean / min) |"
    )
    assert len(lines) == 4
    assert "| fast | 2.50 | 20.0 | 3.00x | n/a |" in table and "| 50% | 0 / 0 |" in table  # no engine row: no share
    assert "| plain | 1.00 | 6.0 | 1.00x | n/a | 1.00x | 100% | - |" in table
    summary["fast"]["tau"] = None
    assert "| fast | n/a |" in markdown_table(summary)
    cat = category_table(summarize(plain + fast))
    assert cat.splitlines()[0] == "| method | writing | math |"


def test_plot_writes_png(runs, tmp_path):
    plain, fast = runs
    path = plot_results(summarize(plain + fast), tmp_path / "sub" / "plot.png", title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_records_round_trip_plain_and_gzipped(tmp_path):
    """``--output x.json.gz`` writes the record gzipped (as the docs keep them), ``x.json`` as text; `read_json`
    reads either."""
    import gzip

    from hf_speculative.bench.report import read_json, write_json

    record = {"methods": {"suffix": {"tau": 1.9, "tokens_per_s": [21.5, 22.0]}}, "note": "ü"}
    plain, packed = write_json(record, tmp_path / "r.json"), write_json(record, tmp_path / "r.json.gz")
    assert json.loads(plain.read_text(encoding="utf-8")) == record
    assert json.loads(gzip.decompress(packed.read_bytes())) == record
    assert read_json(plain) == read_json(packed) == record
    assert packed.read_bytes() == write_json(record, tmp_path / "again.json.gz").read_bytes()  # no timestamp inside
