"""Federated client splits (commgnn.federated.client_split, client_data, client_map_file) and the fairness report (fairness)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from commgnn.config import from_dict
from commgnn.data import SyntheticConfig, make_csbm
from commgnn.errors import ConfigError, DataError
from commgnn.federated.fairness import fairness_markdown, fairness_report
from commgnn.federated.client_data import ClientData, build_clients, split_stats
from commgnn.federated.client_map_file import load_client_map
from commgnn.federated.client_split import split_clients, split_from_config
from commgnn.federated.config import SplitConfig

K = 4


@pytest.fixture(scope="module")
def graph() -> Data:
    """A homophilous CSBM: 4 classes, so there are communities for Louvain and METIS to find."""
    cfg = SyntheticConfig(num_nodes=600, num_classes=4, avg_degree=6.0, homophily=0.9,
                          feature_dim=8, seed=3)
    return make_csbm(cfg)


def _cut_fraction(g: Data, owner: torch.Tensor) -> float:
    src, dst = g.edge_index
    return float((owner[src] != owner[dst]).float().mean())


def _random_owner_like(owner: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The same client sizes, nodes shuffled: the no-locality baseline."""
    perm = torch.randperm(owner.numel(), generator=torch.Generator().manual_seed(seed))
    return owner[perm]


def _file_owner(tmp_path: Path, n: int) -> str:
    ids = torch.arange(n) % K
    path = tmp_path / "map.npy"
    np.save(path, ids.numpy())
    return str(path)


@pytest.mark.parametrize("method", ["louvain", "metis", "dirichlet", "file"])
def test_every_node_in_exactly_one_nonempty_client(graph: Data, method: str, tmp_path: Path) -> None:
    path = _file_owner(tmp_path, graph.num_nodes) if method == "file" else None
    owner = split_clients(graph, K, method, seed=1, alpha=0.5, path=path)  # type: ignore[arg-type]
    assert owner.shape == (graph.num_nodes,) and owner.dtype == torch.int64
    assert int(owner.min()) >= 0 and int(owner.max()) < K
    assert bool((torch.bincount(owner, minlength=K) > 0).all())
    clients = build_clients(graph, owner)
    assert len(clients) == K
    covered = torch.cat([c.nodes for c in clients])
    assert torch.equal(torch.sort(covered).values, torch.arange(graph.num_nodes))  # no node twice
    for c in clients:
        assert c.num_nodes > 0 and bool((owner[c.nodes] == c.client).all())


@pytest.mark.parametrize("method", ["louvain", "metis", "dirichlet"])
def test_seed_fixes_the_split(graph: Data, method: str) -> None:
    a = split_clients(graph, K, method, seed=7)  # type: ignore[arg-type]
    b = split_clients(graph, K, method, seed=7)  # type: ignore[arg-type]
    assert torch.equal(a, b)


def test_dirichlet_seed_changes_the_split(graph: Data) -> None:
    a = split_clients(graph, K, "dirichlet", seed=1)
    b = split_clients(graph, K, "dirichlet", seed=2)
    assert not torch.equal(a, b)


def test_louvain_keeps_more_edges_than_random(graph: Data) -> None:
    owner = split_clients(graph, K, "louvain", seed=0)
    louvain_cut = _cut_fraction(graph, owner)
    random_cut = _cut_fraction(graph, _random_owner_like(owner))
    assert louvain_cut < 0.5 * random_cut, (louvain_cut, random_cut)
    # The greedy balances sizes: no client over twice the mean.
    assert int(torch.bincount(owner).max()) <= 2 * math.ceil(graph.num_nodes / K)


def _cliques(*sizes: int) -> Data:
    """Disjoint cliques of the given sizes, both edge directions stored."""
    blocks, start = [], 0
    for size in sizes:
        blocks.append(torch.combinations(torch.arange(size)).t() + start)
        start += size
    ei = torch.cat(blocks, dim=1)
    return Data(edge_index=torch.cat([ei, ei.flip(0)], dim=1), num_nodes=start,
                y=torch.zeros(start, dtype=torch.long))


def test_louvain_keeps_communities_whole_when_it_can() -> None:
    owner = split_clients(_cliques(10, 10), 2, "louvain", seed=0)
    assert len(set(owner[:10].tolist())) == 1 and len(set(owner[10:].tolist())) == 1
    assert int(owner[0]) != int(owner[10])


