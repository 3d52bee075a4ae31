# As run for docs/results/2026-11-30-exploration-budget.md, from the repository root (a probe, not a tool).
import collections
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from downstream.compare import _load_arms, parse_arm  # noqa: E402
from downstream.tasks import get_task  # noqa: E402

from hf_speculative.drafters.eagle import drafting as D  # noqa: E402
from hf_speculative.drafters.eagle import modeling_eagle as M  # noqa: E402
from hf_speculative.training.data import encode_chat  # noqa: E402

torch.set_num_threads(2)

acc = collections.defaultdict(float)
cnt = collections.Counter()
state = {"in": None}


def wrapf(obj, name, key):
    f = getattr(obj, name)

    def w(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        acc[key + ("@" + state["in"] if state["in"] else "")] += time.perf_counter() - t
        cnt[key + ("@" + state["in"] if state["in"] else "")] += 1
        return r

    setattr(obj, name, w)


def ctx(obj, name, key):
    f = getattr(obj, name)

    def w(*a, **k):
        if key == "committed":
            T = max(seq.shape[1] - 1 - d.rows for d, seq in zip(a[0], a[1]))
            key2 = "committed-prompt" if T > 16 else "committed"
        else:
            key2 = key
        state["in"] = key2
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[key2] += time.perf_counter() - t
            cnt[key2] += 1
            state["in"] = None

    setattr(obj, name, w)


wrapf(M.EagleDrafter, "forward", "fwd")
wrapf(M.EagleDrafter, "_logits", "logits") if hasattr(M.EagleDrafter, "_logits") else None
wrapf(M.EagleDecoderLayer, "finish", "mlp")
wrapf(M.EagleAttention, "qkv", "qkv")
wrapf(M.EagleAttention, "attend", "attend")
wrapf(D, "_past", "past")
wrapf(D, "_additive", "mask")
wrapf(M.EagleDrafter, "fuse", "fuse")
wrapf(M.EagleDrafter, "embed", "embed")
wrapf(M.EagleDecoderLayer, "attention_input", "attn_in")
ctx(D, "committed_rows", "committed")
ctx(D.TreeRows, "run", "depth")
arms = _load_arms(
    [parse_arm("model_cards/eagle3-smollm2-135m-e2e-nlg:hybrid-suffix")],
    "e2e_nlg",
    "../shared/data/e2e_nlg",
    None,
    None,
)
recs = get_task("e2e_nlg").load("../shared/data/e2e_nlg", "test")[:12]
prompts = [torch.tensor([encode_chat(arms[0].tokenizer, r.messages)]) for r in recs]
n = get_task("e2e_nlg").max_new_tokens
arms[0].speculative(prompts[0], 8)
acc.clear()
cnt.clear()
for p in prompts:
    arms[0].speculative(p, n)
for k in sorted(acc):
    print(f"{k:20s} calls {cnt[k]:4d} total {1000 * acc[k]:7.1f} ms  per call {1000 * acc[k] / cnt[k]:.3f}")
