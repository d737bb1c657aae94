"""Tests of commgnn.data loading: real datasets from the shared root, the cache, user files.

Real datasets come from ``shared/datasets`` (see ``conftest.py``; skipped where absent).
Every test uses a fresh cache folder, so PyG processes the raw files each time.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from commgnn.data import DataConfig, dataset_names, load_dataset, stratified_split
from commgnn.data.staging import MARKER, ensure_copy, root_key
from commgnn.data.datasets import resolve_dataset
from commgnn.errors import ConfigError, DataError

# nodes, directed edges, features, classes: the table of shared/datasets/README.md
README_STATS = {
    "Cora": (2708, 10556, 1433, 7),
    "CiteSeer": (3327, 9104, 3703, 6),
    "Computers": (13752, 491722, 767, 10),
    "CS": (18333, 163788, 6805, 15),
}
PUBLIC_SPLIT = {"Cora": (140, 500, 1000), "CiteSeer": (120, 500, 1000)}


def _listing(root: Path) -> list[tuple[str, int, int]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = (Path(dirpath) / name).stat()
            out.append((str(Path(dirpath, name).relative_to(root)), st.st_size, st.st_mtime_ns))
    return sorted(out)


def _check_graph(data: Data, name: str) -> None:
    assert data.name == name
    assert data.x.dtype == torch.float32 and data.edge_index.dtype == torch.int64
    assert data.y.dtype == torch.int64
    for key in ("train_mask", "val_mask", "test_mask"):
        assert data[key].dtype == torch.bool and data[key].dim() == 1


# ---------------------------------------------------------------- shared root


@pytest.mark.parametrize("name", list(README_STATS))
def test_load_shared_dataset(name: str, shared_datasets: Path, cache_dir: Path) -> None:
    before = _listing(shared_datasets)
    cfg = DataConfig(dataset=name.lower(), root=str(shared_datasets), cache_dir=str(cache_dir),
                     split_seed=3)
    data = load_dataset(cfg)
    nodes, edges, feats, classes = README_STATS[name]
    assert (data.num_nodes, data.edge_index.size(1), data.x.size(1), data.num_classes_total) \
        == (nodes, edges, feats, classes)
    _check_graph(data, name)
    sizes = tuple(int(data[k].sum()) for k in ("train_mask", "val_mask", "test_mask"))
    if name in PUBLIC_SPLIT:
        assert sizes == PUBLIC_SPLIT[name]
    else:  # no masks shipped: stratified 60/20/20 with the config's seed
        expected = stratified_split(data.y, 0.6, 0.2, seed=3)
        assert torch.equal(data.train_mask, expected[0])
        assert torch.equal(data.test_mask, expected[2])
        assert sum(sizes) == nodes and abs(sizes[0] - 0.6 * nodes) <= classes
    # The root was only read; the copy and PyG's processed files are in the cache.
    assert _listing(shared_datasets) == before
    copy = cache_dir / "datasets" / root_key(shared_datasets) / name
    assert (copy / MARKER).is_file()
    assert (copy / name / "raw").is_dir() and any((copy / name / "processed").iterdir())


def test_cached_copy_is_reused(shared_datasets: Path, cache_dir: Path) -> None:
    cfg = DataConfig(dataset="Cora", root=str(shared_datasets), cache_dir=str(cache_dir))
    first = load_dataset(cfg)
    copy = cache_dir / "datasets" / root_key(shared_datasets) / "Cora"
    stamps = _listing(copy)
    second = load_dataset(cfg)
    assert _listing(copy) == stamps, "a complete copy must be reused, not rebuilt"
    assert torch.equal(first.x, second.x) and torch.equal(first.train_mask, second.train_mask)


def test_download_path_layout_without_root(shared_datasets: Path, cache_dir: Path) -> None:
    # Stage the raw files where PyG's own download would put them: PyG then finds them and
    # does not download, which proves where root=None looks (no network needed).
    target = cache_dir / "datasets" / "download" / "Cora" / "Cora" / "raw"
    shutil.copytree(shared_datasets / "Cora" / "raw", target)
    data = load_dataset(DataConfig(dataset="Cora", cache_dir=str(cache_dir)))
    assert data.num_nodes == 2708 and int(data.train_mask.sum()) == 140
    assert (target.parent / "processed").is_dir()


def test_missing_and_incomplete_dataset_errors(shared_datasets: Path, tmp_path: Path,
                                               cache_dir: Path) -> None:
    empty = tmp_path / "empty_root"
    empty.mkdir()
    cfg = DataConfig(dataset="Cora", root=str(empty), cache_dir=str(cache_dir))
    with pytest.raises(DataError) as info:
        load_dataset(cfg)
    assert str(info.value).startswith(
        f"dataset 'Cora' not found under data root {empty}: expected {empty}/Cora/raw (see")

    (empty / "Cora" / "raw").mkdir(parents=True)  # folder there, files missing: no download
    with pytest.raises(DataError, match=r"dataset 'Cora' is incomplete: .*/Cora/raw lacks "
                                        r"ind\.cora\.x, ind\.cora\.tx, .* and 4 more$"):
        load_dataset(cfg)

    broken = tmp_path / "broken_root"
    shutil.copytree(shared_datasets / "Cora" / "raw", broken / "Cora" / "raw")
    (broken / "Cora" / "raw" / "ind.cora.graph").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match=r"^PyG could not load dataset 'Cora' \(Planetoid\) from "):
        load_dataset(DataConfig(dataset="Cora", root=str(broken), cache_dir=str(cache_dir)))

    with pytest.raises(DataError, match="is not a directory"):
        load_dataset(DataConfig(dataset="Cora", root=str(tmp_path / "nope"),
                                cache_dir=str(cache_dir)))


def test_pandas_datasets_say_how_to_fix(shared_datasets: Path, cache_dir: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pandas" else real_find_spec(name, *a))
    with pytest.raises(DataError, match=r"^dataset 'EmailEUCore' needs pandas .*pip install pandas"):
        load_dataset(DataConfig(dataset="EmailEUCore", root=str(shared_datasets),
                                cache_dir=str(cache_dir)))


# ---------------------------------------------------------------- names


def test_dataset_names_and_aliases() -> None:
    names = dataset_names()
    for name in ("Cora", "CiteSeer", "Computers", "Photo", "CS", "Physics", "Cora_ML", "DBLP",
                 "Actor", "Cornell", "chameleon", "Minesweeper", "USA", "reed98",
                 "EmailEUCore", "PolBlogs", "BlogCatalog", "Flickr"):
        assert name in names
    assert names == sorted(names) and "synthetic" not in names
    assert resolve_dataset("cora").name == "Cora"
    assert resolve_dataset("AmazonComputers").name == "Computers"
    assert resolve_dataset("coauthor-cs").name == "CS"
    assert resolve_dataset("CORA_ML").name == "Cora_ML"
    assert resolve_dataset("cornell").name == "Cornell"
    assert resolve_dataset("Cornell5").name == "cornell5"


def test_unknown_dataset_lists_choices(cache_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset(DataConfig(dataset="pubmed", cache_dir=str(cache_dir)))
    msg = str(info.value)
    assert msg.startswith("unknown dataset 'pubmed' (choose from: synthetic, Actor, ")
    assert "Cora" in msg and "Tolokers" in msg and ".pt" in msg


# ---------------------------------------------------------------- the cache itself


def test_ensure_copy_rebuilds_partial_and_stale_copies(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "raw").mkdir(parents=True)
    (src / "raw" / "a.txt").write_text("one")
    os.chmod(src / "raw", 0o555)  # read-only like the shared root: the copy must be writable
    dest = tmp_path / "cache" / "D"
    assert ensure_copy(src, dest, "d") == dest
    assert (dest / "d" / "raw" / "a.txt").read_text() == "one"
    assert os.stat(dest / "d" / "raw").st_mode & 0o200
    (dest / "d" / "processed").mkdir()  # PyG's output survives a reuse
    ensure_copy(src, dest, "d")
    assert (dest / "d" / "processed").is_dir()

    os.chmod(src / "raw", 0o755)
    (src / "raw" / "a.txt").write_text("two!")  # source changed: stale copy is rebuilt
    ensure_copy(src, dest, "d")
    assert (dest / "d" / "raw" / "a.txt").read_text() == "two!"
    assert not (dest / "d" / "processed").exists()

    (dest / MARKER).unlink()  # an interrupted copy (no marker) is never reused
    (dest / "d" / "raw" / "a.txt").write_text("partial")
    ensure_copy(src, dest, "d")
    assert (dest / "d" / "raw" / "a.txt").read_text() == "two!"
    assert [p.name for p in dest.parent.iterdir()] == ["D"], "temporary folders left behind"


# ---------------------------------------------------------------- user .pt graphs


def _user_graph(n: int = 40) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    src = torch.arange(n)
    return {"x": torch.randn(n, 4, generator=gen, dtype=torch.float64),
            "edge_index": torch.stack([src, (src + 1) % n]).int(),
            "y": torch.arange(n) % 3}


def test_user_graph_without_masks_gets_split(tmp_path: Path) -> None:
    path = tmp_path / "g.pt"
    graph = _user_graph()
    graph["y"][:4] = -1
    torch.save(graph, path)
    data = load_dataset(DataConfig(dataset=str(path), train_ratio=0.5, val_ratio=0.25,
                                   split_seed=5))
    _check_graph(data, "g")
    assert data.num_classes_total == 3 and data.num_nodes == 40
    assert torch.equal(data.x, graph["x"].float())
    expected = stratified_split(graph["y"], 0.5, 0.25, seed=5)
    assert all(torch.equal(data[k], e) for k, e in
               zip(("train_mask", "val_mask", "test_mask"), expected))
    assert not (data.train_mask | data.val_mask | data.test_mask)[:4].any()


def test_user_graph_data_object_keeps_masks(tmp_path: Path) -> None:
    graph = _user_graph()
    masks = torch.zeros(40, 3, dtype=torch.bool)
    masks[:10, 0] = True
    val, test = torch.zeros_like(masks), torch.zeros_like(masks)
    val[10:25, 0], test[25:, 0] = True, True  # disjoint in column 0 (the one used)
    val[:, 1:], test[:, 1:] = True, True      # other columns are ignored
    graph.update(train_mask=masks, val_mask=val, test_mask=test, num_classes=5)
    path = tmp_path / "obj.pt"
    torch.save(Data(**graph), path)
    data = load_dataset(DataConfig(dataset=str(path)))
    assert torch.equal(data.train_mask, masks[:, 0])  # 2-D masks: column 0
    assert torch.equal(data.test_mask, test[:, 0])
    assert data.num_classes_total == 5


@pytest.mark.parametrize("content, message", [
    ([1, 2, 3], "must hold a dict or a torch_geometric Data with x, edge_index and y; got list"),
    ({"x": torch.zeros(3, 2), "edge_index": torch.zeros(2, 1, dtype=torch.long)},
     "has no tensor 'y'"),
    ({"x": torch.zeros(3, 2), "edge_index": torch.zeros(2, 1, dtype=torch.long),
      "y": torch.zeros(3)}, "y must hold integer class labels, got dtype torch.float32"),
    ({"x": torch.zeros(3, 2), "edge_index": torch.zeros(2, 1), "y": torch.zeros(3).long()},
     "edge_index must be an integer tensor"),
    ({**_user_graph(), "train_mask": torch.ones(40, dtype=torch.bool)},
     "has train_mask but not val_mask, test_mask: give all three masks or none"),
    ({**_user_graph(), "edge_index": torch.tensor([[0, 40], [1, 2]])},
     "edge_index has node id 40 but the graph has 40 nodes"),
    ({**_user_graph(), "x": torch.full((40, 4), float("nan"))},
     "x has 160 NaN/inf values, first at node 0"),
    ({**_user_graph(), "y": torch.zeros(39, dtype=torch.long)},
     "y must have one label per node (40)"),
    ({**_user_graph(), "num_classes": 2}, "num_classes = 2 but y has label 2"),
])
def test_bad_user_graph(tmp_path: Path, content: object, message: str) -> None:
    path = tmp_path / "bad.pt"
    torch.save(content, path)
    with pytest.raises(DataError) as info:
        load_dataset(DataConfig(dataset=str(path)))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unreadable_user_graph(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"^graph file not found: .*missing\.pt$"):
        load_dataset(DataConfig(dataset=str(tmp_path / "missing.pt")))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00 definitely not torch")
    with pytest.raises(DataError, match=r"^cannot read graph file .*garbage\.pt: not a torch "
                                        r"file saved with torch\.save: garbage\.pt \(22 bytes"):
        load_dataset(DataConfig(dataset=str(garbage)))
    unsafe = tmp_path / "unsafe.pt"
    torch.save({"x": torch.zeros(2, 2), "edge_index": torch.zeros(2, 0, dtype=torch.long),
                "y": torch.zeros(2, dtype=torch.long), "extra": Path("/")}, unsafe)
    with pytest.raises(DataError, match=r"^cannot read graph file .*unsafe\.pt: "):
        load_dataset(DataConfig(dataset=str(unsafe)))


# ---------------------------------------------------------------- every dataset (slow)


@pytest.mark.slow
@pytest.mark.parametrize("name", dataset_names())
def test_every_registered_dataset_loads(name: str, shared_datasets: Path, cache_dir: Path) -> None:
    spec = resolve_dataset(name)
    if spec.pandas and importlib.util.find_spec("pandas") is None:
        pytest.skip("needs pandas")
    data = load_dataset(DataConfig(dataset=name, root=str(shared_datasets),
                                   cache_dir=str(cache_dir)))
    _check_graph(data, name)
    assert int(data.train_mask.sum()) > 0 and int(data.test_mask.sum()) > 0
