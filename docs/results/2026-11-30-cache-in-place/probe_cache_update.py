"""One decoding step's cache appends, 30 layers of SmolLM2-135M's key/value shape: `DynamicLayer` (concatenation)
against the engine's `ReservedLayer` (writes into a buffer), after an L-token prefix, 100 one-token steps each.

    python probe_cache_update.py
"""

import time

import torch
from transformers.cache_utils import DynamicLayer

from hf_speculative.engine.cache import ReservedLayer

torch.set_num_threads(2)
for length in (150, 600):
    for cls in (DynamicLayer, ReservedLayer, DynamicLayer, ReservedLayer):
        layers = [cls() for _ in range(30)]
        for layer in layers:
            layer.update(torch.randn(1, 3, length, 64), torch.randn(1, 3, length, 64))
        new = torch.randn(1, 3, 1, 64)
        start = time.perf_counter()
        for _ in range(100):
            for layer in layers:
                layer.update(new, new)
        print(length, cls.__name__, f"{(time.perf_counter() - start) / 100 * 1e3:.3f} ms per step")
