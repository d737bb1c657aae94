"""Fuzz cases: TOML configs, partition directories, gossip topology files (used by
tests/test_fuzz.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import shutil
import string
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Union, get_args, get_origin

import pytest
import tomli_w
import torch
from hypothesis import strategies as st
from torch import Tensor

from commgnn.runner.config import RunConfig
from commgnn.cli.main import main

from fuzz_graphs import I64, GraphSpec, _as_float, build_graph  # noqa: F401
from fuzz_harness import Harness, note

# --------------------------------------------------------------------------- configs

SECTIONS_SKIPPED = {"fault"}
"""``[fault]`` injects failures on purpose (SIGKILL/SIGSTOP of the rank: in-process, of
pytest itself); it is not user input to fuzz."""

GRAPH = "@GRAPH@"
"""Stands for the test graph's path in generated configs (filled in at run time)."""


def _registered(name: str) -> bool:
    from commgnn.data.datasets import resolve_dataset
    from commgnn.errors import ConfigError
    if name.strip().lower() == "synthetic":
        return True
    try:
        resolve_dataset(name)
    except ConfigError:
        return False
    return True


SAFE: dict[str, st.SearchStrategy] = {
    # Keys that set a run's cost: fuzzed only within a tiny range (wrong types are drawn as
    # for any key). The file's value is used: the matching SMALL flag is then left out.
    "train.epochs": st.integers(-2, 2),
    "model.hidden": st.integers(-1, 8),
    "model.layers": st.integers(-1, 3),
    "model.heads": st.integers(-1, 4),
    "runtime.threads": st.integers(-1, 2),
    "runtime.parts": st.integers(-1, 1),
    # The dataset: the test graph, missing files, odd names; never a registered dataset
    # name (without a data root that would start a download) nor "synthetic" (20000 nodes).
    "data.dataset": st.one_of(st.just(GRAPH), st.just(GRAPH), st.sampled_from(["missing.pt", "", " ", "a\nb.pt",
                                                                             "dir.pt", "."]),
                              st.text(max_size=10).filter(lambda t: not _registered(t))),
}
SAFE_FLAGS = {"train.epochs": ("--epochs", "1"), "model.hidden": ("--hidden", "4"), "model.layers": ("--layers", "1"),
              "runtime.threads": ("--threads", "1"), "data.dataset": ("--dataset", GRAPH)}

WORDS = ["", " ", "auto", "gloo", "nccl", "cpu", "cuda", "metis", "random", "contiguous", "cut", "vol", "gcn",
         "sage", "gat", "adam", "sgd", "constant", "cosine", "float32", "float64", "on", "off", "none",
         "pipeline", "skip", "adaptive", "ring", "torus", "exponential", "full", "dpsgd", "dpsgd-atc",
         "pushsum", "tracking", "tracking-atc", "allreduce", "fp16", "bf16", "powersgd", "localsgd", "topk",
         "cltk", "qsgd", "signsgd", ".", "/", "..", "\x00", "a\nb", "synthetic", "Cora", "x.pt", "~"]
TOML_INT = st.one_of(st.integers(-3, 12), st.sampled_from([0, -1, 100, 2**31, 2**53 + 1, I64[0], I64[1], 2**64,
                                                           10**30, -10**30]))
TOML_FLOAT = st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 0.5, 1.0, 1e-300, 1e300, math.nan,
                                                     math.inf, -math.inf, 0.999999]))
TOML_STR = st.one_of(st.sampled_from(WORDS), st.text(max_size=10))
TOML_KEY = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=8)
TOML_SCALAR = st.one_of(TOML_INT, TOML_FLOAT, TOML_STR, st.booleans(),
                        st.dates(), st.datetimes(timezones=st.none() | st.timezones()))
TOML_VALUE = st.recursive(TOML_SCALAR, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(TOML_KEY, inner, max_size=3), max_leaves=5)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _typed(hint: Any, path: str) -> st.SearchStrategy:
    """Values of the right type for ``hint`` (ranges unconstrained)."""
    origin = get_origin(hint)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return TOML_INT
    if hint is float:
        return st.one_of(TOML_FLOAT, TOML_INT)
    if hint is str:
        return TOML_STR
    if origin is Literal:
        return st.one_of(st.sampled_from(get_args(hint)), st.sampled_from(get_args(hint)), TOML_STR)
    if origin in (Union, types.UnionType):
        return st.one_of([_value(a, path) for a in get_args(hint) if a is not type(None)])
    if dataclasses.is_dataclass(hint):
        return _table(hint, path)
    return TOML_VALUE


