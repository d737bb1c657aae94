"""Governance policy: strict parsing, organisation lookup, plan checks, and the gate's
decisions, transcript and byte totals."""

from __future__ import annotations

from pathlib import Path

import pytest

from commgnn.errors import ConfigError, UserError
from commgnn.federated.policy import (MB, Payload, Policy, PolicyGate, PolicyViolation, load_policy,
                                      parse_policy, policy_to_dict)

POLICY_TOML = """
[[organisation]]
name = "bank-a"
clients = [0, 1]
[[organisation]]
name = "bank-b"
clients = [2]
[crossing]
raw_features = "never"
embeddings = "quantised_or_noised"
embedding_max_bits = 8
embedding_min_noise_std = 0.1
updates = "secure_aggregation"
[budget]
per_link_mb = 0.001
"""


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_TOML)
    return load_policy(path)


def emb(src: int, dst: int | str, *, bits: int | None = None, noise: float = 0.0, nbytes: int = 100) -> Payload:
    return Payload(kind="embeddings", src_client=src, dst=dst, nbytes=nbytes, bits=bits, noise_std=noise)


# ------------------------------------------------------------------ parsing
def test_parse_file(policy):
    assert [o.name for o in policy.organisation] == ["bank-a", "bank-b"]
    assert policy.organisation[0].clients == (0, 1)
    assert policy.crossing.embeddings == "quantised_or_noised" and policy.crossing.embedding_max_bits == 8
    assert policy.crossing.updates == "secure_aggregation"
    assert policy.budget.per_link_mb == 0.001 and policy.budget.per_link_bytes == 1000
    assert parse_policy(policy_to_dict(policy)) == policy


def test_organisation_of(policy):
    assert [policy.organisation_of(c) for c in range(5)] == ["bank-a", "bank-a", "bank-b", "client-3", "client-4"]
    strict = parse_policy({"organisation": [{"name": "a", "clients": [0, 1]}], "require_all_listed": True})
    assert strict.organisation_of(1) == "a"
    with pytest.raises(ConfigError, match="client 2 is in no organisation and require_all_listed = true"):
        strict.organisation_of(2)
    strict.validate_for(2)
    with pytest.raises(ConfigError, match="client 2 is in no organisation"):
        strict.validate_for(3)
    with pytest.raises(ConfigError, match="lists client 2 but the run has 2 clients"):
        policy.validate_for(2)


