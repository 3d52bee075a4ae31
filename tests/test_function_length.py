"""No function of the package is longer than 60 lines (read from the source with ``ast``: nested functions and
methods count on their own)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hf_speculative"
MAX_LINES = 60


def test_no_function_over_60_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 60 lines: " + ", ".join(long)


MAX_PARAMETERS = 8


def test_no_engine_function_takes_more_than_8_parameters():
    """The engine's state is held (by `SpeculativeLoop`, `SpeedPolicy`), not passed around: at most 8 parameters
    besides ``self``/``cls`` (``*args``/``**kwargs`` not counted)."""
    wide = []
    for path in sorted((PACKAGE / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
                names = names[1:] if names and names[0] in ("self", "cls") else names
                if len(names) > MAX_PARAMETERS:
                    wide.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({len(names)})")
    assert not wide, "engine functions with more than 8 parameters: " + ", ".join(wide)
