"""Out-of-core partitioning of a graph folder (issue 55): the on-disk CSR, the lp-metis
partitioner, and one memory-mapped folder per rank (partition directory version 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from commgnn.data.ondisk import GraphFolderWriter, open_graph_folder
from commgnn.errors import PartitionError
from commgnn.partition import (LocalPartition, PartitionConfig, assign_parts, build_local_partitions,
                               build_symmetric_csr, folder_parts, load_meta, load_partition, load_rank_folder,
                               partition_graph_folder, partition_report, write_partition_folders)
from commgnn.partition import folders as folders_mod
from commgnn.partition.disk_csr import array_edge_chunks
from commgnn.partition.folder_rank import SourceRows
from commgnn.partition.metis import symmetric_csr

N, P, F, C = 3000, 4, 6, 5


def _community_graph(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A planted-partition graph: 30 communities with random (so shuffled) member ids, most
    edges inside a community, both directions stored, plus a few self loops and duplicates."""
    rng = np.random.default_rng(seed)
    comm = rng.integers(0, 30, N)
    members = np.argsort(comm, kind="stable")
    start = np.searchsorted(comm[members], np.arange(30))
    size = np.bincount(comm, minlength=30)
    u = rng.integers(0, N, 4 * N)
    v = members[start[comm[u]] + (rng.random(4 * N) * size[comm[u]]).astype(np.int64)]
    u2, v2 = rng.integers(0, N, N // 2), rng.integers(0, N, N // 2)
    s, d = np.concatenate([u, u2]), np.concatenate([v, v2])
    loops = rng.integers(0, N, 20)
    ei = np.stack([np.concatenate([s, d, loops, s[:50]]), np.concatenate([d, s, loops, d[:50]])])
    return ei, comm


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Data]:
    ei, comm = _community_graph()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, F)).astype(np.float32)
    y = (comm % C).astype(np.int64)
    perm = rng.permutation(N)
    splits = {"train": np.sort(perm[:600]), "valid": perm[600:900], "test": perm[900:1200]}
    out = tmp_path_factory.mktemp("g") / "graph"
    with GraphFolderWriter(out, num_nodes=N, num_edges=ei.shape[1], num_features=F, num_classes=C,
                           directed=False) as w:
        for s in range(0, ei.shape[1], 5000):  # chunk by chunk, as a big graph is written
            w.edge_index[:, s:s + 5000] = ei[:, s:s + 5000]
        w.x[:] = x
        w.y[:] = y
        for name, ids in splits.items():
            w.set_split(name, ids)
        w.commit()
    masks = {}
    for key, name in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        m = torch.zeros(N, dtype=torch.bool)
        m[torch.from_numpy(splits[name])] = True
        masks[key] = m
    data = Data(x=torch.from_numpy(x), edge_index=torch.from_numpy(ei), y=torch.from_numpy(y), **masks)
    data.num_classes_total = C
    return out, data


def _assert_same(lp: LocalPartition, ref: LocalPartition) -> None:
    for k in ("rank", "num_parts", "num_nodes_global", "num_classes", "recv_counts", "send_counts"):
        assert getattr(lp, k) == getattr(ref, k), k
    for k, t in ref.tensors().items():
        got = getattr(lp, k)
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), k


