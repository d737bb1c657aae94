"""The federated round engine: placement parity, secure sums inside training, the policy
gate over a whole run, DP accounting in a run, the cross-client embedding term, anchors."""

from __future__ import annotations

import pytest
import torch

from commgnn.data.config import DataConfig, SyntheticConfig
from commgnn.errors import ConfigError
from commgnn.federated.config import (FedConfig, FederateConfig, FedRuntimeConfig, PolicyRef, SplitConfig,
                                      UplinkConfig)
from commgnn.federated.dp import DPConfig
from commgnn.federated.engine import Federation
from commgnn.federated.policy import PolicyViolation
from commgnn.api.federate import federate as _federate
from commgnn.federated.secagg.config import SecAggConfig
from commgnn.models.graph import CSRPair

DATA = DataConfig(dataset="synthetic", synthetic=SyntheticConfig(num_nodes=600, feature_dim=16, num_classes=4,
                                                                avg_degree=6))


def cfg(**kw) -> FederateConfig:
    fed = kw.pop("fed", {})
    runtime = kw.pop("runtime", FedRuntimeConfig(threads=1))
    return FederateConfig(data=DATA, split=kw.pop("split", SplitConfig(method="metis", clients=4)),
                          federated=FedConfig(rounds=kw.pop("rounds", 4), **fed), runtime=runtime, **kw)


pytestmark = pytest.mark.usefixtures("one_thread")


def federate(c: FederateConfig, out) -> dict:
    """A run through the shared runner (its folder ``out``): the summary with the curve."""
    res = _federate(config=c, out=out)
    return {**res.summary, "curve": res.curve}


def params_count(c: FederateConfig) -> int:
    f, h, k = 16, c.federated.hidden, 4
    return f * h + h + h * k + k


@pytest.mark.timeout(120)
def test_three_ranks_equal_one_process_with_secure_aggregation(tmp_path):
    """Rank 0 as server and clients on ranks 1-2 give the very run of one process: the
    same accuracy curve and the same bytes (every client draws from its own generator)."""
    # a clip below some update values, so that the clamped counts are not 0 == 0
    sec = SecAggConfig(enabled=True, clip=1e-3)
    one = federate(cfg(secagg=sec), tmp_path / "one")
    three = federate(cfg(secagg=sec, runtime=FedRuntimeConfig(parts=3, threads=1)), tmp_path / "three")
    assert [r["val_acc"] for r in one["curve"]] == [r["val_acc"] for r in three["curve"]]
    assert one["uplink_bytes_total"] == three["uplink_bytes_total"] > 0
    assert three["ranks"] == 3 and one["ranks"] == 1
    assert one["uplink_clamped_values"] == three["uplink_clamped_values"] > 0  # gathered from the client ranks


