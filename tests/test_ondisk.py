"""Graph folders (issue 55): the streamed check finds every bad input in one line naming the
file and the first bad chunk, hashes the files' bytes; Data -> folder -> Data is exact; a
writer that stops leaves nothing; OGB's raw layout loads (as PyG's own dataset class does)
and converts chunk by chunk into the same graph; training from a folder equals training
from the same graph in memory; the CLI refuses a bad folder with exit 2 and one line."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from helpers import small_graph

import commgnn
from commgnn.data import (DataConfig, GraphFolderWriter, check_graph_folder, convert_ogb_raw, folder_identity,
                          load_dataset, load_graph_folder, load_ogb_raw, write_graph_folder)
from commgnn.errors import DataError

KEYS = ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")
N, F, C = 300, 8, 3


def _folder(tmp_path: Path, name: str = "g") -> Path:
    return write_graph_folder(small_graph(n=N, m=1200, f=F, c=C, seed=3), tmp_path / name)


def _save(path: Path, arr: np.ndarray) -> None:
    np.save(path, arr, allow_pickle=False)


def _edit(name: str, fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], str]:
    def apply(g: Path) -> str:
        _save(g / name, fn(np.load(g / name).copy()))
        return name
    return apply


def _set(name: str, index: tuple, value: float) -> Callable[[Path], str]:
    def fn(a: np.ndarray) -> np.ndarray:
        a[index] = value
        return a
    return _edit(name, fn)


def _missing(name: str) -> Callable[[Path], str]:
    def apply(g: Path) -> str:
        (g / name).unlink()
        return name
    return apply


def _meta(change: dict) -> Callable[[Path], str]:
    def apply(g: Path) -> str:
        meta = json.loads((g / "meta.json").read_text())
        (g / "meta.json").write_text(json.dumps({**meta, **change}))
        return "meta.json"
    return apply


def _fortran_bad(g: Path) -> str:
    ei = np.load(g / "edge_index.npy").copy()
    ei[0, 130] = -5
    _save(g / "edge_index.npy", np.asfortranarray(ei))
    return "edge_index.npy"


def _split_dup_across_chunks(g: Path) -> str:
    ids = np.load(g / "split/train.npy").copy()
    ids[100] = ids[3]
    _save(g / "split/train.npy", ids)
    return "split/train.npy"


def _overlap(g: Path) -> str:
    train = np.load(g / "split/train.npy")
    valid = np.load(g / "split/valid.npy").copy()
    valid[70] = train[5]
    _save(g / "split/valid.npy", valid)
    return "split/valid.npy"


def _unlabelled_in_split(g: Path) -> str:
    node = int(np.load(g / "split/test.npy")[2])
    _set("y.npy", (node,), -1)(g)
    return "split/test.npy"


def _truncate(g: Path) -> str:
    raw = (g / "x.npy").read_bytes()
    (g / "x.npy").write_bytes(raw[:-40])
    return "x.npy"


# (how the folder is broken, what the one-line message must hold); the check runs with
# chunk=64: 64 edges / 64 ids / 8 rows of x (F = 8) a block
BAD = {
    "missing x": (_missing("x.npy"), "x.npy: missing"),
    "missing split": (_missing("split/valid.npy"), "valid.npy: missing"),
    "missing meta": (_missing("meta.json"), "meta.json: missing"),
    "meta wrong": (_meta({"num_nodes": "many"}), "num_nodes must be a positive integer"),
    "x dtype": (_edit("x.npy", lambda a: a.astype(np.float64)), "dtype float64"),
    "y shape": (_edit("y.npy", lambda a: a[:-1]), f"shape [{N - 1}], meta.json says [{N}]"),
    "edges float": (_edit("edge_index.npy", lambda a: a.astype(np.float32)), "dtype float32"),
    "truncated": (_truncate, "x.npy: not a readable .npy array"),
    "edge too big": (_set("edge_index.npy", (1, 200), N),
                     f"node id {N} out of range [0, {N}) in edges 192..255 (chunk 3; first at edge 200, target)"),
    "edge negative": (_set("edge_index.npy", (0, 5), -1),
                      f"node id -1 out of range [0, {N}) in edges 0..63 (chunk 0; first at edge 5, source)"),
    "edge fortran": (_fortran_bad, "node id -5 out of range [0, 300) in edges 128..191 (chunk 2; first at edge 130, source)"),
    "nan": (_set("x.npy", (130, 2), np.nan), "NaN feature in nodes 128..135 (chunk 16; first at node 130, feature 2)"),
    "inf": (_set("x.npy", (9, 0), np.inf), "inf feature in nodes 8..15 (chunk 1"),
    "label": (_set("y.npy", (77, ), C), f"label {C} outside [0, {C}) in nodes 64..127 (chunk 1; first at node 77"),
    "split range": (_set("split/train.npy", (80,), N), f"node id {N} out of range [0, {N}) in ids 64..127 (chunk 1"),
    "split dup in chunk": (_edit("split/test.npy", lambda a: np.concatenate([a, a[70:71]])),
                           "appears twice in ids 64..75 (chunk 1)"),
    "split dup across chunks": (_split_dup_across_chunks, "appears twice: again in ids 64..127 (chunk 1; position 100)"),
    "overlap": (_overlap, "is also in split/train.npy in ids 64..74 (chunk 1; position 70)"),
    "unlabelled": (_unlabelled_in_split, "has no label (y < 0 in y.npy) in ids 0..63 (chunk 0; position 2)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_each_bad_input_is_one_line_naming_the_file_and_chunk(tmp_path, case):
    g = _folder(tmp_path)
    check_graph_folder(g, chunk=64)  # valid before the damage
    damage, expected = BAD[case]
    name = damage(g)
    with pytest.raises(DataError) as err:
        check_graph_folder(g, chunk=64)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{g / name}: "), msg
    assert expected in msg, msg


def test_overlap_can_be_allowed(tmp_path):
    g = _folder(tmp_path)
    _overlap(g)
    check_graph_folder(g, allow_overlap=True)
    data = load_graph_folder(g, allow_overlap=True)
    assert bool((data.train_mask & data.val_mask).any())


def test_hashes_are_the_files_bytes_and_the_fingerprint_follows_the_content(tmp_path):
    g = _folder(tmp_path)
    check = check_graph_folder(g, chunk=50)
    for name, digest in check.file_hashes.items():
        assert digest == hashlib.sha256((g / name).read_bytes()).hexdigest(), name
    assert set(check.file_hashes) == {"meta.json", "edge_index.npy", "x.npy", "y.npy", "split/train.npy",
                                      "split/valid.npy", "split/test.npy"}
    assert check_graph_folder(g, chunk=7).fingerprint == check.fingerprint  # chunking does not matter
    meta = json.loads((g / "meta.json").read_text())
    (g / "meta.json").write_text(json.dumps(meta, indent=4, sort_keys=True))  # same meta, other bytes
    again = check_graph_folder(g)
    assert again.fingerprint == check.fingerprint and again.file_hashes["meta.json"] != check.file_hashes["meta.json"]
    ident = folder_identity(g)
    assert ident["path"] == str(g.resolve()) and ident["files"]["x.npy"]["size"] == (g / "x.npy").stat().st_size
    _set("x.npy", (0, 0), 0.5)(g)  # one value changed
    assert check_graph_folder(g).fingerprint != check.fingerprint
    assert folder_identity(g) != ident


def test_round_trip_data_folder_data_is_exact(tmp_path):
    data = small_graph(n=N, m=1200, f=F, c=C, seed=4)
    g = write_graph_folder(data, tmp_path / "g")
    meta = json.loads((g / "meta.json").read_text())
    assert meta["directed"] is False and meta["num_edges"] == data.edge_index.size(1) and meta["num_classes"] == C
    assert np.load(g / "edge_index.npy").dtype == np.int32  # int32 where ids fit
    back = load_graph_folder(g)
    for k in KEYS:
        assert back[k].dtype == data[k].dtype and torch.equal(back[k], data[k]), k
    assert back.num_classes_total == C and back.name == "g" and back.graph_notes == {"isolated_nodes": 0, "self_loops": 0}
    # a directed graph stays as stored and is recorded as directed
    data.edge_index = data.edge_index[:, data.edge_index[0] < data.edge_index[1]]
    g2 = write_graph_folder(data, tmp_path / "d")
    assert json.loads((g2 / "meta.json").read_text())["directed"] is True
    assert torch.equal(load_graph_folder(g2).edge_index, data.edge_index)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "g"]  # no hidden leftovers


def test_a_stopped_writer_leaves_nothing(tmp_path):
    out = tmp_path / "g"
    with pytest.raises(RuntimeError):
        with GraphFolderWriter(out, num_nodes=10, num_edges=20, num_features=2, num_classes=2, directed=True) as w:
            w.x[:5] = 1.0
            raise RuntimeError("stopped midway")
    assert list(tmp_path.iterdir()) == []
    w = GraphFolderWriter(out, num_nodes=10, num_edges=20, num_features=2, num_classes=2, directed=True)
    w.abort()
    assert list(tmp_path.iterdir()) == []
    old = _folder(tmp_path)  # replacing a folder: the old one stays whole until the commit
    before = check_graph_folder(old).fingerprint
    with pytest.raises(RuntimeError), GraphFolderWriter(old, num_nodes=5, num_edges=1, num_features=1,
                                                        num_classes=1, directed=True):
        raise RuntimeError("stopped midway")
    assert check_graph_folder(old).fingerprint == before and [p.name for p in tmp_path.iterdir()] == ["g"]


def test_load_dataset_takes_a_folder_path(tmp_path):
    g = _folder(tmp_path)
    data = load_dataset(DataConfig(dataset=str(g)))
    ref = load_dataset(DataConfig(), graph=small_graph(n=N, m=1200, f=F, c=C, seed=3))
    for k in KEYS:
        assert torch.equal(data[k], ref[k]), k
    assert data.name == "g" and data.num_classes_total == C
    for bad in (tmp_path / "nothing-here", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        with pytest.raises(DataError, match="not a folder|meta.json: missing"):
            load_dataset(DataConfig(dataset=str(bad)))
    _set("edge_index.npy", (0, 3), N)(g)
    with pytest.raises(DataError, match="edge_index.npy: node id 300 out of range"):
        load_dataset(DataConfig(dataset=str(g)))
    for s in ("train", "valid", "test"):  # no split given: a stratified one, as for a .pt file without masks
        _save(g / f"split/{s}.npy", np.empty(0, dtype=np.int32))
    _set("edge_index.npy", (0, 3), 0)(g)
    data = load_dataset(DataConfig(dataset=str(g)))
    assert int(data.train_mask.sum()) + int(data.val_mask.sum()) + int(data.test_mask.sum()) == N


def test_cli_refuses_a_bad_folder_with_exit_2_and_one_line(tmp_path):
    g = _folder(tmp_path)
    _set("x.npy", (13, 1), np.nan)(g)
    res = subprocess.run([sys.executable, "-m", "commgnn", "train", "--dataset", str(g), "--parts", "1",
                          "--epochs", "1"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{g / 'x.npy'}: NaN feature" in lines[0], res.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["g"]  # no run folder


def test_training_from_a_folder_equals_training_in_memory(tmp_path):
    data = small_graph(n=200, m=800, f=6, c=3, seed=1)
    g = write_graph_folder(data, tmp_path / "g")
    opts = dict(parts=1, epochs=2, quiet=True, hidden=8)
    disk = commgnn.train(str(g), out=tmp_path / "disk", **opts)
    mem = commgnn.train(data, out=tmp_path / "mem", **opts)

    def losses(run: Path) -> list[float]:
        return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert len(losses(disk.run_dir)) == 2 and losses(disk.run_dir) == losses(mem.run_dir)
    a, b = disk.model.state_dict(), mem.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- OGB's own layout -------------------------------------------------------------------
# (not pytest.importorskip("ogb"): importing ogb directly starts its PyPI version check)
needs_ogb = pytest.mark.skipif(importlib.util.find_spec("ogb") is None or importlib.util.find_spec("pandas") is None,
                               reason="ogb and pandas not installed (pip install 'commgnn[datasets]')")

def _csv(path: Path, arr: np.ndarray, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, arr, fmt=fmt, delimiter=",")


def _ogb_folder(root: Path, name: str, scheme: str, n: int = 300, e: int = 900, f: int = 5, seed: int = 0) -> Path:
    """A tiny folder laid out as ogb downloads a node-property dataset."""
    rng = np.random.default_rng(seed)
    p = root / name
    src = rng.integers(0, n, e)
    _csv(p / "raw/edge.csv.gz", np.stack([src, (src + rng.integers(1, n, e)) % n], 1), "%d")
    _csv(p / "raw/node-feat.csv.gz", rng.standard_normal((n, f)), "%.6f")
    _csv(p / "raw/node-label.csv.gz", rng.integers(0, 4, (n, 1)), "%d")
    _csv(p / "raw/num-node-list.csv.gz", np.array([[n]]), "%d")
    _csv(p / "raw/num-edge-list.csv.gz", np.array([[e]]), "%d")
    for s, ids in zip(("train", "valid", "test"), np.split(rng.permutation(n), [n // 2, 3 * n // 4])):
        _csv(p / f"split/{scheme}/{s}.csv.gz", ids[:, None], "%d")
    (p / "RELEASE_v1.txt").write_text("")
    return p


@needs_ogb
@pytest.mark.parametrize("name,scheme,directed", [("ogbn_products", "sales_ranking", False),
                                                   ("ogbn_arxiv", "time", True)])
def test_ogb_raw_loads_and_converts_to_the_same_graph(tmp_path, name, scheme, directed):
    src = _ogb_folder(tmp_path, name, scheme)
    mem = load_ogb_raw(src)
    assert mem.edge_index.size(1) == (900 if directed else 1800)
    out = convert_ogb_raw(src, tmp_path / "g", chunk_rows=37)  # many chunks, not aligned with anything
    meta = json.loads((out / "meta.json").read_text())
    assert meta["directed"] is directed and meta["num_edges"] == mem.edge_index.size(1)
    disk = load_graph_folder(out)
    for k in KEYS:
        assert torch.equal(mem[k], disk[k]), k
    assert mem.num_classes_total == disk.num_classes_total == (40 if directed else 47)
    via_config = load_dataset(DataConfig(dataset=str(src)))
    assert torch.equal(via_config.edge_index, mem.edge_index) and via_config.name == name.replace("_", "-")


@needs_ogb
def test_ogb_raw_equals_pygs_own_dataset_class(tmp_path):
    import threading

    src = _ogb_folder(tmp_path, "ogbn_products", "sales_ranking")
    before = set(threading.enumerate())
    mine = load_ogb_raw(src)  # imports ogb first, without its PyPI version check (a thread)
    assert not [t for t in set(threading.enumerate()) - before if not t.daemon] and "outdated" not in sys.modules
    from ogb.nodeproppred import PygNodePropPredDataset
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    with torch.serialization.safe_globals([Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]):
        ds = PygNodePropPredDataset("ogbn-products", root=str(tmp_path))
    pyg, split = ds[0], ds.get_idx_split()
    assert torch.equal(pyg.edge_index, mine.edge_index) and torch.equal(pyg.x, mine.x)
    assert torch.equal(pyg.y.view(-1), mine.y)
    assert torch.equal(split["valid"].sort().values, mine.val_mask.nonzero().view(-1))


@needs_ogb
def test_ogb_raw_errors_are_one_line_and_leave_nothing(tmp_path):
    src = _ogb_folder(tmp_path, "mygraph", "only")
    with pytest.raises(DataError, match="pass undirected=True or False"):
        load_ogb_raw(src)
    assert load_ogb_raw(src, undirected=True).edge_index.size(1) == 1800
    edges = np.loadtxt(gzip.open(src / "raw/edge.csv.gz", "rt"), delimiter=",", dtype=np.int64)
    edges[50, 1] = 300
    _csv(src / "raw/edge.csv.gz", edges, "%d")
    with pytest.raises(DataError) as err:
        convert_ogb_raw(src, tmp_path / "g", chunk_rows=16, undirected=False)
    expected = f"{src / 'raw/edge.csv.gz'}: node id out of range [0, 300) at line 51 ({edges[50, 0]},300)"
    assert str(err.value) == expected
    for undirected in (False, True):  # the same line named when loading in memory
        with pytest.raises(DataError) as err:
            load_ogb_raw(src, undirected=undirected)
        assert str(err.value) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mygraph"]
    (src / "raw/node-label.csv.gz").unlink()
    with pytest.raises(DataError, match="node-label.csv.gz: missing$"):
        load_ogb_raw(src, undirected=False)


def test_which_dataset_strings_are_folders(tmp_path, monkeypatch):
    from commgnn.data import is_folder_path

    monkeypatch.chdir(tmp_path)
    for name in ("Cora", "mygraph"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text("{}")
    assert not is_folder_path("Cora") and not is_folder_path("synthetic_graph")  # a registered name wins
    assert is_folder_path("mygraph") and is_folder_path("./Cora") and is_folder_path("no/such/folder")


@needs_ogb
@pytest.mark.parametrize("undirected", [False, True])
def test_ogb_binary_layout_loads_and_converts_to_the_same_graph(tmp_path, undirected):
    """papers100M's layout: raw/data.npz + raw/node-label.npz (float labels, NaN = unlabelled)."""
    rng = np.random.default_rng(5)
    n, e = 200, 700
    p = tmp_path / "ogbn_papers100M"
    (p / "raw").mkdir(parents=True)
    src = rng.integers(0, n, e)
    np.savez_compressed(p / "raw/data.npz", edge_index=np.stack([src, (src + rng.integers(1, n, e)) % n]),
                        node_feat=rng.standard_normal((n, 6)).astype(np.float16),
                        num_nodes_list=np.array([n]), num_edges_list=np.array([e]))
    labels = rng.integers(0, 172, (n, 1)).astype(np.float64)
    labels[::3] = np.nan
    np.savez_compressed(p / "raw/node-label.npz", node_label=labels)
    labelled = np.flatnonzero(~np.isnan(labels[:, 0]))
    for s, ids in zip(("train", "valid", "test"), np.array_split(rng.permutation(labelled), 3)):
        _csv(p / f"split/time/{s}.csv.gz", ids[:, None], "%d")
    mem = load_ogb_raw(p, undirected=undirected)
    out = convert_ogb_raw(p, tmp_path / "g", chunk_rows=33, undirected=undirected)
    assert np.load(out / "x.npy").dtype == np.float16  # kept as stored
    disk = load_graph_folder(out)
    for k in KEYS:
        assert torch.equal(mem[k], disk[k]), k
    assert int((disk.y < 0).sum()) == len(range(0, n, 3)) and disk.num_classes_total == 172
    assert disk.edge_index.size(1) == (2 if undirected else 1) * e
