"""Task fine-tuning arms of Speculative Streaming's Table 1 (Bhendawade et al., 2024, Sec. 4.1), each built from the
library's own training code, with one PEFT LoRA setup and one wall-time budget for every arm:

* ``lora``: LoRA next-token fine-tuning (the baseline; `train_speculative_streaming` on the plain PEFT model, the
  same data path, segments, optimizer and schedule as shared-mode Speculative Streaming, with alpha_0 = 1 and no
  streams). Decoded plainly, and speculatively with training-free tree prompt lookup.
* ``streaming``: shared-mode Speculative Streaming (Sec. 3.1: streams + stream embeddings on the top N_s layers, the
  same LoRA on the base, alpha_0 = 1, alpha_j = 0.1, gamma = 3, N_s = 4), tree calibrated on held-out pairs.
* ``medusa2``: Medusa-2 (Cai et al., 2024, Sec. 2.2.2): the same LoRA and Medusa heads trained jointly, next-token
  CE on the task's references plus ``lambda_0 * L_Medusa``; tree calibrated on the adapted model's states.
* ``eagle``: EAGLE-3 (Li et al., 2025) trained on the frozen model of a ``lora`` folder (base + its adapter merged),
  on that model's features and top-k over the task's training sequences.
* ``medusa``: Medusa-1 heads (Cai et al., 2024, Sec. 2.2.1) on the same frozen model, distilled from the same
  labelled data as ``eagle`` (one cache serves both: the final hidden state and the model's top-k per position).

A trained folder holds what the arm adds to the base and ``downstream.json`` (task, method, base, training record);
the base itself is never saved (``"reference"`` comes from the reference package). `write_downstream_info` /
`read_downstream_info` read and write that file; ``downstream.evaluation`` loads the folders.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from hf_speculative.drafters.streaming.configuration_speculative_streaming import LORA_TARGET_MODULES
from hf_speculative.training.curve_plot import PLOT_NAME
from hf_speculative.training.data import Record
from hf_speculative.training.distributed import is_main_process, num_processes, weights_agree

__all__ = [
    "METHODS",
    "INFO_FILE",
    "ADAPTER_SUBFOLDER",
    "DownstreamTrainingConfig",
    "write_downstream_info",
    "read_downstream_info",
    "lora_config",
    "train_lora",
    "train_streaming",
    "train_medusa2",
    "train_eagle",
    "train_medusa_heads",
    "train_arm",
    "prune_folder",
]

METHODS = ("lora", "medusa2", "streaming", "eagle", "medusa")
#: the methods trained on the frozen model of a ``lora`` folder (``--adapter``), from target-labelled data
ON_LORA_MODEL = ("eagle", "medusa")
LAMBDA0_WARMUP_STEPS = 100
EAGLE_TOP_K = 8  # the teacher's top-k per token of the EAGLE arm's labelling
INFO_FILE = "downstream.json"
ADAPTER_SUBFOLDER = "adapter"  # the PEFT adapter of the lora, medusa2 and eagle folders (streaming: lora/)


@dataclass
class DownstreamTrainingConfig:
    """The settings every arm shares (same LoRA, learning rate, batch and budget) and each arm's own.

    Args:
        lora_rank / lora_alpha: the PEFT LoRA adapters on the base (every arm; q/k/v/o and gate/up/down).
        learning_rate: AdamW learning rate of the LoRA weights (and of the streams; Medusa heads x4, Medusa-2 2.2.2).
        batch_size: examples per optimizer step.
        epochs / max_steps: the training length (``max_steps`` > 0 wins); ``time_budget`` (seconds) stops earlier.
        save_steps / resume: a resumable `Trainer` checkpoint every ``save_steps`` steps; continue from the last one.
        keep_state: keep the checkpoints when the run ends (``OUT/trainer_state``), so a later ``--resume`` with a
            larger ``time_budget`` or step count goes on training instead of starting again (default: removed).
        max_length: tokens per training example (prompt + answer).
        calibration_prompts: training prompts set aside to calibrate the draft tree (never trained on).
        tree_nodes: node budget of the calibrated tree (Speculative Streaming, Medusa-2).
        num_streams / num_msa_layers: gamma and N_s of Speculative Streaming (Sec. 3.1.1).
        num_heads / lambda0: the heads of the Medusa arms, and Medusa-2's final weight of ``L_Medusa``; it rises over
            the first 30% of the steps, or under a ``time_budget`` (where the step count is not known) over the first
            `LAMBDA0_WARMUP_STEPS` steps.
        eagle_max_tokens / eagle_draft_vocab: the labelled training tokens and the draft vocabulary of the arms
            trained on the model's labels (EAGLE-3, Medusa heads).
        answers: the training answers of EAGLE-3 and the Medusa heads: ``"references"`` (the data set's) or
            ``"self"`` (the fine-tuned model's own greedy answers to the training prompts,
            `self_distilled.self_distilled_records`).
        synthetic_prompts: with ``answers="self"`` on E2E NLG, this many more prompts drawn from the training MRs'
            slots and values (`self_distilled.synthetic_e2e_prompts`).
        curve_points / curve_examples: streaming: the learning curve (held-out stream accuracies and the expected
            tau of the tree calibrated on them) at that many points of training, on the first ``curve_examples``
            calibration pairs; under a ``time_budget`` the points fall at shares of the budget (tau against
            training time, `hf_speculative.training.callbacks.LearningCurveCallback`).
        pruning_layer / pruning_threshold / pruning_budget / pruning_examples: streaming: parallel tree pruning
            (Sec. 3.1.3), the paper's downstream mode: after the streams, an early exit after ``pruning_layer``
            layers of the fine-tuned model is trained for ``pruning_budget`` seconds on its states over the first
            ``pruning_examples`` training pairs; nodes below ``pruning_threshold`` are pruned (None: no pruning).
    """

    lora_rank: int = 8
    lora_alpha: float = 16.0
    learning_rate: float = 1e-3
    batch_size: int = 16
    epochs: float = 1.0
    max_steps: int = -1
    time_budget: float | None = None
    save_steps: int | None = 200
    resume: bool = False
    keep_state: bool = False
    max_length: int = 512
    calibration_prompts: int = 48
    tree_nodes: int = 16
    num_streams: int = 3
    num_msa_layers: int = 4
    num_heads: int = 4
    lambda0: float = 0.2
    eagle_max_tokens: int = 400_000
    eagle_draft_vocab: int = 8192
    answers: str = "references"
    synthetic_prompts: int = 0
    curve_points: int = 0
    curve_examples: int = 64
    pruning_layer: int | None = None
    pruning_threshold: float = 0.01
    pruning_budget: float = 120.0
    pruning_examples: int = 1024
    seed: int = 0
    progress: bool = True


# ---------------------------------------------------------------------------------------------- folder record


def write_downstream_info(folder: str | Path, info: dict) -> Path:
    """``downstream.json`` in ``folder`` (``task``, ``method``, ``base_model`` and the training record)."""
    path = Path(folder) / INFO_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return path


def read_downstream_info(folder: str | Path) -> dict:
    """The ``downstream.json`` of a trained folder (a clear error when the folder is not one)."""
    path = Path(folder) / INFO_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a 'run_downstream.py train' folder (no {INFO_FILE})")
    info = json.loads(path.read_text(encoding="utf-8"))
    if info.get("method") not in METHODS:
        raise ValueError(f"{path}: unknown method {info.get('method')!r} (known: {', '.join(METHODS)})")
    return info


def _hub_base_name(base_model: str) -> str:
    """The base model as a folder records it: the reference's Hub id, else the name given."""
    from hf_speculative.bench.reference import is_reference
    from hf_speculative.drafters.streaming.modeling_speculative_streaming import REFERENCE_HUB_ID

    return REFERENCE_HUB_ID if is_reference(base_model) else str(base_model)


def lora_config(cfg: DownstreamTrainingConfig):
    """The one PEFT `LoraConfig` of every arm (the shared-mode streaming default targets)."""
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGET_MODULES),
        task_type="CAUSAL_LM",
    )


