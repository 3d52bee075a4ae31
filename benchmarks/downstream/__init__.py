"""Downstream task fine-tuning with speculative decoding: Speculative Streaming's Table 1 setting (Bhendawade et al.,
2024, Sec. 4.1) on E2E NLG, WikiSQL and DialogSum, with the arms LoRA, Medusa-2, shared-mode Speculative Streaming
and EAGLE-3 trained on one base with one LoRA setup and budget (`training`), evaluated plain against speculative
in one process (`evaluation`), gathered into a table (`table`). ``python benchmarks/run_downstream.py`` wires them
(`cli`); this folder sits beside the package, which it uses, and is not installed with it.
"""

from .evaluation import load_downstream
from .tasks import TASKS, DownstreamTask, calibration_split, get_task, load_task

__all__ = ["TASKS", "DownstreamTask", "calibration_split", "get_task", "load_downstream", "load_task"]
