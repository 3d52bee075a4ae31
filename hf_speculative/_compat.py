"""What differs between the transformers releases this project supports (``transformers>=5.17``), in one place.

transformers 5.24 renamed the KV cache argument ``past_key_values`` to ``cache``: in every model's ``forward``
and decoder layer, in the mask builders (``create_causal_mask``), in the model outputs
(``CausalLMOutputWithPast.cache``) and in the ``model_kwargs`` that ``generate`` hands a decoding loop. The
old name still works there until 5.40, with a deprecation warning. Code in this project never spells either
name when it talks to transformers; it uses:

- ``CACHE_ARG``: the installed release's name;
- ``cache_arg(cache)``: ``{CACHE_ARG: cache}``, to splat into a forward, a mask builder or an output class;
- ``get_cache(outputs)``: the cache of a model output (or of any object with the output's attributes);
- ``model_kwargs_cache(model_kwargs)``: the cache in the ``model_kwargs`` generate hands a decoding loop;
- ``takes_cache``: lets a forward of this project (whose own argument is ``cache``) also take
  ``past_key_values``, as transformers before 5.24 and code written for it pass it.

The project's own output classes (``ParallelDrafterOutput``, ``EagleOutput``) name their field ``cache``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

from transformers.modeling_outputs import CausalLMOutputWithPast

__all__ = ["CACHE_ARG", "cache_arg", "get_cache", "model_kwargs_cache", "takes_cache"]

OLD_CACHE_ARG = "past_key_values"

CACHE_ARG: str = (
    "cache" if "cache" in {field.name for field in dataclasses.fields(CausalLMOutputWithPast)} else OLD_CACHE_ARG
)
"""The keyword under which the installed transformers takes and returns a KV cache."""


def cache_arg(cache) -> dict[str, Any]:
    """``{CACHE_ARG: cache}``: ``model(input_ids, **cache_arg(cache), use_cache=True)``."""
    return {CACHE_ARG: cache}


def get_cache(outputs):
    """The cache a model output carries (None if it has none)."""
    return getattr(outputs, CACHE_ARG, None)


def model_kwargs_cache(model_kwargs: Mapping[str, Any]):
    """The cache ``generate`` prepared, from the ``model_kwargs`` it passes a custom decoding loop."""
    return model_kwargs.get(CACHE_ARG)


def takes_cache(forward: Callable) -> Callable:
    """Decorate a forward whose cache argument is ``cache`` so that it also accepts ``past_key_values``."""

    @functools.wraps(forward)
    def wrapper(*args, **kwargs):
        if OLD_CACHE_ARG in kwargs:
            old = kwargs.pop(OLD_CACHE_ARG)
            if kwargs.get("cache") is not None and old is not None:
                raise ValueError(f"{forward.__qualname__} got both `cache` and `past_key_values`; pass one")
            kwargs["cache"] = kwargs.get("cache") if old is None else old
        return forward(*args, **kwargs)

    return wrapper