@pytest.mark.parametrize("sizes, k", [((10, 10), 5), ((10,), 6), ((16, 3, 1), 4)])
def test_louvain_with_fewer_communities_than_clients(sizes: tuple[int, ...], k: int) -> None:
    g = _cliques(*sizes)
    owner = split_clients(g, k, "louvain", seed=0)
    counts = torch.bincount(owner, minlength=k)
    assert counts.numel() == k and bool((counts > 0).all())
    # Large communities are cut near N / K before the greedy: no client over twice that.
    assert int(counts.max()) <= 2 * math.ceil(g.num_nodes / k)


def test_metis_cut_below_random(graph: Data) -> None:
    owner = split_clients(graph, K, "metis", seed=0)
    assert _cut_fraction(graph, owner) < 0.5 * _cut_fraction(graph, _random_owner_like(owner))


def test_dirichlet_small_alpha_skews_labels_more(graph: Data) -> None:
    skewed = split_stats(graph, split_clients(graph, K, "dirichlet", seed=0, alpha=0.1))
    iid = split_stats(graph, split_clients(graph, K, "dirichlet", seed=0, alpha=100.0))
    assert skewed["label_tv_mean"] > iid["label_tv_mean"] + 0.2
    assert iid["label_tv_mean"] < 0.15


def test_dirichlet_never_leaves_a_client_small() -> None:
    # 2 classes, 8 clients, tiny alpha: most draws leave clients empty; the fallback fills them.
    g = make_csbm(SyntheticConfig(num_nodes=200, num_classes=2, avg_degree=4.0, feature_dim=4))
    owner = split_clients(g, 8, "dirichlet", seed=0, alpha=0.01)
    assert int(torch.bincount(owner, minlength=8).min()) >= min(10, 200 // 8)


def test_client_edges_are_the_induced_subgraph(graph: Data) -> None:
    owner = split_clients(graph, K, "louvain", seed=0)
    for c in build_clients(graph, owner):
        expected, _ = subgraph(c.nodes, graph.edge_index, relabel_nodes=True,
                               num_nodes=graph.num_nodes)
        assert torch.equal(c.edge_index, expected)
        assert torch.equal(c.x, graph.x[c.nodes]) and torch.equal(c.y, graph.y[c.nodes])
        assert torch.equal(c.train_mask, graph.train_mask[c.nodes])
        assert torch.equal(c.test_mask, graph.test_mask[c.nodes])


def test_local_and_cross_edges_account_for_every_edge(graph: Data) -> None:
    owner = split_clients(graph, K, "dirichlet", seed=0)
    clients = build_clients(graph, owner)
    pairs = []
    for c in clients:
        pairs.append(torch.stack([c.nodes[c.edge_index[0]], c.nodes[c.edge_index[1]]]))
        src, dst_local = c.cross_edges
        pairs.append(torch.stack([src, c.nodes[dst_local]]))
        assert bool((owner[src] != c.client).all())
        assert torch.equal(c.cross_src_client, owner[src])
        back = torch.tensor([int(clients[o].nodes[i]) for o, i in
                             zip(c.cross_src_client.tolist(), c.cross_src_local.tolist())],
                            dtype=torch.long)
        assert torch.equal(back, src)
    n = graph.num_nodes
    got = torch.sort(torch.cat(pairs, 1)[0] * n + torch.cat(pairs, 1)[1]).values
    want = torch.sort(graph.edge_index[0] * n + graph.edge_index[1]).values
    assert torch.equal(got, want)  # the same multiset: nothing lost, nothing counted twice
    cut = int((owner[graph.edge_index[0]] != owner[graph.edge_index[1]]).sum())
    assert sum(c.num_cross for c in clients) == cut


def test_split_stats_numbers() -> None:
    # 6 nodes, clients {0,1,2} and {3,4,5}; directed edges 0->1, 1->2, 2->3, 3->4, 5->0.
    ei = torch.tensor([[0, 1, 2, 3, 5], [1, 2, 3, 4, 0]])
    y = torch.tensor([0, 0, 1, 1, 1, -1])
    train = torch.tensor([True, False, True, False, False, False])
    g = Data(edge_index=ei, y=y, num_nodes=6, x=torch.zeros(6, 1), train_mask=train)
    owner = torch.tensor([0, 0, 0, 1, 1, 1])
    s = split_stats(g, owner)
    assert [r["nodes"] for r in s["per_client"]] == [3, 3]
    assert [r["local_edges"] for r in s["per_client"]] == [2, 1]      # 0->1,1->2 | 3->4
    assert [r["cross_in_edges"] for r in s["per_client"]] == [1, 1]   # 5->0 | 2->3
    assert [r["train"] for r in s["per_client"]] == [2, 0]
    assert s["cross_edge_fraction"] == pytest.approx(2 / 5)
    # Global labels (labelled nodes only): 2x class 0, 3x class 1 -> (0.4, 0.6).
    # Client 0: (2/3, 1/3): TV = 0.5 * (|2/3-0.4| + |1/3-0.6|) = 4/15; client 1: (0, 1): 0.4.
    assert s["per_client"][0]["label_tv"] == pytest.approx(4 / 15)
    assert s["per_client"][1]["label_tv"] == pytest.approx(0.4)
    assert s["label_tv_mean"] == pytest.approx((4 / 15 + 0.4) / 2)


# ---------------------------------------------------------------------------- file


def test_file_formats_agree(graph: Data, tmp_path: Path) -> None:
    n = graph.num_nodes
    ids = torch.randint(0, K, (n,), generator=torch.Generator().manual_seed(0))
    ids[:K] = torch.arange(K)
    np.save(tmp_path / "m.npy", ids.numpy())
    torch.save(ids, tmp_path / "m.pt")
    rows = "\n".join(f"{v},{int(ids[v])}" for v in torch.randperm(n).tolist())  # any row order
    (tmp_path / "m.csv").write_text("node,client\n" + rows + "\n")
    for name in ("m.npy", "m.pt", "m.csv"):
        got = split_clients(graph, K, "file", seed=0, path=str(tmp_path / name))
        assert torch.equal(got, ids), name


@pytest.mark.parametrize("case, error, match", [
    ("short", DataError, "maps 5 nodes but the graph has 6"),
    ("negative", DataError, "node 2 is mapped to no client"),
    ("gap", DataError, "no node has client 1"),
    ("mismatch", ConfigError, "names 2 clients but clients = 3"),
    ("float", DataError, "not an integer"),
    ("csv_missing", DataError, "node 4 is mapped to no client"),
    ("csv_empty_cell", DataError, "node 1 is mapped to no client"),
    ("csv_duplicate", DataError, "node 0 appears in 2 rows"),
    ("csv_range", DataError, "names node 9, outside 0..5"),
    ("absent", DataError, "not found"),
    ("suffix", ConfigError, "must end in .npy, .pt or .csv"),
])
def test_file_errors(tmp_path: Path, case: str, error: type, match: str) -> None:
    n, k = 6, 3
    path = tmp_path / "m.npy"
    arrays = {"short": [0, 1, 2, 0, 1], "negative": [0, 1, -1, 2, 0, 1], "gap": [0, 2, 0, 2, 0, 2],
              "mismatch": [0, 1, 0, 1, 0, 1], "float": [0, 1.5, 2, 0, 1, 2]}
    texts = {"csv_missing": "0,0\n1,1\n2,2\n3,0\n5,1\n",
             "csv_empty_cell": "node,client\n0,0\n1,\n2,2\n3,0\n4,1\n5,1\n",
             "csv_duplicate": "0,0\n0,1\n1,1\n2,2\n3,0\n4,1\n5,2\n",
             "csv_range": "0,0\n1,1\n2,2\n3,0\n4,1\n9,2\n"}
    if case in arrays:
        np.save(path, np.array(arrays[case]))
    elif case in texts:
        path = tmp_path / "m.csv"
        path.write_text(texts[case])
    elif case == "absent":
        path = tmp_path / "nope.npy"
    else:
        path = tmp_path / "m.txt"
        path.write_text("0\n")
    with pytest.raises(error, match=match) as info:
        load_client_map(path, n, k)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- config


def test_split_config_validates() -> None:
    assert SplitConfig().method == "louvain"
    with pytest.raises(ConfigError, match="clients must be an int >= 2"):
        SplitConfig(clients=1)
    with pytest.raises(ConfigError, match="alpha must be > 0"):
        SplitConfig(method="dirichlet", alpha=0.0)
    with pytest.raises(ConfigError, match="alpha"):
        SplitConfig(alpha=float("nan"))
    with pytest.raises(ConfigError, match="needs path"):
        SplitConfig(method="file")
    with pytest.raises(ConfigError, match="only read with method = 'file'"):
        SplitConfig(method="metis", path="m.npy")
    with pytest.raises(ConfigError, match="federated.split.clients"):
        from_dict(SplitConfig, {"clients": 0}, path="federated.split")
    with pytest.raises(ConfigError, match="'spectral' is not one of"):
        from_dict(SplitConfig, {"method": "spectral"})


def test_split_from_config_and_too_many_clients(graph: Data) -> None:
    cfg = SplitConfig(method="metis", clients=3, seed=2)
    assert torch.equal(split_from_config(graph, cfg), split_clients(graph, 3, "metis", seed=2))
    with pytest.raises(ConfigError, match="cannot split 600 nodes into 601 clients"):
        split_clients(graph, 601, "louvain", seed=0)


def test_build_clients_returns_client_data(graph: Data) -> None:
    owner = torch.arange(graph.num_nodes) % 3
    clients = build_clients(graph, owner)
    assert all(isinstance(c, ClientData) for c in clients)
    assert [c.client for c in clients] == [0, 1, 2]
    assert torch.equal(clients[1].nodes, torch.arange(1, graph.num_nodes, 3))


# ------------------------------------------------------------------------- fairness


def _tiny_fairness_case() -> dict:
    """Hand-built: 3 clients; client 2 has nodes but no test nodes.

    client 0: test nodes 0..3 with degrees 1,2,3,4; correct on 0,1,2 (3/4)
    client 1: test nodes 4..7 with degrees 5,6,7,8; correct on 4 only (1/4)
    client 2: nodes 8, 9, not in the test mask (degree 9, 10).
    """
    y = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1, 0, 1])
    pred = y.clone()
    pred[3] = 0  # client 0: one miss
    pred[5], pred[6], pred[7] = 0, 1, 0  # client 1: three misses
    test = torch.tensor([True] * 8 + [False] * 2)
    owner = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    degree = torch.arange(1, 11)
    return dict(pred=pred, y=y, test_mask=test, owner=owner, degree=degree)


