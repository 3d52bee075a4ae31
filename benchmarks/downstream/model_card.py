"""The model card (README.md) of a ``downstream train`` folder: task, data, split, budget, hardware, and the
measured metric, tau and speedup of ``downstream eval`` (`write_model_card`, ``downstream eval --write-card``)."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from hf_speculative.model_card import public_data_source, render_card, user_data_path

from .table import ARM_NAMES, TASK_NAMES
from .tasks import get_task

__all__ = ["render_model_card", "write_model_card"]

_SPLITS = {
    "e2e_nlg": "train: `devset.csv` (4,672 MR/reference pairs, 48 MRs set aside for tree calibration); test: `testset_w_refs.csv` (630 MRs, all references)",
    "wikisql": "`dev.jsonl` + `dev_results.jsonl` joined by `question_id`, split by `table_id`: 90% of the tables train (48 questions set aside for calibration), a fixed 10% test (779 questions); schema = a CREATE TABLE line of the columns the table's questions use",
    "dialogsum": "`DialogSum_Data.zip`: train split (12,460; 48 dialogues set aside for calibration), test split (500, three summaries each)",
}
_DECODING = {
    "lora": "the merged LoRA model; speculative: training-free tree prompt lookup (`hfs.PromptLookupDrafter`)",
    "medusa2": "the merged LoRA model; speculative: its Medusa-2 heads as `assistant_model`",
    "streaming": "plain: the joint forward one token at a time (`ss.generate_autoregressive`); speculative: `ss.generate` (drafts for itself)",
    "eagle": "the merged LoRA model of the `lora` arm; speculative: this EAGLE-3 drafter as `assistant_model`",
    "medusa": "the merged LoRA model of the `lora` arm; speculative: these Medusa-1 heads as `assistant_model`",
}


def _loading(folder: str, task: str, method: str) -> str:
    """A runnable snippet: the folder loaded the way `downstream eval` loads it, one test prompt decoded both ways."""
    n = get_task(task).max_new_tokens
    lines = [
        "```python",
        "import torch",
        "",
        "import sys",
        "",
        'sys.path.insert(0, "benchmarks")  # from the repository root: the study beside the package',
        "from downstream import load_downstream, load_task",
        "from hf_speculative.training.data import encode_chat",
        "",
        f'arm = load_downstream("{folder}")  # the reference base model + what this folder adds',
        f'record = load_task("{task}", "path/to/{task}", "test")[0]  # a test prompt of the downloaded data set',
        "ids = torch.tensor([encode_chat(arm.tokenizer, record.messages)])",
        f"fast = arm.speculative(ids, {n})  # speculative greedy decoding",
        f"assert torch.equal(fast.sequences, arm.plain(ids, {n}).sequences)  # the same tokens as its plain decoding",
        "print(arm.tokenizer.decode(fast.sequences[0, ids.shape[1]:], skip_special_tokens=True))",
        "```",
    ]
    return "\n".join(lines) + f"\n\nDecoding: {_DECODING[method]}. Decoding length used for the task: {n} new tokens."


def _data_line(task: str, data: str | None) -> str:
    """Where the task's data come from, as a user gets them, and the folder the commands below name for them."""
    source = public_data_source(data or task) or public_data_source(task) or "the task's public data set"
    return f"{source}, downloaded to `path/to/{task}` in the commands below"


def _measured(result: dict) -> str:
    """The ``downstream eval`` section: metric, tau, speedup and lossless rate on the test prompts."""
    metric = ", ".join(f"{k} {v:.4f}" for k, v in result["metric"].items())
    return (
        f"On {result['n']} test prompts, {result['max_new_tokens']} new tokens at most, greedy, fp32, on "
        f"{result.get('machine', {}).get('processor')} ({result.get('threads')} threads; a shared machine, so speedups are indicative):\n\n"
        "| metric | tokens/step (tau) | speedup over its own plain decoding | lossless |\n|---|---:|---:|---:|\n"
        f"| {metric} | {result['tau']:.2f} | {result['speedup']:.2f}x | {result['lossless_rate']:.2f} |\n\n"
        f"Speculative decoding: {result['drafter']}. Command: `{current_command(result.get('command'))}`"
    )


