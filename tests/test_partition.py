"""Tests of commgnn.partition: strategies, report, local views and the partition store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.datasets import FakeDataset
from torch_geometric.utils import stochastic_blockmodel_graph

import commgnn.partition.metis as metis_mod
import commgnn.partition.store as store_mod
from commgnn.config import from_dict
from commgnn.errors import ConfigError, PartitionError
from commgnn.partition import (
    PARTITIONERS, LocalPartition, PartitionConfig, PartitionReport, assign_parts, build_local_partition,
    build_local_partitions, format_report, load_meta, load_partition, partition_report, save_partitions,
)

METHODS = ["metis", "random", "contiguous"]


def fake_graph(seed: int = 0, nodes: int = 1000) -> Data:
    torch.manual_seed(seed)
    return FakeDataset(num_graphs=1, avg_num_nodes=nodes, avg_degree=10, num_channels=4, num_classes=3)[0]


def random_data(n: int = 120, e: int = 900, seed: int = 0) -> Data:
    """A random directed multigraph with self loops and duplicates, features, labels and masks."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei = torch.cat([ei, ei[:, :20], torch.arange(5).repeat(2, 1)], 1)  # duplicates + self loops
    split = torch.rand(n, generator=g)
    return Data(x=torch.randn(n, 5, generator=g), edge_index=ei, y=torch.randint(0, 4, (n,), generator=g),
                train_mask=split < 0.5, val_mask=(split >= 0.5) & (split < 0.7), test_mask=split >= 0.7)


def sbm(seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    probs = torch.full((4, 4), 0.002) + torch.eye(4) * 0.098
    return stochastic_blockmodel_graph([200] * 4, probs, directed=False)


# --- strategies ---------------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS)
def test_every_node_once_nonempty_deterministic(method: str) -> None:
    d = fake_graph()
    n = d.num_nodes
    for P in (1, 3, 4):
        parts = assign_parts(d.edge_index, n, P, PartitionConfig(method=method, seed=7))
        assert parts.shape == (n,) and parts.dtype == torch.int64
        assert int(parts.min()) >= 0 and int(parts.max()) < P
        assert (torch.bincount(parts, minlength=P) > 0).all()
        again = assign_parts(d.edge_index, n, P, PartitionConfig(method=method, seed=7))
        assert torch.equal(parts, again)


def test_random_and_contiguous_are_exactly_balanced() -> None:
    n, P = 103, 4
    ei = torch.empty(2, 0, dtype=torch.int64)
    for method in ("random", "contiguous"):
        sizes = torch.bincount(assign_parts(ei, n, P, PartitionConfig(method=method)), minlength=P)
        assert sizes.tolist() == [26, 26, 26, 25]
    contiguous = assign_parts(ei, n, P, PartitionConfig(method="contiguous"))
    assert (contiguous[1:] >= contiguous[:-1]).all()
    r0 = assign_parts(ei, n, P, PartitionConfig(method="random", seed=0))
    r1 = assign_parts(ei, n, P, PartitionConfig(method="random", seed=1))
    assert not torch.equal(r0, r1)


def test_metis_balanced_and_beats_random_on_communities() -> None:
    d = fake_graph()
    parts = assign_parts(d.edge_index, d.num_nodes, 4, PartitionConfig(method="metis"))
    assert partition_report(d.edge_index, parts, 4).node_balance <= 1.1

    ei = sbm()
    n = 800
    rep = {m: partition_report(ei, assign_parts(ei, n, 4, PartitionConfig(method=m)), 4)
           for m in ("metis", "random")}
    assert rep["metis"].edge_cut < 0.3 * rep["random"].edge_cut
    vol_parts = assign_parts(ei, n, 4, PartitionConfig(method="metis", objective="vol"))
    vol = partition_report(ei, vol_parts, 4)
    assert (torch.bincount(vol_parts, minlength=4) > 0).all()
    assert vol.comm_volume <= rep["random"].comm_volume


def test_metis_passes_seed_and_objective() -> None:
    # If the options did not reach METIS, every seed / objective would give the same answer.
    d = fake_graph()
    runs = {(s, o): assign_parts(d.edge_index, d.num_nodes, 4, PartitionConfig(objective=o, seed=s))
            for s in (0, 1, 2) for o in ("cut", "vol")}
    assert any(not torch.equal(runs[(0, "cut")], runs[(s, "cut")]) for s in (1, 2))
    assert any(not torch.equal(runs[(s, "cut")], runs[(s, "vol")]) for s in (0, 1, 2))


def test_metis_empty_part_is_a_partition_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import pymetis

    monkeypatch.setattr(metis_mod.pymetis, "part_graph",
                        lambda nparts, adj, **kw: pymetis.GraphPartition(0, [0] * (len(adj.adj_starts) - 1)))
    ei = sbm()
    with pytest.raises(PartitionError, match="METIS left 1 of 2 partitions empty.*fewer parts"):
        assign_parts(ei, 800, 2, PartitionConfig(method="metis"))


def test_partition_argument_errors() -> None:
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(PartitionError, match="num_parts must be a positive int, got 0"):
        assign_parts(ei, 10, 0, PartitionConfig())
    with pytest.raises(PartitionError, match="^cannot split 10 nodes into 16 partitions$"):
        assign_parts(ei, 10, 16, PartitionConfig())
    with pytest.raises(PartitionError, match="refers to node 2, outside"):
        assign_parts(ei, 2, 2, PartitionConfig(method="random"))


def test_config_validation() -> None:
    assert PARTITIONERS.names() == ["contiguous", "ldg", "lp-metis", "metis", "random"]
    with pytest.raises(ConfigError, match="unknown partitioner 'louvain' .*contiguous, ldg, lp-metis, metis, random"):
        PartitionConfig(method="louvain")
    with pytest.raises(ConfigError, match="objective"):
        PartitionConfig(objective="edges")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="seed must be an int >= 0"):
        PartitionConfig(seed=-1)
    with pytest.raises(ConfigError, match="^partition.method: unknown partitioner"):
        from_dict(PartitionConfig, {"method": "x"}, path="partition")
    cfg = from_dict(PartitionConfig, {"method": "random", "objective": "vol", "seed": 3, "dir": "p"})
    assert cfg == PartitionConfig(method="random", objective="vol", seed=3, dir="p")


