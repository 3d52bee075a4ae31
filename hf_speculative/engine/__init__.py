"""The engine: tree speculative decoding behind ``model.generate(assistant_model=...)``. It runs the target; drafters
meet it through `protocol`, and it imports nothing of the drafters, training, benchmarks or commands.

- `generation`: `enable(model)` and the ``generate()`` arguments;
- `decoding`: the decoding loop (prefill, one verification forward per step, acceptance, cache bookkeeping);
- `trees`: tree shapes (`TreeSpec`, `DynamicTree`), drafts (`DraftTree`) and their masks;
- `acceptance`: greedy, exact sampling (tree rejection sampling) and typical acceptance;
- `tree_forward`: the verification forward, with a drafter's pruning hook inside it;
- `logits`, `rows`, `cache`: the target's logits per node, its rows for drafters, the KV cache per row;
- `kernels`, `step_pricing`: the verification forward at the machine's cost, and drafting only while it pays;
- `protocol`, `resolve`, `placement`: the drafter interface, the drafter of a call, where a drafter runs;
- `hooks`: module hooks that act on their own thread's forwards only (concurrent calls on one model).
"""
