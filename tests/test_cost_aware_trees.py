"""Cost-aware trees: `TreeSpec.optimize(cost=)` on a hand-computed toy, and the calibrated drafters' default tree."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import hf_speculative as hfs
from hf_speculative.perf_model import CostCurve, set_cost_curve

# Toy accuracy table: depth 1 top-1 0.8, top-2 0.1; depth 2 top-1 0.7, top-2 0.1.
# Node values (product along the path): (0)=.8  (0,0)=.56  (1)=.1  (0,1)=.08  (1,0)=.07
ACC = [[0.8, 0.1], [0.7, 0.1]]
# c(n) for a forward over n tokens (root + N nodes): c(2)=1.1, c(3)=1.2, c(4)=1.8, c(5)=2.4
CURVE = CostCurve((1, 2, 3, 4, 5), (1.0, 1.1, 1.2, 1.8, 2.4))
CHAIN = hfs.TreeSpec.from_choices([[0], [0, 0]])
SINGLE = hfs.TreeSpec.from_choices([[0]])
WIDE = hfs.TreeSpec.from_choices([[0], [1]])


def test_cost_aware_optimize_on_a_hand_computed_toy():
    # Without a cost: the greedy 4-node tree, (0), (0,0), (1), (0,1)
    assert hfs.TreeSpec.optimize(ACC, 4) == hfs.TreeSpec.from_choices([[0], [1], [0, 0], [0, 1]])

    # With the cost curve, no drafting cost; tau = 1 + sum of node values, speed = tau / c(N + 1):
    #   depth limit 1: {(0)} 1.8/1.1 = 1.636   {(0),(1)} 1.9/1.2 = 1.583
    #   depth limit 2: {(0),(0,0)} 2.36/1.2 = 1.967   + (1): 2.46/1.8 = 1.367   + (0,1): 2.54/2.4 = 1.058
    # -> the 2-chain wins, although 4 nodes were allowed
    assert hfs.TreeSpec.optimize(ACC, 4, cost=CURVE) == CHAIN

    # Drafting costs 0.1 steps for a depth-1 tree and 0.5 for depth 2 (e.g. one vs two head projections):
    #   {(0)} 1.8/(1.1+0.1) = 1.5   {(0),(1)} 1.9/(1.2+0.1) = 1.462   {(0),(0,0)} 2.36/(1.2+0.5) = 1.388
    #   3 nodes: 2.46/(1.8+0.5) = 1.070   4 nodes: 2.54/(2.4+0.5) = 0.876   -> the single node wins
    assert hfs.TreeSpec.optimize(ACC, 4, cost=CURVE, draft_cost=[0.1, 0.5]) == SINGLE

    # The same drafting cost on a machine where 3 tokens cost 1.12: {(0),(1)} 1.9/(1.12+0.1) = 1.557 beats
    # {(0)} 1.5 and {(0),(0,0)} 2.36/(1.12+0.5) = 1.457 -> the wide, shallow tree wins
    flat = CostCurve((1, 2, 3, 4, 5), (1.0, 1.1, 1.12, 1.8, 2.4))
    assert hfs.TreeSpec.optimize(ACC, 4, cost=flat, draft_cost=[0.1, 0.5]) == WIDE

    # A drafting cost per node, f(N, depth) = 0.05 N: chain 2.36/(1.2+0.1) = 1.815 > {(0)} 1.8/1.15 = 1.565
    assert hfs.TreeSpec.optimize(ACC, 4, cost=CURVE, draft_cost=lambda n, d: 0.05 * n) == CHAIN

    # Batch of 2: a step costs c(2 (N + 1)) / c(2), with c(6) = 3.0 (c(8) extrapolated to 4.2):
    #   {(0)} 1.8/(1.8/1.1) = 1.1   {(0),(1)} 1.9/(3.0/1.1) = 0.697   chain 2.36/(3.0/1.1) = 0.865  -> single
    six = CostCurve((1, 2, 3, 4, 5, 6), (1.0, 1.1, 1.2, 1.8, 2.4, 3.0))
    assert hfs.TreeSpec.optimize(ACC, 4, cost=six) == CHAIN
    assert hfs.TreeSpec.optimize(ACC, 4, cost=six, batch_size=2) == SINGLE

    # the expected acceptance length and speed used above
    assert CHAIN.expected_acceptance_length(ACC) == pytest.approx(2.36)
    assert CHAIN.expected_speedup(ACC, CURVE) == pytest.approx(2.36 / 1.2)
    assert SINGLE.expected_speedup(ACC, CURVE, draft_cost=[0.1, 0.5]) == pytest.approx(1.5)
    assert SINGLE.expected_speedup(ACC, six, batch_size=2) == pytest.approx(1.8 / (1.8 / 1.1))
    with pytest.raises(ValueError, match="batch_size"):
        hfs.TreeSpec.optimize(ACC, 4, cost=CURVE, batch_size=0)


# --------------------------------------------------------------------------- drafters' default tree


@pytest.fixture
def cost_aware(monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_COST_AWARE", "1")


def _medusa(model, **config):
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=2, medusa_choices=[[0], [1], [2], [0, 0]], **config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    heads.config.calibration = {"head_top_i_accuracy": ACC}
    return heads


def test_medusa_default_tree_is_the_cost_aware_tree(cost_aware, monkeypatch):
    model = hfs.enable(tiny_model("llama"))
    heads = _medusa(model)
    set_cost_curve(model, CURVE)  # no projection data: drafting counts as free -> the chain (see the toy)
    assert heads.get_tree_drafter(model).default_tree == CHAIN
    # head projections cost 0.1 (1 row) and 0.5 (2 rows) steps: the toy's single node
    with_heads = CostCurve(CURVE.nodes, CURVE.ratios, projection_rows=(1, 2), projection_ratios=(0.1, 0.5))
    set_cost_curve(model, with_heads)
    assert heads.get_tree_drafter(model).draft_cost(with_heads) == pytest.approx([0.1, 0.5])
    assert heads.get_tree_drafter(model).default_tree == SINGLE
    # a draft vocabulary of a quarter of the 96 tokens reads a quarter of the matrix: costs 0.025 / 0.125, and
    # the chain wins again: 2.36/(1.2+0.125) = 1.781 > 1.8/(1.1+0.025) = 1.6
    heads.set_draft_vocab(torch.arange(24))
    assert heads.get_tree_drafter(model).default_tree == CHAIN
    set_cost_curve(model, CURVE)

    # greedy decoding with the cost-aware default tree in the loop: exact, and every step verifies the chain
    prompt = torch.tensor([[5, 3, 9, 1]])
    out = model.generate(
        prompt, assistant_model=heads, max_new_tokens=20, do_sample=False, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, model.generate(prompt, max_new_tokens=20, do_sample=False))
    assert set(out.speculative_stats.tree_sizes) == {3}
    # speculative_tree= still overrides
    tree = hfs.TreeSpec.from_choices([[0], [1], [2]])
    out = model.generate(
        prompt,
        assistant_model=heads,
        max_new_tokens=8,
        do_sample=False,
        speculative_tree=tree,
        return_dict_in_generate=True,
    )
    assert set(out.speculative_stats.tree_sizes) == {4}

    # opting out: the environment, the config flag; no calibration: the saved tree
    saved = heads.config.tree
    monkeypatch.setenv("HF_SPECULATIVE_COST_AWARE", "0")
    assert heads.get_tree_drafter(model).default_tree == saved
    monkeypatch.setenv("HF_SPECULATIVE_COST_AWARE", "1")
    heads.config.cost_aware_tree = False
    assert heads.get_tree_drafter(model).default_tree == saved
    heads.config.cost_aware_tree = True
    heads.config.calibration = None
    assert heads.get_tree_drafter(model).default_tree == saved
    set_cost_curve(model, None)


def test_parallel_drafter_default_tree_is_the_cost_aware_tree(cost_aware):
    model = hfs.enable(tiny_model("llama"))
    drafter = hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=1)
    drafter.config.calibration = {"depth_top_i_accuracy": ACC}
    set_cost_curve(model, CURVE)
    tree_drafter = drafter.get_tree_drafter(model)
    # one drafter layer of the target's 4: a quarter of c(k + 2) = c(3) = 1.2 -> 0.3 per step at every depth
    assert tree_drafter.draft_cost(CURVE) == pytest.approx([0.3, 0.3])
    # {(0)} 1.8/1.4 = 1.286  {(0),(1)} 1.9/1.5 = 1.267  chain 2.36/1.5 = 1.573  3 nodes 2.46/2.1 = 1.171
    assert tree_drafter.default_tree == CHAIN
    set_cost_curve(model, None)


def test_speculative_streaming_default_tree_is_the_cost_aware_tree(cost_aware):
    base = tiny_model("llama")
    ss = hfs.LlamaForSpeculativeStreaming.from_base_model(base, num_streams=2, num_msa_layers=2)
    ss.config.calibration = {"stream_top_i_accuracy": ACC}
    set_cost_curve(ss, CURVE)  # ss drafts for itself: its own forward is the verification forward
    drafter = ss.get_self_drafter()
    # lossless: the 2 streams run through 2 of the 4 layers, half of c(2) = 1.1 -> 0.55 per step
    assert drafter.draft_cost(CURVE) == pytest.approx(0.55)
    # {(0)} 1.8/1.65 = 1.091  {(0),(1)} 1.9/1.75 = 1.086  chain 2.36/1.75 = 1.349  3 nodes 2.46/2.35 = 1.047
    assert drafter.default_tree == CHAIN
    set_cost_curve(ss, None)


def test_spire_default_tree_is_the_best_chain_with_alternatives(cost_aware):
    """SPIRe's calibration is cumulative top-i acceptance per depth; its candidates are the chain-shaped trees it
    conditions exactly, each depth costing one drafter forward (its layers' share of a target step)."""
    model = hfs.enable(tiny_model("llama"))
    set_cost_curve(model, CURVE)
    try:
        for num_layers, per_pass, best in ((1, 0.25, CHAIN), (2, 0.5, SINGLE)):
            drafter = hfs.SpireDrafter.from_base_model(
                model, num_layers=num_layers, sliding_window=8, num_draft_tokens=2
            )
            drafter.config.calibration = {"depth_top_i_accuracy": [[0.8, 0.9], [0.7, 0.8]]}  # per rank: ACC
            tree_drafter = drafter.get_tree_drafter(model)
            assert [r for row in tree_drafter.rank_accuracies() for r in row] == pytest.approx(
                [a for row in ACC for a in row]
            )
            assert tree_drafter.draft_cost(CURVE) == pytest.approx([per_pass, 2 * per_pass])
            assert len(tree_drafter.candidate_trees(2, 10)) == 4 and len(tree_drafter.candidate_trees(2, 2)) == 3
            # 1 layer:  {(0)} 1.8/1.35 = 1.333  {(0),(1)} 1.9/1.45 = 1.310  chain 2.36/1.7 = 1.388  4 nodes 2.54/2.9
            # 2 layers: {(0)} 1.8/1.6 = 1.125   {(0),(1)} 1.9/1.7 = 1.118   chain 2.36/2.2 = 1.073  4 nodes 2.54/3.4
            assert tree_drafter.default_tree == best
        prompt = torch.tensor([[5, 3, 9, 1, 7, 2]])
        out = model.generate(
            prompt, assistant_model=drafter, max_new_tokens=16, do_sample=False, return_dict_in_generate=True
        )
        assert torch.equal(out.sequences, model.generate(prompt, max_new_tokens=16, do_sample=False))
        assert set(out.speculative_stats.tree_sizes) == {2}
        drafter.config.cost_aware_tree = False
        assert drafter.get_tree_drafter(model).default_tree == drafter.config.tree
    finally:
        set_cost_curve(model, None)


def test_cost_aware_trees_shrink_as_the_batch_grows(cost_aware):
    """A batch of B rows verifies B x (N + 1) tokens against a plain batched step: bigger batches leave the flat
    part of the cost curve sooner, so the drafter's tree for the call's batch size shrinks."""
    model = hfs.enable(tiny_model("llama"))
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=3)
    heads.config.calibration = {"head_top_i_accuracy": [[0.8, 0.15, 0.05], [0.7, 0.15, 0.05], [0.6, 0.1, 0.05]]}
    # flat up to 16 tokens, then linear
    curve = CostCurve((1, 2, 4, 8, 16, 32, 64, 128), (1.0, 1.0, 1.0, 1.02, 1.05, 2.0, 4.0, 8.0))
    set_cost_curve(model, curve)
    try:
        drafter = heads.get_tree_drafter(model)
        sizes = [drafter.tree_for_batch(b).num_nodes for b in (1, 4, 8, 16)]
        assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1], sizes
        assert drafter.tree_for_batch(1) == drafter.default_tree
        # the loop uses the tree of the call's batch size, and stays exact
        ids = torch.tensor([[0, 5, 3, 9, 1], [4, 4, 8, 2, 6]])
        mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
        out = model.generate(
            ids,
            attention_mask=mask,
            assistant_model=heads,
            max_new_tokens=10,
            do_sample=False,
            pad_token_id=0,
            return_dict_in_generate=True,
        )
        plain = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert torch.equal(out.sequences, plain)
        batch_tree = heads.get_tree_drafter(model).tree_for_batch(2)
        assert {s for row in out.speculative_stats.rows for s in row.tree_sizes} == {batch_tree.num_nodes + 1}
    finally:
        set_cost_curve(model, None)


