import pytest
import torch

import hf_speculative as hfs
from hf_speculative.engine.trees import additive_mask, tree_attention_mask


def test_from_choices_orders_breadth_first_and_derives_structure():
    spec = hfs.TreeSpec.from_choices([[1, 0], [0], [0, 1], [1], [0, 0]])
    assert spec.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert spec.num_nodes == 5 and spec.depth == 2
    assert spec.parents == (-1, 0, 0, 1, 1, 2)
    assert spec.ranks == (0, 0, 1, 0, 1, 0)
    assert spec.depths.tolist() == [0, 1, 1, 2, 2, 2]
    assert spec.children == ((1, 2), (3, 4), (5,), (), (), ())
    anc = spec.ancestors
    assert anc[5].tolist() == [True, False, True, False, False, True]  # (1,0): root, (1,), itself
    assert anc.diagonal().all() and not anc.triu(1).any()


def test_cartesian_and_chain():
    spec = hfs.TreeSpec.cartesian([3, 2, 2])
    assert spec.num_nodes == 3 + 6 + 12 and spec.depth == 3
    assert all(len(spec.children[i]) == 2 for i in range(1, 10))
    chain = hfs.TreeSpec.chain(4)
    assert chain.paths == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))
    assert chain.parents == (-1, 0, 1, 2, 3)


@pytest.mark.parametrize(
    "choices, match",
    [([[0, 0]], "no parent path"), ([[1]], "lower-ranked sibling"), ([[0], [-1]], "negative"), ([[]], "empty")],
)
def test_invalid_trees_raise(choices, match):
    with pytest.raises(ValueError, match=match):
        hfs.TreeSpec.from_choices(choices)


def test_optimize_on_toy_accuracy_table():
    # depth-1 head: top-1 0.6, top-2 0.2; depth-2 head: top-1 0.5, top-2 0.1
    acc = [[0.6, 0.2], [0.5, 0.1]]
    # node values: (0)=.6 (0,0)=.3 (1)=.2 (0,1)=.06 (1,0)=.1 (1,1)=.02
    assert hfs.TreeSpec.optimize(acc, 1).paths == ((0,),)
    assert hfs.TreeSpec.optimize(acc, 3).paths == ((0,), (1,), (0, 0))
    assert hfs.TreeSpec.optimize(acc, 4).paths == ((0,), (1,), (0, 0), (1, 0))
    assert hfs.TreeSpec.optimize(acc, 5).paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))

    # the greedy tree maximises the expected acceptance length among all 4-node trees here
    def expected(spec):
        total = 0.0
        for p in spec.paths:
            v = 1.0
            for d, r in enumerate(p):
                v *= acc[d][r]
            total += v
        return total

    best = hfs.TreeSpec.optimize(acc, 4)
    for other in [hfs.TreeSpec.from_choices(c) for c in ([[0], [1], [0, 0], [0, 1]], [[0], [0, 0], [0, 1], [1]])]:
        assert expected(best) >= expected(other) - 1e-12
    assert expected(best) == pytest.approx(0.6 + 0.3 + 0.2 + 0.1)


def test_to_list_round_trip():
    spec = hfs.TreeSpec.cartesian([2, 2])
    assert hfs.TreeSpec.from_choices(spec.to_list()) == spec


def test_tree_attention_mask():
    spec = hfs.TreeSpec.from_choices([[0], [1], [0, 0]])
    mask = tree_attention_mask(spec.ancestors, past_length=2, dtype=torch.float32, device="cpu")
    assert mask.shape == (1, 1, 4, 6)
    visible = mask[0, 0] == 0
    assert visible[:, :2].all()
    assert visible[3, 2:].tolist() == [True, True, False, True]  # (0,0) sees root, (0,), itself
    assert visible[2, 2:].tolist() == [True, False, True, False]
    hidden = mask[0, 0][~visible]
    assert (hidden == torch.finfo(torch.float32).min).all()
    pad = torch.tensor([False, True])
    assert not (tree_attention_mask(spec.ancestors, 2, torch.float32, "cpu", pad)[0, 0, :, 0] == 0).any()
    assert additive_mask(torch.tensor([[True, False]]), torch.float16)[0, 0, 0, 1] == torch.finfo(torch.float16).min


def test_draft_tree_path_and_dynamic_structure():
    tree = hfs.DraftTree(tokens=torch.tensor([5, 6, 7, 8]), parents=(-1, 0, 0, 2))
    assert tree.path_to(3) == [0, 2, 3]
    assert tree.children == ((1, 2), (), (3,), ())
    assert tree.depths.tolist() == [0, 1, 1, 2]
    with pytest.raises(ValueError, match="parents must come before"):
        _ = hfs.DraftTree(tokens=torch.tensor([1, 2]), parents=(-1, 1)).ancestors


def test_tree_mask_buffer_equals_fresh_masks_every_step():
    """The engine's reused mask buffer gives exactly `tree_attention_mask` at every step: growing past lengths,
    changing tree shapes (more than the block cache holds), hidden padding columns."""
    from hf_speculative.engine.trees import MAX_BLOCKS, BatchTreeMaskBuffer, TreeSpec, batch_tree_block

    pad = torch.tensor([False, False, True, True, True])
    buffer = BatchTreeMaskBuffer(torch.float32, "cpu")
    shapes = [TreeSpec.cartesian([2, 2]), TreeSpec.chain(3), TreeSpec.from_choices([[0], [1], [0, 0]])]
    shapes += [TreeSpec.chain(k) for k in range(1, MAX_BLOCKS + 3)]
    past, blocks = 5, []
    for step, spec in enumerate(shapes * 2):
        visible = torch.cat([pad, torch.ones(past - pad.numel(), dtype=torch.bool)])
        expected = tree_attention_mask(spec.ancestors, past, torch.float32, "cpu", visible)
        draft = hfs.DraftTree.from_spec(spec, torch.zeros(spec.num_nodes + 1, dtype=torch.long))
        assert torch.equal(buffer(visible[None], batch_tree_block([draft], torch.float32, "cpu", blocks)), expected), (
            step
        )
        past += 1 + step % 3  # an accepted path of 1-3 tokens
