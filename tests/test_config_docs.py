"""Every config field says what it is: each field of a config dataclass (a ``kw_only``
dataclass named ``*Config``, or one such a config holds as a field) is followed by its
docstring, which the TOML reference and ``--help`` texts are written from. Read statically
with :mod:`ast`, so that a field added without one fails here, naming the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

import commgnn

ROOT = Path(commgnn.__file__).parent


def _kw_only_dataclasses() -> dict[str, tuple[Path, ast.ClassDef]]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "id", "") == "dataclass"
                    and any(k.arg == "kw_only" for k in d.keywords) for d in node.decorator_list):
                found[node.name] = (path, node)
    return found


def _fields(node: ast.ClassDef) -> list[tuple[int, ast.AnnAssign]]:
    return [(i, st) for i, st in enumerate(node.body) if isinstance(st, ast.AnnAssign)
            and isinstance(st.target, ast.Name)]


def test_every_config_field_has_a_docstring():
    classes = _kw_only_dataclasses()
    configs = {name for name in classes if name.endswith("Config")}
    todo = list(configs)
    while todo:  # and the dataclasses a config holds as fields ([output], [policy], ...)
        _, node = classes[todo.pop()]
        for _, st in _fields(node):
            for n in ast.walk(st.annotation):
                if isinstance(n, ast.Name) and n.id in classes and n.id not in configs:
                    configs.add(n.id)
                    todo.append(n.id)
    assert {"RunConfig", "FederateConfig", "HaloConfig", "ModelConfig"} <= configs
    missing = []
    for name in sorted(configs):
        path, node = classes[name]
        for i, st in _fields(node):
            nxt = node.body[i + 1] if i + 1 < len(node.body) else None
            if not (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str) and nxt.value.value.strip()):
                missing.append(f"{path.relative_to(ROOT.parent)}:{st.lineno} {name}.{st.target.id}")
    assert not missing, "config fields without a docstring:\n" + "\n".join(missing)