def _last_loss(trainer) -> dict:
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "first_logged": {k: v for k, v in logs[0].items() if k != "epoch"} if logs else None,
        "last_logged": {k: v for k, v in logs[-1].items() if k != "epoch"} if logs else None,
    }


def adapter_path(folder: str | Path, adapter_folder: str | Path) -> str:
    """The PEFT adapter of the ``lora`` folder ``adapter_folder`` as a path relative to ``folder`` (so a clone anywhere
    finds it)."""
    return os.path.relpath(Path(adapter_folder) / ADAPTER_SUBFOLDER, Path(folder))


def _training_record(
    cfg: DownstreamTrainingConfig, trainer, seconds: float, train: list[Record], calib: list[Record]
) -> dict:
    from hf_speculative.training.trainer import DrafterTrainer

    return {
        "train_examples": len(train),
        "calibration_examples": len(calib),
        "steps": trainer.state.global_step,
        "train_seconds": round(seconds, 1),
        "device": _device_name(),
        "processes": num_processes(),
        "processes_in_sync": weights_agree(DrafterTrainer.trainable_tensors(trainer.model)),
        **_last_loss(trainer),
        "settings": asdict(cfg),
    }


def _device_name() -> str:
    from hf_speculative.perf_model.cost_curve import machine_description

    return machine_description("cuda" if torch.cuda.is_available() else "cpu")