def _value(hint: Any, path: str) -> st.SearchStrategy:
    """A value for key ``path``: mostly of the right type, sometimes anything at all."""
    if path in SAFE:
        wrong = TOML_VALUE.filter(lambda v: not _is_int(v))  # (and _guard in prop_config)
        return st.one_of(SAFE[path], SAFE[path], wrong)
    return st.one_of(_typed(hint, path), _typed(hint, path), TOML_VALUE)


def _table(cls: type, path: str) -> st.SearchStrategy:
    """A table of ``cls``: a random subset of its keys."""
    hints = typing.get_type_hints(cls)
    optional = {f.name: _value(hints[f.name], f"{path}.{f.name}") for f in dataclasses.fields(cls) if f.init}
    return st.fixed_dictionaries({}, optional=optional)


def _keys(cls: type, path: str = "") -> list[tuple[str, Any]]:
    """Every config key under ``cls`` as ``(dotted path, type hint)``; a table (such as
    ``comm.halo``) is listed itself (so it can be given a wrong value) and by its keys."""
    out: list[tuple[str, Any]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{path}.{f.name}" if path else f.name
        if not f.init or key in SECTIONS_SKIPPED:
            continue
        hint = hints[f.name]
        arms = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) in (Union, types.UnionType) \
            else [hint]
        out.append((key, hint))
        if len(arms) == 1 and dataclasses.is_dataclass(arms[0]):
            out += _keys(arms[0], key)
    return out


CONFIG_KEYS = _keys(RunConfig)


@st.composite
def config_trees(draw: Callable) -> dict:
    """A few keys (mostly leaves) with values; tables are built on the way."""
    chosen = draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=6, unique_by=lambda kv: kv[0]))
    tree: dict = {}
    for key, hint in chosen:
        *heads, leaf = key.split(".")
        table = tree
        for head in heads:
            if not isinstance(table.get(head), dict):
                table[head] = {}
            table = table[head]
        if not isinstance(table.get(leaf), dict):  # a table listed before one of its keys stays a table
            table[leaf] = draw(_value(hint, key))
    return tree


TEXT_EDITS = ("insert", "delete", "duplicate_line", "truncate", "replace", "bytes", "bom", "unterminated",
              "header_twice", "deep")


@dataclass(frozen=True)
class ConfigCase:
    tree: dict
    unknown: tuple[tuple[int, str, Any], ...]
    edit: tuple[str, int, Any] | None


@st.composite
def config_cases(draw: Callable) -> ConfigCase:
    tree = draw(config_trees())
    unknown = tuple(draw(st.lists(st.tuples(st.integers(0, 50), TOML_KEY, TOML_VALUE), max_size=1))
                    if draw(st.integers(0, 4)) == 0 else [])
    edit = None
    if draw(st.integers(0, 4)) == 0:
        kind = draw(st.sampled_from(TEXT_EDITS))
        edit = (kind, draw(st.integers(0, 10**6)),
                draw(st.binary(max_size=20)) if kind == "bytes" else draw(st.text(max_size=20)))
    return ConfigCase(tree=tree, unknown=unknown, edit=edit)


def _tables(tree: dict, prefix: tuple = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for k, v in tree.items():
        if isinstance(v, dict):
            out += _tables(v, prefix + (k,))
    return out


def config_text(case: ConfigCase) -> bytes:
    tree = _copy(case.tree)
    for where, key, value in case.unknown:
        tables = _tables(tree)
        table = tree
        for k in tables[where % len(tables)]:
            table = table[k]
        table[f"zz_{key}"] = value  # no real key starts with zz_
    text = tomli_w.dumps(tree).encode()
    if case.edit is None:
        return text
    kind, pos, arg = case.edit
    i = pos % (len(text) + 1)
    if kind == "insert":
        return text[:i] + str(arg).encode() + text[i:]
    if kind == "delete":
        return text[:i] + text[i + 1 + pos % 7:]
    if kind == "duplicate_line":
        lines = text.splitlines(keepends=True) or [b"a = 1\n"]
        j = pos % len(lines)
        return b"".join(lines[:j + 1] + [lines[j]] + lines[j + 1:])
    if kind == "truncate":
        return text[:i]
    if kind == "replace":
        return str(arg).encode()
    if kind == "bytes":
        return text[:i] + arg + text[i:]
    if kind == "bom":
        return b"\xff\xfe" + text
    if kind == "unterminated":
        return text + b'\nzz = "abc\n'
    if kind == "header_twice":
        return text + b"\n[model]\n[model]\n"
    return text + b"\nzz = " + b"[" * (200 + pos % 5000) + b"\n"  # deep


def _copy(tree: Any) -> Any:
    return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def _has(tree: dict, dotted: str) -> bool:
    for k in dotted.split("."):
        if not isinstance(tree, dict) or k not in tree:
            return False
        tree = tree[k]
    return True


def _fill(value: Any, graph: str) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, graph) for k, v in value.items()}
    return graph if value == GRAPH else value


