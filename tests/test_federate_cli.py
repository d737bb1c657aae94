"""``commgnn federate``: flags and TOML into a FederateConfig, the run folder's four files,
secure aggregation and DP end to end, and one-line user errors that leave nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from commgnn.federated.options import FEDERATE_OPTIONS, resolve_federate_config
from commgnn.cli.main import main
from commgnn.config import from_dict, load_toml
from commgnn.errors import UserError
from commgnn.federated.config import FederateConfig
from commgnn.federated.engine import Federation

F, H, C, N = 8, 16, 3, 300
"""Features, hidden width, classes and nodes of the small synthetic graph."""
PARAMS = F * H + H + H * C + C
"""The 2-layer GCN's parameters: W1 [F, h], b1 [h], W2 [h, C], b2 [C]."""
ROUNDS, CLIENTS = 3, 3

SMALL = f"""
[data.synthetic]
num_nodes = {N}
num_classes = {C}
avg_degree = 6.0
feature_dim = {F}
[federated]
hidden = {H}
[runtime]
threads = 1
"""
REQUIRED = ("test_acc", "worst_client_acc", "uplink_bytes_total", "rounds")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def small_toml(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "small.toml"
    path.write_text(SMALL)
    return path


def federate(toml: Path, out: Path, *extra: str) -> int:
    return main(["federate", "--config", str(toml), "--clients", str(CLIENTS), "--rounds", str(ROUNDS),
                 "--seed", "0", "--out", str(out), *extra])


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def plain_run(small_toml, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "plain"
    assert federate(small_toml, out, "--quiet") == 0
    return out


# ------------------------------------------------------------------ a FedAvg run's folder
def test_fedavg_writes_config_metrics_summary_fairness(small_toml, tmp_path, capsys):
    out = tmp_path / "fedavg"
    assert federate(small_toml, out) == 0
    # the run folder of `commgnn train`: the four files of a federation plus manifest, status and logs
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "fairness.md", "logs", "manifest.json",
                                                    "metrics.jsonl", "status.json", "summary.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    assert json.loads((out / "status.json").read_text())["state"] == "complete"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"] == "federate" and manifest["dataset"]["num_nodes"] == N
    s = summary_of(out)
    for key in REQUIRED:
        assert key in s, key
    assert "curve" not in s
    assert s["rounds"] == ROUNDS and s["clients"] == CLIENTS and s["params"] == PARAMS
    assert s["uplink_bytes_total"] == ROUNDS * CLIENTS * PARAMS * 4  # fp32, no secure aggregation
    assert 1 / C < s["test_acc"] <= 1 and 0 <= s["worst_client_acc"] <= s["test_acc"] + 1e-9
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
    assert rows[-1]["uplink_bytes"] == s["uplink_bytes_total"] and "epsilon" not in rows[-1]
    cfg = from_dict(FederateConfig, load_toml(out / "config.toml"))  # the resolved config reloads strictly
    assert (cfg.split.clients, cfg.federated.rounds, cfg.federated.hidden) == (CLIENTS, ROUNDS, H)
    assert cfg.data.synthetic.num_nodes == N and cfg.output.out == str(out)
    assert (out / "fairness.md").read_text().startswith("| metric | value |")
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == ROUNDS + 1 and lines[0].startswith("round    1") and "uplink" in lines[0]
    assert lines[-1].startswith("test accuracy") and "worst client" in lines[-1] and str(out) in lines[-1]


@pytest.mark.timeout(120)
def test_three_ranks_give_the_one_process_run(small_toml, plain_run, tmp_path):
    """--parts 3: rank 0 serves, clients on ranks 1-2; the same curve and bytes as one process."""
    out = tmp_path / "ranks"
    assert federate(small_toml, out, "--parts", "3") == 0
    ranks, one = summary_of(out), summary_of(plain_run)
    assert ranks["ranks"] == 3 and one["ranks"] == 1
    assert ranks["uplink_bytes_total"] == one["uplink_bytes_total"]
    rows = lambda d: [json.loads(line)["val_acc"] for line in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert rows(out) == rows(plain_run)


def test_quiet_prints_only_the_final_line(plain_run, capsys):
    # plain_run ran with --quiet; a second quiet run shows the same (one line)
    out = plain_run.parent / "quiet2"
    assert federate(plain_run / "config.toml", out, "--quiet") == 0
    assert capsys.readouterr().out.strip().count("\n") == 0
    assert summary_of(out)["test_acc"] == summary_of(plain_run)["test_acc"]  # same seed, same run


def test_secure_aggregation_costs_bytes_not_accuracy(small_toml, plain_run, tmp_path):
    out = tmp_path / "secagg"
    assert federate(small_toml, out, "--quiet", "--secure-agg") == 0
    plain, secure = summary_of(plain_run), summary_of(out)
    assert secure["secure_agg"] is True and plain["secure_agg"] is False
    assert secure["uplink_bytes_total"] > plain["uplink_bytes_total"]  # keys, shares, unmasking
    assert abs(secure["test_acc"] - plain["test_acc"]) <= 0.05  # the fixed-point sum is near-exact


def test_dp_reports_epsilon_within_target(small_toml, tmp_path, capsys):
    out = tmp_path / "dp"
    assert federate(small_toml, out, "--dp-epsilon", "4", "--secure-agg") == 0
    s = summary_of(out)
    assert 0 < s["epsilon"] <= 4.0 and s["delta"] == 1e-5
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("epsilon" in r for r in rows) and rows[-1]["epsilon"] == pytest.approx(s["epsilon"])
    text = capsys.readouterr().out
    assert "epsilon" in text.splitlines()[0] and "delta" in text.splitlines()[-1]


def test_compressed_uplink_sends_fewer_bytes(small_toml, plain_run, tmp_path):
    out = tmp_path / "quant"
    assert federate(small_toml, out, "--quiet", "--uplink-bits", "8") == 0  # implies --uplink quant
    assert from_dict(FederateConfig, load_toml(out / "config.toml")).uplink.codec == "quant"
    assert summary_of(out)["uplink_bytes_total"] == ROUNDS * CLIENTS * PARAMS  # 1 byte a value
    assert summary_of(out)["uplink_bytes_total"] < summary_of(plain_run)["uplink_bytes_total"]


def test_default_out_folder(small_toml, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["federate", "--config", str(small_toml), "--clients", "2", "--rounds", "1", "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("federate-synthetic-fedavg-") and (run / "summary.json").is_file()


# ------------------------------------------------------------------ flags -> config
def test_flags_override_the_file_and_imply_codecs(small_toml, tmp_path):
    flags = {"clients": 5, "seed": 7, "uplink_bits": 4, "dp_epsilon": 2.0, "secure_agg": True, "threshold": 3.0,
             "algorithm": "fedprox", "mu": 0.1, "rounds": 9}
    cfg = resolve_federate_config(str(small_toml), flags, {})
    assert (cfg.split.clients, cfg.split.seed, cfg.federated.seed) == (5, 7, 7)
    assert (cfg.uplink.codec, cfg.uplink.bits) == ("quant", 4)
    assert cfg.dp.epsilon == 2.0 and cfg.secagg.enabled and cfg.secagg.threshold == 3.0
    assert (cfg.federated.algorithm, cfg.federated.mu, cfg.federated.rounds, cfg.federated.hidden) == \
        ("fedprox", 0.1, 9, H)
    assert resolve_federate_config(None, {"uplink_fraction": 0.1}, {}).uplink.codec == "randomk"
    assert resolve_federate_config(None, {"uplink_rank": 3}, {}).uplink.codec == "rank"
    mapped = resolve_federate_config(None, {"client_map": "map.csv"}, {})
    assert (mapped.split.method, mapped.split.path) == ("file", "map.csv")
    # the data root: flag, else $COMMGNN_DATA_ROOT (read here, in the CLI layer only)
    assert resolve_federate_config(None, {}, {"COMMGNN_DATA_ROOT": "/data"}).data.root == "/data"
    assert resolve_federate_config(None, {"data_root": "/mine"}, {"COMMGNN_DATA_ROOT": "/data"}).data.root == "/mine"
    assert resolve_federate_config(None, {}, {}).data.root is None
    adaptive = resolve_federate_config(None, {"dp_epsilon": 4.0, "secure_agg": True, "dp_adaptive_clip": True,
                                              "dp_max_clip": 3.0, "dp_count_stddev": 2.5}, {}).dp
    assert (adaptive.adaptive_clip, adaptive.max_clip, adaptive.count_stddev) == (True, 3.0, 2.5)
    for flags, match in (({"uplink_bits": 4, "uplink": "fp32"}, "--uplink-bits does not apply"),
                         ({"mu": 0.1}, "--mu applies to --algorithm fedprox"),
                         ({"threshold": 2.0}, "--threshold applies to secure aggregation"),
                         ({"dp_clip": 0.5}, "--dp-clip applies with DP on"),
                         ({"dp_epsilon": 4.0, "secure_agg": True, "dp_target_quantile": 0.7},
                          "--dp-target-quantile applies with --dp-adaptive-clip"),
                         ({"uplink_fraction": 0.1, "uplink_rank": 2}, "name different codecs")):
        with pytest.raises(UserError, match=match):
            resolve_federate_config(None, flags, {})


def test_every_flag_names_a_federate_config_key():
    cfg = FederateConfig()
    for dest, key in FEDERATE_OPTIONS.flag_keys.items():
        obj = cfg
        for part in key.split("."):
            assert hasattr(obj, part), (dest, key)
            obj = getattr(obj, part)


def test_example_config_parses():
    path = Path(__file__).resolve().parents[1] / "examples" / "federate_cora.toml"
    cfg = from_dict(FederateConfig, load_toml(path))
    assert cfg.secagg.enabled and cfg.dp.enabled and cfg.uplink.codec != "fp32"


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["federate", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--secure-agg", "--dp-epsilon", "--uplink-bits", "--client-map", "--policy", "--threshold"):
        assert flag in text


# ------------------------------------------------------------------ user errors
@pytest.fixture
def no_training(monkeypatch):
    """Any error case must stop before the first round."""
    def refuse(self, *a, **k):
        pytest.fail("training started")
    monkeypatch.setattr(Federation, "run", refuse)


def _one_line_error(capsys, rc: int) -> str:
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("commgnn: error: "), err
    return lines[0]


def _nothing_left(parent: Path, out: Path) -> None:
    assert not out.exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{out.name}")], list(parent.iterdir())


@pytest.mark.parametrize("extra, match", [
    (["--clients", "1"], "split.clients must be an int >= 2"),
    (["--split", "nope"], "split.method: 'nope' is not one of"),
    (["--secure-agg", "--threshold", "99"], "asks for 99 shares but there are only 3 clients"),
    (["--algorithm", "fedsgd"], "federated.algorithm"),
    (["--uplink", "zip"], "uplink.codec"),
    (["--lr", "-1"], "federated.lr must be > 0"),
    (["--secure-agg", "--aggregator", "krum"], "secure aggregation"),
])
def test_bad_values_are_one_line_and_leave_nothing(small_toml, tmp_path, capsys, no_training, extra, match):
    out = tmp_path / "run"
    line = _one_line_error(capsys, federate(small_toml, out, *extra))
    assert match in line, line
    _nothing_left(tmp_path, out)


def test_unknown_toml_key(tmp_path, capsys, no_training):
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL + "[secagg]\nenabled = true\ntreshold = 2\n")
    out = tmp_path / "run"
    line = _one_line_error(capsys, federate(bad, out))
    assert "unknown config key 'secagg.treshold'" in line and str(bad) in line
    _nothing_left(tmp_path, out)


def test_client_map_with_an_unmapped_node(small_toml, tmp_path, capsys, no_training):
    owner = np.arange(N) % CLIENTS
    owner[17] = -1
    path = tmp_path / "map.npy"
    np.save(path, owner)
    out = tmp_path / "run"
    line = _one_line_error(capsys, federate(small_toml, out, "--client-map", str(path)))  # implies --split file
    assert "node 17 is mapped to no client" in line
    _nothing_left(tmp_path, out)


def test_policy_forbidding_plain_updates_fails_before_training(small_toml, tmp_path, capsys, no_training):
    policy = tmp_path / "policy.toml"
    policy.write_text('[[organisation]]\nname = "bank-a"\nclients = [0, 1]\n'
                      '[crossing]\nupdates = "secure_aggregation"\n')
    out = tmp_path / "run"
    line = _one_line_error(capsys, federate(small_toml, out, "--policy", str(policy)))
    assert "policy forbids plain updates" in line and "--secure-agg" in line
    _nothing_left(tmp_path, out)


def test_existing_out_is_refused(small_toml, tmp_path, capsys, no_training):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    line = _one_line_error(capsys, federate(small_toml, out))
    assert "already exists and is not empty" in line
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_failure_mid_run_removes_the_staging_folder(small_toml, tmp_path, capsys, monkeypatch):
    from commgnn.errors import ConfigError

    def half_run(self, on_eval=None, **resume_and_checkpoints):
        on_eval({"round": 1, "val_acc": 0.5, "test_acc": 0.5, "uplink_bytes": 10})
        raise ConfigError("something the run refused")

    monkeypatch.setattr(Federation, "run", half_run)
    out = tmp_path / "run"
    line = _one_line_error(capsys, federate(small_toml, out, "--quiet"))
    assert line == "commgnn: error: something the run refused"
    _nothing_left(tmp_path, out)
