"""Benchmarking: the reference target model, prompt sets, the timing harness, reports and plots."""

from .reference import load_reference_model, resolve_model

__all__ = ["load_reference_model", "resolve_model"]
