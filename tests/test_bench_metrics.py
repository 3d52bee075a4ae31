"""The local evaluate metric modules load offline and compute the right numbers."""

import os
import subprocess
import sys

import pytest

from hf_speculative.bench.metrics import METRIC_PATHS, load_metric, metric_path


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def test_metric_scripts_are_in_the_package():
    for name, folder in METRIC_PATHS.items():
        assert (folder / f"{folder.name}.py").is_file(), name
    with pytest.raises(ValueError):
        metric_path("bleu")


def test_rouge():
    rouge = load_metric("rouge")
    same = rouge.compute(predictions=["the cat sat on the mat"], references=["the cat sat on the mat"])
    assert set(same) == {"rouge1", "rouge2", "rougeL", "rougeLsum"} and same["rouge1"] == pytest.approx(1.0)
    res = rouge.compute(predictions=["the cat sat", "hello"], references=["the cat sat", "hello there"])
    assert res["rouge1"] == pytest.approx((1.0 + 2 / 3) / 2)
    multi = rouge.compute(predictions=["the cat"], references=[["a dog", "the cat"]])  # best reference counts
    assert multi["rouge1"] == pytest.approx(1.0)
    per = rouge.compute(predictions=["a", "b"], references=["a", "c"], use_aggregator=False, rouge_types=["rouge1"])
    assert per == {"rouge1": [1.0, 0.0]}


def test_sql_exact_match():
    em = load_metric("sql_exact_match")
    preds = ['select "Name" from "1-1" where "No." = \'3\';', "```sql\nSELECT a FROM t\n```", "SELECT b FROM t"]
    refs = ['SELECT "Name" FROM "1-1" WHERE "No." = \'3\';', "SELECT a FROM t;", "SELECT c FROM t"]
    assert em.compute(predictions=preds, references=refs)["exact_match"] == pytest.approx(2 / 3)
    assert em.compute(predictions=preds, references=refs, normalize=False)["exact_match"] == 0.0
    assert em.compute(predictions=["SELECT 1"], references=[["SELECT 2", "select 1"]])["exact_match"] == 1.0


def test_loads_in_a_fresh_offline_process():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    code = (
        "import evaluate; from hf_speculative.bench.metrics import metric_path;"
        "r = evaluate.load(str(metric_path('rouge'))); s = evaluate.load(str(metric_path('sql_exact_match')));"
        "print(r.compute(predictions=['a b'], references=['a b'])['rouge1'], s.name)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("1.0")
