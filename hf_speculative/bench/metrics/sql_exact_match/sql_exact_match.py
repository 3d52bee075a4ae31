"""SQL exact match as a local ``evaluate`` metric module (no Hub download).

Load it with ``evaluate.load("<this folder>")`` or ``hf_speculative.bench.metrics.load_metric("sql_exact_match")``.
"""

import re

import datasets
import evaluate

_DESCRIPTION = """\
Exact match between predicted and reference SQL strings (e.g. WikiSQL's `query` field). By default
both sides are normalized first: code fences and a leading "SQL:" removed, whitespace collapsed, a
trailing semicolon dropped, keywords and identifiers lower-cased, double quotes turned into single
quotes, spaces around punctuation removed. `normalize=False` compares the raw strings.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of predicted SQL strings.
    references: list of reference SQL strings (or lists of acceptable strings).
    normalize: normalize before comparing (default True).
Returns:
    {"exact_match": float}: share of predictions equal to (one of) their reference(s).
Examples:
    >>> em = evaluate.load("hf_speculative/bench/metrics/sql_exact_match")
    >>> em.compute(predictions=["select a from t;"], references=["SELECT a FROM t"])["exact_match"]
    1.0
"""

_FENCE = re.compile(r"^```(?:sql)?\s*|\s*```$", re.IGNORECASE)


def normalize_sql(sql: str) -> str:
    s = sql.strip()
    s = _FENCE.sub("", s).strip()
    s = re.sub(r"^sql\s*:\s*", "", s, flags=re.IGNORECASE)
    s = s.replace('"', "'").replace("`", "'")
    s = re.sub(r"\s+", " ", s).strip().rstrip(";").strip()
    s = re.sub(r"\s*([(),=<>])\s*", r"\1", s)
    return s.lower()


class SqlExactMatch(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
        )

    def _compute(self, predictions, references, normalize=True):
        norm = normalize_sql if normalize else (lambda s: s)
        hits = 0
        for pred, ref in zip(predictions, references):
            refs = ref if isinstance(ref, (list, tuple)) else [ref]
            hits += any(norm(pred) == norm(r) for r in refs)
        return {"exact_match": hits / max(len(predictions), 1)}
