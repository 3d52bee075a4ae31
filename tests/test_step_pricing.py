"""Online step pricing: tree steps only while they pay. A drafter whose trees are never accepted decodes at one target
forward per token with (almost) no drafts; one-token steps in between tree steps leave every drafter's output exact."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model
from test_batch import DRAFTERS, PAD, left_padded

import hf_speculative as hfs
from hf_speculative.engine.protocol import OneRowDrafter
from hf_speculative.engine.step_pricing import StepPricer
from hf_speculative.engine.trees import DraftTree, TreeSpec


def _steps(pricer: StepPricer, n: int, tokens: float, seconds: float, plain_seconds: float) -> list[bool]:
    """Run ``n`` steps of a pricer whose tree steps commit ``tokens`` in ``seconds`` and plain steps take
    ``plain_seconds``; returns which steps drafted."""
    plan = []
    for _ in range(n):
        drafted = pricer.draft_this_step()
        plan.append(drafted)
        pricer.record(drafted, seconds if drafted else plain_seconds, tokens if drafted else 1, rows=1)
    return plan


def test_pricer_keeps_drafting_while_trees_pay():
    pricer = StepPricer()
    plan = _steps(pricer, 200, tokens=3, seconds=1.5, plain_seconds=1.0)
    w = pricer.window
    assert plan[:w] == [True] * w and plan[w : w + 2] == [False, False]  # speculate, then learn the plain price
    assert sum(plan) >= 190  # one recheck every 48 tree steps


def test_a_run_of_unlucky_steps_does_not_stop_a_drafter_that_pays():
    """Six tree steps that accept nothing, after six that accept two tokens each: over both, speculation pays
    (2 tokens per 1.3 s against 1 per second), so the pricer keeps drafting instead of backing off."""
    pricer, plan = StepPricer(), []
    for i in range(240):
        drafted = pricer.draft_this_step()
        plan.append(drafted)
        tokens = (3 if (i // 6) % 2 == 0 else 1) if drafted else 1
        pricer.record(drafted, 1.3 if drafted else 1.0, tokens, rows=1)
    assert sum(plan[40:]) >= 190


def test_pricer_backs_off_when_trees_lose_and_tries_again():
    plan = _steps(StepPricer(), 200, tokens=1.4, seconds=1.6, plain_seconds=1.0)  # 1.14 s/token against 1.0
    drafted = sum(plan)
    assert drafted <= 4 + 4 * 5  # the first window, then one window after each doubling back-off (8, 16, 32, 64)
    assert plan[-64:].count(True) <= 4


def test_a_costly_losing_drafter_explores_within_its_share_of_the_time():
    """Tree steps that cost two one-token steps for 1.1 tokens: after the first window and the plain probe the
    pricer waits 8 steps; losing again, until one more window's loss (4 x 0.94 one-token steps) is 2% of the wait:
    188 steps, not 16; then twice that after each loss in a row."""
    pricer = StepPricer()
    plan = _steps(pricer, 2000, tokens=1.1, seconds=2.0, plain_seconds=1.0)
    start = pricer.window + pricer.probe
    assert plan[:start] == [True] * pricer.window + [False] * pricer.probe
    quiet = math.ceil(4 * (2.0 * 1.02 - 1.1) / 0.02)
    windows = [i for i in range(1, len(plan)) if plan[i] and not plan[i - 1]]
    gaps = [b - a - pricer.window for a, b in zip([0, *windows], windows)]
    assert gaps == [pricer.probe + pricer.backoff, quiet, 2 * quiet, 4 * quiet]
    lost = sum(2.0 - 1.1 for drafted in plan[pricer.window :] if drafted)  # exploration after the first window
    assert lost / 2000 <= 0.01
    doubling = _steps(StepPricer(explore=float("inf")), 2000, tokens=1.1, seconds=2.0, plain_seconds=1.0)
    assert sum(doubling) - 4 >= 4 * (sum(plan) - 4)  # the doubling alone (8, 16, ... 128) explores 4x as often


@pytest.mark.parametrize("tokens, seconds, wait", [(1.5, 1.6, 27), (1.6, 1.58, 16)])
def test_the_back_off_grows_with_the_loss_and_is_never_shorter_than_the_doubling(tokens, seconds, wait):
    """After a first back-off of 8 steps, a loss of 0.13 one-token steps per tree step waits 27 steps (4 x 0.13 is 2%
    of them); a loss of 0.01 waits the doubling's second back-off, 16."""
    pricer = StepPricer()
    plan = _steps(pricer, 120, tokens=tokens, seconds=seconds, plain_seconds=1.0)
    start = pricer.window + pricer.probe
    assert plan[start:].index(True) == pricer.backoff
    second = start + pricer.backoff + pricer.window
    assert plan[second:].index(True) == wait


