"""Benchmarks and examples use commgnn's public names only: no ``_private`` name, no
``commgnn.cli`` module (the command line is reached as ``python -m commgnn``, the rest
through :mod:`commgnn.api` and the packages' public names). Read statically with
:mod:`ast`, code in strings (a child interpreter's script) included."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

IMPORT_IN_TEXT = re.compile(r"^\s*(?:from\s+(commgnn[\w.]*)\s+import\s+([\w\s,()]+)|import\s+(commgnn[\w.]*))", re.M)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _bad_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "commgnn" and (parts[1:2] == ["cli"] or any(_private(p) for p in parts))


def offences(path: Path) -> list[str]:
    """``file:line: what`` for each private or CLI import, or private attribute of a
    commgnn name, in the file (and in the Python code its string constants hold)."""
    text = path.read_text()
    found = []
    tree = ast.parse(text, filename=str(path))
    commgnn_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "commgnn":
                    commgnn_names.add(a.asname or a.name.split(".")[0])
                    if _bad_module(a.name):
                        found.append(f"{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "commgnn" and not node.level:
            module = node.module or ""
            for a in node.names:
                commgnn_names.add(a.asname or a.name)
                if _bad_module(module) or _private(a.name):
                    found.append(f"{node.lineno}: from {module} import {a.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, (ast.Name, ast.Attribute))
                and ast.unparse(node.value).split(".")[0] in commgnn_names):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in IMPORT_IN_TEXT.finditer(node.value):
                module = m.group(1) or m.group(3)
                names = [n.strip() for n in (m.group(2) or "").replace("(", "").replace(")", "").split(",")]
                if _bad_module(module) or any(_private(n) for n in names if n):
                    found.append(f"{node.lineno}: in a string: {m.group(0).strip()}")
    return [f"{path.relative_to(REPO)}:{line}" for line in found]


def scripts() -> list[Path]:
    return sorted(p for folder in ("benchmarks", "examples") for p in (REPO / folder).rglob("*.py"))


def test_benchmarks_and_examples_use_public_names_only() -> None:
    assert scripts()
    assert [o for p in scripts() for o in offences(p)] == []


def test_a_private_import_is_caught(tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "benchmarks"
    fake.mkdir()
    bad = fake / "bad.py"
    bad.write_text("import commgnn.planner as planner\nfrom commgnn.cli.bench import run_grid\n"
                   "from commgnn.runner.launch import _preflight_memory\nfrom commgnn import planner as p\n"
                   "x = planner._score(1)\ny = p.plan\n"
                   "CHILD = '''\nimport sys\nfrom commgnn.cli.main import main\n'''\n")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert sorted(o.split(": ", 1)[1] for o in offences(bad)) == [
        "from commgnn.cli.bench import run_grid", "from commgnn.runner.launch import _preflight_memory",
        "in a string: from commgnn.cli.main import main", "planner._score"]


@pytest.mark.parametrize("module, home", [("commgnn.cli.bench", "commgnn.api.bench"),
                                          ("commgnn.federated.splits", "commgnn.federated.client_split")])
def test_old_homes_warn_and_hold_public_names_only(module: str, home: str) -> None:
    """A moved module's old home stays for one release: importing it warns and names the new
    home; it re-exports public names only."""
    import importlib
    import sys

    sys.modules.pop(module, None)
    with pytest.warns(DeprecationWarning, match=home.rpartition(".")[0]):
        old = importlib.import_module(module)
    assert not [n for n in vars(old) if n.startswith("_") and not n.startswith("__")]
