"""SmolLM2-135M-Instruct's one-token forwards after an L-token prefix, greedy, with a plain `DynamicCache` against one
whose layers the engine swapped for `ReservedLayer` (`prepare_tree_cache`); the two alternate, R rounds of N steps,
and the tokens must be identical.

    python probe_forward_loop.py 150 48 14
"""

import statistics
import sys
import time

import torch
from transformers import DynamicCache

import hf_speculative.engine.cache as engine_cache
from hf_speculative.bench.reference import load_reference_model

torch.set_num_threads(2)
model, _ = load_reference_model()
length, steps, rounds = (int(a) for a in sys.argv[1:4])
ids = torch.randint(100, 40000, (1, length), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def run(reserved: bool):
    cache = DynamicCache(config=model.config)
    if reserved:
        engine_cache.prepare_tree_cache(cache)
    out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    start, tokens = time.perf_counter(), []
    for _ in range(steps):
        out = model(token, past_key_values=cache, use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
    return (time.perf_counter() - start) / steps * 1e3, torch.cat(tokens)


assert torch.equal(run(False)[1], run(True)[1])
ms = {False: [], True: []}
for r in range(rounds):
    for reserved in (False, True) if r % 2 else (True, False):
        ms[reserved].append(run(reserved)[0])
for reserved, values in ms.items():
    kind = "ReservedLayer" if reserved else "DynamicLayer"
    print(f"L={length} {kind}: ms per step median {statistics.median(values):.2f}, min {min(values):.2f}")
print("ReservedLayer / DynamicLayer: median", round(statistics.median(ms[True]) / statistics.median(ms[False]), 4))