def test_secure_sum_trains_like_the_plain_sum_and_costs_key_bytes():
    plain = Federation(cfg()).run()
    sec = Federation(cfg(secagg=SecAggConfig(enabled=True))).run()
    # fixed point at 2^-16 per coordinate: the same predictions round by round
    assert [r["val_acc"] for r in sec["curve"]] == pytest.approx([r["val_acc"] for r in plain["curve"]], abs=0.01)
    d, rounds, clients = params_count(cfg()), 4, 4
    assert plain["uplink_bytes_total"] == rounds * clients * d * 4
    # the masked payload is the 32-bit ring element per coordinate; keys, shares and unmasking come on top
    assert sec["uplink_payload_bytes_total"] == rounds * clients * (d * 32 // 8)
    assert sec["uplink_bytes_total"] > sec["uplink_payload_bytes_total"]


def test_compressed_secure_uplink_is_smaller_and_still_learns():
    base = Federation(cfg(rounds=8)).run()
    small = Federation(cfg(rounds=8, secagg=SecAggConfig(enabled=True),
                           uplink=UplinkConfig(codec="quant", bits=4))).run()
    d = params_count(cfg())
    # 4-bit codes in a ring of 4 + ceil(log2 4) = 6 bits
    assert small["uplink_payload_bytes_total"] == 8 * 4 * ((d * 6 + 7) // 8)
    assert small["uplink_payload_bytes_total"] * 5 < base["uplink_bytes_total"]
    assert small["test_acc"] > 0.5  # four classes: chance is 0.25


def _trained(c: FederateConfig) -> tuple[torch.Tensor, dict]:
    """The final global model (flat) and the run's summary."""
    fed = Federation(c)
    out = fed.run()
    return torch.cat([p.detach().flatten() for p in fed.model.parameters()]), out


@pytest.mark.timeout(120)
def test_dp_noise_is_secret_unless_reproducible_noise_is_asked_for():
    """With the run's seed in config.toml, seeded noise could be regenerated and subtracted:
    by default two runs of one config must differ by their noise alone, and only
    ``reproducible_noise`` repeats a run bit for bit (and says it is not private)."""
    def run(noise_at: str, reproducible: bool) -> tuple[torch.Tensor, dict]:
        return _trained(cfg(rounds=3, dp=DPConfig(noise_multiplier=1.0, clip=0.5, noise_at=noise_at,
                                                  reproducible_noise=reproducible),
                            secagg=SecAggConfig(enabled=True)))
    for at in ("clients", "server"):
        a, out_a = run(at, False)
        b, _ = run(at, False)
        assert not torch.equal(a, b), at
        assert out_a["dp"]["noise"].startswith("secret")
        r1, out_r = run(at, True)
        r2, _ = run(at, True)
        assert torch.equal(r1, r2), at
        assert "not private" in out_r["dp"]["noise"]
    # without DP nothing is noised: runs repeat exactly
    assert torch.equal(*(_trained(cfg(rounds=2, secagg=SecAggConfig(enabled=True)))[0] for _ in range(2)))


def test_a_client_missing_from_a_dp_secure_sum_stops_the_run(monkeypatch):
    """Each client carries 1/K of the noise; a sum without one would be under-noised."""
    import commgnn.federated.engine as engine

    real = engine.secure_sum

    def lossy(*args, **kw):
        total, stats = real(*args, **kw)
        if stats is not None and kw.get("dim", 0) > 1:  # the update's sum, not the clip count's
            stats.survivors = tuple(stats.survivors)[1:]
        return total, stats

    monkeypatch.setattr(engine, "secure_sum", lossy)
    with pytest.raises(ConfigError, match="dropped out of the secure sum under DP"):
        Federation(cfg(rounds=2, dp=DPConfig(noise_multiplier=1.0), secagg=SecAggConfig(enabled=True))).run()


def test_an_adaptive_count_that_would_wrap_its_ring_is_refused():
    with pytest.raises(ConfigError, match="overflow"):
        Federation(cfg(dp=DPConfig(noise_multiplier=1.0, adaptive_clip=True, count_stddev=5000.0),
                       secagg=SecAggConfig(enabled=True)))


def test_dp_run_reports_its_budget():
    out = Federation(cfg(rounds=5, dp=DPConfig(epsilon=4.0, clip=0.5), secagg=SecAggConfig(enabled=True))).run()
    assert 3.0 < out["epsilon"] <= 4.0 + 1e-6 and out["delta"] == 1e-5
    assert out["dp"]["protected_unit"].startswith("one client")
    # half the clients a round: the accountant charges the real rate K / n = 2 / 4
    half = Federation(cfg(rounds=5, dp=DPConfig(noise_multiplier=1.0), secagg=SecAggConfig(enabled=True),
                          fed={"participation": 0.4})).run()
    assert half["dp"]["sample_rate"] == pytest.approx(0.5)
    # noise shares at the clients need the masking; error feedback would re-send noised updates
    with pytest.raises(ConfigError, match="secure-agg"):
        cfg(dp=DPConfig(epsilon=4.0))
    with pytest.raises(ConfigError, match="error feedback"):
        cfg(dp=DPConfig(epsilon=4.0), secagg=SecAggConfig(enabled=True), uplink=UplinkConfig(codec="rank"))


def test_policy_gate_sees_every_payload_and_nothing_forbidden_crosses(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[[organisation]]\nname = "bank-a"\nclients = [0, 1]\n'
                      '[[organisation]]\nname = "bank-b"\nclients = [2, 3]\n'
                      '[crossing]\nembeddings = "quantised"\nembedding_max_bits = 8\nupdates = "secure_aggregation"\n')
    c = cfg(secagg=SecAggConfig(enabled=True), policy=PolicyRef(path=str(policy)),
            fed={"cross_edges": "embeddings", "embedding_bits": 8})
    fed = Federation(c)
    out = fed.run()
    sent = fed.gate.transcript
    assert {p.kind for p in sent} == {"update", "embeddings", "evaluation"} and out["embedding_bytes_total"] > 0
    org = fed.policy.organisation_of
    for p in sent:
        assert p.kind != "raw_features"
        crossing = p.dst == "server" or org(p.src_client) != org(p.dst)
        if p.kind == "update":
            assert p.secure
        if p.kind == "embeddings" and crossing:
            assert p.bits is not None and p.bits <= 8
    assert sum(p.nbytes for p in sent if p.kind == "update") == out["uplink_bytes_total"]
    # evaluation's traffic passes the same gate and is counted apart from training's: one
    # byte per node for the predicted classes at each evaluation, plus its embedding rows
    evals = len(out["curve"])
    predictions = evals * fed.graph.num_nodes
    eval_rows = out["evaluation_bytes_total"] - predictions
    assert sum(p.nbytes for p in sent if p.kind == "evaluation") == predictions
    assert eval_rows > 0 and eval_rows % evals == 0  # the same rows at every evaluation
    assert sum(p.nbytes for p in sent if p.kind == "embeddings") == out["embedding_bytes_total"] + eval_rows
    # the same policy refuses a plan that would send fp32 embeddings, before any training
    with pytest.raises(ConfigError):
        Federation(cfg(secagg=SecAggConfig(enabled=True), policy=PolicyRef(path=str(policy)),
                       fed={"cross_edges": "embeddings", "embedding_bits": 32}))
    # ... and plain updates
    with pytest.raises(ConfigError, match="secure"):
        Federation(cfg(policy=PolicyRef(path=str(policy))))


def test_gate_stops_a_payload_over_budget(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[crossing]\nupdates = "plain"\n[budget]\nper_link_mb = 0.002\n')
    with pytest.raises(PolicyViolation, match="budget"):
        Federation(cfg(policy=PolicyRef(path=str(policy)))).run()


def test_cross_embeddings_in_fp32_make_the_model_exact():
    """With every cross edge's fp32 embeddings (both layers), each client's model equals
    the whole graph's GCN on its rows; with the edges dropped it does not."""
    import torch.nn.functional as F

    fed = Federation(cfg(fed={"cross_edges": "embeddings", "embedding_bits": 32}))
    g, m = fed.graph, fed.model
    params = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    cross = fed._cross_terms(params, None)
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    ei, w = gcn_norm(g.edge_index, num_nodes=g.num_nodes, add_self_loops=True)  # PyG's operator, independent of ours
    adj = torch.sparse_coo_tensor(ei.flip(0), w, (g.num_nodes, g.num_nodes))
    with torch.no_grad():
        full = adj @ (F.relu(adj @ (g.x @ m.w1) + m.b1) @ m.w2) + m.b2
        m.eval()
        for c, client in fed.clients.items():
            torch.testing.assert_close(m(client.data.x, client.adj, cross[c]), full[client.data.nodes],
                                       atol=1e-5, rtol=1e-5)
        dropped = Federation(cfg())
        client = dropped.clients[0]
        assert not torch.allclose(m(client.data.x, client.adj), full[client.data.nodes], atol=1e-3)


def test_sparse_features_train_like_dense_ones():
    """Bag-of-words features go through a sparse X W1 (forward and W1's gradient): the same
    update as the dense product."""
    from commgnn.data import load_dataset

    graph = load_dataset(DATA)
    graph.x = (graph.x > 1.5).float()  # ~7% ones, like a bag of words
    fed = Federation(cfg(), graph=graph)
    client = next(c for c in fed.clients.values() if isinstance(c.x_op, CSRPair))
    start = torch.cat([p.detach().reshape(-1) for p in fed.model.parameters()])
    sparse, _ = client.train(fed.model, start, cross=None, gen=torch.Generator().manual_seed(3))
    client.x_op = client.data.x
    dense, _ = client.train(fed.model, start, cross=None, gen=torch.Generator().manual_seed(3))
    torch.testing.assert_close(sparse, dense, atol=1e-5, rtol=1e-4)
    assert sparse.abs().sum() > 0


def test_anchors_and_robust_rules_run():
    central = Federation(cfg(rounds=6, fed={"algorithm": "central"})).run()
    local = Federation(cfg(rounds=6, fed={"algorithm": "local"})).run()
    median = Federation(cfg(rounds=6, fed={"aggregator": "median"})).run()
    assert central["uplink_bytes_total"] == local["uplink_bytes_total"] == 0
    assert median["uplink_bytes_total"] == 6 * 4 * params_count(cfg()) * 4
    for out in (central, local, median):
        assert out["test_acc"] > 0.4 and out["worst_client_acc"] is not None


def test_a_robust_rule_bounds_a_forging_client_in_training():
    """One of five clients sends -10x its update: the mean collapses; the median loses far
    less against its own attack-free run (on non-IID METIS clients the median itself costs
    accuracy even without an attack: a known price of coordinate-wise rules)."""
    five = SplitConfig(method="metis", clients=5)
    run = lambda **fed: Federation(cfg(rounds=6, split=five, fed=fed)).run()["test_acc"]  # noqa: E731
    honest, attacked = run(), run(byzantine=1)
    median, median_attacked = run(aggregator="median"), run(byzantine=1, aggregator="median")
    assert attacked < honest - 0.3
    assert median_attacked > attacked + 0.1
    assert median - median_attacked < (honest - attacked) / 2


def test_config_refuses_what_cannot_work():
    with pytest.raises(ConfigError, match="secure aggregation"):
        cfg(secagg=SecAggConfig(enabled=True), fed={"aggregator": "krum"})
    with pytest.raises(ConfigError, match="sends no updates"):
        cfg(secagg=SecAggConfig(enabled=True), fed={"algorithm": "local"})
    with pytest.raises(ConfigError, match="one process"):
        Federation(cfg(fed={"algorithm": "local"}), ctx=_FakeCtx())
    with pytest.raises(ConfigError, match="not covered by the DP accountant"):  # the guarantee would not hold
        cfg(secagg=SecAggConfig(enabled=True), dp=DPConfig(noise_multiplier=1.0),
            fed={"cross_edges": "embeddings", "embedding_noise": 0.5})


class _FakeCtx:
    """Only what Transport reads: a two-rank world (the check fires before any collective)."""

    world_size, rank, group = 2, 0, None


def _adaptive(secure: bool, **dp) -> FederateConfig:
    return cfg(rounds=10, fed={"eval_every": 1},
               dp=DPConfig(noise_multiplier=0.05, adaptive_clip=True, clip=50.0, count_stddev=0.05, clip_lr=0.5,
                           noise_at="server", reproducible_noise=True, **dp),
               secagg=SecAggConfig(enabled=secure))


@pytest.mark.timeout(120)
def test_adaptive_clipping_in_a_run_shrinks_the_clip_and_splits_the_noise():
    fed = Federation(_adaptive(True))
    # the accountant is charged the total z; the updates get z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2
    assert fed.accountant.noise_multiplier == 0.05
    assert fed.sigma == pytest.approx((0.05 ** -2 - 0.1 ** -2) ** -0.5)
    sec = fed.run()
    clips = [r["clip"] for r in sec["curve"]]
    # every update norm is far below 50, so nearly every bit is 1 and C falls by about
    # exp(-0.5 (1 - 0.5)) a round until it nears the median norm
    assert clips[0] == pytest.approx(50 * 0.7788, rel=0.05) and clips[-1] < 10 and clips == sorted(clips, reverse=True)
    assert sec["dp"]["clip"] < 50 and sec["epsilon"] > 0
    # The count through its own secure sum decodes to the plain count (fixed point 2^-16):
    # the same clip trajectory as with the bits in the clear.
    plain = Federation(_adaptive(False)).run()
    assert clips == pytest.approx([r["clip"] for r in plain["curve"]], rel=1e-3)
    # and costs a secure sum's key material on top of the update's
    assert sec["uplink_bytes_total"] > Federation(cfg(rounds=10, fed={"eval_every": 1},
                                                     dp=DPConfig(noise_multiplier=0.05, clip=50.0, noise_at="server"),
                                                     secagg=SecAggConfig(enabled=True))).run()["uplink_bytes_total"]


def test_adaptive_clipping_never_exceeds_its_ceiling_and_refuses_a_small_count_noise():
    # norms far above the clip: every bit is 0 and C wants to grow, but stays at max_clip
    run = Federation(cfg(rounds=4, fed={"eval_every": 1},
                         dp=DPConfig(noise_multiplier=0.05, adaptive_clip=True, clip=1e-4, max_clip=2e-4,
                                     count_stddev=0.05, clip_lr=1.0),
                         secagg=SecAggConfig(enabled=True))).run()
    assert max(r["clip"] for r in run["curve"]) == pytest.approx(2e-4)
    with pytest.raises(ConfigError, match="count_stddev"):
        Federation(cfg(dp=DPConfig(noise_multiplier=1.0, adaptive_clip=True, count_stddev=0.1),
                       secagg=SecAggConfig(enabled=True)))


def test_the_count_noise_is_drawn_by_each_client_and_sums_to_the_stated_deviation():
    """Under secure aggregation each of the K clients adds N(0, sigma_b^2 / K) to its bit, so
    the released count carries N(0, sigma_b^2) and the server adds none of it."""
    fed = Federation(cfg(dp=DPConfig(noise_multiplier=1.0, adaptive_clip=True, clip=1.0, count_stddev=1.0,
                                     reproducible_noise=True),
                         secagg=SecAggConfig(enabled=True)))
    drawn = []
    real = fed.adaptive.count_noise

    def spy(n, generator=None, at="clients"):  # records who draws; the draw itself is the library's
        drawn.append(at)
        return real(n, generator, at)

    fed.adaptive.count_noise = spy
    active, norms, R = [0, 1, 2, 3], {0: 0.5, 1: 2.0, 2: 3.0, 3: 1.0}, 100
    counts = torch.tensor([fed._clipped_count(r, active, norms)[0] for r in range(R)], dtype=torch.float64)
    assert drawn == ["clients"] * len(active) * R
    # two clients within the clip; mean within 4 standard errors, deviation within ~4 of its own
    assert abs(float(counts.mean()) - 2.0) < 0.4, float(counts.mean())
    assert 0.7 < float(counts.std()) < 1.3, float(counts.std())


def test_the_secure_clipped_count_is_the_plain_count_with_centred_bits_and_noise_at_the_clients():
    fed = Federation(cfg(dp=DPConfig(noise_multiplier=1e-3, adaptive_clip=True, clip=1.0, count_stddev=1e-3),
                         secagg=SecAggConfig(enabled=True)))
    assert fed.cfg.dp.noise_at == "clients"
    active = [0, 1, 2, 3]
    norms = {0: 0.5, 1: 2.0, 2: 3.0, 3: 1.0}  # three bits 0 or 1 -> centred -1/2 and 1/2: negative ring sums
    count, summed = fed._clipped_count(0, active, norms)
    assert summed == 4 and count == pytest.approx(2.0, abs=0.01)  # two within the clip, plus noise of std 1e-3
    count, _ = fed._clipped_count(1, active, {c: 5.0 for c in active})  # all clipped: the ring sum is -2
    assert count == pytest.approx(0.0, abs=0.01)
    report = Federation(cfg(rounds=2, dp=DPConfig(noise_multiplier=0.05, adaptive_clip=True, count_stddev=0.05),
                            secagg=SecAggConfig(enabled=True))).run()["dp"]["adaptive_clip"]
    assert report["ceiling"] == 1.0 and report["update_noise_multiplier"] > 0.05


def test_fedavg_weights_and_the_fedprox_step():
    """FedAvg weighs client c by ``K n_c / sum n``; DP and robust rules force equal weights.
    FedProx's proximal term ``mu/2 ||w - w_0||^2`` adds ``mu (w - w_0)`` to the gradient: its
    first local step equals FedAvg's, and its second differs by exactly ``-lr mu Delta_1``."""
    from commgnn.federated.model import flat_params

    fed = Federation(cfg())
    n = fed.num_train[[0, 1, 2, 3]].float()
    assert list(fed._weights([0, 1, 2, 3]).values()) == pytest.approx((4 * n / n.sum()).tolist())
    assert len(set(fed._weights([0, 1, 2, 3]).values())) > 1  # the clients' counts differ here
    assert set(Federation(cfg(fed={"aggregator": "median"}))._weights([0, 1, 2, 3]).values()) == {1.0}
    dp = cfg(dp=DPConfig(noise_multiplier=1.0), secagg=SecAggConfig(enabled=True))
    assert set(Federation(dp)._weights([0, 1]).values()) == {1.0}

    mu = 0.5

    def local(algorithm: str, epochs: int) -> torch.Tensor:
        f = Federation(cfg(fed={"algorithm": algorithm, "mu": mu, "local_epochs": epochs, "dropout": 0.0}))
        start = flat_params(fed.model)
        return f.clients[0].train(f.model, start, cross=None, gen=torch.Generator().manual_seed(1))[0]

    one_avg, one_prox = local("fedavg", 1), local("fedprox", 1)
    assert torch.equal(one_avg, one_prox)
    two_avg, two_prox = local("fedavg", 2), local("fedprox", 2)
    lr = fed.cfg.federated.lr
    assert not torch.allclose(two_avg, two_prox)
    assert torch.allclose(two_prox, two_avg - lr * mu * one_avg, atol=1e-6)


@pytest.mark.timeout(120)
def test_ranks_that_split_the_graph_differently_all_stop_naming_them(tmp_path):
    import fed_ranks
    from helpers import run_on_ranks

    # (ranks that agree pass the same check in every multi-rank test, e.g. the 3-rank parity one)
    said = run_on_ranks(fed_ranks.agree, 3, tmp_path, 2, timeout_s=20.0)
    assert len(set(said)) == 1 and said[0].startswith("rank 2 computed another client split than rank 0")


@pytest.mark.parametrize("secure", [False, True])
def test_a_round_that_would_overrun_the_budget_is_not_started(tmp_path, secure):
    """A budget that holds a few rounds: the run stops before the round (or evaluation) that
    would take a link over it, so no link ever carries more than its budget (SecAgg's key
    and share messages included, learned from each client's first round)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[crossing]\nupdates = "{"secure_aggregation" if secure else "plain"}"\n'
                      '[budget]\nper_link_mb = 0.02\n')
    fed = Federation(cfg(rounds=20, policy=PolicyRef(path=str(policy)), secagg=SecAggConfig(enabled=secure)))
    with pytest.raises(PolicyViolation, match="stopped before it started"):
        fed.run()
    used = fed.gate.bytes_by_link()
    assert used and max(used.values()) <= 20_000
    assert max(used.values()) > 20_000 - 2 * max(fed.gate._round_cost.values())  # it ran up to the edge


def test_clipped_uplink_values_are_counted():
    """Fixed point clips each value to [-clip, clip] before masking: a clip far below the
    updates clips many (and the count says so), a clip far above them none."""
    c = cfg(rounds=2)
    tight = Federation(cfg(rounds=2, secagg=SecAggConfig(enabled=True, clip=1e-4))).run()
    loose = Federation(cfg(rounds=2, secagg=SecAggConfig(enabled=True, clip=100.0, ring_bits=40))).run()
    assert 0 < tight["uplink_clamped_values"] <= 2 * 4 * params_count(c)
    assert loose["uplink_clamped_values"] == 0


def test_what_reaches_the_server_is_masked_not_the_update(monkeypatch):
    """The transcript's labels aside, the bytes themselves: every update arrives at the server
    as the MaskedInput its client made, whose payload differs from the client's ring-encoded
    update in most coordinates, and no message arriving anywhere is a float tensor holding
    a feature row."""
    from commgnn.federated.secagg import protocol, ring
    from commgnn.federated.transport import Transport

    arrived: list = []
    made: dict[int, tuple[torch.Tensor, int]] = {}  # id(MaskedInput) -> (plain ring input, m)
    gather = Transport.gather_dicts
    masked = protocol.SecAggClient.masked_input

    def spy_gather(self, part):
        got = gather(self, part)
        if got is not None:
            arrived.extend(got.values())
        return got

    def spy_masked(self, x, delivery):
        out = masked(self, x, delivery)
        made[id(out)] = (ring.reduce(x, self.m), self.m)
        return out

    monkeypatch.setattr(Transport, "gather_dicts", spy_gather)
    monkeypatch.setattr(protocol.SecAggClient, "masked_input", spy_masked)
    fed = Federation(cfg(rounds=3, secagg=SecAggConfig(enabled=True)))
    fed.run()
    inputs = [m for m in arrived if isinstance(m, protocol.MaskedInput)]
    assert len(inputs) == 3 * 4 and all(id(m) in made for m in inputs)
    for m in inputs:
        x, bits = made[id(m)]
        y = ring.unpack(m.payload, bits, x.numel())
        assert (y != x).float().mean() > 0.99  # masked: almost every coordinate moved
    assert not any(isinstance(m, torch.Tensor) and m.dtype.is_floating_point for m in arrived
                   if not isinstance(m, protocol.MaskedInput))  # predictions travel as integers


@pytest.mark.timeout(120)
def test_a_budget_overrun_on_the_server_stops_every_rank_at_once(tmp_path):
    """Three ranks, SecAgg: the budget holds round 1's masked payload (what the reservation
    can know before it) but not the key and share messages besides. The server's gate
    refuses them after the secure sum, and the run ends with that one-line refusal well
    before the collective time-out (the launcher's watchdog ends the client ranks)."""
    import time

    policy = tmp_path / "policy.toml"
    policy.write_text('[crossing]\nupdates = "secure_aggregation"\n[budget]\nper_link_mb = 0.0055\n')
    c = cfg(rounds=3, secagg=SecAggConfig(enabled=True), policy=PolicyRef(path=str(policy)),
            runtime=FedRuntimeConfig(parts=3, threads=1, timeout_s=60))
    assert Federation(cfg()).dim * 4 + 4 <= 5500  # the payload alone fits
    t0 = time.monotonic()
    with pytest.raises(Exception, match="over its budget") as err:
        federate(c, tmp_path / "run")
    assert time.monotonic() - t0 < 30 and "\n" not in str(err.value)
