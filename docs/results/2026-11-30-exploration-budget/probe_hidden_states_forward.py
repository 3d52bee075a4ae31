# As run for docs/results/2026-11-30-exploration-budget.md, from the repository root (a probe, not a tool).
import time

import torch
from transformers import DynamicCache

from hf_speculative.bench.reference import load_reference_model

torch.set_num_threads(2)

model, tok = load_reference_model()
ids = torch.randint(0, 49000, (1, 200))
c = DynamicCache(config=model.config)
with torch.no_grad():
    model(ids, cache=c, use_cache=True)
x = torch.tensor([[5]])
pos = torch.tensor([[200]])
empty = torch.empty(0, dtype=torch.long)


def f(ohs):
    model(x, cache=c, position_ids=pos, use_cache=True, output_hidden_states=ohs, logits_to_keep=empty)
    c.crop(-1)


res = {True: [], False: []}
with torch.no_grad():
    for _r in range(8):
        for o in (True, False):
            t = time.perf_counter()
            for _i in range(20):
                f(o)
            res[o].append((time.perf_counter() - t) / 20 * 1000)
for k, v in res.items():
    print(k, "min %.2f med %.2f" % (min(v), sorted(v)[4]))
