"""Robust aggregation under Byzantine attacks: each robust rule stays within a bound set by
the honest updates alone, while the plain mean leaves it; Krum picks an honest update."""

from __future__ import annotations

import pytest
import torch

from commgnn.errors import ConfigError
from commgnn.federated.byzantine import Attack, GaussianNoise, ScaleAttack, SignFlip, apply_attacks
from commgnn.federated.robust import (Aggregator, CoordinateMedian, Krum, Mean, TrimmedMean,
                                      make_aggregator)

N, D = 10, 64
ATTACKS = {"scale-10": ScaleAttack(-10.0), "signflip": SignFlip(), "noise": GaussianNoise(20.0)}


def honest_updates(seed: int) -> torch.Tensor:
    """N updates around a common true update (spread small against its norm, as in a round
    of well-behaved local training)."""
    g = torch.Generator().manual_seed(seed)
    true = 1.0 + torch.rand(D, generator=g)
    return true + 0.05 * torch.randn(N, D, generator=g)


def bound(honest: torch.Tensor) -> float:
    """Distance from the honest mean within which every robust aggregate must lie: the norm
    of the per-coordinate honest radius max_i |h_ij - mean_j|. A coordinate-wise median or
    trimmed mean (with f under its tolerance) keeps each coordinate inside the honest
    range; Krum's choice (an honest update) is within max_i ||h_i - mean|| <= this."""
    centre = honest.mean(dim=0)
    return float((honest - centre).abs().max(dim=0).values.norm())


def robust_rules(f: int) -> dict[str, Aggregator]:
    return {"median": CoordinateMedian(), "trimmed_mean": TrimmedMean(beta=f / N),
            "krum": Krum(f=f), "multi_krum": Krum(f=f, m=N - 2 * f)}


def scenario(seed: int, f: int, attack: Attack) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    updates = honest_updates(seed)
    g = torch.Generator().manual_seed(100 + seed)
    byz = torch.randperm(N, generator=g)[:f].tolist()
    attacked = apply_attacks(updates, byz, attack, g)
    honest = attacked[[i for i in range(N) if i not in byz]]
    return attacked, honest, byz


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
@pytest.mark.parametrize("f", [2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_robust_rules_stay_within_honest_bound_and_mean_does_not(seed, f, attack):
    attacked, honest, _ = scenario(seed, f, ATTACKS[attack])
    centre, b = honest.mean(dim=0), bound(honest)
    for name, rule in robust_rules(f).items():
        err = float((rule.aggregate(attacked) - centre).norm())
        assert err <= b * (1 + 1e-5), f"{name} under {attack}: error {err:.3f} > bound {b:.3f}"
    mean_err = float((Mean().aggregate(attacked) - centre).norm())
    assert mean_err > b, f"the bound is vacuous: even the mean stays within it ({mean_err:.3f} <= {b:.3f})"


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_krum_selects_honest_updates(attack):
    attacked, _, byz = scenario(3, 2, ATTACKS[attack])
    chosen = Krum(f=2).select(attacked)
    assert chosen.shape == (1,) and int(chosen[0]) not in byz
    multi = Krum(f=2, m=6).select(attacked).tolist()
    assert len(multi) == 6 and not set(multi) & set(byz)
    assert torch.equal(Krum(f=2).aggregate(attacked), attacked[int(chosen[0])])


def test_krum_scores_match_definition():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 4, generator=g)
    f = 2
    scores = Krum(f=f).scores(x)
    for i in range(7):
        d = sorted(float((x[i].double() - x[j].double()).pow(2).sum()) for j in range(7) if j != i)
        assert float(scores[i]) == pytest.approx(sum(d[: 7 - f - 2]), rel=1e-9)


def test_aggregators_without_attack():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, 3, generator=g)
    w = torch.tensor([1.0, 2.0, 0.0, 1.0, 4.0])
    assert torch.allclose(Mean().aggregate(x, w), (x * w[:, None]).sum(0) / w.sum())
    assert torch.allclose(Mean().aggregate(x), x.mean(0))
    assert torch.equal(CoordinateMedian().aggregate(x), x.median(dim=0).values)  # odd n: the middle value
    even = x[:4]
    s = even.sort(0).values
    assert torch.allclose(CoordinateMedian().aggregate(even), (s[1] + s[2]) / 2)
    assert torch.allclose(TrimmedMean(beta=0.0).aggregate(x), x.mean(0))
    assert torch.allclose(TrimmedMean(beta=0.2).aggregate(x), x.sort(0).values[1:4].mean(0))


