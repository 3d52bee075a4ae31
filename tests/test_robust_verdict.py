"""The speed verdict of the demo and of ``hf-speculative bench`` under a disturbed run: the median of the per-prompt
speedups with their spread decides, and a line says that the timings looked disturbed."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_model

import hf_speculative as hfs
from hf_speculative.bench.report import Measurement, speedup_lines, summarize
from hf_speculative.bench.verdict import SpeedupSpread, disturbed_runs

ROOT = Path(__file__).resolve().parents[1]


def _demo():
    spec = importlib.util.spec_from_file_location("hf_speculative_demo", ROOT / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_spread_summary_and_disturbed_runs():
    spread = SpeedupSpread.from_seconds([1.0, 1.0, 10.0, 1.0], [1.0, 0.9, 1.0, 1.1])
    assert spread.median == pytest.approx((1 / 0.9 + 1 / 1.0) / 2) and spread.high == pytest.approx(10.0)
    assert spread.wide and "median of 4 prompts" in spread.describe()
    assert disturbed_runs({"a": 0.1, "b": 0.11, "c": 1.0, "d": 0.09}) == {"c": pytest.approx(10.0)}
    assert disturbed_runs({"a": 0.1, "b": 0.2}) == {}  # two runs cannot tell which one was disturbed


def test_bench_verdict_is_the_median_and_names_a_disturbed_plain_run():
    plain = [Measurement(str(i), "chat", "plain", 10, [10.0 if i == 2 else 1.0]) for i in range(5)]
    fast = [Measurement(str(i), "chat", "fast", 10, [0.9]) for i in range(5)]
    methods = summarize(plain + fast)
    assert methods["fast"]["speedup"] == pytest.approx(1 / 0.9)  # total time over total time would say 14 / 4.5
    assert methods["plain"]["disturbed"] == {"2": pytest.approx(10.0)}
    text = speedup_lines(methods)
    assert "fast: 1.11x (median of 5 prompts; per prompt 1.11-11.11x" in text
    assert "timings look disturbed" in text and "plain on 2 took 10.0x" in text


def test_demo_under_a_slow_plain_run_reports_the_median_and_says_so(monkeypatch, capsys):
    demo = _demo()
    model = hfs.enable(tiny_model())
    generate, calls = demo.plain_generate, []

    def slow_third_plain_run(model, ids, common):
        start = time.perf_counter()
        out = generate(model, ids, common)
        calls.append(ids)
        if len(calls) == 3:  # the third prompt's plain run, as if another process took the cores
            time.sleep(max(0.3, 9 * (time.perf_counter() - start)))
        return out

    monkeypatch.setattr(demo, "plain_generate", slow_third_plain_run)
    torch.manual_seed(0)
    prompts = [
        SimpleNamespace(
            input_ids=torch.randint(0, 60, (1, 12)).repeat(1, 2),
            category="chat",
            record=SimpleNamespace(prompt=f"prompt {i}"),
        )
        for i in range(5)
    ]
    runs = demo.run_demo(
        model, None, prompts, {"prompt-lookup": (hfs.PromptLookupDrafter(), "")}, max_new_tokens=12, show=0
    )
    out = capsys.readouterr().out
    assert "timings look disturbed" in out and "plain on prompt 3 took" in out and "re-measured" in out
    assert "verdict: prompt-lookup:" in out and "(median of 5 prompts; per prompt" in out
    # the engine with nothing drafted runs beside every drafter: its verdict, and each drafter's share over it
    assert "verdict: engine, nothing drafted:" in out and "tau 1.00" in out
    assert "speculation's own share" in out.split("verdict: prompt-lookup:")[1] and "speculation's share" in out
    assert all(torch.equal(r.plain, r.outputs["engine, nothing drafted"]) for r in runs)
    # prompt 3 measured again, the faster time kept (a busy shared core may disturb another method's run too)
    assert any(torch.equal(c, prompts[2].input_ids) for c in calls[5:]) and runs[2].plain_s < 0.3
