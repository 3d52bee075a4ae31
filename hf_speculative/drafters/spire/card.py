"""What this family's model card (``card.yaml``) says beyond its config entries, computed from the drafter."""

from __future__ import annotations


def _spire_facts(drafter) -> dict:
    cfg = drafter.config
    vocab = (
        f"; drafting projects onto a {cfg.draft_vocab_size}-token draft vocabulary (FR-Spec)"
        if cfg.draft_vocab_size
        else ""
    )
    return {"vocab": vocab, "nodes": cfg.tree.num_nodes}


#: card kind -> its facts
CARD_FACTS = {"spire_drafter": _spire_facts}