# --- report -------------------------------------------------------------------------------

def test_report_hand_computed() -> None:
    # parts: {0,1} -> 0, {2,3} -> 1, {4,5} -> 2
    ei = torch.tensor([(0, 1), (1, 2), (2, 1), (3, 4), (5, 0), (5, 1), (4, 5), (2, 2), (1, 2)]).t()
    parts = torch.tensor([0, 0, 1, 1, 2, 2])
    train = torch.tensor([True, True, True, False, False, False])
    r = partition_report(ei, parts, 3, train)
    # Crossing pairs {1,2}, {3,4}, {0,5}, {1,5}; six crossing columns (1->2 twice).
    assert (r.edge_cut, r.cut_edges_directed) == (4, 6)
    # H_0 = {2, 5}, H_1 = {1}, H_2 = {3}; rank 1 sends 2 (to 0) and 3 (to 2).
    assert r.comm_volume == 4
    assert r.halo_in == (2, 1, 1) and r.halo_out == (1, 2, 1)
    assert (r.max_halo_in, r.max_halo_out, r.max_rank_halo) == (2, 2, 2)
    assert r.mean_halo_in == pytest.approx(4 / 3) and r.mean_halo_out == pytest.approx(4 / 3)
    assert r.nodes == (2, 2, 2) and r.edges == (4, 3, 2) and r.train_nodes == (2, 1, 0)
    assert r.node_balance == 1.0 and r.edge_balance == pytest.approx(4 / 3)
    assert r.train_balance == pytest.approx(2.0)
    assert PartitionReport.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    text = format_report(r)
    assert "C = 4" in text and "train 2.000" in text and len(text.splitlines()) == 5 + 1 + 3
    no_train = partition_report(ei, parts, 3)
    assert no_train.train_nodes is None and no_train.train_balance is None
    assert "..." in format_report(partition_report(ei, torch.arange(6), 6), max_rows=4)


