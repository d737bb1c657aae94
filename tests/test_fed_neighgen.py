"""FedSage+-style missing-neighbour generation: the impaired graph, the feature loss, the
mending, a mended client, and a whole run (bytes, what the generator learns, refusals)."""

from __future__ import annotations

import itertools

import pytest
import torch

from commgnn.cli.main import main
from commgnn.data.config import DataConfig, SyntheticConfig
from commgnn.errors import ConfigError
from commgnn.federated.client import Client
from commgnn.federated.client_data import ClientData
from commgnn.federated.config import FedConfig, FederateConfig, FedRuntimeConfig, SplitConfig
from commgnn.federated.dp import DPConfig
from commgnn.federated.engine import Federation
from commgnn.federated.model import FedGCN, RowBlocks
from commgnn.models.graph import CSRPair
from commgnn.federated.secagg.config import SecAggConfig
from commgnn.federated.neighgen import (Generated, NeighGen, NeighGenConfig, feature_loss, impair, mend,
                                        train_generator)

DATA = DataConfig(dataset="synthetic", synthetic=SyntheticConfig(num_nodes=600, feature_dim=16, num_classes=4,
                                                                avg_degree=6))

pytestmark = pytest.mark.usefixtures("one_thread")


def client_data(n: int = 12, seed: int = 0) -> ClientData:
    """A random undirected subgraph of ``n`` nodes with distinct features, plus one edge in
    one direction only (so that a swapped source and target would show)."""
    g = torch.Generator().manual_seed(seed)
    pairs = [(u, v) for u, v in itertools.combinations(range(n), 2) if torch.rand(1, generator=g) < 0.3]
    one_way = [(u, v) for u in range(n) for v in range(n) if u != v and (u, v) not in pairs and (v, u) not in pairs][:1]
    edges = torch.tensor(pairs + [(v, u) for u, v in pairs] + one_way, dtype=torch.int64).t()
    mask = torch.zeros(n, dtype=torch.bool)
    empty = torch.zeros(2, 0, dtype=torch.int64)
    return ClientData(client=0, nodes=torch.arange(n), x=torch.randn(n, 5, generator=g), y=torch.zeros(n, dtype=torch.int64),
                      train_mask=~mask, val_mask=mask, test_mask=mask, edge_index=edges, cross_edges=empty,
                      cross_src_client=torch.zeros(0, dtype=torch.int64), cross_src_local=torch.zeros(0, dtype=torch.int64))


def test_the_impaired_graph_counts_each_nodes_hidden_neighbours():
    data = client_data()
    hidden = torch.rand(data.num_nodes, generator=torch.Generator().manual_seed(3)) < 0.3
    got = impair(data, 0.3, torch.Generator().manual_seed(3))
    keep = [i for i in range(data.num_nodes) if not hidden[i]]
    new = {old: k for k, old in enumerate(keep)}
    edges = data.edge_index.t().tolist()
    want = [sum(1 for u, v in edges if v == old and hidden[u]) for old in keep]
    assert got.missing.tolist() == want and got.adj.a.shape[0] == len(keep)
    # every (node left, hidden neighbour) pair points at the hidden node, whose features are the target
    pairs = sorted((new[v], u) for u, v in edges if hidden[u] and not hidden[v])
    assert sorted(zip(got.pair_node.tolist(), got.pair_src.tolist())) == pairs
    assert got.features is data.x  # a reference, not a copy


def test_the_feature_loss_matches_each_slot_to_its_nearest_hidden_neighbour():
    g = torch.Generator().manual_seed(0)
    generated = torch.randn(3, 2, 4, generator=g)  # 3 nodes, 2 slots, 4 features
    missing = torch.tensor([2.0, 1.0, 0.0, 3.0])  # node 3 is not in the batch
    nodes = torch.tensor([0, 1, 2])
    pair_node = torch.tensor([0, 0, 1, 3])
    pair_feat = torch.randn(4, 4, generator=g)
    terms = []
    for b, v in enumerate(nodes.tolist()):
        mine = [pair_feat[p] for p in range(4) if pair_node[p] == v]
        for j in range(min(int(missing[v]), 2)):
            terms.append(min(float(((generated[b, j] - f) ** 2).sum()) / 4 for f in mine))
    assert float(feature_loss(generated, nodes, missing, pair_node, pair_feat)) == pytest.approx(sum(terms) / len(terms),
                                                                                                rel=1e-5)
    # more hidden neighbours than batch rows takes the other branch of the distance: same value
    many = torch.cat([pair_node, torch.zeros(3, dtype=torch.int64)])
    feats = torch.cat([pair_feat, pair_feat[:1].repeat(3, 1)])  # duplicates of node 0's first neighbour
    assert float(feature_loss(generated, nodes, missing, many, feats)) == pytest.approx(sum(terms) / len(terms),
                                                                                        rel=1e-5)
    # a generator that reproduces the hidden neighbours exactly costs nothing
    perfect = torch.stack([torch.stack([pair_feat[0], pair_feat[1]]), pair_feat[2][None].repeat(2, 1),
                           torch.zeros(2, 4)])
    assert float(feature_loss(perfect, nodes, missing, pair_node, pair_feat)) == pytest.approx(0.0, abs=1e-12)


