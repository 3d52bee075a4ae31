"""Medusa-2 (joint LoRA backbone + heads training, Medusa Sec. 2.2.2 / 2.3.2) on tiny random models."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_LAYERS, tiny_model

import hf_speculative as hfs
from hf_speculative.drafters.medusa import MedusaHeadsModel
from hf_speculative.drafters.medusa.training_medusa2 import (
    Lambda0Schedule,
    Medusa2Model,
    Medusa2Trainer,
    add_lora,
    evaluate_lm_loss,
    lambda0_schedule,
    load_medusa2,
    medusa2_head_labels,
    medusa2_loss,
    save_medusa2,
    train_medusa2,
)

VOCAB = 64


def _randomize_lora(peft_model, scale: float = 0.5, seed: int = 0) -> None:
    """Give the LoRA B matrices (zero at init) random values, so the adapted model differs from the base."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(scale * torch.randn(p.shape, generator=g))


def _randomize_heads(heads, scale: float = 0.3, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g))


def _joint(seed: int = 0, num_heads: int = 3, randomize: bool = True, r: int = 4):
    base = hfs.enable(tiny_model("llama", seed=seed, vocab_size=VOCAB, num_layers=2))
    heads = MedusaHeadsModel.from_base_model(base, num_heads=num_heads)
    if randomize:
        _randomize_heads(heads)
    peft_model = add_lora(base, r=r, alpha=2 * r)
    if randomize:
        _randomize_lora(peft_model)
    return Medusa2Model(peft_model, heads), base


def _batch(seed: int = 0, B: int = 2, T: int = 14, prompt: int = 4):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    labels = ids.clone()
    labels[:, :prompt] = -100
    labels[1, T - 3 :] = -100  # row 1 is shorter: right padding
    mask = (labels != -100) | (torch.arange(T) < prompt)
    return ids, labels, mask.long()


def test_lambda0_schedule_values():
    assert lambda0_schedule(0, 100, 0.2, 0.0, "sine") == 0.2  # no warm-up
    assert lambda0_schedule(3, 100, 0.2, 10, "constant") == 0.2
    assert lambda0_schedule(0, 100, 0.2, 10, "linear") == 0.0
    assert lambda0_schedule(5, 100, 0.2, 10, "linear") == pytest.approx(0.1)
    assert lambda0_schedule(5, 100, 0.2, 10, "sine") == pytest.approx(0.2 * math.sin(math.pi / 4))
    assert lambda0_schedule(10, 100, 0.2, 10, "sine") == pytest.approx(0.2)
    assert lambda0_schedule(60, 100, 0.2, 10, "sine") == pytest.approx(0.2)
    # a warm-up below 1 is a share of the steps: 0.25 * 40 = 10 steps
    assert lambda0_schedule(5, 40, 0.2, 0.25, "linear") == pytest.approx(0.1)
    values = [lambda0_schedule(s, 50, 1.0, 20, "sine") for s in range(50)]
    assert all(a <= b for a, b in zip(values, values[1:]))  # rising, then flat
    with pytest.raises(ValueError):
        lambda0_schedule(0, 10, 0.2, 0.1, "cosine")


def test_head_labels_shift_by_k_plus_two():
    labels = torch.tensor([[-100, 5, 6, 7, 8, 9], [-100, 1, 2, 3, -100, -100]])
    out = medusa2_head_labels(labels, 3)
    for b in range(2):
        for t in range(6):
            for k in range(3):
                expect = int(labels[b, t + k + 2]) if t + k + 2 < 6 else -100
                assert int(out[b, t, k]) == expect


