"""Client-level DP: clipping bounds, distributed noise variance, accounting against opacus
and against closed forms computed here, calibration, resume, adaptive clipping."""

from __future__ import annotations

import json
import math

import pytest
import torch
from opacus.accountants import RDPAccountant
from scipy import special

from commgnn.config import from_dict
from commgnn.errors import ConfigError
from commgnn.federated.dp import (PROTECTED_UNIT, AdaptiveClip, ClientDPAccountant, DPConfig, calibrate,
                                  clip_update, clip_updates, noise_for, noise_std, privatise_update)

# opacus's RDP order grid, written out here rather than read from opacus.
ALPHAS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))


def eps_from_rdp(rdp: list[float], alphas: list[float], delta: float) -> float:
    """(epsilon, delta) from RDP curves: Balle et al. 2020, Thm. 21 (opacus's conversion):
    eps = min_a rdp(a) - (log delta + log a) / (a - 1) + log((a - 1) / a)."""
    return min(r - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a) for r, a in zip(rdp, alphas))


def sgm_rdp_int(q: float, sigma: float, alpha: int) -> float:
    """RDP at integer order ``alpha`` of the sampled Gaussian mechanism (Mironov, Talwar,
    Zhang 2019, Sec. 3.3): log(sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2-k) / (2 sigma^2))) / (a-1)."""
    terms = [math.log(special.binom(alpha, k)) + k * math.log(q) + (alpha - k) * math.log1p(-q)
             + (k * k - k) / (2 * sigma ** 2) for k in range(alpha + 1)]
    top = max(terms)
    return (top + math.log(sum(math.exp(t - top) for t in terms))) / (alpha - 1)


# ------------------------------------------------------------------ config
def test_config_defaults_are_off_with_sensible_delta():
    cfg = DPConfig()
    assert not cfg.enabled and cfg.delta == 1e-5 and cfg.noise_at == "clients"
    assert DPConfig(epsilon=3.0).enabled and DPConfig(noise_multiplier=1.0).enabled


@pytest.mark.parametrize("kw, words", [
    ({"epsilon": 1.0, "noise_multiplier": 1.0}, "not both"),
    ({"epsilon": -1.0}, "epsilon must be >= 0"),
    ({"clip": 0.0}, "clip must be > 0"),
    ({"epsilon": 1.0, "delta": 0.0}, "delta must lie in (0, 1)"),
    ({"epsilon": 1.0, "delta": 0.1}, "well below"),
    ({"noise_at": "peer"}, "noise_at"),
    ({"adaptive_clip": True}, "needs DP on"),
    ({"count_stddev": 1.0, "epsilon": 1.0}, "only used with adaptive_clip"),
    ({"max_clip": 2.0, "epsilon": 1.0}, "only used with adaptive_clip"),
    ({"adaptive_clip": True, "epsilon": 1.0, "clip": 2.0, "max_clip": 1.0}, "at least clip"),
    ({"epsilon": float("nan")}, "finite"),
])
def test_config_validation_is_one_line(kw, words):
    with pytest.raises(ConfigError) as exc:
        DPConfig(**kw)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_config_from_toml_table_is_strict():
    assert from_dict(DPConfig, {"epsilon": 4, "clip": 0.5}, path="dp") == DPConfig(epsilon=4.0, clip=0.5)
    with pytest.raises(ConfigError, match="unknown config key 'dp.sigma'"):
        from_dict(DPConfig, {"sigma": 1.0}, path="dp")
    with pytest.raises(ConfigError, match="dp.clip must be > 0"):
        from_dict(DPConfig, {"clip": -1.0}, path="dp")


# ------------------------------------------------------------------ clipping
def test_clipping_bounds_norm_and_keeps_direction():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(1000, generator=g) * 5
    clipped, norm = clip_update(u, 1.5)
    assert norm == pytest.approx(float(u.double().norm()), rel=1e-9)
    assert float(clipped.norm()) == pytest.approx(1.5, rel=1e-5)
    assert torch.allclose(clipped / clipped.norm(), u / u.norm(), atol=1e-6)


def test_clipping_leaves_small_updates_untouched():
    u = torch.full((4, 3), 0.1)
    clipped, norm = clip_update(u, 1.0)
    assert clipped is u and norm == pytest.approx(math.sqrt(12) * 0.1)


def test_clip_updates_row_wise():
    g = torch.Generator().manual_seed(1)
    u = torch.randn(6, 50, generator=g) * torch.tensor([0.01, 0.1, 1.0, 5.0, 10.0, 0.05])[:, None]
    clipped, norms = clip_updates(u, 1.0)
    small = norms <= 1.0
    assert small.any() and (~small).any()
    assert torch.equal(clipped[small], u[small])
    assert torch.allclose(clipped[~small].norm(dim=1), torch.ones(int((~small).sum())), rtol=1e-5)


