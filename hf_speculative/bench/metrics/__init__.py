"""Quality metrics as local ``evaluate`` modules stored in this package (loaded offline, no Hub).

from hf_speculative.bench.metrics import load_metric
rouge = load_metric("rouge")            # hf_speculative/bench/metrics/rouge_local/rouge_local.py
em = load_metric("sql_exact_match")     # hf_speculative/bench/metrics/sql_exact_match/sql_exact_match.py
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["METRICS_DIR", "METRIC_PATHS", "metric_path", "load_metric"]

METRICS_DIR = Path(__file__).resolve().parent

METRIC_PATHS = {
    "rouge": METRICS_DIR / "rouge_local",
    "rouge_local": METRICS_DIR / "rouge_local",
    "sql_exact_match": METRICS_DIR / "sql_exact_match",
    "sql_em": METRICS_DIR / "sql_exact_match",
}


def metric_path(name: str) -> Path:
    if name not in METRIC_PATHS:
        raise ValueError(f"unknown metric {name!r}; known: {sorted(METRIC_PATHS)}")
    return METRIC_PATHS[name]


def load_metric(name: str, **kwargs):
    """``evaluate.load`` of a metric module stored in this package (works with ``HF_HUB_OFFLINE=1``)."""
    import evaluate

    return evaluate.load(str(metric_path(name)), **kwargs)