def test_combined_loss_matches_hand_computation():
    """L = CE + KL(p_orig || p) + lambda0 * sum_k 0.8^k CE_k, each term computed position by position."""
    model, base = _joint()
    ids, labels, mask = _batch()
    lam = 0.3
    with torch.no_grad():
        res = medusa2_loss(model, ids, labels, mask, lambda0=lam, lm_loss="ce+kl")
        out = model.backbone(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        with model.backbone.disable_adapter():
            orig = model.backbone(input_ids=ids, attention_mask=mask).logits
        h = out.hidden_states[-1]
        ce, kl, n = 0.0, 0.0, 0
        head_sum = [0.0] * 3
        head_n = [0] * 3
        B, T = ids.shape
        for b in range(B):
            for t in range(T):
                if t + 1 < T and labels[b, t + 1] != -100:
                    logp = F.log_softmax(out.logits[b, t].double(), -1)
                    logq = F.log_softmax(orig[b, t].double(), -1)
                    ce += -float(logp[labels[b, t + 1]])
                    kl += float((logq.exp() * (logq - logp)).sum())
                    n += 1
                for k in range(3):
                    if t + k + 2 < T and labels[b, t + k + 2] != -100:
                        hk = model.heads.heads[k](h[b, t])
                        logits_k = base.lm_head(hk).double()
                        head_sum[k] += -float(F.log_softmax(logits_k, -1)[labels[b, t + k + 2]])
                        head_n[k] += 1
        ce, kl = ce / n, kl / n
        medusa = sum(0.8**k * head_sum[k] / head_n[k] for k in range(3))
    assert kl > 1e-3  # the random adapter really changed the model
    assert float(res.lm) == pytest.approx(ce, rel=1e-4)
    assert float(res.kl) == pytest.approx(kl, rel=1e-4, abs=1e-5)
    assert float(res.medusa) == pytest.approx(medusa, rel=1e-4)
    assert float(res.loss) == pytest.approx(ce + kl + lam * medusa, rel=1e-4)
    with torch.no_grad():
        only_kl = medusa2_loss(model, ids, labels, mask, lambda0=lam, lm_loss="kl")
        only_ce = medusa2_loss(model, ids, labels, mask, lambda0=0.0, lm_loss="ce")
    assert only_kl.lm is None and float(only_kl.loss) == pytest.approx(kl + lam * medusa, rel=1e-4)
    assert only_ce.kl is None and float(only_ce.loss) == pytest.approx(ce, rel=1e-4)


def test_kl_is_zero_at_init_and_adapter_disabled_gives_base_logits():
    model, base = _joint(randomize=False)  # LoRA B = 0 at init
    ids, labels, mask = _batch(1)
    assert all(float(p.abs().max()) == 0 for n, p in model.backbone.named_parameters() if "lora_B" in n)
    res = medusa2_loss(model, ids, labels, mask, lambda0=0.2, lm_loss="kl")
    assert float(res.kl) == pytest.approx(0.0, abs=1e-7)

    # a changed adapter: disabling it gives exactly the logits of the base model before wrapping
    reference = tiny_model("llama", seed=0, vocab_size=VOCAB, num_layers=2)
    with torch.no_grad():
        ref_logits = reference(input_ids=ids).logits
        _randomize_lora(model.backbone)
        adapted = model.backbone(input_ids=ids).logits
        with model.backbone.disable_adapter():
            disabled = model.backbone(input_ids=ids).logits
        assert torch.allclose(model.original_logits(ids), ref_logits, **FP32_LAYERS)
    assert torch.allclose(disabled, ref_logits, **FP32_LAYERS)
    assert not torch.allclose(adapted, ref_logits, atol=1e-2)


class _Repeat(torch.utils.data.Dataset):
    def __init__(self, ids, labels, n=8):
        self.rows = [{"input_ids": ids[i], "labels": labels[i]} for i in range(ids.shape[0])]
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.rows[i % len(self.rows)]


def test_param_groups_give_the_heads_four_times_the_lora_learning_rate(tmp_path):
    from transformers import TrainingArguments

    model, _ = _joint(randomize=False)
    ids, labels, _ = _batch()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        learning_rate=1e-3,
        max_steps=3,
        warmup_steps=1,
        lr_scheduler_type="cosine",
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Medusa2Trainer(model=model, args=args, train_dataset=_Repeat(ids, labels), heads_lr_ratio=4.0)
    opt = trainer.create_optimizer()
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["backbone_lora"]["lr"] == pytest.approx(1e-3)
    assert groups["medusa_heads"]["lr"] == pytest.approx(4e-3)
    lora_ids = {id(p) for n, p in model.backbone.named_parameters() if "lora_" in n}
    assert {id(p) for p in groups["backbone_lora"]["params"]} == lora_ids  # only LoRA trains in the backbone
    assert {id(p) for p in groups["medusa_heads"]["params"]} == {id(p) for p in model.heads.parameters()}
    # the learning-rate schedule scales both groups alike: the ratio stays 4 at every step
    from hf_speculative.drafters.medusa.training_medusa2 import Medusa2Collator

    trainer.data_collator = Medusa2Collator()
    ratios = []

    class Watch(__import__("transformers").TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, **kw):
            g = {x["name"]: x["lr"] for x in optimizer.param_groups}
            if g["backbone_lora"] > 0:
                ratios.append(g["medusa_heads"] / g["backbone_lora"])

    trainer.add_callback(Watch())
    trainer.train()
    assert ratios and all(r == pytest.approx(4.0) for r in ratios)


def test_a_few_training_steps_reduce_the_loss(tmp_path):
    torch.manual_seed(0)
    model, _ = _joint(randomize=False)
    ids, labels, mask = _batch(2)
    with torch.no_grad():
        before = medusa2_loss(model, ids, labels, mask, lambda0=0.2, lm_loss="ce+kl")
    lora_before = {n: p.detach().clone() for n, p in model.backbone.named_parameters() if "lora_B" in n}
    trainer = train_medusa2(
        model,
        _Repeat(ids, labels, n=24),
        str(tmp_path),
        max_steps=12,
        learning_rate=5e-3,
        batch_size=2,
        schedule=Lambda0Schedule(lambda0=0.2, warmup=4, kind="sine"),
        lm_loss="ce+kl",
        progress=False,
    )
    with torch.no_grad():
        after = medusa2_loss(model, ids, labels, mask, lambda0=0.2, lm_loss="ce+kl")
    assert float(after.loss) < float(before.loss) - 0.1
    assert float(after.medusa) < float(before.medusa)
    assert float(after.kl) > 0  # the backbone moved away from the original model ...
    assert any(not torch.equal(p, lora_before[n]) for n, p in model.backbone.named_parameters() if "lora_B" in n)
    logged = [h["lambda0"] for h in trainer.state.log_history if "lambda0" in h]
    assert logged and max(logged) <= 0.2 + 1e-6


def test_greedy_generate_with_heads_equals_the_adapted_models_own_greedy(tmp_path):
    """The Medusa-2 result is a changed model: the tree output equals base + adapter's plain greedy output
    (adapter kept, and merged), not the base model's."""
    model, base_inner = _joint(seed=3, num_heads=3)
    peft_model, heads = model.backbone, model.heads
    reference = hfs.enable(tiny_model("llama", seed=3, vocab_size=VOCAB, num_layers=2))
    prompts = [torch.tensor([[1, 2, 3, 4]]), torch.tensor([[7, 30, 9]]), torch.tensor([[50, 5, 17, 22, 8, 60]])]
    differs = False
    for prompt in prompts:
        plain = peft_model.generate(input_ids=prompt, max_new_tokens=24, do_sample=False)
        tree = peft_model.generate(input_ids=prompt, assistant_model=heads, max_new_tokens=24, do_sample=False)
        assert torch.equal(plain, tree)
        differs |= not torch.equal(plain, reference.generate(prompt, max_new_tokens=24, do_sample=False))
    assert differs  # ... and that output is not the base model's

    save_medusa2(model, tmp_path / "m2")
    assert (tmp_path / "m2" / "adapter" / "adapter_config.json").is_file()
    merged, loaded = load_medusa2(
        tmp_path / "m2", hfs.enable(tiny_model("llama", seed=3, vocab_size=VOCAB, num_layers=2))
    )
    assert loaded.config.base_adapter == "adapter"
    for a, b in zip(loaded.parameters(), heads.parameters()):
        assert torch.equal(a, b)
    hfs.enable(merged)
    for prompt in prompts:
        plain = merged.generate(prompt, max_new_tokens=24, do_sample=False)
        assert torch.equal(plain, peft_model.generate(input_ids=prompt, max_new_tokens=24, do_sample=False))
        out = merged.generate(
            prompt, assistant_model=loaded, max_new_tokens=24, do_sample=False, return_dict_in_generate=True
        )
        assert torch.equal(out.sequences, plain)


def test_held_out_lm_loss_with_and_without_the_adapter():
    model, _ = _joint(randomize=True)
    ids, labels, _ = _batch(4)
    data = [{"input_ids": ids[i], "labels": labels[i]} for i in range(2)]
    adapted = evaluate_lm_loss(model.backbone, data, adapter=True)
    base = evaluate_lm_loss(model.backbone, data, adapter=False)
    reference = tiny_model("llama", seed=0, vocab_size=VOCAB, num_layers=2)
    total = n = 0
    with torch.no_grad():
        for ex in data:
            logits = reference(input_ids=ex["input_ids"][None]).logits[0]
            for t in range(len(ex["labels"]) - 1):
                if ex["labels"][t + 1] != -100:
                    total += -float(F.log_softmax(logits[t], -1)[ex["labels"][t + 1]])
                    n += 1
    assert base == pytest.approx(total / n, rel=1e-4)
    assert adapted != pytest.approx(base, rel=1e-3)


def test_medusa2_command_trains_calibrates_and_decodes_exactly(tmp_path):
    """``hf-speculative train medusa --medusa2`` (the method's `fit_medusa2`): LoRA + heads trained jointly, held-out
    LM losses, a tree calibrated on the adapted model; the folder loads (`load_medusa2`) and drafts exactly."""
    import json

    from conftest import saved_chat_model_and_data

    from hf_speculative.cli import main
    from hf_speculative.drafters.medusa.training_medusa2 import load_medusa2

    model, _, _, _ = saved_chat_model_and_data(tmp_path, num_layers=2)
    out = tmp_path / "out"
    argv = [
        "train",
        "medusa",
        "--medusa2",
        "--model",
        str(tmp_path / "base"),
        "--data",
        str(tmp_path / "data.jsonl"),
        "--out",
        str(out),
        "--num-heads",
        "2",
        "--max-steps",
        "2",
        "--holdout",
        "0.25",
        "--calibrate-nodes",
        "4",
        "--lm-loss",
        "ce",
        "--lr",
        "1e-2",
        "--threads",
        "1",
    ]
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    training = config["training"]
    assert (
        training["optimizer_steps"] == 2 and training["conversations"] == 6 and training["held_out_conversations"] == 2
    )
    assert training["held_out_lm_loss_adapted"] > 0 and config["calibration"]["num_nodes"] == 4
    assert (out / "adapter" / "adapter_config.json").is_file() and not (out / "trainer_state").exists()
    tuned, heads = load_medusa2(out, type(model).from_pretrained(tmp_path / "base"))
    target = hfs.enable(tuned)
    ids = torch.tensor([[3, 5, 7, 9]])
    plain = target.generate(ids, max_new_tokens=10, do_sample=False)
    assert torch.equal(target.generate(ids, assistant_model=heads, max_new_tokens=10, do_sample=False), plain)
