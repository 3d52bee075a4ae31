"""The model card (README.md) of a ``downstream train`` folder: task, data, split, budget, hardware, and the
measured metric, tau and speedup of ``downstream eval`` (`write_model_card`, ``downstream eval --write-card``)."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from ..model_card import render_card
from .table import ARM_NAMES, TASK_NAMES
from .tasks import get_task

__all__ = ["render_model_card", "write_model_card"]

_SPLITS = {
    "e2e_nlg": "train: `devset.csv` (4,672 MR/reference pairs, 48 MRs set aside for tree calibration); test: `testset_w_refs.csv` (630 MRs, all references)",
    "wikisql": "`dev.jsonl` + `dev_results.jsonl` joined by `question_id`, split by `table_id`: 90% of the tables train (48 questions set aside for calibration), a fixed 10% test (779 questions); schema = a CREATE TABLE line of the columns the table's questions use",
    "dialogsum": "`DialogSum_Data.zip`: train split (12,460; 48 dialogues set aside for calibration), test split (500, three summaries each)",
}
_LOADING = {
    "lora": "model = PeftModel.from_pretrained(base, f\"{folder}/adapter\").merge_and_unload()",
    "medusa2": "model, heads = load_medusa2(folder, base)  # hf_speculative.drafters.medusa.training_medusa2\nhfs.enable(model); model.generate(ids, assistant_model=heads)",
    "streaming": "ss = LlamaForSpeculativeStreaming.from_pretrained(folder)  # loads the reference base and lora/\nss.generate(ids, max_new_tokens=80)",
    "eagle": "model = PeftModel.from_pretrained(base, f\"{folder}/adapter\").merge_and_unload(); hfs.enable(model)\neagle = EagleDrafter.from_pretrained(folder, base_model=model); model.generate(ids, assistant_model=eagle)",
}
_IMPORTS = "import hf_speculative as hfs\nfrom peft import PeftModel\nfrom hf_speculative.bench import load_reference_model\nbase, tok = load_reference_model()"


def _measured(result: dict) -> str:
    """The ``downstream eval`` section: metric, tau, speedup and lossless rate on the test prompts."""
    metric = ", ".join(f"{k} {v:.4f}" for k, v in result["metric"].items())
    return (
        f"On {result['n']} test prompts, {result['max_new_tokens']} new tokens at most, greedy, fp32, on "
        f"{result.get('machine', {}).get('processor')} ({result.get('threads')} threads; a shared machine, so speedups are indicative):\n\n"
        "| metric | tokens/step (tau) | speedup over its own plain decoding | lossless |\n|---|---:|---:|---:|\n"
        f"| {metric} | {result['tau']:.2f} | {result['speedup']:.2f}x | {result['lossless_rate']:.2f} |\n\n"
        f"Speculative decoding: {result['drafter']}. Command: `{result.get('command')}`"
    )


def render_model_card(info: dict, result: dict | None = None) -> ModelCard:
    """The card from a folder's ``downstream.json`` (``info``) and an eval record (``result``)."""
    task, method = info["task"], info["method"]
    training = info.get("training") or {}
    settings = training.get("settings") or {}
    intro = (
        "Speculative Streaming's Table 1 setting (Bhendawade et al., 2024, Sec. 4.1), reproduced with `hf-speculative downstream`"
        " (see docs/downstream.md). The folder holds what this arm adds to the base model; the base comes from the reference package.\n\n"
        f"- task: {task}; data: `{info.get('data')}`\n- split: {_SPLITS.get(task, info.get('split'))}\n"
        f"- training: {training.get('steps')} optimizer steps of {settings.get('batch_size')} examples, {training.get('train_seconds')} s"
        f" (budget {settings.get('time_budget')} s) on {training.get('device')}; LoRA rank {settings.get('lora_rank')}, alpha {settings.get('lora_alpha')},"
        f" learning rate {settings.get('learning_rate')}\n"
        f"- parameters: LoRA {training.get('lora_parameters')}, extra (drafting) {training.get('extra_parameters')}\n"
        f"- command: `{info.get('command')}`"
    )
    loading = f"```python\n{_IMPORTS}\n{_LOADING[method]}\n```\n\nDecoding length used for the task: {get_task(task).max_new_tokens} new tokens."
    data = ModelCardData(
        base_model=info.get("base_model_hub_id", info.get("base_model")), library_name="hf_speculative",
        pipeline_tag="text-generation", tags=["speculative-decoding", "hf_speculative", method],
    )  # fmt: skip
    title = f"{ARM_NAMES.get(method, method)}: SmolLM2-135M-Instruct fine-tuned for {TASK_NAMES.get(task, task)}"
    sections = {"Measured (`downstream eval`)": _measured(result) if result is not None else "", "Loading": loading}
    return render_card(data, title, intro, sections)


def write_model_card(folder: str | Path, info: dict, result: dict | None = None) -> Path:
    path = Path(folder) / "README.md"
    render_model_card(info, result).save(path)
    return path