# --- local partitions ---------------------------------------------------------------------

def check_contract(d: Data, parts: torch.Tensor, lps: list[LocalPartition]) -> None:
    P, n = len(lps), d.num_nodes
    src, dst = d.edge_index
    deg = torch.bincount(dst, minlength=n)
    all_edges = []
    for r, lp in enumerate(lps):
        assert (lp.rank, lp.num_parts, lp.num_nodes_global, lp.num_classes) == (r, P, n, 4)
        assert torch.equal(lp.global_ids, (parts == r).nonzero().flatten())
        into = parts[dst] == r
        expected_halo = sorted({int(s) for s in src[into & (parts[src] != r)]},
                               key=lambda v: (int(parts[v]), v))
        assert lp.halo_global_ids.tolist() == expected_halo
        owners = parts[lp.halo_global_ids]
        assert lp.recv_counts == torch.bincount(owners, minlength=P).tolist() and lp.recv_counts[r] == 0
        ids = torch.cat([lp.global_ids, lp.halo_global_ids])
        assert torch.equal(lp.in_degree, deg[ids])
        s, t = lp.edge_index
        assert t.numel() == 0 or int(t.max()) < lp.num_owned
        key = t * ids.numel() + s
        assert (key[1:] >= key[:-1]).all()  # sorted by target, then source
        all_edges.append(ids[lp.edge_index])
        for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(getattr(lp, name), getattr(d, name)[lp.global_ids])
        assert sum(lp.send_counts) == lp.send_index.numel() and lp.send_counts[r] == 0
    # Alignment: rank r's send block for q lists, by global id, q's halo block from r.
    for r, lp in enumerate(lps):
        sent = lp.global_ids[lp.send_index].split(lp.send_counts)
        for q, peer in enumerate(lps):
            halo_from_r = peer.halo_global_ids.split(peer.recv_counts)[r]
            assert torch.equal(sent[q], halo_from_r), (r, q)
            assert lp.send_counts[q] == peer.recv_counts[r]
    glob = torch.cat(all_edges, 1)
    assert glob.size(1) == d.edge_index.size(1)
    assert torch.equal(torch.sort(glob[0] * n + glob[1]).values, torch.sort(src * n + dst).values)


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_build_local_partitions_contract(P: int) -> None:
    d = random_data()
    parts = assign_parts(d.edge_index, d.num_nodes, P, PartitionConfig(method="random", seed=P))
    lps = build_local_partitions(d, parts, P)
    check_contract(d, parts, lps)
    if P == 1:
        assert lps[0].num_halo == 0 and lps[0].send_index.numel() == 0
        assert lps[0].recv_counts == [0] and lps[0].send_counts == [0]
    for r in range(P):  # the one-rank builder gives the same object
        one = build_local_partition(d, parts, P, r)
        assert one.recv_counts == lps[r].recv_counts and one.send_counts == lps[r].send_counts
        for k, t in lps[r].tensors().items():
            assert torch.equal(getattr(one, k), t), k


def test_build_with_metis_and_errors() -> None:
    d = random_data(n=200, e=1500, seed=1)
    parts = assign_parts(d.edge_index, d.num_nodes, 3, PartitionConfig(method="metis"))
    check_contract(d, parts, build_local_partitions(d, parts, 3))
    with pytest.raises(PartitionError, match="partition 2 of 3 is empty"):
        build_local_partitions(d, parts.clamp(max=1), 3)
    with pytest.raises(PartitionError, match="part id 3 outside"):
        build_local_partitions(d, parts + 1, 3)
    with pytest.raises(PartitionError, match="rank must be in"):
        build_local_partition(d, parts, 3, 3)