def test_a_drafter_that_paid_until_now_is_retried_after_the_first_back_off():
    """Tree steps that commit 4 tokens for 100 steps, then 1 (a dry spell in a drafter that pays in bursts): the
    first loss after wins waits 8 steps, as before; only a second loss in a row waits the cost-based 2% share."""
    pricer, plan = StepPricer(), []
    for i in range(400):
        drafted = pricer.draft_this_step()
        plan.append(drafted)
        tokens = (4 if i < 100 else 1) if drafted else 1
        pricer.record(drafted, 1.7 if drafted else 1.0, tokens, rows=1)
    off = [len(run) for run in "".join("T" if d else "." for d in plan[100:]).split("T") if len(run) > 1]  # no rechecks
    assert off[:2] == [pricer.backoff, math.ceil(4 * (1.7 * 1.02 - 1) / 0.02)]


def test_pricer_never_drafts_on_when_nothing_is_accepted_however_cheap():
    plan = _steps(StepPricer(), 100, tokens=1, seconds=0.5, plain_seconds=1.0)
    assert sum(plan) <= 4 * 4 and not any(plan[-18:])  # windows after back-offs of 8, 16 and 32 steps; then 64


class WrongTokens(OneRowDrafter):
    """Proposes a chain whose every token differs from what the model will say (known from its plain output)."""

    def __init__(self, reference: torch.Tensor, vocab: int, depth: int = 4):
        self.reference, self.vocab, self.depth, self.proposals = reference, vocab, depth, 0
        self.default_tree = TreeSpec.chain(depth)

    def propose(self, sequence, tree, options):
        self.proposals += 1
        position = sequence.shape[1]
        wrong = [
            (int(self.reference[min(position + i, self.reference.numel() - 1)]) + 1) % self.vocab
            for i in range(self.depth)
        ]
        return DraftTree(tokens=torch.tensor([int(sequence[0, -1])] + wrong), parents=tuple(range(-1, self.depth)))


def test_a_drafter_that_never_pays_decodes_one_token_per_forward_without_drafting():
    model = hfs.enable(tiny_model("llama"))
    prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7]])
    plain = model.generate(prompt, max_new_tokens=80, do_sample=False)
    drafter = WrongTokens(plain[0], model.config.vocab_size)
    out = model.generate(
        prompt,
        assistant_model=drafter,
        max_new_tokens=80,
        do_sample=False,
        return_dict_in_generate=True,
        speculative_pricing=True,
    )
    assert torch.equal(out.sequences, plain)
    stats = out.speculative_stats
    assert stats.num_target_forwards == 80  # one forward per token (the prefill's included)
    assert drafter.proposals <= 4 + 4 * 3  # the first window and one after each back-off (8, 16, 32)
    assert stats.tree_sizes[-30:].count(1) >= 24  # the tail is one-token steps: no drafts
    unpriced = WrongTokens(plain[0], model.config.vocab_size)
    model.generate(prompt, assistant_model=unpriced, max_new_tokens=80, do_sample=False, speculative_pricing=False)
    assert unpriced.proposals == 79  # without pricing every step drafts


def _alternating(monkeypatch):
    """Every other step a one-token step, whatever the timings."""
    state = {"step": 0}

    def draft_this_step(self):
        state["step"] += 1
        return state["step"] % 2 == 1

    monkeypatch.setattr(StepPricer, "draft_this_step", draft_this_step)


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_one_token_steps_between_tree_steps_keep_every_drafter_exact(monkeypatch, name):
    _alternating(monkeypatch)
    model = hfs.enable(tiny_model("llama"))
    ids, mask = left_padded()
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=PAD)
    drafter = DRAFTERS[name](model)
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=10,
        do_sample=False,
        pad_token_id=PAD,
        assistant_model=drafter,
        speculative_pricing=True,
    )
    assert torch.equal(out, plain), name
    single = model.generate(
        ids[:1], max_new_tokens=10, do_sample=False, assistant_model=DRAFTERS[name](model), speculative_pricing=True
    )
    assert torch.equal(single, model.generate(ids[:1], max_new_tokens=10, do_sample=False)), name


def test_a_drafter_model_keeps_its_step_prices_across_calls(monkeypatch):
    """A drafter model makes a new per-call `TreeDrafter` on every call; its step prices live with the model, so the
    pricer's warm-up (a window of tree steps, then plain probes) is paid once, not by every short generation."""
    model = hfs.enable(tiny_model("llama"))
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=2)
    made, records = [], []
    post_init, record = StepPricer.__post_init__, StepPricer.record
    monkeypatch.setattr(StepPricer, "__post_init__", lambda self: (made.append(self), post_init(self))[-1])
    monkeypatch.setattr(StepPricer, "record", lambda self, *a, **k: (records.append(self), record(self, *a, **k))[-1])
    prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7]])
    kwargs = dict(assistant_model=heads, max_new_tokens=6, do_sample=False, speculative_pricing=True)
    steps = 0
    for _ in range(3):
        steps += (
            model.generate(prompt, return_dict_in_generate=True, **kwargs).speculative_stats.num_target_forwards - 1
        )
    assert len(made) == 1  # one pricer for the three calls: every step of every call was recorded in it
    assert len(records) == steps and set(map(id, records)) == {id(made[0])}
    other = hfs.MedusaHeadsModel.from_base_model(model, num_heads=2)
    model.generate(prompt, **{**kwargs, "assistant_model": other})
    assert len(made) == 2  # another drafter model prices its own steps
