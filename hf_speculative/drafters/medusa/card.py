"""What this family's model card (``card.yaml``) says beyond its config entries, computed from the drafter."""

from __future__ import annotations

from ...model_card import training_record


def _medusa_projection(drafter, backbone: str = "base model", stored: str = "not stored here") -> str:
    shared = f"the {backbone}'s own frozen `lm_head` (shared, {stored})"
    return shared if drafter.config.share_lm_head else "its own vocabulary projection W2"


def _medusa_facts(heads) -> dict:
    kd = "KD" in str(training_record(heads).get("method"))
    loss = (
        "`sum_k 0.8^k KL(p_target(. | x_<=t+k+1) || head_k(h_t))` (the target's stored top-k)"
        if kd
        else "`sum_k 0.8^k CE(head_k(h_t), x_(t+k+2))`"
    )
    return {"projection": _medusa_projection(heads), "loss": loss}


def _medusa2_facts(heads) -> dict:
    t = training_record(heads)
    lm = {
        "kl": "`KL(p_original || p)` (self-distillation against the adapter-disabled model, Medusa 2.3.2)",
        "ce": "next-token cross entropy",
        "ce+kl": "cross entropy + `KL(p_original || p)`",
    }
    init = f"`{t['init_heads']}` (Medusa-1 stage)" if t.get("init_heads") else "zero-init W1 (no Medusa-1 stage)"
    return {
        "projection": _medusa_projection(heads, "backbone", "not stored"),
        "lm": lm.get(t.get("lm_loss"), t.get("lm_loss")),
        "init": init,
    }


#: card kind -> its facts
CARD_FACTS = {"medusa_heads": _medusa_facts, "medusa2": _medusa2_facts}