def _trainer_dir(out: Path) -> str:
    return str(out / "trainer_state")


def _train_streams(
    model, tokenizer, train: list[Record], out: Path, cfg: DownstreamTrainingConfig, callbacks=None, states=None
):
    """The Speculative Streaming trainer over ``train`` (the LoRA arm is the same loss with no streams; ``states``: the
    records already tokenized); returns the trainer and the training seconds."""
    from hf_speculative.drafters.streaming.training_speculative_streaming import (
        tokenize_records,
        train_speculative_streaming,
    )

    states = states if states is not None else tokenize_records(tokenizer, train, max_length=cfg.max_length)
    t0 = time.perf_counter()
    trainer = train_speculative_streaming(
        model,
        states,
        output_dir=_trainer_dir(out),
        num_epochs=cfg.epochs,
        learning_rate=cfg.learning_rate,
        batch_size=cfg.batch_size,
        segment_length=cfg.max_length,
        max_steps=cfg.max_steps,
        seed=cfg.seed,
        progress=cfg.progress,
        time_budget=cfg.time_budget,
        save_steps=cfg.save_steps,
        resume=cfg.resume,
        callbacks=callbacks,
    )
    return trainer, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------- the arms


def train_lora(
    model,
    tokenizer,
    train: list[Record],
    calib: list[Record],
    out: str | Path,
    cfg: DownstreamTrainingConfig,
    base_model: str,
) -> dict:
    """(a) LoRA next-token fine-tuning; saves the PEFT adapter in ``out/adapter``."""
    from peft import get_peft_model

    out = Path(out)
    peft_model = get_peft_model(model, lora_config(cfg))
    trainer, seconds = _train_streams(peft_model, tokenizer, train, out, cfg)
    for c in peft_model.peft_config.values():
        c.base_model_name_or_path = _hub_base_name(base_model)
    if is_main_process():
        peft_model.save_pretrained(out / ADAPTER_SUBFOLDER)
    lora_params = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    record = {
        **_training_record(cfg, trainer, seconds, train, calib),
        "lora_parameters": lora_params,
        "extra_parameters": 0,
    }
    return record


def train_streaming(
    model,
    tokenizer,
    train: list[Record],
    calib: list[Record],
    out: str | Path,
    cfg: DownstreamTrainingConfig,
    base_model: str,
) -> dict:
    """(c) shared-mode Speculative Streaming; saves config + streams + ``lora/`` (``ss.save_pretrained``)."""
    from hf_speculative.drafters.streaming.modeling_speculative_streaming import LlamaForSpeculativeStreaming
    from hf_speculative.drafters.streaming.training_speculative_streaming import calibrate_stream_tree, tokenize_records

    out = Path(out)
    ss = LlamaForSpeculativeStreaming.from_base_model(
        model,
        num_streams=cfg.num_streams,
        num_msa_layers=cfg.num_msa_layers,
        mode="shared",
        lora_rank=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
    )
    ss.config.base_model_name_or_path = _hub_base_name(base_model)
    curve = None
    states = tokenize_records(tokenizer, train, max_length=cfg.max_length)
    if cfg.curve_points and calib:
        from hf_speculative.drafters.streaming.training_speculative_streaming import StreamCurveCallback

        held_out = tokenize_records(tokenizer, calib[: cfg.curve_examples], max_length=cfg.max_length)
        per_step = cfg.batch_size * num_processes() * states.input_ids.numel() / len(states)  # tokens, on average
        curve = StreamCurveCallback(
            ss, held_out, num_nodes=cfg.tree_nodes, num_points=cfg.curve_points, tokens_per_step=per_step
        )
    trainer, seconds = _train_streams(
        ss, tokenizer, train, out, cfg, callbacks=[curve] if curve else None, states=states
    )
    curve_seconds = None
    if (
        curve and curve.curve and "train_seconds" in curve.curve[-1]
    ):  # the budget's clock: measuring the curve is not training
        curve_seconds, seconds = round(seconds - curve.curve[-1]["train_seconds"], 1), curve.curve[-1]["train_seconds"]
    calibration = {}
    if calib:
        held_out = tokenize_records(tokenizer, calib, max_length=cfg.max_length)
        calibration = calibrate_stream_tree(ss, held_out, cfg.tree_nodes, segment_length=cfg.max_length)
        print(
            f"calibrated stream tree: {cfg.tree_nodes} nodes, expected tau {calibration['expected_acceptance_length']}",
            file=sys.stderr,
        )
    pruning = _train_pruning(ss, tokenizer, train, calib, out, cfg) if cfg.pruning_layer is not None else None
    if is_main_process():
        ss.save_pretrained(out)
    lora_params = sum(p.numel() for p in ss.trainable_parameters()) - ss.num_stream_parameters()
    return {
        **_training_record(cfg, trainer, seconds, train, calib),
        "lora_parameters": lora_params,
        "extra_parameters": ss.num_stream_parameters(),
        "calibration": calibration,
        **({"learning_curve": curve.curve, "learning_curve_seconds": curve_seconds} if curve else {}),
        **({"pruning": pruning} if pruning else {}),
    }


