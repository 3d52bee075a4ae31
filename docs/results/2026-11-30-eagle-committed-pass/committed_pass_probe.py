"""The EAGLE-3 drafter's pass over committed rows, every row's output against the last row's only (``output_rows``).

    python docs/results/2026-11-30-eagle-committed-pass/committed_pass_probe.py

E2E NLG's EAGLE-3 card on SmolLM2-135M-Instruct, float32, 2 threads; median of 50 calls after 5 warm-up calls, for a
150-row prompt (no cache) and for catch-ups of 3 and 1 rows after a 150-row cache.
"""

import time
from pathlib import Path

import torch

import hf_speculative as hfs
from hf_speculative.bench.reference import load_reference_model
from hf_speculative.drafters.eagle import EagleDrafter
from hf_speculative.drafters.eagle.drafting import _additive

CARD = Path(__file__).resolve().parents[3] / "model_cards" / "eagle3-smollm2-135m-e2e-nlg"


def median_ms(call, runs: int = 50) -> float:
    for _ in range(5):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[runs // 2]


@torch.no_grad()
def main() -> None:
    torch.set_num_threads(2)
    model = hfs.enable(load_reference_model()[0])
    drafter = EagleDrafter.from_pretrained(CARD)
    drafter.attach_base_model(model)
    drafter = drafter.float()
    H, heads, dim = model.config.hidden_size, drafter.config.num_key_value_heads, drafter.config.head_dim
    for past, rows in [(0, 150), (150, 3), (150, 1)]:
        feats, ids = torch.randn(1, rows, 3 * H), torch.randint(0, 1000, (1, rows))
        cache = None if past == 0 else (torch.randn(1, heads, past, dim), torch.randn(1, heads, past, dim))
        visible = torch.ones(1, rows, past + rows, dtype=torch.bool)
        visible[0, :, past:] = torch.ones(rows, rows, dtype=torch.bool).tril()
        kwargs = dict(
            target_features=feats,
            position_ids=torch.arange(past, past + rows)[None],
            attention_mask=_additive(visible, torch.float32),
            cache=cache,
            use_cache=True,
            compute_logits=False,
        )
        last_row = torch.tensor([rows - 1])
        every = median_ms(lambda ids=ids, kwargs=kwargs: drafter(ids, **kwargs))
        last = median_ms(lambda ids=ids, kwargs=kwargs, r=last_row: drafter(ids, output_rows=r, **kwargs))
        print(
            f"{past}-row cache, {rows} new rows: every row's output {every:.2f} ms, the last row's only {last:.2f} ms"
        )


if __name__ == "__main__":
    main()
