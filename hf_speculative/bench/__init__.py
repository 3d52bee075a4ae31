"""Benchmarking: the reference target model, prompt sets, the timing harness, reports and plots."""

from .harness import METHODS, BenchMethod, BenchOptions, parse_tree, register_method, run_benchmark
from .projection import measure_step_latency, projected_speedup
from .prompts import PROMPT_SETS, describe_prompts, load_prompts, prepare_prompts
from .reference import load_reference_model, resolve_model
from .report import Measurement, category_table, markdown_table, plot_results, summarize

__all__ = [
    "load_reference_model",
    "resolve_model",
    "load_prompts",
    "prepare_prompts",
    "describe_prompts",
    "PROMPT_SETS",
    "METHODS",
    "BenchMethod",
    "BenchOptions",
    "register_method",
    "parse_tree",
    "run_benchmark",
    "Measurement",
    "summarize",
    "markdown_table",
    "category_table",
    "plot_results",
    "projected_speedup",
    "measure_step_latency",
]