def _train_pruning(
    ss, tokenizer, train: list[Record], calib: list[Record], out: Path, cfg: DownstreamTrainingConfig
) -> dict:
    """Parallel tree pruning for trained shared-mode streams (Sec. 3.1.3, the method's `fit_pruning_head`): the early
    exit after ``pruning_layer`` layers of the fine-tuned model, trained on its states over the first
    ``pruning_examples`` training pairs for ``pruning_budget`` seconds; held-out top-1 on the calibration pairs."""
    from hf_speculative.drafters.streaming.training_pruning import fit_pruning_head

    ss.add_pruning_head(cfg.pruning_layer, threshold=cfg.pruning_threshold)
    record = fit_pruning_head(
        ss,
        tokenizer,
        train[: cfg.pruning_examples],
        calib,
        str(out / "trainer_state" / "pruning"),
        max_length=cfg.max_length,
        progress=cfg.progress,
        learning_rate=cfg.learning_rate,
        batch_size=cfg.batch_size,
        segment_length=cfg.max_length,
        num_epochs=100,
        time_budget=cfg.pruning_budget,
        seed=cfg.seed,
    )
    ss.config.pruning = record
    print(
        f"pruning early exit after layer {cfg.pruning_layer}: held-out top-1 {record['held_out_top1_before']} -> "
        f"{record['held_out_top1_after']}",
        file=sys.stderr,
    )
    return record


def train_medusa2(
    model,
    tokenizer,
    train: list[Record],
    calib: list[Record],
    out: str | Path,
    cfg: DownstreamTrainingConfig,
    base_model: str,
) -> dict:
    """(b) Medusa-2 (the method's `fit_medusa2`, next-token CE on the task's references); the tree calibrated on the
    adapted model's states; saves heads + ``adapter/`` (`save_medusa2`)."""
    from hf_speculative.drafters.medusa.modeling_medusa import MedusaHeadsModel
    from hf_speculative.drafters.medusa.training_medusa2 import (
        Lambda0Schedule,
        calibrate_adapted_tree,
        fit_medusa2,
        save_medusa2,
    )

    out = Path(out)
    heads = MedusaHeadsModel.from_base_model(model, num_heads=cfg.num_heads)
    heads.config.base_model_name_or_path = _hub_base_name(base_model)
    run = fit_medusa2(
        model,
        heads,
        tokenizer,
        train,
        _trainer_dir(out),
        lora_r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_targets=LORA_TARGET_MODULES,
        max_length=cfg.max_length,
        num_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        learning_rate=cfg.learning_rate,
        batch_size=cfg.batch_size,
        schedule=Lambda0Schedule(cfg.lambda0, LAMBDA0_WARMUP_STEPS if cfg.time_budget else 0.3),
        lm_loss="ce",
        seed=cfg.seed,
        progress=cfg.progress,
        time_budget=cfg.time_budget,
        save_steps=cfg.save_steps,
        resume=cfg.resume,
    )
    if calib:
        tree = calibrate_adapted_tree(run, tokenizer, calib, max_length=cfg.max_length, num_nodes=cfg.tree_nodes)
        print(
            f"calibrated Medusa tree: {tree.num_nodes} nodes, expected tau {heads.config.calibration['expected_acceptance_length']}",
            file=sys.stderr,
        )
    if is_main_process():
        save_medusa2(run.joint, out)
    return {
        **_training_record(cfg, run.trainer, run.seconds, train, calib),
        "lora_parameters": sum(p.numel() for p in run.peft_model.parameters() if p.requires_grad),
        "extra_parameters": sum(p.numel() for p in heads.parameters()),
        "calibration": getattr(heads.config, "calibration", None),
    }


def _labelled_states(
    tuned,
    tokenizer,
    train: list[Record],
    layers: list[int],
    cfg: DownstreamTrainingConfig,
    data: str,
    read_layers: bool = True,
):
    """The EAGLE and Medusa arms' training data: ``train`` labelled by the merged model ``tuned`` into cached shards
    (`label_conversations`; keyed by the model's fingerprint, so each adapter has its own folder), read back as
    `HiddenStates` (the final state, and ``layers`` too with ``read_layers``). A killed run resumes after the last
    finished shard instead of labelling again."""
    from hf_speculative.training.labelling import LabelledShards, label_conversations, labelled_cache_dir

    L = tuned.config.num_hidden_layers
    folder = labelled_cache_dir(tuned, data, cfg.max_length)
    manifest = label_conversations(
        tuned,
        tokenizer,
        train,
        folder,
        layers=sorted({*layers, L}),
        top_k=EAGLE_TOP_K,
        max_tokens=cfg.eagle_max_tokens,
        max_length=cfg.max_length,
        shard_tokens=32768,
        progress=cfg.progress,
        data=data,
    )
    print(f"labels: {manifest['total_tokens']} tokens in {folder}", file=sys.stderr)
    return LabelledShards(folder).to_hidden_states(extra_layers=[i for i in layers if i != L] if read_layers else [])


