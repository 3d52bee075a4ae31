"""ROUGE as a local ``evaluate`` metric module (no Hub download), computed with ``rouge-score``.

Load it with ``evaluate.load("<this folder>")`` or ``hf_speculative.bench.metrics.load_metric("rouge")``.
"""

import datasets
import evaluate
from rouge_score import rouge_scorer

_CITATION = """\
@inproceedings{lin-2004-rouge,
    title = "{ROUGE}: A Package for Automatic Evaluation of Summaries",
    author = "Lin, Chin-Yew",
    booktitle = "Text Summarization Branches Out",
    year = "2004",
    publisher = "Association for Computational Linguistics",
    pages = "74--81",
}
"""

_DESCRIPTION = """\
ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum F-measures (Lin, 2004) through Google's `rouge-score`
package. With several references per prediction the best-scoring reference counts (as in
`rouge_score.RougeScorer.score_multi`).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of predicted texts.
    references: list of reference texts, or list of lists of reference texts.
    rouge_types: subset of ["rouge1", "rouge2", "rougeL", "rougeLsum"] (default all four).
    use_stemmer: Porter stemming before matching (default False).
    use_aggregator: mean over examples (default True); False returns one list per type.
Returns:
    {"rouge1": float, "rouge2": float, "rougeL": float, "rougeLsum": float} (F-measures in [0, 1])
Examples:
    >>> rouge = evaluate.load("hf_speculative/bench/metrics/rouge_local")
    >>> rouge.compute(predictions=["the cat sat"], references=["the cat sat"])["rouge1"]
    1.0
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class RougeLocal(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
            codebase_urls=["https://github.com/google-research/google-research/tree/master/rouge"],
        )

    def _compute(self, predictions, references, rouge_types=None, use_stemmer=False, use_aggregator=True):
        rouge_types = rouge_types or ["rouge1", "rouge2", "rougeL", "rougeLsum"]
        scorer = rouge_scorer.RougeScorer(rouge_types=rouge_types, use_stemmer=use_stemmer)
        scores = []
        for pred, ref in zip(predictions, references):
            if isinstance(ref, (list, tuple)):
                scores.append(scorer.score_multi(list(ref), pred))
            else:
                scores.append(scorer.score(ref, pred))
        if use_aggregator:
            return {t: sum(s[t].fmeasure for s in scores) / max(len(scores), 1) for t in rouge_types}
        return {t: [s[t].fmeasure for s in scores] for t in rouge_types}
