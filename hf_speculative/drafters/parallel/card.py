"""What this family's model card (``card.yaml``) says beyond its config entries, computed from the drafter."""

from __future__ import annotations


def _parallel_facts(drafter) -> dict:
    fused = "Each context token is fused with the target's final hidden state at the previous position (`W [e(x_i); h_(i-1)]`, ParallelSpec Sec. 4.3)."
    return {
        "k_plus_1": drafter.config.num_mask_tokens + 1,
        "conditioning": fused if drafter.config.use_target_hidden_states else "It reads tokens only.",
    }


#: card kind -> its facts
CARD_FACTS = {"parallel_drafter": _parallel_facts}