def test_symmetric_csr_matches_metis_input() -> None:
    ei, _ = _community_graph(3)
    csr = build_symmetric_csr(array_edge_chunks(ei[0], ei[1], 777), N)
    xadj, adjncy = symmetric_csr(torch.from_numpy(ei), N)
    # the same neighbours per row once duplicates are removed; self loops are gone
    rows = np.repeat(np.arange(N), np.diff(csr.indptr))
    keys = np.unique(rows * N + csr.indices)
    assert np.array_equal(keys % N, adjncy.numpy())
    assert np.array_equal(np.bincount(keys // N, minlength=N), np.diff(xadj.numpy()))
    assert csr.nnz == 2 * int((ei[0] != ei[1]).sum())


@pytest.mark.parametrize("bucket", [50, 1 << 26])
def test_symmetric_csr_on_disk_equals_in_memory(tmp_path: Path, bucket: int, monkeypatch) -> None:
    """The external bucket sort (many buckets, or one) gives the in-memory scatter's arrays,
    entry for entry, and leaves no scratch file."""
    from commgnn.partition import disk_csr
    monkeypatch.setattr(disk_csr, "BUCKET_ENTRIES", bucket)
    monkeypatch.setattr(disk_csr._fill_by_buckets, "__defaults__", (bucket,))
    ei, _ = _community_graph(5)
    ref = build_symmetric_csr(array_edge_chunks(ei[0], ei[1], 777), N)
    with build_symmetric_csr(array_edge_chunks(ei[0], ei[1], 777), N, workdir=tmp_path) as disk:
        assert np.array_equal(np.asarray(disk.indptr), ref.indptr)
        assert np.array_equal(np.asarray(disk.indices), ref.indices)
        assert sorted(f.name for f in disk.workdir.iterdir()) == ["indices.npy", "indptr.npy"]
    assert not any(tmp_path.iterdir())


def test_rank_folders_equal_the_in_memory_build(graph: tuple[Path, Data], tmp_path: Path) -> None:
    path, data = graph
    folder = open_graph_folder(path)
    parts = assign_parts(data.edge_index, N, P, PartitionConfig(method="random", seed=3))
    out = write_partition_folders(folder, parts.numpy(), P, tmp_path / "parts", meta={"graph_fingerprint": "fp"},
                                  chunk=4096, rank_edges=2000)  # several buckets per rank
    refs = build_local_partitions(data, parts, P)
    for r in range(P):
        _assert_same(load_rank_folder(out, r, expected_fingerprint="fp", expected_parts=P), refs[r])
        _assert_same(load_partition(out, r), refs[r])  # the same directory through the v1 entry point
    meta = load_meta(out)
    assert (meta["version"], meta["layout"], meta["num_edges"]) == (2, "folders", data.edge_index.size(1))
    expected = partition_report(data.edge_index, parts, P, data.train_mask).to_dict()
    assert meta["report"] == pytest.approx(expected)
    with pytest.raises(PartitionError, match="4 parts but 2 were requested"):
        load_partition(out, 0, expected_parts=2)
    with pytest.raises(PartitionError, match="different graph"):
        load_rank_folder(out, 0, expected_fingerprint="other")


def test_lp_metis_same_on_disk_and_in_memory(graph: tuple[Path, Data], tmp_path: Path) -> None:
    path, data = graph
    cfg = PartitionConfig(method="lp-metis", seed=5)
    on_disk = folder_parts(open_graph_folder(path), P, cfg, workdir=tmp_path / "work", chunk=3333)
    in_memory = assign_parts(data.edge_index, N, P, cfg)
    assert np.array_equal(on_disk, in_memory.numpy())
    assert not any((tmp_path / "work").iterdir())  # the on-disk CSR was removed


def test_coarse_graph_spilled_equals_in_memory_and_keeps_the_heaviest(tmp_path: Path) -> None:
    """The cluster graph accumulated through scratch files (several source-cluster
    buckets) equals the in-memory one; over ``max_entries`` it keeps exactly the pairs of
    weight >= the smallest threshold that fits, and stays symmetric."""
    from commgnn.partition import lp_metis as lpm
    ei, comm = _community_graph(4)
    csr = build_symmetric_csr(array_edge_chunks(ei[0], ei[1]), N)
    cluster = (comm * 7 + np.arange(N) % 7).astype(np.int64)  # 210 clusters, many pairs between them
    C = 210
    cw = np.bincount(cluster, minlength=C)
    ref = lpm._coarse_graph(csr.indptr, csr.indices, cluster, C, None, 997)
    spilled = lpm._coarse_graph(csr.indptr, csr.indices, cluster, C, None, 997, cw=cw, workdir=tmp_path,
                                spill_entries=len(csr.indices) // 5)  # 5 buckets
    for a, b in zip(ref, spilled):
        assert np.array_equal(a, b)
    assert not any(tmp_path.iterdir())  # the scratch files are gone
    # the same pairs by brute force
    rows = np.repeat(np.arange(N), np.diff(csr.indptr))
    a, b = cluster[rows], cluster[csr.indices]
    keys, w = np.unique((a * C + b)[a != b], return_counts=True)
    xadj, adjncy, ew = ref
    assert np.array_equal(np.repeat(np.arange(C), np.diff(xadj)) * C + adjncy, keys) and np.array_equal(ew, w)
    # a budget: keep w >= tau, the smallest tau whose survivors fit
    budget = len(keys) // 3
    tau = min(t for t in range(1, int(w.max()) + 2) if (w >= t).sum() <= budget)
    xadj2, adjncy2, ew2 = lpm._coarse_graph(csr.indptr, csr.indices, cluster, C, None, 997, cw=cw,
                                            workdir=tmp_path, spill_entries=1000, max_entries=budget)
    kept = np.repeat(np.arange(C), np.diff(xadj2)) * C + adjncy2
    assert np.array_equal(kept, keys[w >= tau]) and np.array_equal(ew2, w[w >= tau])
    assert 0 < len(kept) <= budget
    assert np.array_equal(np.sort(kept), np.sort((kept % C) * C + kept // C))  # symmetric


def test_lp_metis_quality(graph: tuple[Path, Data]) -> None:
    _, data = graph
    cut = {m: partition_report(data.edge_index, assign_parts(data.edge_index, N, P, PartitionConfig(method=m)),
                               P).edge_cut for m in ("lp-metis", "metis", "random")}
    assert cut["lp-metis"] <= 1.5 * cut["metis"], cut
    assert cut["lp-metis"] < 0.5 * cut["random"], cut
    parts = assign_parts(data.edge_index, N, P, PartitionConfig(method="lp-metis"))
    assert int(torch.bincount(parts, minlength=P).max()) <= 1.03 * N / P + 1


def test_partition_graph_folder_end_to_end(graph: tuple[Path, Data], tmp_path: Path) -> None:
    path, data = graph
    report = partition_graph_folder(open_graph_folder(path), P, None, tmp_path / "parts", meta={"dataset": "g"},
                                    workdir=tmp_path / "work", copy_features=False)
    meta = load_meta(tmp_path / "parts")
    assert meta["method"] == "lp-metis" and meta["report"] == report and meta["copy_features"] is False
    assert len(meta["graph_fingerprint"]) == 64
    owned = []
    for r in range(P):
        lp = load_partition(tmp_path / "parts", r, expected_fingerprint=meta["graph_fingerprint"])
        assert not (tmp_path / "parts" / f"part_{r}" / "x.npy").exists()
        # read on use from the graph's own x.npy, by any index the mini-batch path uses
        x, ref = lp.x, data.x[lp.global_ids]
        assert isinstance(x, SourceRows) and tuple(x.shape) == tuple(ref.shape) and x.dtype == ref.dtype
        assert torch.equal(x[:], ref) and torch.equal(x[5:17], ref[5:17]) and torch.equal(x[3], ref[3])
        pick = torch.tensor([[9, 2], [2, 0]])
        assert torch.equal(x[pick], ref[pick]) and torch.equal(x[torch.arange(len(ref)) % 3 == 0], ref[::3])
        assert x.to("cpu") is x and torch.equal(x.to(torch.float64), ref.double())
        with pytest.raises(TypeError):
            torch.cat([x, x])
        # the in-CSR is the folder's; edge_index is expanded only when read, and agrees with it
        indptr, src = lp.in_csr()
        assert lp.num_edges == len(src) and lp._edge_index is None
        assert torch.equal(lp.edge_index[0], src.to(torch.int64))
        assert torch.equal(lp.edge_index[1], torch.repeat_interleave(torch.arange(lp.num_owned), indptr.diff()))
        owned.append(lp.global_ids)
    assert torch.equal(torch.sort(torch.cat(owned)).values, torch.arange(N))
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []


def test_stopped_write_leaves_nothing_complete(graph: tuple[Path, Data], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = graph
    real = folders_mod._save

    def stop_at_rank_1(p: Path, arr: np.ndarray) -> None:
        if ".part_1.tmp" in str(p):
            raise KeyboardInterrupt
        real(p, arr)

    monkeypatch.setattr(folders_mod, "_save", stop_at_rank_1)
    parts = np.arange(N) % P
    with pytest.raises(KeyboardInterrupt):
        write_partition_folders(open_graph_folder(path), parts, P, tmp_path / "parts",
                                meta={"graph_fingerprint": "fp"})
    left = list(tmp_path.rglob("*"))
    assert not [p for p in left if p.name == "meta.json"], left
    assert not [p for p in left if p.is_dir() and p.name.startswith("part_")], left
    assert not (tmp_path / "parts").exists()


def test_tampered_rank_file_is_refused(graph: tuple[Path, Data], tmp_path: Path) -> None:
    path, _ = graph
    out = write_partition_folders(open_graph_folder(path), np.arange(N) % P, P, tmp_path / "parts",
                                  meta={"graph_fingerprint": "fp"})
    f = out / "part_1" / "indices.npy"
    blob = bytearray(f.read_bytes())
    blob[-1] ^= 1
    f.write_bytes(bytes(blob))
    load_rank_folder(out, 0)  # other ranks are untouched
    with pytest.raises(PartitionError) as err:
        load_rank_folder(out, 1)
    assert "part_1/indices.npy" in str(err.value) and "corrupt" in str(err.value) and "\n" not in str(err.value)
    rm = out / "part_2" / "meta.json"
    rmeta = json.loads(rm.read_text())
    rmeta["send_counts"][0] += 1
    rm.write_text(json.dumps(rmeta))
    with pytest.raises(PartitionError, match="part_2/meta.json .* corrupt"):
        load_partition(out, 2)


def test_in_memory_methods_on_a_folder(graph: tuple[Path, Data]) -> None:
    path, data = graph
    folder = open_graph_folder(path)
    cfg = PartitionConfig(method="metis", seed=2)
    assert np.array_equal(folder_parts(folder, P, cfg), assign_parts(data.edge_index, N, P, cfg).numpy())
    with pytest.raises(PartitionError, match="needs about .* over the"):
        folder_parts(folder, P, PartitionConfig(method="metis", memory_limit_gb=1e-6))
