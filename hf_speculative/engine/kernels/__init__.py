"""Kernels for the engine's forwards: the target's linear layers at the machine's cost, reading the weights in place
(`linear`), built for this CPU and checked where they are C (`build`). Which kernel runs when is the speed policy's
choice (`hf_speculative.engine.policy`)."""

from . import linear
from .linear import *  # noqa: F403 (imports exactly linear.__all__, the names the package re-exports)

__all__ = linear.__all__