def test_mending_adds_the_predicted_number_of_neighbours_both_ways():
    data = client_data()
    cfg = NeighGenConfig(num_pred=3)
    model = NeighGen(5, cfg)
    client = Client(data, FedConfig(), global_degree=None)
    with torch.no_grad():
        model.degree.weight.zero_()
        for bias, per_node in ((50.0, 3), (-50.0, 0), (1.0, 1)):  # softplus(1) = 1.31 -> 1
            model.degree.bias.fill_(bias)
            params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            extra = mend(model, params, data, client.x_op, client.adj, cfg.num_pred)
            n, g = data.num_nodes, data.num_nodes * per_node
            assert extra.num_nodes == g and extra.x.shape == (g, 5)
            new, owner = extra.edge_index[:, :g]
            assert new.tolist() == list(range(n, n + g))
            assert owner.tolist() == [v for v in range(n) for _ in range(per_node)]
            assert torch.equal(extra.edge_index[:, g:], extra.edge_index[:, :g].flip(0))
            # generated features stay in the range of the client's own
            assert g == 0 or (extra.x.min() >= data.x.min() and extra.x.max() <= data.x.max())


def test_a_mended_client_keeps_its_sparse_rows_sparse():
    data = client_data()
    sparse_x = torch.zeros(12, 40)
    sparse_x[torch.arange(12), torch.arange(12)] = 1.0  # 2.5% dense: the CSR path
    data = ClientData(**{**data.__dict__, "x": sparse_x})
    extra = Generated(x=torch.rand(2, 40), edge_index=torch.tensor([[12, 13, 0, 5], [0, 5, 12, 13]]))
    mended = Client(data, FedConfig(), global_degree=None, generated=extra)
    assert isinstance(mended.x_op, RowBlocks) and isinstance(mended.x_op.head, CSRPair)
    torch.manual_seed(0)
    model = FedGCN(40, 8, 3, 0.0)
    dense = torch.cat([sparse_x, extra.x]) @ model.w1
    assert torch.allclose(model.embed(mended.x_op), dense, atol=1e-6)


def test_a_mended_client_aggregates_its_generated_nodes_but_learns_and_predicts_only_its_own():
    data = client_data()
    extra = Generated(x=torch.full((2, 5), 7.0), edge_index=torch.tensor([[12, 13, 0, 5], [0, 5, 12, 13]]))
    plain, mended = (Client(data, FedConfig(), global_degree=None, generated=e) for e in (None, extra))
    assert mended.adj.a.shape[0] == 14 and mended.num_real == 12
    torch.manual_seed(0)
    model = FedGCN(5, 8, 3, 0.0)
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert mended.predict(model, start, None).shape == (12,)
    # the generated rows change the real nodes' aggregation, hence the update
    u_plain, _ = plain.train(model, start, cross=None, gen=torch.Generator())
    u_mended, _ = mended.train(model, start, cross=None, gen=torch.Generator())
    assert not torch.allclose(u_plain, u_mended)


def _cfg(**kw) -> FederateConfig:
    return FederateConfig(data=DATA, split=SplitConfig(method="metis", clients=4),
                          federated=FedConfig(rounds=kw.pop("rounds", 3), **kw.pop("fed", {})),
                          runtime=FedRuntimeConfig(threads=1), **kw)