def test_fairness_report_tiny_example() -> None:
    case = _tiny_fairness_case()
    r = fairness_report(**case, bytes_by_client={0: 100, 1: 300, 2: 50})
    accs = [row["accuracy"] for row in r["clients"]]
    assert accs == [0.75, 0.25, None]  # client 2: "no test nodes", not 0
    assert r["clients_without_test"] == [2]
    assert r["accuracy_overall"] == pytest.approx(4 / 8)
    assert r["accuracy_mean"] == pytest.approx(0.5)
    assert r["accuracy_spread"] == pytest.approx(0.5)
    assert r["accuracy_std"] == pytest.approx(0.25)  # population std of {0.75, 0.25}
    assert r["worst_client"] == {"client": 1, "accuracy": 0.25}
    assert r["worst10_clients"] == 1 and r["worst10_mean"] == pytest.approx(0.25)
    # Test-node degrees 1..8: linear quantiles 1 + 7p -> 2.75, 4.5, 6.25, so the
    # quartiles are nodes {0,1}, {2,3}, {4,5}, {6,7}; the correct nodes are 0, 1, 2, 4.
    q = r["degree_quartiles"]
    assert [row["test_nodes"] for row in q] == [2, 2, 2, 2]
    assert [row["accuracy"] for row in q] == [1.0, 0.5, 0.5, 0.0]
    assert [row["upper"] for row in q] == pytest.approx([2.75, 4.5, 6.25, 8.0])
    assert q[0]["lower"] == 1.0 and q[0]["range"] == "[1, 2.75]" and q[3]["range"] == "(6.25, 8]"
    # Per class: class 0 test nodes 0,2,4,6 -> correct 0,2,4 ; class 1 nodes 1,3,5,7 -> 1.
    assert {row["class"]: row["accuracy"] for row in r["classes"]} == {0: 0.75, 1: 0.25}
    assert [row["bytes"] for row in r["clients"]] == [100, 300, 50]
    assert r["bytes_total"] == 450 and r["bytes_max"] == 300
    md = fairness_markdown(r)
    assert "| 2 | 0 | no test nodes | 50 |" in md and "| Q1 | [1, 2.75] | 2 | 1.0000 |" in md