SAFE_INTS = {"train.epochs": 2, "model.hidden": 8, "model.layers": 3, "model.heads": 4, "runtime.threads": 2,
             "runtime.parts": 1}


def _guard(tree: Any, path: str = "") -> Any:
    """The SAFE limits also where a wrong-typed table happens to spell a real key (a random
    ``runtime = {threads = 10**6}`` would start a million threads in this process)."""
    if not isinstance(tree, dict):
        return tree
    out = {}
    for k, v in tree.items():
        key = f"{path}.{k}" if path else k
        if key in SAFE_INTS and _is_int(v) and v > SAFE_INTS[key]:
            v = SAFE_INTS[key]
        elif key == "data.dataset" and isinstance(v, str) and _registered(v):
            v = GRAPH
        out[k] = _guard(v, key)
    return out


def prop_config(h: Harness, graph: Path, case: ConfigCase) -> None:
    case = dataclasses.replace(case, tree=_guard(case.tree))
    small: list[str] = []
    for key, (flag, value) in SAFE_FLAGS.items():
        # Edited text could turn `threads = 1` into `threads = 19999`: flags then win.
        if case.edit is not None or not _has(case.tree, key):
            small += [flag, str(graph) if value == GRAPH else value]
    case = dataclasses.replace(case, tree=_fill(case.tree, str(graph)))
    with h.workspace() as ws:
        path = ws / "in" / "c.toml"
        path.write_bytes(config_text(case))
        note(f"config:\n{path.read_bytes()!r}")
        h.train(ws, "--config", str(path), "--parts", "1", small=tuple(small))


# --------------------------------------------------------------------------- partition dirs

META_FIELDS = ("format", "version", "num_parts", "num_nodes", "num_edges", "num_features", "num_classes",
               "graph_fingerprint", "files",
               "method", "objective", "seed", "report", "dataset")
REPORT_FIELDS = ("nodes", "halo_in", "halo_out", "edges", "train_nodes", "edge_cut", "comm_volume",
                 "max_rank_halo", "num_parts")
JSON_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-3, 50), st.sampled_from([I64[1], 2**70]),
                        st.floats(), st.text(max_size=8), st.sampled_from(["metis", "random", "cut", "vol"]))
JSON_VALUE = st.recursive(JSON_SCALAR,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3),
                          max_leaves=5)
PART_FILES = ("meta.json", "part_0.pt")
CORRUPTIONS = ("delete", "truncate", "flip", "append", "edit_meta", "drop_meta_key", "edit_report",
               "meta_not_dict", "meta_is_dir", "dir_is_file", "extra_file", "forge_part")


@st.composite
def corruptions(draw: Callable) -> tuple:
    kind = draw(st.sampled_from(CORRUPTIONS))
    if kind in ("delete", "truncate", "flip", "append"):
        return (kind, draw(st.sampled_from(PART_FILES)), draw(st.lists(st.integers(0, 10**6), min_size=1,
                                                                          max_size=3)))
    if kind == "edit_meta":
        return (kind, draw(st.sampled_from(META_FIELDS)), draw(JSON_VALUE))
    if kind == "drop_meta_key":
        return (kind, draw(st.sampled_from(META_FIELDS)))
    if kind == "edit_report":
        return (kind, draw(st.sampled_from(REPORT_FIELDS)), draw(JSON_VALUE | st.lists(st.integers(-2, 30),
                                                                                        max_size=3)))
    if kind == "meta_not_dict":
        return (kind, draw(JSON_SCALAR | st.lists(JSON_VALUE, max_size=3)))
    if kind == "forge_part":
        return (kind, draw(st.sampled_from(FORGE_KEYS)), draw(st.sampled_from(FORGES)))
    return (kind,)


