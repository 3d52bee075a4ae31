"""The hybrid's scored merge and its gate: drafters' own node scores (SuffixDecoding, EAGLE), their calibration by
confidence bin, the gain a costly part adds over the free plan (by hand), the gate's decisions, and a hybrid of EAGLE
and SuffixDecoding that leaves EAGLE out where the suffix plan is sure, with greedy output unchanged."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from test_drafter_protocol import begin_one, propose_one

import hf_speculative as hfs
from hf_speculative.drafters import draft_gate
from hf_speculative.drafters.draft_gate import DraftGate, accepted_depth
from hf_speculative.drafters.eagle import EagleDrafter
from hf_speculative.drafters.online_accuracy import ScoreCalibration, tried_nodes
from hf_speculative.engine.trees import budget_tree
from hf_speculative.perf_model import CostCurve

# root 0 -> 1 (tok 5, score .8) -> 3 (tok 7, .4); root -> 2 (tok 6, .1)
SCORED = hfs.DraftTree(tokens=torch.tensor([0, 5, 6, 7]), parents=(-1, 0, 0, 1), scores=(1.0, 0.8, 0.1, 0.4))


def test_tried_nodes_are_those_below_the_committed_path():
    assert list(tried_nodes(SCORED, [5, 9])) == [(1, 1, True), (2, 1, False), (3, 2, False)]
    assert list(tried_nodes(SCORED, [6])) == [(1, 1, False), (2, 1, True)]  # node 3's parent missed


def test_score_calibration_counts_by_the_drafters_own_confidence():
    cal = ScoreCalibration(num_bins=10, prior_weight=0.0)
    cal.observe_tree(SCORED, [5, 7, 1])  # node 1 (own .8) hit, node 2 (.1) missed, node 3 (own .5) hit
    assert cal.trials.tolist() == [0, 1, 0, 0, 0, 1, 0, 0, 1, 0]
    assert cal.hits.tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 1, 0]
    cal.observe_tree(SCORED, [6])  # node 1 missed, node 2 hit; node 3 not tried
    assert cal.trials[8] == 2 and cal.hits[8] == 1 and cal.hits[1] == 1
    values = cal.node_values(SCORED)  # products of the measured rates along each path
    assert values == pytest.approx([1.0, 0.5, 0.5, 0.5 * 1.0])
    prior = ScoreCalibration(num_bins=4).node_values(SCORED)  # no rows yet: each bin's midpoint
    assert prior == pytest.approx([1.0, 0.875, 0.125, 0.875 * 0.625])


def test_accepted_depth_by_hand():
    tokens, parents = [0, 5, 6, 7, 8], [-1, 0, 0, 1, 3]
    assert accepted_depth(tokens, parents, [0, 1, 2, 3, 4], [5, 7, 8, 2]) == 3
    assert accepted_depth(tokens, parents, [0, 1, 3], [5, 7, 8, 2]) == 2  # node 4 not in the plan
    assert accepted_depth(tokens, parents, [0, 1, 2, 3, 4], [6, 1]) == 1
    assert accepted_depth(tokens, parents, [0, 1, 2], [9]) == 0


def test_the_gate_drafts_where_the_measured_gain_pays_and_still_explores():
    gate = DraftGate()
    assert gate.wants(tau_free=4.0, cost_free=1.0, drafting=0.2)  # prior gain 1.0 > 4 * 0.2
    for _ in range(200):
        gate.observe(4.0, 0.0)  # never adds a token over a strong free plan
    decisions = [gate.wants(4.0, 1.0, 0.2) for _ in range(3 * draft_gate.EXPLORE_EVERY)]
    assert sum(decisions) == 3  # skipped but for one exploration in EXPLORE_EVERY rows
    assert gate.wants(tau_free=1.0, cost_free=1.0, drafting=0.2)  # another band: still its prior
    for _ in range(200):
        gate.observe(1.0, 0.6)
    assert gate.gain(1.0) == pytest.approx(0.6, rel=0.02) and gate.wants(1.0, 1.0, 0.5)
    assert not gate.wants(1.0, 1.0, 0.7)  # 0.6 tokens do not pay for 0.7 steps of drafting
    assert gate.extra_cost(1.0) == 0.0  # no extra verification measured: drafting alone is priced
    for _ in range(400):
        gate.observe(1.0, 0.6, extra_cost=0.3)  # the same gain, each time with 0.3 steps more verification
    assert gate.extra_cost(1.0) == pytest.approx(0.3, rel=0.05)
    assert gate.wants(1.0, 1.0, 0.2) and not gate.wants(1.0, 1.0, 0.4)  # 0.6 pays for 0.2 + 0.3, not 0.4 + 0.3


def test_suffix_and_eagle_drafts_carry_their_own_scores():
    sfx = hfs.SuffixDrafter(cost_curve=lambda n: 1.0).warm([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 9]])
    draft = sfx.draft(torch.tensor([7, 1, 2]), budget_tree(8, 4))
    assert draft.scores[0] == 1.0 and len(draft.scores) == len(draft)
    assert all(0 < draft.scores[i] <= draft.scores[draft.parents[i]] for i in range(1, len(draft)))

    model = hfs.enable(tiny_model("llama", seed=3, num_layers=4))
    td = EagleDrafter.from_base_model(model, variant="eagle3", draft_vocab_size=40).get_tree_drafter(model)
    prompt = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():
        begin_one(td, prompt, model(prompt, output_hidden_states=True))
        tree = hfs.TreeSpec([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
        draft = propose_one(td, prompt, tree, hfs.DraftingOptions())
    assert draft.scores[0] == 1.0
    assert all(0 < draft.scores[i] <= draft.scores[draft.parents[i]] for i in range(1, len(draft)))
    assert draft.scores[1] >= draft.scores[2]  # rank 0 is the drafter's most likely child
    sub = draft.select([0, 1, 3])
    assert sub.scores == (draft.scores[0], draft.scores[1], draft.scores[3])


def _costly_curve():
    """A cost curve with a measured LM head, so EAGLE's drafting is priced (a fixed one: nothing measured in a test)."""
    return CostCurve(nodes=(1, 64), ratios=(1.0, 1.0), projection_rows=(1, 64), projection_ratios=(0.3, 0.3))