def test_fairness_worst_ten_percent_from_definition() -> None:
    # 23 clients with random test accuracies, client 5 without test nodes; the expected
    # values are recomputed here from the definitions with plain Python loops.
    gen = torch.Generator().manual_seed(0)
    n_clients, per = 23, 12
    owner = torch.arange(n_clients).repeat_interleave(per)
    n = owner.numel()
    y = torch.randint(0, 3, (n,), generator=gen)
    pred = torch.where(torch.rand(n, generator=gen) < torch.rand(n_clients, generator=gen)[owner],
                       y, (y + 1) % 3)
    test = torch.rand(n, generator=gen) < 0.7
    test[owner == 5] = False
    degree = torch.randint(0, 20, (n,), generator=gen)
    r = fairness_report(pred, y, test, owner, degree, None)
    accs = {}
    for c in range(n_clients):
        idx = [i for i in range(n) if owner[i] == c and test[i]]
        if idx:
            accs[c] = sum(int(pred[i] == y[i]) for i in idx) / len(idx)
    assert 5 not in accs and r["clients"][5]["accuracy"] is None
    m = len(accs)  # 22 -> the worst 2 clients
    worst_two = sorted(accs.values())[:2]
    assert r["worst10_clients"] == 2 == max(1, m // 10)
    assert r["worst10_mean"] == pytest.approx(sum(worst_two) / 2)
    assert r["worst_client"]["accuracy"] == pytest.approx(min(accs.values()))
    assert r["accuracy_mean"] == pytest.approx(float(np.mean(list(accs.values()))))
    assert r["accuracy_std"] == pytest.approx(float(np.std(list(accs.values()))))
    # Quartile bins: numpy's quantiles, then counted by hand; every test node in one bin.
    d = [int(degree[i]) for i in range(n) if test[i]]
    q1, q2, q3 = np.quantile(d, [0.25, 0.5, 0.75])
    want = [sum(v <= q1 for v in d), sum(q1 < v <= q2 for v in d),
            sum(q2 < v <= q3 for v in d), sum(v > q3 for v in d)]
    assert [row["test_nodes"] for row in r["degree_quartiles"]] == want
    assert sum(want) == len(d) == r["test_nodes"]
    assert r["bytes_total"] is None and all(row["bytes"] is None for row in r["clients"])


def test_fairness_without_test_nodes() -> None:
    z = torch.zeros(4, dtype=torch.long)
    r = fairness_report(z, z, torch.zeros(4, dtype=torch.bool), torch.tensor([0, 0, 1, 1]), z, None)
    assert r["accuracy_mean"] is None and r["worst_client"] is None
    assert r["clients_without_test"] == [0, 1] and r["degree_quartiles"] == []
    assert "no test nodes" in fairness_markdown(r)


def test_louvain_memo_matches_a_fresh_run_and_keys_on_the_graph(graph: Data) -> None:
    from commgnn.federated import communities

    communities._COMMUNITIES.clear()
    first = split_clients(graph, K, "louvain", seed=1)
    assert len(communities._COMMUNITIES) == 1
    again = split_clients(graph, 2 * K, "louvain", seed=1)  # other clients, same communities: memo hit
    assert len(communities._COMMUNITIES) == 1
    communities._COMMUNITIES.clear()
    assert torch.equal(split_clients(graph, 2 * K, "louvain", seed=1), again)  # same as without the memo
    assert torch.equal(split_clients(graph, K, "louvain", seed=1), first)
    # A different graph of the same size (edges rewired) gets its own communities, not a stale entry.
    other = Data(edge_index=torch.stack([graph.edge_index[0], graph.edge_index[1].roll(7)]),
                 num_nodes=graph.num_nodes)
    split_clients(other, K, "louvain", seed=1)
    assert len(communities._COMMUNITIES) == 2