@pytest.mark.parametrize("data, message", [
    ({"organisations": []}, "unknown config key 'policy.organisations'"),
    ({"crossing": {"raw_feature": "never"}}, "unknown config key 'policy.crossing.raw_feature'"),
    ({"organisation": [{"name": "a", "clients": [0], "country": "x"}]},
     "unknown config key 'policy.organisation[0].country'"),
    ({"budget": {"per_link_gb": 1}}, "unknown config key 'policy.budget.per_link_gb'"),
    ({"crossing": {"raw_features": "quantised"}}, "policy.crossing.raw_features must be 'never'"),
    ({"crossing": {"embeddings": "sometimes"}}, "'sometimes' is not one of"),
    ({"crossing": {"updates": "encrypted"}}, "policy.crossing.updates: 'encrypted' is not one of"),
    ({"crossing": {"embedding_max_bits": 32}}, "embedding_max_bits must be an integer in 1..31"),
    ({"crossing": {"embedding_min_noise_std": 0}}, "embedding_min_noise_std must be > 0"),
    ({"budget": {"per_link_mb": -1}}, "per_link_mb must be >= 0"),
    ({"organisation": [{"name": "a", "clients": [0, 1]}, {"name": "b", "clients": [1]}]},
     "client 1 is in both 'a' and 'b'"),
    ({"organisation": [{"name": "a", "clients": [0]}, {"name": "a", "clients": [1]}]}, "'a' is used twice"),
    ({"organisation": [{"name": "a", "clients": [2, 2]}]}, "lists client 2 twice"),
    ({"organisation": [{"name": "a", "clients": []}]}, "is empty"),
    ({"organisation": [{"name": "a", "clients": [-1]}]}, "-1 is not a client index"),
    ({"organisation": [{"name": "client-3", "clients": [0]}]}, "reserved for clients not listed"),
    ({"organisation": [{"name": "server", "clients": [0]}]}, "reserved for the server"),
    ({"organisation": [{"clients": [0]}]}, "missing 1 required keyword-only argument: 'name'"),
])
def test_parse_errors_are_one_line(data, message):
    with pytest.raises(ConfigError) as exc:
        parse_policy(data)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_policy(tmp_path / "absent.toml")
    (tmp_path / "bad.toml").write_text("[[organisation]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_policy(tmp_path / "bad.toml")


# ------------------------------------------------------------------ plan check
def test_check_plan(policy):
    policy.check_plan(secure_agg=True, embeddings_cross=True, embedding_bits=8, embedding_noise=0.0)
    policy.check_plan(secure_agg=True, embeddings_cross=True, embedding_bits=None, embedding_noise=0.2)
    policy.check_plan(secure_agg=True, embeddings_cross=False, embedding_bits=None, embedding_noise=0.0)
    with pytest.raises(ConfigError, match="policy forbids plain updates .*: pass --secure-agg"):
        policy.check_plan(secure_agg=False, embeddings_cross=False, embedding_bits=None, embedding_noise=0.0)
    with pytest.raises(ConfigError, match=r"quantised to <= 8 bits or noised with std >= 0.1 \(got float32"):
        policy.check_plan(secure_agg=True, embeddings_cross=True, embedding_bits=None, embedding_noise=0.0)
    with pytest.raises(ConfigError, match="'krum' needs each client's update"):
        policy.check_plan(secure_agg=True, embeddings_cross=False, embedding_bits=None, embedding_noise=0.0,
                          aggregator="krum")
    plain = parse_policy({"crossing": {"updates": "plain", "embeddings": "never"}})
    plain.check_plan(secure_agg=False, embeddings_cross=False, embedding_bits=None, embedding_noise=0.0,
                     aggregator="krum")
    with pytest.raises(ConfigError, match="embeddings may not cross organisations"):
        plain.check_plan(secure_agg=False, embeddings_cross=True, embedding_bits=4, embedding_noise=1.0)


@pytest.mark.parametrize("rule, bits, noise, ok", [
    ("quantised", 8, 0.0, True), ("quantised", 16, 1.0, False), ("quantised", None, 1.0, False),
    ("noised", None, 0.1, True), ("noised", 4, 0.05, False),
    ("quantised_or_noised", 4, 0.0, True), ("quantised_or_noised", None, 0.5, True),
    ("quantised_or_noised", 32, 0.0, False),
    ("quantised_and_noised", 8, 0.1, True), ("quantised_and_noised", 8, 0.0, False),
    ("quantised_and_noised", None, 0.5, False), ("never", 1, 10.0, False),
])
def test_embedding_rules(rule, bits, noise, ok):
    gate = PolicyGate(parse_policy({"crossing": {"embeddings": rule}}))
    if ok:
        gate.admit(emb(0, "server", bits=bits, noise=noise))
        assert len(gate.transcript) == 1
    else:
        with pytest.raises(PolicyViolation):
            gate.admit(emb(0, "server", bits=bits, noise=noise))
        assert gate.transcript == [] and gate.bytes_by_link() == {}


# ------------------------------------------------------------------ the gate
def test_gate_rejects_raw_features(policy):
    gate = PolicyGate(policy)
    with pytest.raises(PolicyViolation, match="raw features never leave their organisation") as exc:
        gate.admit(Payload(kind="raw_features", src_client=0, dst="server", nbytes=10))
    assert isinstance(exc.value, UserError) and "\n" not in str(exc.value)
    with pytest.raises(PolicyViolation):
        gate.admit(Payload(kind="raw_features", src_client=0, dst=2, nbytes=10, bits=1, noise_std=5.0, secure=True))
    assert gate.transcript == [] and len(gate.rejected) == 2


def test_gate_embeddings_bits_and_noise(policy):
    gate = PolicyGate(policy)
    with pytest.raises(PolicyViolation, match="got 32 bits, noise std 0|got float32, noise std 0"):
        gate.admit(emb(0, 2, bits=32))
    gate.admit(emb(0, 2, bits=8))
    gate.admit(emb(2, 0, bits=32, noise=0.1))
    assert [p.src_client for p in gate.transcript] == [0, 2]


def test_gate_updates_need_secure_aggregation(policy):
    gate = PolicyGate(policy)
    with pytest.raises(PolicyViolation, match="only securely aggregated"):
        gate.admit(Payload(kind="update", src_client=1, dst="server", nbytes=400))
    gate.admit(Payload(kind="update", src_client=1, dst="server", nbytes=400, secure=True))
    plain = PolicyGate(parse_policy({"crossing": {"updates": "plain"}}))
    plain.admit(Payload(kind="update", src_client=1, dst="server", nbytes=400))
    assert len(gate.transcript) == len(plain.transcript) == 1


def test_gate_byte_budget(policy):
    gate = PolicyGate(policy)  # 0.001 MB = 1000 bytes per link
    gate.admit(emb(0, "server", bits=8, nbytes=600))
    gate.admit(emb(1, "server", bits=8, nbytes=400))  # same link (bank-a -> server): exactly 1000
    gate.admit(emb(2, "server", bits=8, nbytes=900))  # another link
    gate.admit(Payload(kind="control", src_client=3, dst="server", nbytes=0))
    with pytest.raises(PolicyViolation, match=r"link bank-a -> server would carry 1001 bytes, over its budget"):
        gate.admit(Payload(kind="control", src_client=1, dst="server", nbytes=1))
    with pytest.raises(PolicyViolation, match="budget"):
        gate.admit(emb(2, 0, bits=8, nbytes=1001))  # bank-b -> bank-a on its own is over
    assert gate.bytes_by_link() == {("bank-a", "server"): 1000, ("bank-b", "server"): 900,
                                    ("client-3", "server"): 0}
    unlimited = PolicyGate(parse_policy({"budget": {"per_link_mb": 0.0}}))
    unlimited.admit(emb(0, "server", bits=8, nbytes=10 * MB))


def test_intra_organisation_payloads_pass_unrestricted(policy):
    gate = PolicyGate(policy)
    gate.admit(Payload(kind="raw_features", src_client=0, dst=1, nbytes=800))
    gate.admit(emb(1, 0, bits=None, nbytes=800))  # float32, no noise: fine inside bank-a
    gate.admit(Payload(kind="update", src_client=1, dst=0, nbytes=800))  # plain, over the link budget in total
    assert gate.bytes_by_link() == {("bank-a", "bank-a"): 2400}
    # the same raw features to another organisation's client are a crossing
    with pytest.raises(PolicyViolation):
        gate.admit(Payload(kind="raw_features", src_client=1, dst=2, nbytes=8))


def test_transcript_and_byte_totals(policy):
    gate = PolicyGate(policy)
    sent = [emb(0, 2, bits=4, nbytes=120), Payload(kind="update", src_client=0, dst="server", nbytes=300, secure=True),
            emb(2, 1, bits=8, nbytes=50), Payload(kind="control", src_client=1, dst="server", nbytes=8),
            emb(1, 0, nbytes=70), Payload(kind="update", src_client=4, dst="server", nbytes=300, secure=True)]
    for p in sent:
        gate.admit(p)
    with pytest.raises(PolicyViolation):
        gate.admit(emb(0, 2, nbytes=5))
    assert gate.transcript == sent
    assert gate.rejected[0][0] == emb(0, 2, nbytes=5) and "quantised" in gate.rejected[0][1]
    assert gate.bytes_by_client() == {0: 420, 2: 50, 1: 78, 4: 300}
    assert gate.bytes_by_link() == {("bank-a", "bank-b"): 120, ("bank-a", "server"): 308,
                                    ("bank-b", "bank-a"): 50, ("bank-a", "bank-a"): 70,
                                    ("client-4", "server"): 300}
    assert sum(gate.bytes_by_link().values()) == sum(p.nbytes for p in sent) == sum(gate.bytes_by_client().values())
    rep = gate.report()
    assert rep["admitted"] == 6 and rep["rejected"] == 1 and rep["bytes_by_link"]["bank-a->server"] == 308


def test_malformed_payloads_are_bugs():
    with pytest.raises(ValueError, match="kind"):
        Payload(kind="weights", src_client=0, dst="server", nbytes=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dst"):
        Payload(kind="control", src_client=0, dst="cloud", nbytes=1)
    with pytest.raises(ValueError, match="nbytes"):
        Payload(kind="control", src_client=0, dst=1, nbytes=-1)
    with pytest.raises(ValueError, match="bits"):
        Payload(kind="embeddings", src_client=0, dst=1, nbytes=1, bits=0)


def test_check_refuses_like_admit_but_records_nothing():
    policy = parse_policy({"crossing": {"updates": "secure_aggregation"}})
    gate = PolicyGate(policy)
    with pytest.raises(PolicyViolation, match="securely aggregated"):
        gate.check(Payload(kind="update", src_client=0, dst="server", nbytes=10))
    gate.check(Payload(kind="update", src_client=0, dst="server", nbytes=10, secure=True))
    assert gate.transcript == [] and gate.rejected == [] and gate.bytes_by_client() == {}