@pytest.mark.parametrize("gate", [True, False])
def test_the_gate_leaves_eagle_out_where_suffix_is_sure_and_output_is_unchanged(gate, monkeypatch):
    model = hfs.enable(tiny_model("llama", seed=5, num_layers=4))
    prompt = torch.tensor([[3, 9, 14, 2, 30, 7]])
    ref = model.generate(prompt, max_new_tokens=40, do_sample=False)
    eagle = EagleDrafter.from_base_model(model, variant="eagle3", draft_vocab_size=60)
    sfx = hfs.SuffixDrafter(cost_curve=_costly_curve()).warm([ref[0, prompt.shape[1] :].tolist()])
    hybrid = hfs.HybridDrafter([eagle, sfx], cost_curve=_costly_curve(), gate=gate)
    out = model.generate(prompt, assistant_model=hybrid, max_new_tokens=40, do_sample=False)
    assert torch.equal(out, ref)
    steps = hybrid.drafted[1]  # SuffixDecoding (free) drafts every step
    assert hybrid.drafted[0] + hybrid.skipped[0] == steps and hybrid.skipped[1] == 0
    # the answer is in the suffix memory: the plan is sure, EAGLE's forwards are not worth running
    assert (hybrid.skipped[0] > 0) if gate else (hybrid.skipped[0] == 0)

    # EAGLE drafting every other step of a call it is new to: it catches up on the rows it skipped
    decisions = iter([True, False] * 100)
    monkeypatch.setattr(DraftGate, "wants", lambda self, *args: next(decisions))
    other = torch.tensor([[8, 8, 41, 5]])
    drafted = hybrid.drafted[0]
    out = model.generate(other, assistant_model=hybrid, max_new_tokens=30, do_sample=False)
    assert torch.equal(out, model.generate(other, max_new_tokens=30, do_sample=False))
    assert hybrid.drafted[0] > drafted


def test_rows_only_suffixdecoding_drafted_are_verified_with_its_own_tree(monkeypatch):
    """When the gate leaves EAGLE out, the hybrid verifies SuffixDecoding's draft as SuffixDecoding drafts it
    alone (it prices its own tree); when EAGLE drafts, the merged tree is priced by the hybrid."""
    model = hfs.enable(tiny_model("llama", seed=5, num_layers=4))
    prompt = torch.tensor([[3, 9, 14, 2, 30, 7]])
    ref = model.generate(prompt, max_new_tokens=24, do_sample=False)
    answer = ref[0, prompt.shape[1] :].tolist()
    eagle = EagleDrafter.from_base_model(model, variant="eagle3", draft_vocab_size=60)
    sfx = hfs.SuffixDrafter(cost_curve=_costly_curve()).warm([answer, answer[:5] + [1, 2, 3]])
    hybrid = hfs.HybridDrafter([eagle, sfx], cost_curve=_costly_curve(), max_depth=32)
    own, verified = [], []
    propose = type(sfx).propose_batch

    def suffix_propose(self, *args):
        drafts = propose(self, *args)
        own.extend(drafts)
        return drafts

    monkeypatch.setattr(type(sfx), "propose_batch", suffix_propose)
    monkeypatch.setattr(DraftGate, "wants", lambda self, *args: False)  # EAGLE never drafts
    hybrid_propose = type(hybrid).propose_batch
    monkeypatch.setattr(
        type(hybrid), "propose_batch", lambda self, *a: verified.extend(hybrid_propose(self, *a)) or verified[-1:]
    )
    out = model.generate(prompt, assistant_model=hybrid, max_new_tokens=24, do_sample=False)
    assert torch.equal(out, ref)
    assert len(own) == len(verified) > 0 and max(len(d) for d in own) > 1
    for mine, theirs in zip(own, verified):
        assert torch.equal(mine.tokens, theirs.tokens) and mine.parents == theirs.parents

    # a call's smaller budget cuts that tree (depth first, then nodes in order), its ancestors kept
    verified.clear()
    budget = hfs.TreeSpec([(0,), (0, 0), (0, 0, 0)])
    out = model.generate(prompt, assistant_model=hybrid, max_new_tokens=24, do_sample=False, speculative_tree=budget)
    assert torch.equal(out, ref) and max(len(d) for d in verified) > 1
    assert all(len(d) <= 4 and all(p < i for i, p in enumerate(d.parents) if i) for d in verified)
