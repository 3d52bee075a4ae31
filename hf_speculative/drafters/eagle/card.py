"""What this family's model card (``card.yaml``) says beyond its config entries, computed from the drafter."""

from __future__ import annotations


def _eagle_facts(drafter) -> dict:
    cfg = drafter.config
    if not cfg.is_eagle3:
        arch = "`fc` over [token embedding ; the target's final feature] (2H -> H), one decoder layer, the target's `lm_head`."
        return {
            "name": "EAGLE",
            "paper": "Li et al. 2024, EAGLE, arXiv:2401.15077",
            "arch": arch,
            "tree": repr(cfg.tree),
        }
    arch = (
        f"`fc` fuses three target layers {cfg.feature_layers()} (3H -> H); one decoder layer attends over [normed embedding ; "
        f"normed feature] (2H); its own `lm_head` over a {cfg.draft_vocab_size or cfg.vocab_size}-token draft vocabulary "
        "(`d2t`: target id = draft id + d2t[draft id])."
    )
    return {
        "name": "EAGLE-3",
        "paper": "Li et al. 2025, EAGLE-3, arXiv:2503.01840",
        "arch": arch,
        "tree": repr(cfg.tree),
    }


#: card kind -> its facts
CARD_FACTS = {"eagle_drafter": _eagle_facts}