def test_clipping_refuses_non_finite():
    with pytest.raises(ValueError, match="non-finite"):
        clip_update(torch.tensor([1.0, float("nan")]), 1.0)


# ------------------------------------------------------------------ noise
def test_client_noise_shares_sum_to_central_variance():
    sigma, clip, n, d = 1.5, 2.0, 8, 40_000
    g = torch.Generator().manual_seed(2)
    shares = torch.stack([noise_for((d,), sigma, clip, n, g, "clients") for _ in range(n)])
    target = (sigma * clip) ** 2
    # each share has variance target / n; their sum has variance target (rel. s.e. of a
    # variance estimate from d samples: sqrt(2 / d) ~ 0.7%)
    assert float(shares.var(dim=1).mean()) == pytest.approx(target / n, rel=0.03)
    total = shares.sum(dim=0)
    assert float(total.var()) == pytest.approx(target, rel=0.03)
    assert abs(float(total.mean())) < 4 * math.sqrt(target / d)
    central = noise_for((d,), sigma, clip, n, g, "server")
    assert float(central.var()) == pytest.approx(target, rel=0.03)


def test_noise_std_and_zero_sigma():
    assert noise_std(2.0, 0.5, 4, "clients") == pytest.approx(0.5)
    assert noise_std(2.0, 0.5, 4, "server") == pytest.approx(1.0)
    assert torch.equal(noise_for((3, 2), 0.0, 1.0, 5), torch.zeros(3, 2))


def test_privatise_update_noises_only_at_clients():
    g = torch.Generator().manual_seed(3)
    u = torch.randn(20_000, generator=g) * 10
    sent, norm = privatise_update(u, clip=1.0, sigma=2.0, n_participants=4, at="server", generator=g)
    assert float(sent.norm()) == pytest.approx(1.0, rel=1e-5) and norm > 1
    sent, _ = privatise_update(u, clip=1.0, sigma=2.0, n_participants=4, at="clients", generator=g)
    clipped, _ = clip_update(u, 1.0)
    assert float((sent - clipped).var()) == pytest.approx(1.0, rel=0.05)  # (2 * 1)^2 / 4


# ------------------------------------------------------------------ accounting
def test_accountant_matches_opacus_driven_directly():
    sigma, q, steps, delta = 1.1, 0.1, 100, 1e-5
    ours = ClientDPAccountant(delta=delta, noise_multiplier=sigma)
    theirs = RDPAccountant()
    for _ in range(steps):
        ours.step(sample_rate=q)
        theirs.step(noise_multiplier=sigma, sample_rate=q)
    assert ours.rounds == steps
    assert ours.epsilon() == pytest.approx(theirs.get_epsilon(delta=delta), rel=1e-12)
    # independent check on the integer orders (a subset of opacus's grid, so opacus's
    # minimum is at most ours, and close to it)
    ints = [a for a in ALPHAS if float(a).is_integer()]
    independent = eps_from_rdp([steps * sgm_rdp_int(q, sigma, int(a)) for a in ints], ints, delta)
    assert ours.epsilon() <= independent + 1e-9
    assert ours.epsilon() == pytest.approx(independent, rel=0.05)
    assert ours.as_opacus().get_epsilon(delta=delta) == ours.epsilon()


def test_accountant_with_varying_participation_matches_opacus():
    ours = ClientDPAccountant(delta=1e-5)
    theirs = RDPAccountant()
    for t in range(6):  # alternating rates: opacus keeps 6 entries, we keep 2
        q, sigma = (0.2, 1.0) if t % 2 else (0.3, 1.2)
        ours.step(sample_rate=q, noise_multiplier=sigma)
        theirs.step(noise_multiplier=sigma, sample_rate=q)
    assert len(ours.history) == 2 and len(theirs.history) == 6
    assert ours.epsilon() == pytest.approx(theirs.get_epsilon(delta=1e-5), rel=1e-12)


@pytest.mark.parametrize("sigma, steps, delta", [(1.1, 100, 1e-5), (4.0, 30, 1e-6), (20.0, 500, 1e-5)])
def test_accountant_full_participation_matches_closed_form(sigma, steps, delta):
    acc = ClientDPAccountant(delta=delta)
    for _ in range(steps):
        acc.step(sample_rate=1.0, noise_multiplier=sigma)
    # q = 1: the Gaussian mechanism's RDP is alpha / (2 sigma^2) per round
    expected = eps_from_rdp([steps * a / (2 * sigma ** 2) for a in ALPHAS], ALPHAS, delta)
    assert acc.epsilon() == pytest.approx(expected, rel=1e-9)
    assert acc.epsilon(delta * 10) < acc.epsilon()  # a looser delta gives a smaller epsilon


def test_accountant_edge_cases():
    acc = ClientDPAccountant(delta=1e-5, noise_multiplier=1.0)
    assert acc.epsilon() == 0.0
    acc.step(sample_rate=0.5, noise_multiplier=0.0)
    assert acc.epsilon() == math.inf
    with pytest.raises(ConfigError, match="sample rate"):
        acc.step(sample_rate=0.0)


