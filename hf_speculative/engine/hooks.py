"""Module hooks of one ``generate()`` call. A hook sits on the model's modules, which a second ``generate()`` call on
the same model in another thread runs too: `this_thread_only` makes a hook act on its own thread's forwards only."""

from __future__ import annotations

import functools
import threading
from typing import Callable

__all__ = ["this_thread_only"]


def this_thread_only(hook: Callable) -> Callable:
    """``hook``, run only when the forward that calls it runs in the thread that made it (else it returns None: the
    module's inputs and outputs stay as they are)."""
    thread = threading.get_ident()

    @functools.wraps(hook)
    def guarded(*args, **kwargs):
        return hook(*args, **kwargs) if threading.get_ident() == thread else None

    return guarded