FORGE_KEYS = ("rank", "num_parts", "num_nodes_global", "num_classes", "recv_counts", "send_counts", "global_ids",
              "halo_global_ids", "send_index", "edge_index", "in_degree", "x", "y", "train_mask", "val_mask",
              "test_mask")
FORGES = ("drop", "none", "zero", "negative", "big", "float", "bool", "shorter", "longer", "nan", "transpose")


def forge_value(v: Any, how: str) -> Any:
    """A changed payload value (the part file is re-saved and its sha256 updated, so only the
    loader's consistency checks stand between it and the trainer)."""
    if how == "none":
        return None
    if isinstance(v, Tensor):
        if how == "zero":
            return torch.zeros_like(v)
        if how == "negative":
            return -v - 1 if v.dtype != torch.bool else v
        if how == "big":
            return v * 1000 + 10**6 if v.dtype != torch.bool else v
        if how == "float":
            return v.double()
        if how == "bool":
            return v.bool()
        if how == "shorter":
            return v[..., :-1] if v.dim() else v
        if how == "longer":
            return torch.cat([v, v[..., :1]], dim=-1) if v.dim() and v.numel() else v
        if how == "nan":
            return _as_float(v).clone().fill_(math.nan)
        if how == "transpose":
            return v.t() if v.dim() == 2 else v.unsqueeze(0)
        return v
    if isinstance(v, list):
        return {"zero": [0] * len(v), "negative": [-1] * len(v), "big": [10**6] * len(v),
                "float": [float(c) for c in v], "bool": [bool(c) for c in v], "shorter": v[:-1],
                "longer": v + [0]}.get(how, v)
    return {"zero": 0, "negative": -1, "big": 10**6, "float": float(v), "bool": True, "nan": math.nan}.get(how, v)


def corrupt(pdir: Path, c: tuple) -> None:
    kind = c[0]
    meta_path = pdir / "meta.json"
    if kind in ("delete", "truncate", "flip", "append"):
        path = pdir / c[1]
        if not path.is_file():
            return
        blob = bytearray(path.read_bytes())
        if kind == "delete":
            path.unlink()
        elif kind == "truncate":
            path.write_bytes(bytes(blob[: c[2][0] % max(1, len(blob))]))
        elif kind == "flip" and blob:
            for i in c[2]:
                blob[i % len(blob)] ^= 1 << (i % 8)
            path.write_bytes(bytes(blob))
        else:
            path.write_bytes(bytes(blob) + bytes(b % 256 for b in c[2]))
        return
    if kind == "meta_is_dir":
        if meta_path.is_file():
            meta_path.unlink()
        meta_path.mkdir(exist_ok=True)
        return
    if kind == "dir_is_file":
        shutil.rmtree(pdir)
        pdir.write_text("not a directory\n")
        return
    if kind == "extra_file":
        (pdir / "part_7.pt").write_bytes(b"junk")
        return
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(meta, dict):
        return
    if kind == "edit_meta":
        meta[c[1]] = c[2]
    elif kind == "drop_meta_key":
        meta.pop(c[1], None)
    elif kind == "edit_report":
        if isinstance(meta.get("report"), dict):
            meta["report"][c[1]] = c[2]
    elif kind == "meta_not_dict":
        meta = c[1]
    elif kind == "forge_part":
        part = pdir / "part_0.pt"
        files = meta.get("files")
        if not part.is_file() or not isinstance(files, dict):
            return
        try:
            payload = torch.load(part, weights_only=True)
        except Exception:  # already corrupted by an earlier step
            return
        if not isinstance(payload, dict) or c[1] not in payload:
            return
        if c[2] == "drop":
            payload.pop(c[1], None)
        else:
            try:
                payload[c[1]] = forge_value(payload[c[1]], c[2])
            except (TypeError, ValueError, RuntimeError):  # e.g. float(None) after an earlier forge
                return
        torch.save(payload, part)
        files["part_0.pt"] = hashlib.sha256(part.read_bytes()).hexdigest()
    meta_path.write_text(json.dumps(meta))