@pytest.mark.parametrize("target, rounds, q", [(2.0, 50, 0.2), (8.0, 200, 1.0), (0.5, 20, 0.05)])
def test_calibrate_then_account_lands_just_under_target(target, rounds, q):
    cfg = DPConfig(epsilon=target, delta=1e-5)
    sigma = calibrate(cfg, rounds, q)
    acc = ClientDPAccountant(delta=cfg.delta, clip=cfg.clip, noise_multiplier=sigma)
    for _ in range(rounds):
        acc.step(sample_rate=q)
    assert acc.epsilon() <= target
    assert acc.epsilon() >= target - 0.02  # opacus's search tolerance is 0.01
    # 5% less noise must overspend: sigma is (close to) the smallest that fits
    tight = ClientDPAccountant(delta=cfg.delta, noise_multiplier=sigma * 0.95)
    for _ in range(rounds):
        tight.step(sample_rate=q)
    assert tight.epsilon() > target


def test_calibrate_passthrough_off_and_impossible():
    assert calibrate(DPConfig(noise_multiplier=0.7), 10, 0.5) == 0.7
    assert calibrate(DPConfig(), 10, 0.5) == 0.0
    with pytest.raises(ConfigError, match="cannot be met"):
        calibrate(DPConfig(epsilon=1e-7), 100, 1.0)
    with pytest.raises(ConfigError, match="rounds"):
        calibrate(DPConfig(epsilon=1.0), 0, 1.0)


def test_state_dict_round_trip_resumes_exactly():
    acc = ClientDPAccountant(delta=1e-6, clip=0.8, noise_multiplier=1.3)
    for t in range(40):
        acc.step(sample_rate=1.0 if t % 3 else 0.3, noise_multiplier=1.3 if t < 20 else 1.6)
    state = json.loads(json.dumps(acc.state_dict()))  # plain values survive JSON
    resumed = ClientDPAccountant()
    resumed.load_state_dict(state)
    assert resumed.epsilon() == acc.epsilon() and resumed.rounds == 40 and resumed.delta == 1e-6
    for _ in range(10):
        acc.step(sample_rate=0.3)
        resumed.step(sample_rate=0.3)
    assert resumed.epsilon() == acc.epsilon() and resumed.report() == acc.report()
    with pytest.raises(ConfigError, match="malformed"):
        resumed.load_state_dict({"history": []})


def test_report_names_the_protected_unit():
    acc = ClientDPAccountant(delta=1e-5, clip=2.0, noise_multiplier=1.0)
    for _ in range(5):
        acc.step(sample_rate=0.5)
    rep = acc.report()
    assert rep["protected_unit"] == PROTECTED_UNIT and "client" in rep["protected_unit"]
    assert "update" in rep["covers"] and "evaluation" in rep["not_covered"]  # the exclusions are stated
    assert rep["rounds"] == 5 and rep["sample_rate"] == 0.5 and rep["clip"] == 2.0
    assert rep["delta"] == 1e-5 and rep["noise_multiplier"] == 1.0 and rep["epsilon"] == acc.epsilon() > 0


# ------------------------------------------------------------------ adaptive clipping
def test_adaptive_clip_noise_split():
    ad = AdaptiveClip(DPConfig(noise_multiplier=0.5, adaptive_clip=True, count_stddev=1.0), n_participants=10)
    z_delta = ad.update_noise_multiplier(0.5)
    # the two releases compose to the total: z^-2 = z_delta^-2 + (2 sigma_b)^-2
    assert z_delta ** -2 + (2 * 1.0) ** -2 == pytest.approx(0.5 ** -2)
    assert z_delta > 0.5
    default = AdaptiveClip(DPConfig(noise_multiplier=1.0, adaptive_clip=True), n_participants=100)
    assert default.count_stddev == 5.0
    with pytest.raises(ConfigError, match="count_stddev"):
        ad.update_noise_multiplier(2.5)


def test_adaptive_clip_tracks_the_target_quantile():
    cfg = DPConfig(noise_multiplier=1.0, adaptive_clip=True, clip=0.1, max_clip=10.0, target_quantile=0.5,
                   count_stddev=1e-6)
    n = 50
    ad = AdaptiveClip(cfg, n_participants=n)
    g = torch.Generator().manual_seed(4)
    for _ in range(150):
        norms = 1.0 + 2.0 * torch.rand(n, generator=g, dtype=torch.float64)  # median 2
        count = sum(ad.bit(float(v)) for v in norms) + ad.count_noise(n, g, "server")
        ad.update(count, n)
    assert ad.clip == pytest.approx(2.0, rel=0.2)
    state = ad.state_dict()
    other = AdaptiveClip(cfg, n_participants=n)
    other.load_state_dict(state)
    assert other.clip == ad.clip