# --- store --------------------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, list[LocalPartition], PartitionReport]:
    d = random_data()
    parts = assign_parts(d.edge_index, d.num_nodes, 3, PartitionConfig(method="random"))
    lps = build_local_partitions(d, parts, 3)
    rep = partition_report(d.edge_index, parts, 3, d.train_mask)
    out = save_partitions(tmp_path / "parts", lps, {"graph_fingerprint": "abcdef0123456789xyz",
                                                    "method": "random", "objective": "cut", "seed": 0,
                                                    "report": rep})
    return out, lps, rep


def test_store_round_trip(saved: tuple[Path, list[LocalPartition], PartitionReport]) -> None:
    path, lps, rep = saved
    meta = load_meta(path)
    assert (meta["format"], meta["version"], meta["num_parts"]) == ("commgnn-partition", 1, 3)
    assert meta["num_nodes"] == 120 and meta["num_edges"] == 925
    assert (meta["method"], meta["objective"], meta["seed"]) == ("random", "cut", 0)
    assert PartitionReport.from_dict(meta["report"]) == rep
    assert sorted(meta["files"]) == ["part_0.pt", "part_1.pt", "part_2.pt"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["parts"]  # no temp leftovers
    assert set(store_mod._TENSORS) == set(lps[0].tensors())
    for r, lp in enumerate(lps):
        got = load_partition(path, r, expected_fingerprint="abcdef0123456789xyz", expected_parts=3)
        for k in ("rank", "num_parts", "num_nodes_global", "num_classes", "recv_counts", "send_counts"):
            assert getattr(got, k) == getattr(lp, k), k
        for k, t in lp.tensors().items():
            assert getattr(got, k).dtype == t.dtype and torch.equal(getattr(got, k), t), k


def test_store_errors(saved: tuple[Path, list[LocalPartition], PartitionReport], tmp_path: Path) -> None:
    path, lps, _ = saved
    with pytest.raises(PartitionError,
                       match=r"^partition dir has 3 parts but 2 were requested; run 3 ranks \(--parts 3\)"):
        load_partition(path, 0, expected_parts=2)
    with pytest.raises(PartitionError, match=r"^partition dir was made for a different graph \(fingerprint "
                                             r"abcdef012345… != other\); re-run `commgnn partition`$"):
        load_partition(path, 0, expected_fingerprint="other")
    with pytest.raises(PartitionError, match="partition dir not found"):
        load_partition(tmp_path / "nope", 0)
    with pytest.raises(PartitionError, match=r"rank 3 outside \[0, 3\)"):
        load_partition(path, 3)

    blob = bytearray((path / "part_1.pt").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (path / "part_1.pt").write_bytes(bytes(blob))
    with pytest.raises(PartitionError, match=r"^part_1.pt in .* is corrupt \(sha256 mismatch\)"):
        load_partition(path, 1)
    (path / "part_2.pt").unlink()
    with pytest.raises(PartitionError, match="is missing part_2.pt"):
        load_partition(path, 2)

    meta = json.loads((path / "meta.json").read_text())
    (path / "part_0.pt").write_bytes(b"not a torch file")
    meta["files"]["part_0.pt"] = store_mod.hashlib.sha256(b"not a torch file").hexdigest()
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match="^cannot read part_0.pt in"):
        load_partition(path, 0)
    for bad, pattern in [({**meta, "format": "x"}, "is not a commgnn partition"),
                         ({**meta, "version": 2}, "has format version 2"),
                         ({**meta, "files": {}}, "missing or invalid 'files'")]:
        (path / "meta.json").write_text(json.dumps(bad))
        with pytest.raises(PartitionError, match=pattern):
            load_meta(path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(PartitionError, match="meta.json is not valid JSON"):
        load_partition(path, 0)
    (path / "meta.json").unlink()
    with pytest.raises(PartitionError, match=r"not a partition directory \(no meta.json\)"):
        load_meta(path)


def test_store_inconsistent_part(tmp_path: Path) -> None:
    d = random_data()
    parts = assign_parts(d.edge_index, d.num_nodes, 2, PartitionConfig(method="contiguous"))
    lps = build_local_partitions(d, parts, 2)
    lps[1].send_counts = [lps[1].send_counts[0] + 1, 0]  # valid file, broken content
    lps[0].edge_index = lps[0].edge_index.clone()
    lps[0].edge_index[1, 0] = lps[0].num_owned  # target outside the owned rows
    save_partitions(tmp_path / "p", lps, {"graph_fingerprint": "g"})
    with pytest.raises(PartitionError, match=r"part_1.pt in .* is inconsistent: sum\(send_counts\)"):
        load_partition(tmp_path / "p", 1)
    with pytest.raises(PartitionError, match=r"part_0.pt in .* is inconsistent: edge_index outside"):
        load_partition(tmp_path / "p", 0)


def test_failed_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = random_data()
    lps = build_local_partitions(d, assign_parts(d.edge_index, 120, 2, PartitionConfig(method="random")), 2)
    calls = []

    def failing_save(obj: object, f: object) -> None:
        calls.append(f)
        if len(calls) == 2:
            raise OSError("disk full")
        torch.save(obj, f)

    monkeypatch.setattr(store_mod.torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_partitions(tmp_path / "p", lps, {"graph_fingerprint": "g"})
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PartitionError, match="not JSON-serialisable"):
        save_partitions(tmp_path / "p", lps, {"graph_fingerprint": "g", "bad": object()})
    assert list(tmp_path.iterdir()) == []


def test_save_replaces_whole_dir_and_refuses_foreign(tmp_path: Path) -> None:
    d = random_data()
    for P in (3, 2):
        parts = assign_parts(d.edge_index, 120, P, PartitionConfig(method="random"))
        save_partitions(tmp_path / "p", build_local_partitions(d, parts, P), {"graph_fingerprint": f"g{P}"})
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["meta.json", "part_0.pt", "part_1.pt"]
    assert load_meta(tmp_path / "p")["graph_fingerprint"] == "g2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(PartitionError, match="refusing to overwrite"):
        save_partitions(foreign, build_local_partitions(d, parts, 2), {"graph_fingerprint": "g"})
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_partition_graph_is_a_deprecated_alias_of_assign_parts():
    """The partition layer's ``partition_graph`` was renamed (``commgnn.partition_graph`` is the
    verb that saves a directory); the old name still works for one release, with a warning."""
    import commgnn.partition as partition

    with pytest.warns(DeprecationWarning, match="assign_parts"):
        old = partition.partition_graph
    assert old is assign_parts
    with pytest.raises(AttributeError):
        partition.no_such_name  # noqa: B018


def test_the_partition_verb_takes_a_graph_given_in_python(tmp_path: Path) -> None:
    """``commgnn.partition_graph(out, data)`` with a PyG ``Data`` (as ``commgnn.train`` takes
    it): ``meta.json`` names the graph by its fingerprint, and a run on the same graph
    trains on the saved parts."""
    import json

    import commgnn
    from commgnn.data import fingerprint, load_dataset
    from commgnn.data.config import DataConfig, SyntheticConfig

    data = load_dataset(DataConfig(synthetic=SyntheticConfig(num_nodes=200, num_classes=3, feature_dim=8,
                                                             avg_degree=5.0, seed=3)))
    done = commgnn.partition_graph(tmp_path / "parts", data, parts=2, partitioner="random")
    meta = json.loads((tmp_path / "parts" / "meta.json").read_text())
    assert meta["graph_fingerprint"] == fingerprint(data) and meta["dataset"].startswith("python:")
    assert done.parts == 2 and done.report
    res = commgnn.train(data, parts=2, partition_dir=str(tmp_path / "parts"), epochs=2, threads=1, quiet=True,
                        out=tmp_path / "run")
    assert res is not None and res.summary["epochs_run"] == 2
