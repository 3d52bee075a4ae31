"""`lazy_getattr`: the module ``__getattr__`` of a drafter package whose training code is imported on first use, as
it pulls in `transformers.Trainer` (the inference path never loads it); `lazy_drafter`: a drafter package's
registration and lazy names in one call."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from ..registry import register_drafter

__all__ = ["lazy_drafter", "lazy_getattr", "lazy_package"]


def lazy_getattr(package: str, submodules: dict[str, tuple[str, ...]]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package`` that imports the names ``submodules[module]`` from
    ``package.module`` when they are first asked for."""
    where = _modules_of(submodules)

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f".{where[name]}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def lazy_package(package: str, submodules: dict[str, tuple[str, ...]]) -> tuple[list[str], Callable[[str], Any]]:
    """A drafter package's ``__all__`` and ``__getattr__``: the names ``submodules[module]``, each imported from
    ``package.module`` on first use."""
    return [name for names in submodules.values() for name in names], lazy_getattr(package, submodules)


def lazy_drafter(
    name: str, package: str, submodules: dict[str, tuple[str, ...]], **fields: Any
) -> tuple[list[str], Callable[[str], Any]]:
    """Register drafter ``name`` of ``package`` (`register_drafter`, whose ``config`` and ``model`` may be bare names
    of ``submodules``) and return the package's ``__all__`` and ``__getattr__`` (`lazy_package`)."""
    where = _modules_of(submodules)
    for key in ("config", "model"):
        if key in fields and "." not in fields[key]:
            fields[key] = f"{where[fields[key]]}.{fields[key]}"
    register_drafter(name, package, **fields)
    return lazy_package(package, submodules)


def _modules_of(submodules: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """name -> the submodule that defines it."""
    return {name: module for module, names in submodules.items() for name in names}