def _eagle_records(
    tuned,
    tokenizer,
    train: list[Record],
    calib: list[Record],
    out: Path,
    cfg: DownstreamTrainingConfig,
    task: str,
    data_dir,
) -> tuple[list[Record], str]:
    """EAGLE-3's training records and the name of their labelled cache: the training pairs as they are, or (with
    ``cfg.answers == "self"``) the distinct training prompts and ``cfg.synthetic_prompts`` drawn ones, answered by
    ``tuned`` itself (`self_distilled`). Calibration and test prompts are never drawn."""
    if cfg.answers == "references":
        return train, "train"
    from .self_distilled import self_distilled_records, synthetic_e2e_prompts, unique_prompts
    from .tasks import get_task

    spec = get_task(task)
    prompts = unique_prompts(train)
    n_own = len(prompts)
    if cfg.synthetic_prompts:
        held = {r.turns[0] for r in calib} | {r.turns[0] for r in spec.load(data_dir, "test")}
        prompts += synthetic_e2e_prompts(train, cfg.synthetic_prompts, seed=cfg.seed, exclude=held)
    print(f"self-distillation: {n_own} training prompts + {len(prompts) - n_own} drawn ones", file=sys.stderr)
    records = self_distilled_records(
        tuned, tokenizer, prompts, out / "self_distilled.jsonl", spec.max_new_tokens, progress=cfg.progress
    )
    return records, f"self-{n_own}-{cfg.synthetic_prompts}s{cfg.seed}"


def calibrate_eagle(
    drafter,
    tuned,
    tokenizer,
    calib: list[Record],
    out: Path,
    cfg: DownstreamTrainingConfig,
    task: str,
    adapter_name: str,
) -> dict:
    """EAGLE-3's tree calibration on the calibration prompts, never trained on: their answers (the references, or
    the model's own with ``cfg.answers == "self"``) labelled by ``tuned``, the drafter's held-out accuracies per
    unrolled step and rank (`eagle_step_accuracies`) stored in ``drafter.config.calibration``; the drafter's default
    tree is then the cost-aware one for the target's machine (`hf_speculative.drafters.cost_aware`)."""
    from hf_speculative.drafters.eagle.training_eagle import calibrate_tree

    L = tuned.config.num_hidden_layers
    layers = [i for i in drafter.config.feature_layers(L) if i != L]
    states, prompts = _calibration_states(tuned, tokenizer, calib, out, cfg, task, adapter_name, layers)
    return calibrate_tree(drafter, states, prompts=prompts, answers=cfg.answers)


def _calibration_states(
    tuned,
    tokenizer,
    calib: list[Record],
    out: Path,
    cfg: DownstreamTrainingConfig,
    task: str,
    adapter_name: str,
    layers: list[int],
    read_layers: bool = True,
):
    """``(states, prompts)``: the calibration prompts' answers (the references, or with ``cfg.answers == "self"`` the
    model's own, answered once into ``out``) labelled by ``tuned`` with ``layers`` besides the final state (the
    EAGLE-3 arm's, so one cache serves the EAGLE and Medusa arms), and how many answers there are."""
    from .self_distilled import self_distilled_records, unique_prompts
    from .tasks import get_task

    records = calib
    if cfg.answers == "self":
        path = out / "self_distilled_calibration.jsonl"
        records = self_distilled_records(
            tuned, tokenizer, unique_prompts(calib), path, get_task(task).max_new_tokens, progress=cfg.progress
        )
    data = f"{adapter_name}-calib-{cfg.answers}"
    return _labelled_states(tuned, tokenizer, records, layers, cfg, data, read_layers), len(records)


def _eagle_layers(tuned) -> list[int]:
    """The layers the EAGLE-3 arm's labels hold besides the final state (its low, mid and high features)."""
    from hf_speculative.drafters.eagle.configuration_eagle import eagle3_feature_layers

    L = tuned.config.num_hidden_layers
    return [i for i in eagle3_feature_layers(L) if i != L]


