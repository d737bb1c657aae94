"""The big synthetic graph generator (commgnn.data.synth_large) on small instances:
exact sizes, symmetry, no self loops, few multi-edges, determinism, heavy-tailed degrees,
a community structure that METIS finds and a random assignment does not, labels that
follow the communities, and its config's validation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from commgnn.data.config import BigSynthConfig, SyntheticConfig
from commgnn.data.ondisk import open_graph_folder
from commgnn.data.synth_large import NAME, generate_graph_folder
from commgnn.errors import ConfigError

N, E, F, C = 20_000, 400_000, 16, 8
SMALL = dict(nodes=N, edges=E, features=F, classes=C, community_size=400, communities_per_group=8,
             chunk=1 << 15)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_graph_folder(BigSynthConfig(**SMALL), tmp_path_factory.mktemp("big") / "g")


@pytest.fixture(scope="module")
def edges(folder: Path) -> np.ndarray:
    return np.asarray(open_graph_folder(folder).edge_index, dtype=np.int64)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*.npy")):
        h.update(f.relative_to(path).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _cut(edges: np.ndarray, part: np.ndarray) -> float:
    return float((part[edges[0]] != part[edges[1]]).mean())


def test_sizes_meta_and_files(folder: Path) -> None:
    g = open_graph_folder(folder)  # the header checks pass
    meta = json.loads((folder / "meta.json").read_text())
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (N, E, F, C)
    assert meta["directed"] is False and meta["name"] == NAME
    assert meta["params"]["nodes"] == N and meta["params"]["seed"] == 0
    assert g.edge_index.shape == (2, E) and g.edge_index.dtype == np.int32
    assert g.x.shape == (N, F) and g.x.dtype == np.float32 and np.isfinite(g.x).all()
    y = np.asarray(g.y)
    assert y.shape == (N,) and y.min() >= 0 and y.max() < C
    sizes = {s: len(g.split(s)) for s in ("train", "valid", "test")}
    assert sizes == {"train": round(0.08 * N), "valid": round(0.02 * N), "test": round(0.10 * N)}
    ids = [np.asarray(g.split(s)) for s in ("train", "valid", "test")]
    for a in ids:
        assert (np.diff(a) > 0).all() and a.min() >= 0 and a.max() < N  # ascending, distinct
    assert len(np.unique(np.concatenate(ids))) == sum(sizes.values())  # disjoint
    shares = meta["stats"]
    assert abs(shares["community_share"] + shares["group_share"] + shares["global_share"] - 1) < 1e-9
    assert not list(folder.parent.glob(".g.tmp-*"))  # the writer's hidden folder is gone


def test_symmetric_no_self_loops_few_multi_edges(edges: np.ndarray) -> None:
    m = E // 2
    assert (edges[0, :m] == edges[1, m:]).all() and (edges[1, :m] == edges[0, m:]).all()
    assert edges.min() >= 0 and edges.max() < N
    assert not (edges[0] == edges[1]).any()
    lo, hi = np.minimum(edges[0, :m], edges[1, :m]), np.maximum(edges[0, :m], edges[1, :m])
    repeated = 1 - len(np.unique(lo * N + hi)) / m
    assert repeated < 0.04, f"{repeated:.3f} of the undirected edges repeat a pair"


def test_ids_of_a_community_are_spread(folder: Path, edges: np.ndarray) -> None:
    # contiguous id ranges must not reveal the communities: 4 id blocks cut like random
    part = (np.arange(N) * 4) // N
    assert _cut(edges, part) > 0.6


def test_degrees_are_heavy_tailed(edges: np.ndarray) -> None:
    def tail(deg: np.ndarray) -> tuple[float, float]:
        mean = deg.mean()
        xs = np.array([2.0, 4.0, 8.0]) * mean
        ccdf = np.array([(deg >= x).mean() for x in xs])
        slope = np.polyfit(np.log(xs), np.log(np.maximum(ccdf, 1.0 / len(deg))), 1)[0]
        return deg.max() / mean, slope

    ratio, slope = tail(np.bincount(edges[0], minlength=N))
    assert ratio > 10 and -2.5 < slope < -0.5, (ratio, slope)
    # the same statistics reject near-Poisson degrees (CSBM's): the check can fail
    csbm_deg = np.random.default_rng(0).poisson(E / N, size=N)
    c_ratio, c_slope = tail(csbm_deg)
    assert not (c_ratio > 10 and -2.5 < c_slope < -0.5), (c_ratio, c_slope)


def test_metis_finds_communities_random_does_not(edges: np.ndarray) -> None:
    import pymetis
    import scipy.sparse as sp

    adj = sp.csr_matrix((np.ones(E, dtype=np.int8), (edges[0], edges[1])), shape=(N, N))
    adj.sum_duplicates()  # METIS wants each neighbour once
    idx = pymetis.zero_copy_dtype()
    csr = pymetis.CSRAdjacency(adj.indptr.astype(idx), adj.indices.astype(idx))
    _, parts = pymetis.part_graph(4, csr, recursive=False, options=pymetis.Options(seed=0))
    metis_cut = _cut(edges, np.asarray(parts))
    random_cut = _cut(edges, np.random.default_rng(1).integers(0, 4, size=N))
    assert 0.10 <= metis_cut <= 0.30, metis_cut
    assert abs(random_cut - 0.75) < 0.02, random_cut


def test_labels_follow_communities_and_features_follow_labels(folder: Path, edges: np.ndarray) -> None:
    g = open_graph_folder(folder)
    y = np.asarray(g.y, dtype=np.int64)
    homophily = float((y[edges[0]] == y[edges[1]]).mean())
    assert homophily > 0.4 > 3 / C, homophily
    x = np.asarray(g.x, dtype=np.float64)
    centroids = np.stack([x[y == c].mean(0) for c in range(C)])

    def accuracy(feats: np.ndarray) -> float:  # nearest class centroid
        return float((np.argmin(((feats[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1) == y).mean())

    alone = accuracy(x)
    deg = np.bincount(edges[1], minlength=N)
    mean_of_neighbours = np.zeros_like(x)
    np.add.at(mean_of_neighbours, edges[1], x[edges[0]])
    mean_of_neighbours /= np.maximum(deg, 1)[:, None]
    # features carry signal, and averaging over the neighbourhood (what a GNN does) adds more
    assert 2 / C < alone < 0.6 and accuracy(mean_of_neighbours) > alone + 0.15, (alone, accuracy(mean_of_neighbours))


def test_deterministic_for_a_seed(tmp_path: Path, folder: Path) -> None:
    again = generate_graph_folder(BigSynthConfig(**SMALL), tmp_path / "again")
    assert _digest(again) == _digest(folder)
    other = generate_graph_folder(BigSynthConfig(**{**SMALL, "seed": 1}), tmp_path / "other")
    assert _digest(other) != _digest(folder)
    a, b = open_graph_folder(folder), open_graph_folder(other)
    assert not np.array_equal(a.edge_index, b.edge_index) and not np.array_equal(a.x, b.x)


def test_float16_progress_and_odd_sizes(tmp_path: Path) -> None:
    lines: list[str] = []
    cfg = BigSynthConfig(nodes=501, edges=3002, features=3, classes=5, x_dtype="float16",
                         community_size=1000, mixing=0.0, chunk=7, seed=3)
    g = open_graph_folder(generate_graph_folder(cfg, tmp_path / "h", progress=lines.append))
    assert g.x.dtype == np.float16 and g.edge_index.shape == (2, 3002)
    ei = np.asarray(g.edge_index)
    assert not (ei[0] == ei[1]).any() and lines[-1].startswith("wrote")


@pytest.mark.parametrize("field, value, needle", [
    ("edges", 3, "data.big.edges must be even"),
    ("nodes", 1, "data.big.nodes must be >= 2"),
    ("classes", 1, "data.big.classes"),
    ("mixing", 1.5, "data.big.mixing"),
    ("degree_exponent", 1.0, "data.big.degree_exponent"),
    ("x_dtype", "float64", "data.big.x_dtype"),
    ("train_fraction", 0.9, "data.big.train_fraction + valid_fraction + test_fraction"),
    ("community_size", 1, "data.big.community_size"),
    ("chunk", 0, "data.big.chunk"),
    ("seed", -1, "data.big.seed"),
    ("features", True, "data.big.features must be an integer"),
])
def test_config_errors_name_the_key(field: str, value: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("+", r"\+")) as info:
        BigSynthConfig(**{**SMALL, field: value})
    assert "\n" not in str(info.value)
    SyntheticConfig()  # the CSBM's config is untouched


def test_two_level_search_gives_the_same_graph(tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # large graphs search their cumulative weights in two levels: same positions, same bytes
    import commgnn.data.synth_large as synth_large

    monkeypatch.setattr(synth_large, "_TWO_LEVEL", 0)
    assert _digest(generate_graph_folder(BigSynthConfig(**SMALL), tmp_path / "two")) == _digest(folder)


def test_memory_is_per_node_plus_chunk_not_per_edge(tmp_path: Path) -> None:
    # numpy reports its buffers to tracemalloc (the memory-mapped outputs are not buffers):
    # with E / N = 200 and a small chunk, anything of size E would dominate the peak
    import tracemalloc

    n, e, chunk = 5_000, 1_000_000, 1 << 12
    cfg = BigSynthConfig(nodes=n, edges=e, features=8, classes=4, chunk=chunk)
    tracemalloc.start()
    try:
        generate_graph_folder(cfg, tmp_path / "m")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * n + 200 * chunk + (1 << 20) < 4 * e, peak  # an int32 [E] array alone is 4 * E
