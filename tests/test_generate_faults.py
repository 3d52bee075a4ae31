"""What runs inside a speculative ``generate()`` under faults: concurrent calls on one enabled model, one drafter given
to two calls at once, seeded sampling whatever the step pricer decides, drafts that break the protocol, beams set by
the model's generation config, and per-row logits processors. Each check has a negative control that shows the test
would catch the fault: interleavings are forced with events and barriers, never left to chance."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from conftest import tiny_model

import hf_speculative as hfs
from hf_speculative.engine.kernels.linear import ROW_BUCKETS, KernelTable, LinearKernel
from hf_speculative.engine.policy import DrafterInUseError, SpeedPolicy
from hf_speculative.engine.step_pricing import StepPricer
from hf_speculative.engine.trees import DraftTree

VOCAB = 64
PROMPT = torch.tensor([[3, 9, 4, 7, 3, 9, 4, 7, 3, 9]])
WAIT = 60  # seconds any forced interleaving waits before the test fails instead of hanging


def _plain(model, prompt=PROMPT, new=10, **kwargs):
    return model.generate(prompt, do_sample=False, max_new_tokens=new, **kwargs)


def _run(target, *args):
    """``target(*args)`` in a thread; returns (thread, results dict with "out" or "error")."""
    results: dict = {}

    def body():
        try:
            results["out"] = target(*args)
        except BaseException as exc:  # reported to the test thread, which asserts on it
            results["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    return thread, results


# --------------------------------------------------------------------------- threads: the kernels of one call


class OffsetKernel(LinearKernel):
    """A kernel that computes wrong on purpose (``F.linear + 1``): a forward that runs it says so in its tokens."""

    name = "offset"

    def product(self, prepared, x, n, bias):
        return torch.nn.functional.linear(x, prepared, bias) + 1.0


def _offset_policy_model():
    model = tiny_model("llama", seed=3, vocab_size=VOCAB, num_layers=2)
    reference = _plain(model)  # never enabled: torch's kernels
    policy = SpeedPolicy(measure_seconds=0)
    hfs.enable(model, policy=policy)
    policy._kernels = {"offset": OffsetKernel()}
    policy.table = KernelTable({bucket: "offset" for bucket in ROW_BUCKETS})
    return model, policy, reference


def _plain_while_engine_forward_runs(model, policy) -> torch.Tensor:
    """A plain ``generate()`` in one thread, run entirely while another thread is inside an engine forward of the same
    model (held there by a hook on the first decoder layer)."""
    in_engine, plain_done = threading.Event(), threading.Event()
    speculative_thread: list[threading.Thread] = []

    def hold(module, args):
        if threading.current_thread() in speculative_thread and policy.thread_kernel() is not None:
            in_engine.set()
            assert plain_done.wait(WAIT)

    handle = model.model.layers[0].register_forward_pre_hook(hold)
    try:
        thread, spec = _run(
            lambda: model.generate(PROMPT, assistant_model=hfs.PromptLookupDrafter(), do_sample=False, max_new_tokens=4)
        )
        speculative_thread.append(thread)
        assert in_engine.wait(WAIT), spec.get("error")
        try:
            plain = _plain(model)
        finally:
            plain_done.set()
            thread.join(WAIT)
        assert "error" not in spec, spec.get("error")
        return plain
    finally:
        handle.remove()


def test_plain_generate_beside_an_engine_forward_runs_torchs_kernels():
    model, policy, reference = _offset_policy_model()
    assert torch.equal(_plain_while_engine_forward_runs(model, policy), reference)


def test_negative_control_a_kernel_set_for_every_thread_changes_plain_output(monkeypatch):
    model, policy, reference = _offset_policy_model()
    shared = {}  # the unguarded design: one kernel slot for the whole process, as a swapped module forward is

    real_context = SpeedPolicy.engine_kernels

    def engine_kernels(self, model, rows):
        context = real_context(self, model, rows)

        class Shared:
            def __enter__(inner):
                shared["kernel"] = context.__enter__()
                return shared["kernel"]

            def __exit__(inner, *exc):
                shared.pop("kernel", None)
                return context.__exit__(*exc)

        return Shared()

    monkeypatch.setattr(SpeedPolicy, "engine_kernels", engine_kernels)
    monkeypatch.setattr(SpeedPolicy, "thread_kernel", lambda self: shared.get("kernel"))
    assert not torch.equal(_plain_while_engine_forward_runs(model, policy), reference)


# --------------------------------------------------------------------------- threads: two speculative calls


class SteppedLookup(hfs.PromptLookupDrafter):
    """Prompt lookup whose first ``steps`` drafts wait at a barrier shared with another call: both calls are forced
    to be mid-generation together."""

    def __init__(self, barrier: threading.Barrier, steps: int = 3):
        super().__init__()
        self.barrier, self.steps = barrier, steps

    def propose_batch(self, sequences, rows, tree, options):
        if self.steps:
            self.steps -= 1
            self.barrier.wait(WAIT)
        return super().propose_batch(sequences, rows, tree, options)


def test_two_speculative_calls_at_once_are_each_exact():
    model = tiny_model("llama", seed=5, vocab_size=VOCAB, num_layers=2)
    other = torch.tensor([[5, 1, 8, 5, 1, 8, 5, 1]])
    references = [_plain(model), _plain(model, other)]
    hfs.enable(model)
    barrier = threading.Barrier(2)
    calls = [
        _run(lambda p: _plain(model, p, assistant_model=SteppedLookup(barrier)), prompt) for prompt in (PROMPT, other)
    ]
    for (thread, result), reference in zip(calls, references):
        thread.join(WAIT)
        assert "error" not in result, result.get("error")
        assert torch.equal(result["out"], reference)


class HeldLookup(hfs.PromptLookupDrafter):
    """Prompt lookup whose first draft waits until ``release`` is set."""

    def __init__(self):
        super().__init__()
        self.drafting, self.release = threading.Event(), threading.Event()

    def propose_batch(self, sequences, rows, tree, options):
        self.drafting.set()
        assert self.release.wait(WAIT)
        return super().propose_batch(sequences, rows, tree, options)


def test_one_drafter_in_two_calls_at_once_is_a_clear_error():
    model = hfs.enable(tiny_model("llama", seed=5, vocab_size=VOCAB, num_layers=2))
    reference = _plain(model)
    drafter = HeldLookup()
    thread, first = _run(lambda: _plain(model, assistant_model=drafter))
    assert drafter.drafting.wait(WAIT)
    try:
        with pytest.raises(DrafterInUseError, match="its own drafter"):
            _plain(model, assistant_model=drafter)
    finally:
        drafter.release.set()
        thread.join(WAIT)
    assert torch.equal(first["out"], reference)  # the first call was not disturbed
    assert torch.equal(_plain(model, assistant_model=drafter), reference)  # and the drafter is free again after it
    used = hfs.PromptLookupDrafter()
    _plain(model, assistant_model=used)
    twin = copy.deepcopy(used)  # the fix the error names works on a drafter that has drafted
    assert torch.equal(_plain(model, assistant_model=twin), reference)


# --------------------------------------------------------------------------- seeds


PATTERNS = {
    "always": lambda step: True,
    "never": lambda step: False,
    "alternate": lambda step: step % 2 == 0,
    "late": lambda step: step >= 5,
}


def _sampled_under(model, monkeypatch, pattern: str, acceptance: str | None = None):
    """A seeded sampled call whose steps draft where ``pattern`` says (the drafter: the target's own weights, so trees
    are often accepted); returns the dict output."""
    decide = PATTERNS[pattern]
    counter = {"step": 0}

    def draft_this_step(self):
        counter["step"] += 1
        return decide(counter["step"])

    monkeypatch.setattr(StepPricer, "draft_this_step", draft_this_step)
    torch.manual_seed(0)
    drafter = hfs.CausalLMDrafter(tiny_model("llama", seed=7, vocab_size=VOCAB, num_layers=2))
    return model.generate(
        PROMPT,
        assistant_model=drafter,
        return_dict_in_generate=True,
        do_sample=True,
        temperature=1.3,
        max_new_tokens=24,
        speculative_pricing=True,
        speculative_acceptance=acceptance,
    )


def test_seeded_sampling_is_the_same_whatever_the_pricer_decides(monkeypatch):
    model = hfs.enable(tiny_model("llama", seed=7, vocab_size=VOCAB, num_layers=2))
    outputs = {pattern: _sampled_under(model, monkeypatch, pattern) for pattern in PATTERNS}
    assert outputs["always"].speculative_stats.mean_accepted_length > 1.3  # drafted tokens were accepted
    assert outputs["never"].speculative_stats.mean_accepted_length == 1.0
    for pattern, out in outputs.items():
        assert torch.equal(out.sequences, outputs["always"].sequences), pattern


def test_negative_control_rejection_sampling_depends_on_the_step_kinds(monkeypatch):
    model = hfs.enable(tiny_model("llama", seed=7, vocab_size=VOCAB, num_layers=2))
    outputs = [_sampled_under(model, monkeypatch, p, acceptance="rejection").sequences for p in PATTERNS]
    assert any(not torch.equal(out, outputs[0]) for out in outputs[1:])


# --------------------------------------------------------------------------- drafts that break the protocol


class Corrupt(hfs.PromptLookupDrafter):
    """Prompt lookup whose drafts are corrupted by ``corrupt(tokens)`` (a new token tensor)."""

    def __init__(self, corrupt):
        super().__init__()
        self.corrupt = corrupt

    def propose_batch(self, sequences, rows, tree, options):
        drafts = super().propose_batch(sequences, rows, tree, options)
        return [DraftTree(tokens=self.corrupt(d.tokens.clone()), parents=d.parents) for d in drafts]


def _with_one_more_node(tokens: torch.Tensor, token: int) -> torch.Tensor:
    return torch.cat([tokens, torch.tensor([token])])


def test_out_of_vocabulary_and_wrong_root_drafts_are_clear_errors():
    model = hfs.enable(tiny_model("llama", seed=5, vocab_size=VOCAB, num_layers=2))
    reference = _plain(model)

    class OutOfVocabulary(Corrupt):
        def propose_batch(self, sequences, rows, tree, options):
            return [DraftTree(tokens=torch.tensor([int(seq[0, -1]), VOCAB + 5]), parents=(-1, 0)) for seq in sequences]

    with pytest.raises(ValueError, match=rf"OutOfVocabulary drafted token id {VOCAB + 5}, outside"):
        _plain(model, assistant_model=OutOfVocabulary(None))

    def wrong_root(tokens):
        tokens[0] = (tokens[0] + 1) % VOCAB
        return tokens

    with pytest.raises(ValueError, match="Corrupt drafted a tree for row 0 whose root"):
        _plain(model, assistant_model=Corrupt(wrong_root))
    # the negative control: the same drafter, uncorrupted, decodes exactly
    assert torch.equal(_plain(model, assistant_model=Corrupt(lambda tokens: tokens)), reference)


# --------------------------------------------------------------------------- generate() semantics


def test_beams_set_by_the_models_generation_config_are_refused_by_name():
    model = hfs.enable(tiny_model("llama", seed=5, vocab_size=VOCAB, num_layers=2))
    model.generation_config.num_beams = 2
    with pytest.raises(ValueError, match=r"num_beams=2 \(set by the generation config\)"):
        _plain(model, assistant_model=hfs.PromptLookupDrafter())
    model.generation_config.num_beams = 1  # the negative control: one beam decodes
    assert _plain(model, assistant_model=hfs.PromptLookupDrafter()).shape[1] == PROMPT.shape[1] + 10


def test_prefix_allowed_tokens_fn_gets_each_rows_batch_id():
    model = hfs.enable(tiny_model("llama", seed=5, vocab_size=VOCAB, num_layers=2))
    prompts = torch.cat([PROMPT, PROMPT])
    seen = set()

    def allowed(batch_id, sent):  # row 0 says even tokens only, row 1 odd ones
        seen.add(batch_id)
        return list(range(batch_id % 2, VOCAB, 2))

    kwargs = dict(prefix_allowed_tokens_fn=allowed, attention_mask=torch.ones_like(prompts))
    reference = _plain(model, prompts, **kwargs)
    seen.clear()
    out = _plain(model, prompts, assistant_model=hfs.PromptLookupDrafter(), **kwargs)
    assert torch.equal(out, reference)
    assert seen == {0, 1}
    new = out[:, PROMPT.shape[1] :]
    assert bool((new[0] % 2 == 0).all()) and bool((new[1] % 2 == 1).all())  # each row kept its own constraint