def test_non_finite_byzantine_update_is_absorbed():
    attacked, honest, byz = scenario(7, 2, SignFlip())
    attacked[byz[0]] = float("nan")
    attacked[byz[1]] = float("inf")
    centre, b = honest.mean(dim=0), bound(honest)
    for name, rule in robust_rules(2).items():
        out = rule.aggregate(attacked)
        assert torch.isfinite(out).all() and float((out - centre).norm()) <= b * (1 + 1e-5), name
    assert not torch.isfinite(Mean().aggregate(attacked)).all()


def test_validation_errors():
    x = torch.zeros(6, 2)
    with pytest.raises(ConfigError, match=r"krum: f=2 needs more than 2f\+2 = 6 clients, got 6"):
        Krum(f=2).aggregate(x)
    Krum(f=1).aggregate(x)  # 6 > 4
    with pytest.raises(ConfigError, match="m=6 exceeds n - f = 5"):
        Krum(f=1, m=6).validate(6)
    with pytest.raises(ConfigError, match=r"2\*floor\(beta\*n\) < n"):
        TrimmedMean(beta=0.5).aggregate(torch.zeros(4, 3))  # k = 2 trims all 4
    TrimmedMean(beta=0.45).validate(10)  # k = 4, 8 < 10
    odd = torch.randn(5, 3, generator=torch.Generator().manual_seed(9))
    assert torch.equal(TrimmedMean(beta=0.5).aggregate(odd), CoordinateMedian().aggregate(odd))
    with pytest.raises(ConfigError, match="beta must lie in"):
        TrimmedMean(beta=0.6)
    with pytest.raises(ConfigError, match="f must be an integer"):
        Krum(f=-1)
    with pytest.raises(ValueError, match=r"\[n, d\]"):
        Mean().aggregate(torch.zeros(3))


def test_factory():
    assert make_aggregator("mean") == Mean()
    assert make_aggregator("median") == CoordinateMedian()
    assert make_aggregator("trimmed_mean", beta=0.2) == TrimmedMean(beta=0.2)
    assert make_aggregator("krum", f=1, m=3) == Krum(f=1, m=3)
    assert isinstance(make_aggregator("krum", f=1), Aggregator)
    with pytest.raises(ConfigError, match="unknown aggregator 'bulyan'; choose one of mean, median"):
        make_aggregator("bulyan")
    with pytest.raises(ConfigError, match="'krum' takes f, m; got 'beta'"):
        make_aggregator("krum", beta=0.1)


def test_apply_attacks_touches_only_byzantine_rows():
    x = honest_updates(8)
    out = apply_attacks(x, [1, 4], ScaleAttack(-10.0))
    keep = [i for i in range(N) if i not in (1, 4)]
    assert torch.equal(out[keep], x[keep]) and torch.allclose(out[[1, 4]], -10 * x[[1, 4]])
    assert torch.equal(apply_attacks(x, [2], SignFlip())[2], -x[2])
    noisy = apply_attacks(torch.zeros(3, 20_000), [0], GaussianNoise(3.0), torch.Generator().manual_seed(0))
    assert float(noisy[0].std()) == pytest.approx(3.0, rel=0.05) and not noisy[1:].any()
    assert torch.equal(apply_attacks(x, [], SignFlip()), x)
    with pytest.raises(ConfigError, match="distinct"):
        apply_attacks(x, [1, 1], SignFlip())
    with pytest.raises(ConfigError, match="not a client index"):
        apply_attacks(x, [N], SignFlip())