def _folder_settings(info: dict, data_dir, **overrides) -> tuple[DownstreamTrainingConfig, tuple[list, list]]:
    """The settings a trained folder (its ``downstream.json`` record ``info``) was trained with, ``overrides`` on
    top, and its task's ``(train, calibration)`` split of ``data_dir`` under them."""
    from .tasks import calibration_split, get_task

    known = DownstreamTrainingConfig.__dataclass_fields__
    settings = {k: v for k, v in (info.get("training") or {}).get("settings", {}).items() if k in known}
    cfg = replace(DownstreamTrainingConfig(**settings), **overrides)
    records = get_task(info["task"]).load(data_dir, "train")
    return cfg, calibration_split(records, cfg.calibration_prompts, seed=cfg.seed)


def calibrate_eagle_folder(folder, data_dir, device=None, progress: bool = True, command: str | None = None) -> dict:
    """Calibrate the tree of a trained ``eagle`` folder in place (`calibrate_eagle`) with the settings it was trained
    with; rewrites its ``config.json`` and records the run in its ``downstream.json``."""
    from hf_speculative.bench.reference import resolve_model
    from hf_speculative.drafters.eagle.modeling_eagle import EagleDrafter

    from .evaluation import _merged

    folder = Path(folder)
    info = read_downstream_info(folder)
    if info["method"] != "eagle":
        raise ValueError(f"{folder}: calibrate applies to an 'eagle' folder, this one is {info['method']!r}")
    cfg, (_, calib) = _folder_settings(info, data_dir, progress=progress)
    base, tokenizer = resolve_model(info["base_model"], device=device)
    adapter = EagleDrafter.config_class.from_pretrained(folder).base_adapter
    tuned = _merged(base, folder, adapter)
    drafter = EagleDrafter.from_pretrained(folder, base_model=tuned)
    adapter_name = Path(info["training"]["adapter_from"]).name
    record = calibrate_eagle(drafter, tuned, tokenizer, calib, folder, cfg, info["task"], adapter_name)
    drafter.config.save_pretrained(folder)
    info["training"]["calibration"] = {**record, "command": command}
    write_downstream_info(folder, info)
    return record


def _frozen_lora_model(model, adapter_folder, method: str):
    """``(info, tuned)``: the ``downstream.json`` record of the ``lora`` folder ``adapter_folder`` and ``model`` with
    its adapter merged, frozen (what ``method`` drafts for)."""
    from peft import PeftModel

    info = read_downstream_info(adapter_folder)
    if info["method"] != "lora":
        raise ValueError(
            f"--adapter {adapter_folder}: {method} trains on the model of a 'lora' folder, this one is {info['method']!r}"
        )
    tuned = PeftModel.from_pretrained(model, str(Path(adapter_folder) / ADAPTER_SUBFOLDER)).merge_and_unload().eval()
    for p in tuned.parameters():
        p.requires_grad_(False)
    return info, tuned


def train_eagle(
    model,
    tokenizer,
    train: list[Record],
    calib: list[Record],
    out: str | Path,
    cfg: DownstreamTrainingConfig,
    base_model: str,
    adapter_folder: str | Path,
    task: str = "e2e_nlg",
    data_dir=None,
) -> dict:
    """(d) EAGLE-3 on the frozen model of the ``lora`` folder ``adapter_folder`` (base + adapter, merged); saves the
    drafter (bf16) and, in its config, the path of that adapter relative to ``out`` (no copy: the folders stay small)."""
    from hf_speculative.drafters.draft_vocab import frequent_tokens
    from hf_speculative.drafters.eagle.modeling_eagle import EagleDrafter
    from hf_speculative.drafters.eagle.training_eagle import train_eagle as fit

    out = Path(out)
    info, tuned = _frozen_lora_model(model, adapter_folder, "EAGLE")
    drafter = EagleDrafter.from_base_model(
        tuned, variant="eagle3", draft_vocab_size=min(cfg.eagle_draft_vocab, tuned.config.vocab_size)
    )
    drafter.config.base_model_name_or_path = _hub_base_name(base_model)
    L = tuned.config.num_hidden_layers
    layers = [i for i in drafter.config.feature_layers(L) if i != L]
    records, data = _eagle_records(tuned, tokenizer, train, calib, out, cfg, task, data_dir)
    states = _labelled_states(tuned, tokenizer, records, layers, cfg, data=f"{Path(adapter_folder).name}-{data}")
    print(f"EAGLE labelling: {len(states)} sequences, {int(states.input_ids.numel())} tokens", file=sys.stderr)
    drafter.set_draft_vocab(
        frequent_tokens(states.topk_ids[:, 0].long(), drafter.config.draft_vocab_size, tuned.config.vocab_size)
    )
    t0 = time.perf_counter()
    trainer = fit(
        drafter, states, output_dir=_trainer_dir(out), max_length=cfg.max_length, final_layer=L, **_schedule(cfg)
    )
    seconds = time.perf_counter() - t0
    calibrate_eagle(drafter, tuned, tokenizer, calib, out, cfg, task, Path(adapter_folder).name)
    record = _training_record(cfg, trainer, seconds, train, calib)  # before the bf16 cast
    return {
        **record,
        **_save_on_lora_model(drafter, out, adapter_folder, info),
        **_labelled_data(states, records, cfg),
        "calibration": drafter.config.calibration,
    }


