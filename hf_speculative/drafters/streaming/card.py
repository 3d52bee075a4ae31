"""What this family's model card (``card.yaml``) says beyond its config entries, computed from the drafter."""

from __future__ import annotations

from ...model_card import training_record


def _streaming_facts(ss) -> dict:
    params = ss.num_stream_parameters()
    base = training_record(ss).get("base_parameters") or (
        sum(p.numel() for p in ss.base.parameters()) if ss.base is not None else None
    )
    return {
        "params": f"{params:,}",
        "share": f"{100 * params / base:.3f}%" if base else "?",
        "base_params": f"{base:,}" if base else "?",
    }


#: card kind -> its facts
CARD_FACTS = {"speculative_streaming": _streaming_facts}