def test_without_a_measured_curve_trees_are_sized_with_the_kernel_tables():
    """No cached cost curve: the curve derived from this machine's kernel table (measured at enable) sizes the trees
    instead of the built-in default; its ratios are the table kernel's times over its one-row time."""
    import hf_speculative as hfs
    from hf_speculative.drafters.cost_aware import target_cost_curve
    from hf_speculative.engine.kernels.linear import KernelTable
    from hf_speculative.engine.policy import speed_policy
    from hf_speculative.perf_model.cost_curve import kernel_table_curve

    model = hfs.enable(tiny_model("llama"))
    assert kernel_table_curve(model) is None  # a tiny model gets the default table: nothing measured
    assert target_cost_curve(model).meta["source"] == "default"
    ms = {"torch": {1: 2.0, 4: 3.0, 16: 9.0}, "direct": {1: 1.0, 4: 1.5, 16: 6.0}}
    speed_policy(model).table = KernelTable({1: "direct", 4: "direct", 16: "torch"}, ms)
    curve = target_cost_curve(model)
    assert curve.meta["source"] == "kernel table"
    assert curve.nodes == (1, 4, 16) and curve.ratios == pytest.approx((1.0, 1.5, 9.0))
    assert kernel_table_curve(tiny_model("llama")) is None  # never enabled