def train_medusa_heads(
    model,
    tokenizer,
    train: list[Record],
    calib: list[Record],
    out: str | Path,
    cfg: DownstreamTrainingConfig,
    base_model: str,
    adapter_folder: str | Path,
    task: str = "e2e_nlg",
    data_dir=None,
) -> dict:
    """(e) Medusa-1 heads (Sec. 2.2.1) on the frozen model of the ``lora`` folder ``adapter_folder``, distilled from
    that model's top-k on the EAGLE-3 arm's labelled data (the same answers and cache: labelled once for both). The
    heads draft on an FR-Spec vocabulary of ``cfg.eagle_draft_vocab`` of the model's most frequent answer tokens, so
    drafting costs a few small products; ``cfg.batch_size`` counts positions here. The tree is calibrated on the
    calibration prompts' labels. Saves the heads (bf16) and, in their config, the adapter's path relative to ``out``."""
    from hf_speculative.drafters.draft_vocab import frequent_tokens
    from hf_speculative.drafters.medusa.modeling_medusa import MedusaHeadsModel
    from hf_speculative.drafters.medusa.training_medusa import train_medusa
    from hf_speculative.drafters.medusa.tree_calibration import calibrate_tree

    out = Path(out)
    info, tuned = _frozen_lora_model(model, adapter_folder, "Medusa")
    heads = MedusaHeadsModel.from_base_model(tuned, num_heads=cfg.num_heads)
    heads.config.base_model_name_or_path = _hub_base_name(base_model)
    records, data = _eagle_records(tuned, tokenizer, train, calib, out, cfg, task, data_dir)
    name = Path(adapter_folder).name
    layers = _eagle_layers(tuned)  # labelled as for the EAGLE arm (one cache), read without them
    states = _labelled_states(tuned, tokenizer, records, layers, cfg, f"{name}-{data}", read_layers=False)
    vocab = tuned.config.vocab_size
    greedy = states.topk_ids[states.labels != -100, 0].long()  # the model's own answer tokens (FR-Spec)
    heads.set_draft_vocab(frequent_tokens(greedy, min(cfg.eagle_draft_vocab, vocab), vocab))
    t0 = time.perf_counter()
    trainer = train_medusa(heads, states, _trainer_dir(out), **_schedule(cfg))
    seconds = time.perf_counter() - t0
    calib_states, _ = _calibration_states(tuned, tokenizer, calib, out, cfg, task, name, layers, read_layers=False)
    calibrate_tree(heads, calib_states, num_nodes=cfg.tree_nodes)
    return {
        **_training_record(cfg, trainer, seconds, train, calib),
        **_save_on_lora_model(heads, out, adapter_folder, info),
        **_labelled_data(states, records, cfg),
        "calibration": heads.config.calibration,
    }


def _schedule(cfg: DownstreamTrainingConfig) -> dict:
    """The training schedule of the arms trained on labelled data (the drafters' ``train_*`` keywords)."""
    names = ("max_steps", "batch_size", "learning_rate", "time_budget", "seed", "progress", "save_steps", "resume")
    return {"num_epochs": cfg.epochs, **{name: getattr(cfg, name) for name in names}}


def _save_on_lora_model(drafter, out: Path, adapter_folder, info: dict) -> dict:
    """Save a drafter of a ``lora`` folder's model (bfloat16; its config names that folder's adapter relative to
    ``out``, no copy) and return the record's fields about its base."""
    drafter.config.base_adapter = adapter_path(out, adapter_folder)
    extra = sum(p.numel() for p in drafter.parameters())
    if is_main_process():
        drafter.to(torch.bfloat16).save_pretrained(out)
    return {
        "adapter_from": str(adapter_folder),
        "adapter_train_seconds": (info.get("training") or {}).get("train_seconds"),
        "extra_parameters": extra,
    }


def _labelled_data(states, records: list, cfg: DownstreamTrainingConfig) -> dict:
    """The record's fields about an arm's labelled data."""
    return {
        "labelled_tokens": int(states.input_ids.numel()),
        "answers": cfg.answers,
        "training_prompts": len(records),
    }


