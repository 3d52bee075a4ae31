"""The engine with nothing drafted: a drafter whose every draft is the root alone.

Each step of ``model.generate(..., assistant_model=RootOnlyDrafter())`` is then a one-token step through the
engine: its verification forward over one token (with the engine's kernels), its acceptance and its cache
bookkeeping, and no candidate to verify. Its tokens are plain ``generate()``'s (the root's bonus token is the
target's own next token). Beside plain ``generate()`` and a real drafter it splits a speedup in two:

* the **kernels' share**: the engine's tokens/s over plain's;
* **speculation's own share**: a drafter's tokens/s over the engine's (what drafting adds on top of the kernels).

``hf-speculative bench`` runs it as the method ``engine`` (`ENGINE_LABEL`) and the demo beside every drafter.
"""

from __future__ import annotations

import hf_speculative as hfs

__all__ = ["ENGINE_LABEL", "ENGINE_CALL", "RootOnlyDrafter"]

#: how the tables name the engine with nothing drafted
ENGINE_LABEL = "engine, nothing drafted"
#: the generate() arguments of its calls: step pricing off (there is nothing to price: every step is a one-token step)
ENGINE_CALL = {"speculative_pricing": False}


class RootOnlyDrafter(hfs.TreeDrafter):
    """Drafts nothing: every row's draft is its root (the last committed token), a one-node `DraftTree`, as the
    engine's own one-token steps are. The tree of the call (`default_tree`, a one-node chain) is a budget it leaves
    unused."""

    default_tree = hfs.TreeSpec.chain(1)

    def begin_batch(self, prompts, target_outputs) -> None:
        """Nothing to remember."""

    def propose_batch(self, sequences, rows, tree, options) -> list:
        return [hfs.DraftTree(tokens=sequence[0, -1:].clone(), parents=(-1,)) for sequence in sequences]

    def advance_batch(self, sequences, rows, drafts, results, target_outputs) -> None:
        """Nothing to learn."""