def current_command(command: str | None) -> str | None:
    """A recorded command as it runs now: rows made while the study was a package command (``hf-speculative
    downstream ...``) name its script."""
    legacy = "hf-speculative downstream "
    return (
        "python benchmarks/run_downstream.py " + command[len(legacy) :]
        if command and command.startswith(legacy)
        else command
    )


def _command_for(command: str | None, folder: str | None) -> str | None:
    """The training command as it reproduces this folder: ``--out`` names the folder where it lives now (a run may
    have written it elsewhere first; ``downstream.json`` keeps the command as it ran)."""
    import shlex

    command = current_command(command)
    if not command or folder is None:
        return command
    argv = shlex.split(command)
    if "--out" in argv and argv.index("--out") + 1 < len(argv):
        argv[argv.index("--out") + 1] = folder
    return shlex.join(argv)


def render_model_card(info: dict, result: dict | None = None, folder: str | Path | None = None) -> ModelCard:
    """The card from a folder's ``downstream.json`` (``info``) and an eval record (``result``)."""
    task, method = info["task"], info["method"]
    training = info.get("training") or {}
    settings = training.get("settings") or {}
    intro = (
        "Speculative Streaming's Table 1 setting (Bhendawade et al., 2024, Sec. 4.1), reproduced with `python benchmarks/run_downstream.py`"
        " (see docs/downstream.md). The folder holds what this arm adds to the base model; the base comes from the reference package.\n\n"
        f"- task: {task}; data: {_data_line(task, info.get('data'))}\n- split: {_SPLITS.get(task, info.get('split'))}\n"
        f"- training: {training.get('steps')} optimizer steps of {settings.get('batch_size')} examples, {training.get('train_seconds')} s"
        f" (budget {settings.get('time_budget')} s) on {training.get('device')}; LoRA rank {settings.get('lora_rank')}, alpha {settings.get('lora_alpha')},"
        f" learning rate {settings.get('learning_rate')}\n"
        f"- parameters: LoRA {training.get('lora_parameters')}, extra (drafting) {training.get('extra_parameters')}\n"
        f"- command: `{_command_for(info.get('command'), f'model_cards/{Path(folder).name}' if folder is not None else None)}`"
    )
    curve = training.get("learning_curve")
    if curve:
        points = "; ".join(
            f"{p.get('train_seconds', 0) / 60:.0f} min: {p['expected_tau_calibrated']:.2f}" for p in curve
        )
        intro += f"\n- learning curve (held-out expected tau of the calibrated tree against training time): {points}"
    pruning = training.get("pruning")
    if pruning:
        intro += (
            f"\n- parallel tree pruning (Sec. 3.1.3): early exit after layer {pruning['layer']}, threshold {pruning['threshold']},"
            f" {pruning['adapter_parameters']} parameters trained {pruning['steps']} steps ({pruning['extract_seconds']} s of state"
            f" extraction, {pruning['train_seconds']} s of training) on {pruning['train_examples']} pairs; held-out top-1 of the exit"
            f" {pruning['held_out_top1_before']} before, {pruning['held_out_top1_after']} after"
            + (f"; command: `{pruning['command']}`" if pruning.get("command") else "")
            + " (`downstream eval --pruning-threshold 0` decodes without it)"
        )
    loading = _loading(f"model_cards/{Path(folder).name}" if folder is not None else "<this folder>", task, method)
    data = ModelCardData(
        base_model=info.get("base_model_hub_id", info.get("base_model")),
        library_name="hf_speculative",
        pipeline_tag="text-generation",
        tags=["speculative-decoding", "hf_speculative", method],
    )
    title = f"{ARM_NAMES.get(method, method)}: SmolLM2-135M-Instruct fine-tuned for {TASK_NAMES.get(task, task)}"
    sections = {"Measured (`downstream eval`)": _measured(result) if result is not None else "", "Loading": loading}
    sections = {name: user_data_path(text) for name, text in sections.items()}
    return render_card(data, title, user_data_path(intro), sections)


def write_model_card(folder: str | Path, info: dict, result: dict | None = None) -> Path:
    path = Path(folder) / "README.md"
    render_model_card(info, result, folder).save(path)
    return path
