"""Tree vs chain with the same drafter (the reference Medusa heads): tau on 8 MT-Bench first turns (one per
category), 128 new tokens, greedy.   python scripts/medusa_tree_vs_chain.py
"""

import torch

import hf_speculative as hfs
from hf_speculative.bench import load_prompts, load_reference_model

torch.set_num_threads(1)
model, tok = load_reference_model()
hfs.enable(model)
heads = hfs.MedusaHeadsModel.from_pretrained("model_cards/medusa-smollm2-135m-instruct", base_model=model)
qs = [{"turns": r.turns} for r in load_prompts("mt_bench")]
qs = [qs[i] for i in range(0, 80, 10)]
res = {}
for name, tree in [
    ("chain4", hfs.TreeSpec.chain(4)),
    ("calibrated28", None),
    ("cartesian[4,2,2]", hfs.TreeSpec.cartesian([4, 2, 2])),
]:
    toks = fw = same = 0
    for q in qs:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q["turns"][0]}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        out = model.generate(
            ids,
            assistant_model=heads,
            speculative_tree=tree,
            max_new_tokens=128,
            do_sample=False,
            return_dict_in_generate=True,
        )
        st = out.speculative_stats
        toks += st.num_new_tokens
        fw += st.num_target_forwards
    res[name] = toks / fw
    print(name, "tau", round(toks / fw, 3), flush=True)
print("tree/chain", round(res["calibrated28"] / res["chain4"], 3))