@pytest.mark.timeout(120)
def test_a_neighgen_run_counts_the_generator_bytes_and_learns_the_missing_degree():
    plain = Federation(_cfg()).run()
    fed = Federation(_cfg(neighgen=NeighGenConfig(enabled=True, rounds=6)))
    out = fed.run()
    rep = out["neighgen"]
    dim, clients = rep["generator_params"], 4
    # each generator round: every client uploads its fp32 update and downloads the generator
    assert rep["uplink_bytes"] == 6 * clients * dim * 4 == rep["downlink_bytes"]
    assert out["uplink_bytes_total"] == plain["uplink_bytes_total"] + rep["uplink_bytes"]
    assert rep["degree_mae"] < rep["degree_mae_constant"]  # better than predicting the mean
    assert rep["generated_nodes"] == sum(c.adj.a.shape[0] - c.num_real for c in fed.clients.values()) > 0
    # under secure aggregation the generator's updates are masked like the classifier's, and the
    # masked sum decodes to the plain one (fixed point 2^-16): the same generator, the same mending
    runs = {}
    for secure in (False, True):
        fed = Federation(_cfg(neighgen=NeighGenConfig(enabled=True, rounds=2), secagg=SecAggConfig(enabled=secure)))
        runs[secure] = (fed.run()["neighgen"], fed)
    sec, plain_ng = runs[True][0], runs[False][0]
    assert sec["uplink_bytes"] > plain_ng["uplink_bytes"] == 2 * clients * dim * 4
    assert sec["degree_mae"] == pytest.approx(plain_ng["degree_mae"], rel=1e-3)
    assert sec["generated_nodes"] == plain_ng["generated_nodes"]


def test_the_generator_is_trained_by_fedavg_over_the_clients():
    """Each round sums the clients' local updates weighted by their node counts, and the
    generator moves by that sum (clients of 12 and 30 nodes: weights far from equal)."""
    from commgnn.federated.neighgen import local_update
    from commgnn.federated.model import flat_params

    data = {0: client_data(n=12, seed=0), 1: client_data(n=30, seed=1)}
    cfg = NeighGenConfig(rounds=3, local_steps=2)
    calls, sums = [], []

    def summed(r, updates):
        calls.append((r, {c: u.clone() for c, u in updates.items()}))
        sums.append(sum(updates.values()))
        return sums[-1]

    gens = {c: torch.Generator().manual_seed(c) for c in data}
    _, params, rep = train_generator(data, 5, cfg, seed=0, gens=gens, summed=summed)
    assert [(r, sorted(u)) for r, u in calls] == [(0, [0, 1]), (1, [0, 1]), (2, [0, 1])]
    assert rep["loss"] >= 0
    # round 0 by hand: the same initial generator, impaired graphs and local steps
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = NeighGen(5, cfg)
    start = flat_params(model)
    again = {c: torch.Generator().manual_seed(c) for c in data}
    impaired = {c: impair(d, cfg.hidden_fraction, again[c]) for c, d in data.items()}
    sizes = {c: float(d.missing.numel()) for c, d in impaired.items()}
    assert sizes[0] != sizes[1]
    for c, d in impaired.items():
        delta, _ = local_update(model, start, d, cfg, again[c])
        torch.testing.assert_close(calls[0][1][c], delta * sizes[c] / sum(sizes.values()))
    torch.testing.assert_close(params, start + sum(sums))  # it moved by exactly the summed updates
    assert not torch.equal(params, start)


@pytest.mark.parametrize("kw, message", [
    ({"fed": {"cross_edges": "embeddings"}}, "cross_edges"),
    ({"fed": {"algorithm": "local"}}, "fedavg/fedprox"),
    ({"dp": DPConfig(noise_multiplier=1.0, noise_at="server")}, "DP accountant"),
])
def test_neighgen_refuses_what_it_cannot_do(kw, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(neighgen=NeighGenConfig(enabled=True), **kw)


@pytest.mark.parametrize("kw, message", [({"hidden_fraction": 1.0}, "hidden_fraction"),
                                         ({"num_pred": 0}, "num_pred"), ({"lr": 0.0}, "lr")])
def test_bad_neighgen_settings_are_one_line(kw, message):
    with pytest.raises(ConfigError, match=message):
        NeighGenConfig(**kw)


def test_the_cli_flag_needs_its_mode(tmp_path, capsys):
    code = main(["federate", "--dataset", "synthetic", "--neighgen-rounds", "3", "--out", str(tmp_path / "r")])
    assert code == 2 and "--neighgen-rounds applies with --neighgen" in capsys.readouterr().err