def prune_folder(
    folder,
    data_dir,
    layer: int,
    threshold: float = 0.01,
    budget: float = 120.0,
    examples: int = 1024,
    device=None,
    progress: bool = True,
    command: str | None = None,
) -> dict:
    """Add parallel tree pruning (Sec. 3.1.3) to a trained ``streaming`` folder: its early exit after ``layer`` layers,
    trained as ``downstream train --pruning-layer`` would (`_train_pruning`) on the folder's own task and training
    split; rewrites the folder's config and weights and records the run in its ``downstream.json``."""
    from hf_speculative.bench.reference import resolve_model
    from hf_speculative.drafters.streaming.modeling_speculative_streaming import LlamaForSpeculativeStreaming

    folder = Path(folder)
    info = read_downstream_info(folder)
    if info["method"] != "streaming":
        raise ValueError(
            f"{folder}: tree pruning is Speculative Streaming's (a 'streaming' folder), this one is {info['method']!r}"
        )
    cfg, (train, calib) = _folder_settings(
        info,
        data_dir,
        pruning_layer=layer,
        pruning_threshold=threshold,
        pruning_budget=budget,
        pruning_examples=examples,
        progress=progress,
    )
    base, tokenizer = resolve_model(info["base_model"], device=device)
    ss = LlamaForSpeculativeStreaming.from_pretrained(folder, base_model=base)
    record = _train_pruning(ss, tokenizer, train, calib, folder, cfg)
    record["command"] = command
    ss.save_pretrained(folder)
    shutil.rmtree(folder / "trainer_state", ignore_errors=True)
    info["training"]["pruning"] = record
    write_downstream_info(folder, info)
    return record


def train_arm(
    method: str,
    task: str,
    data_dir,
    out,
    cfg: DownstreamTrainingConfig,
    base_model: str = "reference",
    device=None,
    adapter_folder=None,
    limit: int | None = None,
    command: str | None = None,
) -> dict:
    """Train one arm on one task and write its folder ``out`` (weights + ``downstream.json``); returns the record."""
    from transformers import set_seed

    from hf_speculative.bench.reference import resolve_model

    from .tasks import calibration_split, get_task

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
    if method in ON_LORA_MODEL and adapter_folder is None:
        raise ValueError(f"method {method!r} trains on a fine-tuned model: pass the folder of a 'lora' run (--adapter)")
    if cfg.answers != "references" and method not in ON_LORA_MODEL:
        raise ValueError(
            f"--answers {cfg.answers}: only methods {' and '.join(ON_LORA_MODEL)} train on self-distilled answers"
        )
    if cfg.synthetic_prompts and (task != "e2e_nlg" or cfg.answers != "self"):
        raise ValueError(
            "--synthetic-prompts draws E2E NLG meaning representations: use it with --answers self on e2e_nlg"
        )
    spec = get_task(task)
    records = spec.load(data_dir, "train")
    train, calib = calibration_split(records, cfg.calibration_prompts, seed=cfg.seed)
    if limit:
        train = train[:limit]
    print(f"{task}: {len(train)} training pairs, {len(calib)} calibration pairs", file=sys.stderr)
    model, tokenizer = resolve_model(base_model, device=device)
    # the new modules' random initialisation (stream embeddings, LoRA, heads) from --seed, not from whatever drew
    # random numbers in this process before: the same command trains the same weights
    set_seed(cfg.seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # under several processes (accelerate launch) each takes its share of every optimizer step's examples
    processes = num_processes()
    if cfg.batch_size % processes:
        raise ValueError(
            f"--batch-size {cfg.batch_size} (examples per optimizer step) must divide among the {processes} processes"
        )
    run_cfg = replace(cfg, batch_size=cfg.batch_size // processes)
    if method in ON_LORA_MODEL:
        fit = train_eagle if method == "eagle" else train_medusa_heads
        record = fit(
            model, tokenizer, train, calib, out, run_cfg, base_model, adapter_folder, task=task, data_dir=data_dir
        )
    else:
        fn = {"lora": train_lora, "streaming": train_streaming, "medusa2": train_medusa2}[method]
        record = fn(model, tokenizer, train, calib, out, run_cfg, base_model)
    record["settings"] = asdict(cfg)
    from hf_speculative.bench.reference import is_reference

    info = {
        "task": task,
        "method": method,
        "base_model": "reference" if is_reference(base_model) else str(base_model),
        "base_model_hub_id": _hub_base_name(base_model),
        "data": str(data_dir),
        "split": "train (calibration prompts set aside)",
        "training": record,
        "command": command,
    }
    if is_main_process():  # the other processes trained the same weights
        write_downstream_info(out, info)
        curve = out / "trainer_state" / PLOT_NAME
        if curve.is_file():  # the training curve stays beside the weights
            shutil.copy2(curve, out / PLOT_NAME)
        if not cfg.keep_state:
            shutil.rmtree(out / "trainer_state", ignore_errors=True)
    return info
