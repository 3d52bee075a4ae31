"""House rules of the package, read from its source with ``ast``: no private name imported from another module, no
silent ``except: pass`` without its reason, no cache keyed by ``id()`` in the engine or the drafters, no machine
timings in comments, and every command module named after its command."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hf_speculative"


def _sources(*folders: str) -> list[tuple[Path, str]]:
    roots = [PACKAGE / folder for folder in folders] if folders else [PACKAGE]
    return [(path, path.read_text(encoding="utf-8")) for root in roots for path in sorted(root.rglob("*.py"))]


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_module(path: Path, node: ast.ImportFrom) -> str:
    """The full name of the module ``node`` imports from (relative imports resolved against ``path``)."""
    if node.level == 0:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def test_no_private_name_is_imported_from_another_module():
    """A helper used by two modules is public in the module that owns it. Importing the ``_compat`` module, or a
    dunder name, is fine."""
    found = []
    for path, source in _sources():
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = _imported_module(path, node)
            if module != "hf_speculative" and not module.startswith("hf_speculative."):
                continue
            for alias in node.names:
                name = alias.name
                private = name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
                if private and name != "_compat" and module != _module_name(path):
                    found.append(f"{_where(path, node)} imports {name} from {module}")
    assert not found, "private names imported across modules: " + "; ".join(found)


def test_every_silent_except_says_why():
    """An ``except`` whose body is only ``pass`` has a comment on the ``except`` or the ``pass`` line."""
    found = []
    for path, source in _sources():
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ExceptHandler) and all(isinstance(stmt, ast.Pass) for stmt in node.body):
                said = [lines[node.lineno - 1]] + [lines[stmt.lineno - 1] for stmt in node.body]
                if not any(_comment_of(line) for line in said):
                    found.append(_where(path, node))
    assert not found, "except: pass without a comment saying why: " + ", ".join(found)


def _comment_of(line: str) -> str:
    """The comment of one source line ('' when it has none; a ``#`` inside a string is not one)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):  # a line cut out of a multi-line statement
        return line.partition("#")[2]
    return next((t.string for t in tokens if t.type == tokenize.COMMENT), "")


def _is_id_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id"


def _id_keys(tree: ast.AST) -> list[ast.AST]:
    """The nodes that use an ``id(...)`` call as a key: a subscript, ``.get`` / ``.setdefault`` / ``.pop``'s first
    argument, the left side of ``in`` / ``not in``, a dict display's key. ``memo[id(self)]`` in ``__deepcopy__``
    is the copy protocol's own memo, not a cache."""
    protocol = {
        id(node)
        for func in ast.walk(tree)
        if isinstance(func, ast.FunctionDef) and func.name == "__deepcopy__"
        for node in ast.walk(func)
    }
    keyed = []
    for node in ast.walk(tree):
        if id(node) in protocol:
            continue
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            keys = node.args[:1] if node.func.attr in ("get", "setdefault", "pop") else []
        elif isinstance(node, ast.Compare):
            keys = [node.left] if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) else []
        elif isinstance(node, ast.Dict):
            keys = [key for key in node.keys if key is not None]
        else:
            keys = []
        if any(_is_id_call(part) for key in keys for part in ast.walk(key)):
            keyed.append(node)
    return keyed


def test_no_cache_keyed_by_id_in_the_engine_or_the_drafters():
    """An object's ``id()`` is reused once it is freed: a cache keyed by it can hand a new model (or drafter, or
    tree) what was made for an old one. Key by the object itself (weakly), or keep the object to compare."""
    found = [
        f"{_where(path, node)}: {ast.unparse(node)[:80]}"
        for path, source in _sources("engine", "drafters")
        for node in _id_keys(ast.parse(source))
    ]
    assert not found, "id() used as a key: " + "; ".join(found)


def test_the_id_key_check_sees_the_usual_spellings():
    source = (
        "cache[id(model)] = 1\ncache.get(id(model))\ncache.setdefault(id(model), 1)\nid(model) in cache\n"
        "x = {id(model): 1}\nids = {id(p) for p in ps}\n"
        "def __deepcopy__(self, memo):\n    memo[id(self)] = self\n"
    )
    assert [node.lineno for node in _id_keys(ast.parse(source))] == [1, 2, 3, 4, 5]


#: a duration or a speed in a comment: "7.9 ms", "0.1 s", "1.4x faster", "120 tok/s"
TIMING = re.compile(r"\d\s?(?:ms|µs|us)\b|\d\s+s(?=[\s).,;:]|$)|\d\s?x faster|\d\s?tok(?:ens)?/s\b")
#: comments that may keep a measured timing: the engine's, until its rewrite moves them to docs/results
TIMINGS_ALLOWED: set[str] = set()


def test_no_machine_timings_in_comments():
    """Measured timings belong in ``docs/results`` (with the machine and the command), not in code comments."""
    found = []
    for path, source in _sources():
        if str(path.relative_to(PACKAGE.parent)) in TIMINGS_ALLOWED:
            continue
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and TIMING.search(token.string):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{token.start[0]}: {token.string}")
    assert not found, "timings in comments (move them to docs/results): " + "; ".join(found)


def test_the_timing_check_sees_the_usual_spellings():
    said = ["# 7.9 ms here", "# (0.1 s on a 135M model)", "# 1.4x faster", "# 120 tok/s", "# 30 tokens/s"]
    unsaid = ["# a method's tokens/s over its own", "# within 1.10x of the weights", "# 4 rows", "# 2 s-shaped"]
    assert all(TIMING.search(c) for c in said) and not any(TIMING.search(c) for c in unsaid)


def _subcommands(parser) -> dict:
    """``{name: sub-parser}`` of ``parser``'s sub-commands."""
    import argparse

    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def test_command_modules_are_named_after_their_commands():
    """``hf-speculative NAME`` runs ``hf_speculative.commands.NAME`` (dashes as underscores), ``hf-speculative train
    METHOD`` runs ``hf_speculative.commands.train_METHOD``: the module that runs a command is found by its name."""
    from hf_speculative.cli import build_parser

    wrong = []
    commands = _subcommands(build_parser())
    for name, sub in commands.items():
        if name == "train":
            for method, train in _subcommands(sub).items():
                module = train.get_default("func").__module__
                expected = "hf_speculative.commands.train_" + method.replace("-", "_")
                if module.startswith("hf_speculative.commands.") and module != expected:
                    wrong.append(f"train {method}: {module}")
            continue
        module = sub.get_default("func").__module__
        if module != "hf_speculative.commands." + name.replace("-", "_"):
            wrong.append(f"{name}: {module}")
    assert "calibrate" in commands and "calibrate-tree" in commands and "train" in commands
    assert not wrong, "command modules not named after their commands: " + ", ".join(wrong)