@dataclass(frozen=True)
class PartitionFixture:
    graph: Path
    one: Path
    """A valid 1-part directory of ``graph``."""
    two: Path
    """A valid 2-part directory of ``graph``."""


@pytest.fixture(scope="module")
def partition_fixture(tmp_path_factory: pytest.TempPathFactory) -> PartitionFixture:
    root = tmp_path_factory.mktemp("parts")
    graph = root / "g.pt"
    torch.save(build_graph(GraphSpec(n=30, f=3, c=3, e=70, seed=1)), graph)
    dirs = []
    for p in (1, 2):
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["partition", "--dataset", str(graph), "--parts", str(p), "--out", str(root / f"p{p}")]) == 0
        dirs.append(root / f"p{p}")
    return PartitionFixture(graph, *dirs)


def prop_partition_dir(h: Harness, fx: PartitionFixture, cs: list[tuple]) -> None:
    with h.workspace() as ws:
        pdir = ws / "in" / "parts"
        shutil.copytree(fx.one, pdir)
        for c in cs:
            if pdir.is_dir():
                corrupt(pdir, c)
        h.train(ws, "--dataset", str(fx.graph), "--parts", "1", "--partition-dir", str(pdir))


# --------------------------------------------------------------------------- gossip topologies

TOPO_SUFFIXES = (".txt", ".edgelist", "", ".graphml", ".gml", ".csv")
NODE_IDS = st.one_of(st.integers(-1, 3), st.integers(0, 1), st.sampled_from(["a", "1.5", "0x1", "", " 0"]))


@dataclass(frozen=True)
class TopoCase:
    suffix: str
    nodes: tuple
    edges: tuple
    junk: str | bytes | None
    method: str | None


@st.composite
def topo_cases(draw: Callable) -> TopoCase:
    suffix = draw(st.sampled_from(TOPO_SUFFIXES))
    if draw(st.booleans()):  # one rank: a file naming node 0 alone is valid
        nodes = (0,)
        edges = draw(st.sampled_from([((0, 0),), ((0, 0),), (), ((0, 0), (0, 0))]))
    else:
        nodes = tuple(draw(st.lists(NODE_IDS, max_size=3)))
        edges = tuple(draw(st.lists(st.tuples(NODE_IDS, NODE_IDS), max_size=3)))
    junk = None
    if draw(st.integers(0, 4)) == 0:
        junk = draw(st.one_of(st.text(max_size=30), st.binary(max_size=30),
                              st.sampled_from(["0 0 {'weight': 1}", "0 0 {bad", "0", "graph [", "<graphml>",
                                               "0 0\n0 x\n"])))
    method = draw(st.none() | st.sampled_from(["dpsgd", "dpsgd-atc", "pushsum", "tracking", "tracking-atc"]))
    return TopoCase(suffix=suffix, nodes=nodes, edges=edges, junk=junk, method=method)


def _q(v: Any) -> str:
    return str(v) if isinstance(v, int) else json.dumps(v)


def topology_text(case: TopoCase) -> str | bytes:
    if case.junk is not None:
        return case.junk
    if case.suffix == ".graphml":
        body = "".join(f'<node id="{v}"/>' for v in case.nodes)
        body += "".join(f'<edge source="{u}" target="{v}"/>' for u, v in case.edges)
        return ('<?xml version="1.0" encoding="UTF-8"?><graphml xmlns="http://graphml.graphdrawing.org/xmlns">'
                f'<graph edgedefault="undirected">{body}</graph></graphml>')
    if case.suffix in (".gml", ".csv"):
        body = "".join(f"  node [ id {_q(v)} label \"n{i}\" ]\n" for i, v in enumerate(case.nodes))
        body += "".join(f"  edge [ source {_q(u)} target {_q(v)} ]\n" for u, v in case.edges)
        return f"graph [\n{body}]\n"
    return "".join(f"{u} {v}\n" for u, v in case.edges)


def prop_topology(h: Harness, graph: Path, case: TopoCase) -> None:
    with h.workspace() as ws:
        path = ws / "in" / f"topo{case.suffix}"
        text = topology_text(case)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        args = ["--dataset", str(graph), "--parts", "1", "--gossip", str(path)]
        if case.method:
            args += ["--gossip-method", case.method]
        h.train(ws, *args)


