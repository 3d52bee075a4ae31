# As run for docs/results/2026-11-30-exploration-budget.md, from the repository root (a probe, not a tool).
import sys
import time

import torch

import hf_speculative as hfs
from hf_speculative.bench.harness import load_drafter
from hf_speculative.bench.reference import load_reference_model
from hf_speculative.bench.root_only import RootOnlyDrafter

torch.set_num_threads(2)

model, tok = load_reference_model()
hfs.enable(model)
card = sys.argv[1]
ss = load_drafter(card, model)
qs = [
    "Explain how a hash map works.",
    "Write a short poem about the sea.",
    "What are the benefits of exercise?",
    "Summarize the plot of Hamlet.",
]
B = int(sys.argv[2])
tok.padding_side = "left"
texts = [
    tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
    for q in qs[:B]
]
enc = tok(texts, return_tensors="pt", padding=True)


def run(d, pricing=None):
    kw = {} if pricing is None else {"speculative_pricing": pricing}
    t = time.perf_counter()
    o = model.generate(**enc, max_new_tokens=64, do_sample=False, assistant_model=d, return_dict_in_generate=True, **kw)
    el = time.perf_counter() - t
    s = o.speculative_stats
    n = s.num_target_forwards
    return (
        el,
        n,
        {k: round(v * 1000 / n, 2) for k, v in s.timings.items()},
        s.mean_accepted_length,
        sum(s.tree_sizes) / max(len(s.tree_sizes), 1),
    )


for _r in range(3):
    for name, d, pr in (("engine", RootOnlyDrafter(), False), ("card", ss, None)):
        el, n, tm, tau, ts = run(d, pr)
        print(f"{name:7s} {el:.2f}s forwards {n} tau {tau:.2f} mean tree rows {ts:.1f} per-step ms {tm}")
