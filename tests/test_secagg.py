"""Secure aggregation (commgnn.federated.secagg) and the uplink codecs that ride on it."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from scipy.stats import chisquare

from commgnn.errors import ConfigError, UserError
from commgnn.federated import uplink
from commgnn.federated.secagg import (
    CIPHERTEXT_BYTES,
    SecAggClient,
    SecAggConfig,
    SecAggRefusal,
    SecAggServer,
    UnmaskRequest,
    neighbour_graph,
    run_round,
)
from commgnn.federated.secagg import ring, shamir

M = 32


def entropy(seed: int):
    """A seeded byte source, so key material (and so every mask) is reproducible."""
    return random.Random(seed).randbytes


def ring_inputs(n: int, d: int, m: int = M, seed: int = 0) -> dict[int, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {u: ring.reduce(torch.randint(-10**6, 10**6, (d,), generator=gen), m) for u in range(n)}


def expected(inputs: dict[int, torch.Tensor], survivors, m: int = M) -> torch.Tensor:
    out = torch.zeros_like(next(iter(inputs.values())))
    for u in survivors:
        out = ring.add(out, inputs[u], m)
    return out


def through_masking(inputs: dict[int, torch.Tensor], *, m: int = M, t: int, seed: int = 0):
    """Steps 0-2 by hand: the clients, the server and the masked inputs."""
    dim = next(iter(inputs.values())).numel()
    clients = {u: SecAggClient(u, dim=dim, m=m, threshold=t, entropy=entropy(seed + u)) for u in inputs}
    server = SecAggServer(dim=dim, m=m, threshold=t)
    lists = server.collect_keys([c.advertise() for c in clients.values()])
    deliveries = server.route_shares([clients[u].share_keys(lists[u]) for u in clients])
    masked = {u: clients[u].masked_input(inputs[u], deliveries[u]) for u in clients}
    requests = server.collect_masked(masked.values())
    return clients, server, masked, requests


# ------------------------------------------------------------------------------ protocol


@pytest.mark.parametrize("dropped", [0, 1, 2, 3])
def test_exact_sum_with_dropouts_after_share_keys(dropped: int) -> None:
    inputs = ring_inputs(9, 1000)
    drop = set(range(1, 1 + dropped))
    total, stats = run_round(inputs, m=M, threshold=6, drop_after_share=drop, round_id=3, entropy=entropy(dropped))
    assert stats.u3 == tuple(u for u in range(9) if u not in drop)
    assert torch.equal(total, expected(inputs, stats.u3))
    assert set(stats.seconds) == {"advertise", "share_keys", "masked_input", "unmask"}
    # Bytes: a key list of 9, 8 ciphertexts out, the packed masked input.
    assert stats.up[0]["advertise"] == 68 and stats.down[0]["advertise"] == 4 + 9 * 68
    assert stats.up[0]["share_keys"] == 8 + 8 * (4 + CIPHERTEXT_BYTES)
    assert stats.up[0]["masked_input"] == 4 + ring.packed_nbytes(1000, M)
    assert all(stats.up[u]["masked_input"] == 0 for u in drop)


def test_exact_sum_with_dropouts_during_unmasking() -> None:
    inputs = ring_inputs(9, 500, m=20, seed=1)
    total, stats = run_round(inputs, m=20, threshold=6, drop_after_share={0}, drop_after_masking={4, 8},
                             entropy=entropy(7))
    assert stats.u3 == (1, 2, 3, 4, 5, 6, 7, 8) and stats.responders == (1, 2, 3, 5, 6, 7)
    assert torch.equal(total, expected(inputs, stats.u3, m=20))  # 4 and 8 still count: they sent y_u


def test_fewer_than_threshold_is_one_line_error() -> None:
    inputs = ring_inputs(9, 50)
    with pytest.raises(UserError, match="fewer than the threshold t = 6") as err:
        run_round(inputs, m=M, threshold=6, drop_after_share={1, 2, 3, 4})
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="Unmasking: 5 of 8"):
        run_round(inputs, m=M, threshold=6, drop_after_share={1}, drop_after_masking={2, 3, 4})
    with pytest.raises(ConfigError, match="threshold t = 10 must lie in"):
        run_round(inputs, m=M, threshold=10)


def test_masked_update_is_uniform_and_plain_one_is_not() -> None:
    d = 100_000
    x = ring.encode(torch.full((d,), 0.37), m=M, frac_bits=16)
    inputs = {0: x, 1: x.clone(), 2: x.clone()}
    _, _, masked, _ = through_masking(inputs, t=2, seed=11)
    y = ring.unpack(masked[0].payload, M, d)
    top = lambda v: torch.bincount(v >> (M - 8), minlength=256).numpy()  # noqa: E731
    assert chisquare(top(y)).pvalue > 1e-3
    assert chisquare(top(x)).pvalue < 1e-3  # the same test on the unmasked encoding fails


def test_client_refuses_both_share_kinds_of_one_client() -> None:
    inputs = ring_inputs(5, 20)
    clients, _, _, requests = through_masking(inputs, t=3, seed=3)
    with pytest.raises(SecAggRefusal, match="both"):
        clients[0].unmask(UnmaskRequest((0, 1, 2, 3), (3,)))
    with pytest.raises(SecAggRefusal, match="own mask key"):
        clients[0].unmask(UnmaskRequest((1, 2, 3), (0,)))
    # Across requests: once b_4 is out, s_4^SK is never revealed.
    clients[1].unmask(UnmaskRequest((0, 1, 2, 4), ()))
    with pytest.raises(SecAggRefusal, match=r"client\(s\) \[4\]"):
        clients[1].unmask(UnmaskRequest((0, 1, 2), (4,)))
    assert requests[2] == UnmaskRequest((0, 1, 2, 3, 4), ())


def test_secagg_plus_neighbour_graph_sums_exactly() -> None:
    ids = list(range(12))
    graph = neighbour_graph(ids, 4, seed=5)
    assert all(len(graph[u]) == 4 and u not in graph[u] for u in ids)
    assert all(u in graph[v] for u in ids for v in graph[u])
    inputs = ring_inputs(12, 300, seed=2)
    total, stats = run_round(inputs, m=M, threshold=3, neighbours=4, graph_seed=5, drop_after_share={3},
                             drop_after_masking={7}, entropy=entropy(5))
    assert torch.equal(total, expected(inputs, stats.u3))
    assert stats.up[0]["share_keys"] == 8 + 4 * (4 + CIPHERTEXT_BYTES)  # k ciphertexts, not n - 1


# -------------------------------------------------------------------------------- shamir


def test_shamir_any_t_shares_reconstruct_and_t_minus_1_do_not() -> None:
    secret = bytes(range(32))
    xs = [u + 1 for u in range(7)]
    shares = shamir.split(secret, xs, 4, entropy=entropy(1))
    for subset in itertools.combinations(xs, 4):
        got = shamir.reconstruct({x: shares[x] for x in subset})
        assert shamir.secret_to_bytes(got) == secret
    for subset in itertools.combinations(xs, 3):
        assert shamir.reconstruct({x: shares[x] for x in subset}) != int.from_bytes(secret, "big")
    assert shamir.share_from_bytes(shamir.share_to_bytes(shares[1])) == shares[1]


# ---------------------------------------------------------------------------------- ring


def test_ring_round_trip_and_negative_sums() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, generator=gen) * 100
    r = ring.encode(x, m=M, frac_bits=16, generator=gen)
    assert r.min() >= 0 and r.max() < 2**M
    assert (ring.decode(r, m=M, frac_bits=16).double() - x.double()).abs().max() < 2**-16
    parts = [-(torch.rand(1000, generator=gen) * 50) for _ in range(6)]
    s = torch.zeros(1000, dtype=torch.int64)
    for p in parts:
        s = ring.add(s, ring.encode(p, m=M, frac_bits=16, generator=gen), M)
    assert torch.allclose(ring.decode(s, m=M, frac_bits=16).double(), sum(parts).double(), atol=6 * 2**-16)


@pytest.mark.parametrize("m", [5, 13, 32, 61])
def test_pack_unpack_round_trip(m: int) -> None:
    gen = torch.Generator().manual_seed(m)
    x = torch.randint(0, 2**m, (1003,), generator=gen)
    x[:2] = torch.tensor([0, 2**m - 1])
    packed = ring.pack(x, m)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(1003 * m / 8)
    assert torch.equal(ring.unpack(packed, m, 1003), x)
    assert torch.equal(ring.unpack(bytes(packed.numpy()), m, 1003), x)


# -------------------------------------------------------------------------------- config


def test_config_validation() -> None:
    cfg = SecAggConfig(enabled=True, threshold=0.67, ring_bits=32, frac_bits=16, clip=1.0)
    assert cfg.threshold_count(9) == 7
    assert SecAggConfig(threshold=5).threshold_count(9) == 5
    # the default lets a third drop: t = 6 of 9, 4 of 5 (one drop), 2 of 3, 2 of 2
    assert [SecAggConfig().threshold_count(n) for n in (9, 5, 3, 2, 1)] == [6, 4, 2, 2, 1]
    assert SecAggConfig(neighbours=4).threshold_count(20) == 4  # of a neighbourhood of 5
    for low, n in ((4, 9), (0.5, 10), (0.5, 2)):  # not above half the group
        with pytest.raises(ConfigError, match="not above half"):
            SecAggConfig(threshold=low).threshold_count(n)
    with pytest.raises(ConfigError, match="set ring_bits >= 21"):
        SecAggConfig(ring_bits=20, frac_bits=16, clip=1.0).check_clients(9)
    with pytest.raises(ConfigError, match="only 9 clients"):
        SecAggConfig(threshold=10).threshold_count(9)
    for bad in ({"threshold": 0.0}, {"threshold": 2.5}, {"ring_bits": 63}, {"frac_bits": 31},
                {"clip": -1.0}, {"ring_bits": 16, "frac_bits": 14, "clip": 4.0}, {"neighbours": 1}):
        with pytest.raises(ConfigError):
            SecAggConfig(**bad)


# ------------------------------------------------------------------------------- uplink


def make_codecs(kind: str, client: int):
    shapes = [(6, 40), (40,), (3, 2)]  # d = 240 + 40 + 6 = 286
    d = 286
    if kind == "quant":
        return uplink.SharedScaleQuant(8, 1.0, dim=d, seed=1, client=client)
    if kind == "fixed":
        return uplink.FixedPoint(SecAggConfig(ring_bits=24, frac_bits=12, clip=1.0), dim=d, client=client)
    if kind == "randk":
        return uplink.RandomK(0.25, dim=d, seed=1, bits=10, clip=1.0, client=client)
    return uplink.RankR(2, shapes=shapes, seed=1, bits=12, clip=4.0, client=client)


@pytest.mark.parametrize("kind", ["quant", "fixed", "randk", "rankr"])
def test_codec_sum_under_secure_aggregation(kind: str) -> None:
    n, r = 5, 2
    gen = torch.Generator().manual_seed(9)
    updates = {u: (torch.randn(286, generator=gen) * 0.3).clamp(-0.95, 0.95) for u in range(n)}
    codecs = {u: make_codecs(kind, u) for u in range(n)}
    enc = {u: codecs[u].encode(updates[u], r) for u in range(n)}
    m = codecs[0].ring_bits(n)
    total, stats = run_round({u: ring.reduce(enc[u], m) for u in range(n)}, m=m, threshold=3, entropy=entropy(4))
    decoded = codecs[0].decode_sum(total, n, r)
    one_by_one = sum(codecs[0].decode_sum(ring.reduce(enc[u], codecs[0].ring_bits(1)), 1, r) for u in range(n))
    assert torch.allclose(decoded, one_by_one, atol=1e-5)
    assert stats.up[0]["masked_input"] - 4 == codecs[0].payload_bytes(n)
    if kind in ("quant", "fixed"):  # no sparsification: within n rounding steps of the true sum
        assert (decoded - sum(updates.values())).abs().max() <= n * codecs[0].scale + 1e-6
    # The same through the convenience wrapper.
    codecs = {u: make_codecs(kind, u) for u in range(n)}
    again, _ = uplink.aggregate(codecs, updates, round_id=r, threshold=3, entropy=entropy(4))
    assert torch.allclose(again, decoded, atol=1e-5)


def test_shared_scale_quant_unbiased_and_payload() -> None:
    x = torch.linspace(-0.9, 0.9, 64)
    q = uplink.SharedScaleQuant(4, 1.0, dim=64, seed=2)
    draws = torch.stack([q.decode_sum(q.encode(x, r), 1, r) for r in range(3000)])
    assert (draws.mean(0) - x).abs().max() < 5 * (q.scale / 2) / math.sqrt(3000)
    big = uplink.SharedScaleQuant(8, 1.0, dim=1000)
    assert big.ring_bits(5) == 11 and big.payload_bytes(5) == math.ceil(1000 * 11 / 8)
    assert big.payload_bytes(5) == ring.pack(ring.reduce(big.encode(torch.zeros(1000), 0), 11), 11).numel()
    assert uplink.Plain(dim=1000).payload_bytes(5) == 4000


@pytest.mark.parametrize("kind", ["randk", "rankr"])
def test_error_feedback_state_round_trips(kind: str) -> None:
    gen = torch.Generator().manual_seed(3)
    a, b = make_codecs(kind, 0), make_codecs(kind, 0)
    a.encode(torch.randn(286, generator=gen), 0)
    assert a.state_dict()["residual"].abs().sum() > 0
    b.load_state_dict(a.state_dict())
    nxt = torch.randn(286, generator=gen)
    assert torch.equal(a.encode(nxt, 1), b.encode(nxt, 1))
    assert torch.equal(a.state_dict()["residual"], b.state_dict()["residual"])


def test_rank_r_error_feedback_and_unbiased_mode_track_the_update() -> None:
    """Summed over rounds, the decoded updates track the true sum: with error feedback
    the residual stays bounded; without it the Gaussian projection is unbiased."""
    g = torch.randn(128, generator=torch.Generator().manual_seed(0))
    for feedback, tol in ((True, 0.05), (False, 0.3)):
        codec = uplink.RankR(4, shapes=[(16, 8)], seed=0, bits=16, clip=50.0, error_feedback=feedback)
        sent = sum(codec.decode_sum(ring.reduce(codec.encode(g, r), codec.ring_bits(1)), 1, r) for r in range(100))
        assert (sent - 100 * g).norm() / (100 * g).norm() < tol
        if feedback:
            assert codec.residual.norm() < 5 * g.norm()


@pytest.mark.parametrize("kind", ["randk", "rankr"])
def test_damped_residual_keeps_beta_times_what_was_not_sent(kind: str) -> None:
    """residual_decay beta: the kept residual is beta (acc - sent), so it stays below the
    plain residual's pile-up; beta = 1 is plain error feedback, bit for bit."""
    shapes = [(11, 13), (13,), (13, 10), (10,)]
    make = {"randk": lambda **kw: uplink.RandomK(0.25, dim=296, seed=1, bits=10, clip=50.0, **kw),
            "rankr": lambda **kw: uplink.RankR(2, shapes=shapes, seed=1, bits=12, clip=50.0, **kw)}[kind]
    plain, one, damped = make(), make(residual_decay=1.0), make(residual_decay=0.5)
    g = torch.randn(plain.dim, generator=torch.Generator().manual_seed(5))
    assert torch.equal(plain.encode(g, 0), one.encode(g, 0)) and torch.equal(plain.residual, one.residual)
    damped.encode(g, 0)
    assert torch.allclose(damped.residual, 0.5 * plain.residual)  # same first round, half of it kept
    for r in range(1, 40):
        plain.encode(g, r), damped.encode(g, r)
    assert damped.residual.norm() < 0.5 * plain.residual.norm()  # bounded by about 1 / (1 - beta) rounds
    with pytest.raises(ConfigError, match="residual decay"):
        make(residual_decay=0.0)
