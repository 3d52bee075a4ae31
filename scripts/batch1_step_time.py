"""Batch-1 step time of the tree loop on the reference model (a before/after check of an engine change).

Run from a checkout root (it imports that checkout's hf_speculative): ``OMP_NUM_THREADS=1 python scripts/batch1_step_time.py``;
alternate two checkouts several times and compare the minimum ms_per_step of each (4 held-out prompts, 64 new tokens,
tree prompt lookup and the Medusa card, greedy, one thread)."""

import json
import os
import sys
import time

import torch
from transformers import AutoModel

sys.path.insert(0, os.getcwd())
# noqa below: these imports must follow the sys.path line, so that they load this checkout's package
import hf_speculative as hfs  # noqa: E402
from hf_speculative.bench import load_prompts, load_reference_model  # noqa: E402
from hf_speculative.bench.prompts import first_per_category, prepare_prompts  # noqa: E402

torch.set_num_threads(1)

model, tok = load_reference_model()
model = hfs.enable(model)
records = first_per_category(load_prompts("heldout"), 1)
medusa = AutoModel.from_pretrained("model_cards/medusa-smollm2-135m-instruct")
drafters = {"prompt_lookup": hfs.PromptLookupDrafter(), "medusa": medusa}
out = {}
for name, d in drafters.items():
    total, fwd, toks = 0.0, 0, 0
    for p in prepare_prompts(records, tok):
        ids = p.input_ids
        t = time.perf_counter()
        o = model.generate(ids, assistant_model=d, max_new_tokens=64, do_sample=False, return_dict_in_generate=True)
        total += time.perf_counter() - t
        fwd += o.speculative_stats.num_target_forwards
        toks += o.sequences.shape[1] - ids.shape[1]
    out[name] = dict(
        s=round(total, 3), forwards=fwd, ms_per_step=round(1000 * total / fwd, 2), tok_s=round(toks / total, 2)
    )
print(os.getcwd(), json.dumps(out))
