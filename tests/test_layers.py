"""The package layout is the architecture: imports go only from a higher layer to a lower
one (data -> partition -> ... -> cli), and the leaves may be used by anyone. This test reads
every module's imports (static, with :mod:`ast`; function-level imports included) and fails
on an import against that order, naming the file and line. Units on the same layer may not
import each other either (federated and trainers, say, stay independent)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import commgnn

ROOT = Path(commgnn.__file__).parent

LEAVES = {"errors", "config", "options", "registry", "distributed", "integrity"}
"""Used by every layer; they import only one another."""

LAYER = {
    "data": 0,
    "partition": 1,
    "sampling": 2,
    "kernels": 2,
    "comm": 3,
    "fetch": 4,
    "netmodel": 4,
    "models": 5,
    "trainers": 6,
    "federated": 6,
    "metrics": 7,
    "report": 7,
    "cluster": 7,
    "runner": 8,
    "planner": 9,  # below the API, which exposes it as commgnn.plan
    "api": 10,
    "cli": 11,
    "__main__": 12,
    "__init__": 12,  # the package's face re-exports the API
}
"""Each top-level package or module of ``commgnn`` and its layer (lower = nearer the data)."""


def _unit(path: Path) -> str:
    """The top-level package or module a file belongs to."""
    parts = path.relative_to(ROOT).parts
    return parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, top-level commgnn unit)`` for each import of ``commgnn`` in the file: ``import``
    and ``from ... import`` (absolute or relative, ``from commgnn import x`` naming unit
    ``x``), and ``importlib.import_module("commgnn....")`` with a constant string."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = list(path.relative_to(ROOT).parts[:-1])
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = here[: len(here) - (node.level - 1)]
                module = ".".join(["commgnn", *base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            # `from commgnn import x` imports unit x (the package's lazy re-exports included)
            names = [f"{module}.{a.name}" for a in node.names] if module == "commgnn" else [module]
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        for name in names:
            parts = name.split(".")
            if parts[0] == "commgnn" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def violations() -> list[str]:
    """One line per import against the layers (file:line and the two units)."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        src = _unit(path)
        for line, dst in _imports(path):
            if dst == src or dst in LEAVES:
                continue
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            if src in LEAVES:
                bad.append(f"{where}: leaf {src!r} imports {dst!r}")
            elif src not in LAYER or dst not in LAYER:
                bad.append(f"{where}: {src!r} or {dst!r} has no layer in tests/test_layers.py")
            elif LAYER[dst] >= LAYER[src]:
                bad.append(f"{where}: {src!r} (layer {LAYER[src]}) imports {dst!r} (layer {LAYER[dst]})")
    return bad


def test_imports_follow_the_layers() -> None:
    assert violations() == []


def test_every_unit_has_a_layer() -> None:
    units = {_unit(p) for p in ROOT.rglob("*.py")}
    assert units - set(LAYER) - LEAVES == set()


def test_an_upward_import_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the checker itself can fail: a data module importing the trainers is reported
    fake = tmp_path / "commgnn"
    (fake / "data").mkdir(parents=True)
    (fake / "data" / "x.py").write_text(
        "from commgnn.trainers import TrainConfig\nfrom . import y\n"
        "from commgnn import api\nfrom .. import cli\nimport importlib\n"
        "importlib.import_module('commgnn.runner.local')\nimport commgnn.data.y\n")
    (fake / "config.py").write_text("from commgnn.data import x\n")
    monkeypatch.setattr(f"{__name__}.ROOT", fake)
    found = violations()
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "'data' (layer 0) imports 'api' (layer 10)", "'data' (layer 0) imports 'cli' (layer 11)",
        "'data' (layer 0) imports 'runner' (layer 8)", "'data' (layer 0) imports 'trainers' (layer 6)",
        "leaf 'config' imports 'data'"]


# ------------------------------------------------------------------ no import circle
def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(root: Path) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, read statically: module-level,
    function-level and ``TYPE_CHECKING`` imports alike (each is a dependency a reader must
    follow). ``from package import name`` points at the submodule ``name`` where there is
    one, else at the package."""
    mods = {_module(p, root): p for p in root.rglob("*.py")}

    def known(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in mods:
            parts.pop()
        return ".".join(parts) or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(known(a.name) for a in node.names if a.name.startswith("commgnn"))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                if source.split(".")[0] == "commgnn":
                    found.update(f"{source}.{a.name}" if f"{source}.{a.name}" in mods else known(source)
                                 for a in node.names)
        graph[mod] = {m for m in found if m and m != mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    assert circles(module_graph(ROOT)) == []


def test_a_circle_is_caught(tmp_path: Path) -> None:
    # the partition registry loop as it was: the config imports the strategies (to register
    # them), a strategy names the config in its signature (a TYPE_CHECKING import)
    pkg = tmp_path / "commgnn" / "partition"
    pkg.mkdir(parents=True)
    (tmp_path / "commgnn" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("from commgnn.partition import metis as _metis\n")
    (pkg / "metis.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from commgnn.partition.config import PartitionConfig\n")
    (pkg / "random.py").write_text("def f():\n    from commgnn.partition.base import X\n")
    (pkg / "base.py").write_text("def g():\n    from ..partition import random\n")
    assert circles(module_graph(tmp_path / "commgnn")) == [
        ["commgnn.partition.base", "commgnn.partition.random"],
        ["commgnn.partition.config", "commgnn.partition.metis"]]


def test_cli_modules_share_only_the_common_module() -> None:
    """A command module imports no other command module's names: what they share lives in
    ``commgnn.cli.common`` (``cli/main.py`` loads the command modules by name, through its
    table of commands)."""
    graph = module_graph(ROOT)
    bad = {mod: sorted(m for m in deps if m.startswith("commgnn.cli.") and m != "commgnn.cli.common")
           for mod, deps in graph.items() if mod.startswith("commgnn.cli.")}
    assert {mod: deps for mod, deps in bad.items() if deps} == {}
