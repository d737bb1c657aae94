"""A federated run resumed from its checkpoint equals the uninterrupted run: the same
metrics.jsonl rows (all but wall_s) and the same summary (all but the times), for a run
stopped by a failure and resumed, and for a run of K rounds extended to N by
``--resume RUN --rounds N``; with the stateful parts on too (DP with an adaptive clip and
secure aggregation, a compressed uplink with error feedback, a policy gate, partial
participation). Checkpoints are tensors and plain values only (``weights_only=True``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

import commgnn
from commgnn.api.federate import federate, resume_federated
from commgnn.cli.main import main
from commgnn.errors import UserError
from commgnn.federated.engine import Federation

N_ROUNDS, K = 6, 3

SMALL = """
[data.synthetic]
num_nodes = 300
num_classes = 3
avg_degree = 6.0
feature_dim = 8
[split]
clients = 4
[federated]
hidden = 16
[runtime]
threads = 1
[output]
quiet = true
"""

STATEFUL = SMALL + """
[dp]
noise_multiplier = 0.3
adaptive_clip = true
reproducible_noise = false
[secagg]
enabled = true
[uplink]
codec = "quant"
bits = 8
"""
"""Secret-seeded DP noise, an adaptive clip released through its own secure sum, secure
aggregation and a quantised uplink (its shared scale moves every round)."""

RESIDUAL = SMALL.replace("hidden = 16\n", "hidden = 16\nparticipation = 0.75\n") + """
[uplink]
codec = "randomk"
fraction = 0.3
bits = 8
residual_decay = 0.9
"""
"""A random-k uplink with a damped error-feedback residual, and 3 of 4 clients a round."""

pytestmark = pytest.mark.usefixtures("one_thread")

TIMES = ("wall_s", "train_s", "secagg_s")


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMES}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def summary(run: Path) -> dict:
    s = json.loads((run / "summary.json").read_text())
    return {k: v for k, v in s.items() if k not in TIMES}


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fed.toml"
    path.write_text(text)
    return path


def final_state(run: Path) -> dict:
    """Rank 0's state in the newest checkpoint (after the last round: N is a multiple of K)."""
    latest = json.loads((run / "checkpoints" / "latest.json").read_text())
    assert latest["epoch"] == N_ROUNDS
    return torch.load(run / "checkpoints" / latest["dir"] / "rank0.pt", weights_only=True)


def same_state(a: dict, b: dict) -> None:
    """The parameters, every codec's residual and shared scale, and every generator, bit for bit."""
    pa, pb = a["params"], b["params"]  # one vector, or one per client (local)
    assert all(torch.equal(pa[c], pb[c]) for c in pa) if isinstance(pa, dict) else torch.equal(pa, pb)
    for c in a["codecs"]:
        assert a["codecs"][c].get("scale") == b["codecs"][c].get("scale")
        for key, t in a["codecs"][c]["state"].items():
            assert torch.equal(t, b["codecs"][c]["state"][key]), (c, key)
    assert all(torch.equal(a["cgen"][c], b["cgen"][c]) for c in a["cgen"])
    untimed = lambda t: {k: v for k, v in t.items() if not k.endswith("_s")}  # noqa: E731
    assert untimed(a["tally"]) == untimed(b["tally"])


def run(cfg: Path, out: Path, *extra: str) -> int:
    return main(["federate", "--config", str(cfg), "--rounds", str(N_ROUNDS), "--seed", "1", "--out", str(out),
                 *extra])


@pytest.mark.parametrize("text", [SMALL, STATEFUL, RESIDUAL], ids=["plain", "dp-secagg-quant", "randomk-residual"])
@pytest.mark.timeout(300)
def test_stopped_and_resumed_equals_uninterrupted(tmp_path, monkeypatch, text):
    # The DP noise's secret seeds, made the same in every run so that runs can be compared;
    # a resume that did not restore the noise generators from the checkpoint would start
    # them afresh from this seed, and differ.
    monkeypatch.setattr("commgnn.federated.builders.secrets.randbits", lambda bits: 12345)
    cfg = _config(tmp_path, text)
    whole = tmp_path / "whole"
    assert run(cfg, whole, "--checkpoint-every", str(K)) == 0

    # The same run, checkpointed every K rounds, dies in round K + 2 (after the checkpoint of round K).
    real_round = Federation._round

    def dies(self, r, params):
        if r == K + 1:
            raise RuntimeError("power cut")
        return real_round(self, r, params)

    monkeypatch.setattr(Federation, "_round", dies)
    stopped = tmp_path / "stopped"
    with pytest.raises(RuntimeError, match="power cut"):
        run(cfg, stopped, "--checkpoint-every", str(K))
    monkeypatch.setattr(Federation, "_round", real_round)
    status = json.loads((stopped / "status.json").read_text())
    assert status["state"] == "failed" and "power cut" in status["error"]
    assert not (stopped / "summary.json").exists()
    assert len(rows(stopped)) == K + 1  # round K + 1's row was logged before the failure
    latest = json.loads((stopped / "checkpoints" / "latest.json").read_text())
    assert latest["epoch"] == K

    # Checkpoints hold tensors and plain values only.
    state = torch.load(stopped / "checkpoints" / latest["dir"] / "rank0.pt", weights_only=True)
    assert state["round"] == K and isinstance(state["params"], torch.Tensor)

    assert main(["federate", "--resume", str(stopped)]) == 0
    assert rows(stopped) == rows(whole)  # every round once, the same values
    assert summary(stopped) == summary(whole)
    same_state(final_state(stopped), final_state(whole))
    status = json.loads((stopped / "status.json").read_text())
    assert status["state"] == "complete" and status["attempt"] == 1


NEIGHGEN = SMALL + """
[neighgen]
enabled = true
rounds = 2
local_steps = 2
[secagg]
enabled = true
"""
"""Mended subgraphs: the generator's rounds run again on resume, before the state is loaded."""

LOCAL = SMALL.replace("hidden = 16\n", "hidden = 16\nalgorithm = \"local\"\n")
"""Every client its own parameters."""

EMBEDDINGS = SMALL.replace("hidden = 16\n", "hidden = 16\ncross_edges = \"embeddings\"\nembedding_noise = 0.1\n"
                           "eval_every = 2\n") + "[dp]\nreproducible_noise = true\n"
"""Noised cross-client embeddings, evaluated every 2 rounds: the K-round run's last evaluation
(round 3) is one the N-round run does not make, so the state is taken before it."""


@pytest.mark.parametrize("text", [RESIDUAL, NEIGHGEN, LOCAL, EMBEDDINGS],
                         ids=["randomk-residual", "neighgen-secagg", "local", "embeddings-eval2"])
@pytest.mark.timeout(300)
def test_k_rounds_extended_to_n_equals_n_rounds(tmp_path, text):
    """``--resume RUN --rounds N`` of a finished K-round run, through the Python API too
    (``commgnn.resume`` recognises the federated folder)."""
    cfg = _config(tmp_path, text)
    whole, short = tmp_path / "whole", tmp_path / "short"
    assert run(cfg, whole, "--checkpoint-every", str(K)) == 0
    assert main(["federate", "--config", str(cfg), "--rounds", str(K), "--seed", "1", "--out", str(short),
                 "--checkpoint-every", str(K)]) == 0
    result = commgnn.resume(short, epochs=N_ROUNDS)
    assert result.run_dir == short and result.summary["rounds"] == N_ROUNDS
    assert rows(short) == rows(whole)
    assert summary(short) == summary(whole)
    same_state(final_state(short), final_state(whole))
    assert result.summary["test_acc"] == json.loads((whole / "summary.json").read_text())["test_acc"]


def test_resume_refuses_other_flags_and_other_folders(tmp_path, capsys):
    cfg = _config(tmp_path, SMALL)
    out = tmp_path / "run"
    assert main(["federate", "--config", str(cfg), "--rounds", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["federate", "--resume", str(out), "--clients", "3"]) == 2
    err = capsys.readouterr().err
    assert "--clients cannot be given with it (only --rounds" in err and "Traceback" not in err
    with pytest.raises(UserError, match="not a federated run folder"):
        resume_federated(tmp_path / "nothing")
    # A run without a checkpoint starts again from round 0 in its folder: the same rows.
    before = rows(out)
    assert main(["federate", "--resume", str(out)]) == 0
    assert rows(out) == before


def test_a_checkpoint_holding_an_object_is_refused(tmp_path):
    """A stranger's checkpoint that pickles an arbitrary object is not unpickled."""
    cfg = _config(tmp_path, SMALL)
    out = tmp_path / "run"
    res = federate(config=cfg, out=out, rounds=2, checkpoint_every=1)
    assert res is not None and len(res.curve) == 2
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    path = out / "checkpoints" / latest["dir"] / "rank0.pt"
    state = torch.load(path, weights_only=True)
    state["evil"] = Path("/")  # any class outside the weights-only allow-list
    torch.save(state, path)
    with pytest.raises(UserError, match="sha256 mismatch"):  # the hash in latest.json no longer fits
        resume_federated(out)
    latest["sha256"]["rank0.pt"] = hashlib.sha256(path.read_bytes()).hexdigest()  # a stranger's consistent set
    (out / "checkpoints" / "latest.json").write_text(json.dumps(latest))
    with pytest.raises(UserError, match="holds more than tensors"):
        resume_federated(out)


@pytest.mark.timeout(300)
def test_three_ranks_extended_equal_one_process_with_a_policy(tmp_path):
    """Rank 0 serves, the clients on ranks 1-2: each rank checkpoints its own share (its
    clients' generators and codecs; the server's gate, accountant and clip), and the run
    extended from K to N rounds on three ranks equals the one-process N-round run."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[[organisation]]\nname = "bank-a"\nclients = [0, 1]\n'
                      '[[organisation]]\nname = "bank-b"\nclients = [2, 3]\n'
                      '[crossing]\nupdates = "secure_aggregation"\n[budget]\nper_link_mb = 5\n')
    cfg = _config(tmp_path, STATEFUL.replace("reproducible_noise = false", "reproducible_noise = true"))
    whole, short = tmp_path / "whole", tmp_path / "short"
    assert run(cfg, whole, "--checkpoint-every", str(K), "--policy", str(policy)) == 0
    assert main(["federate", "--config", str(cfg), "--rounds", str(K), "--seed", "1", "--out", str(short),
                 "--checkpoint-every", str(K), "--policy", str(policy), "--parts", "3"]) == 0
    assert sorted(p.name for p in (short / "checkpoints" / f"epoch-{K:06d}").iterdir()) == \
        ["rank0.pt", "rank1.pt", "rank2.pt"]
    assert main(["federate", "--resume", str(short), "--rounds", str(N_ROUNDS)]) == 0
    assert rows(short) == rows(whole)
    a, b = summary(short), summary(whole)
    assert a.pop("ranks") == 3 and b.pop("ranks") == 1
    assert a == b and a["gate"]["admitted"] > 0 and "bank-a->server" in a["gate"]["bytes_by_link"]
    assert torch.equal(final_state(short)["params"], final_state(whole)["params"])


@pytest.mark.timeout(300)
def test_a_graph_given_in_python_is_recorded_and_needed_again(tmp_path):
    """``commgnn.federate(data, ...)``: config.toml and summary.json name the graph by its
    fingerprint (not the synthetic default); resuming needs the graph again, and with it
    the run continues exactly."""
    from commgnn.data import load_dataset
    from commgnn.data.config import DataConfig, SyntheticConfig

    data = load_dataset(DataConfig(synthetic=SyntheticConfig(num_nodes=300, num_classes=3, feature_dim=8,
                                                             avg_degree=6.0, seed=5)))
    opts = dict(clients=4, hidden=16, threads=1, quiet=True, seed=1)
    whole = federate(data, out=tmp_path / "whole", rounds=N_ROUNDS, **opts)
    assert whole is not None and whole.summary["dataset"].startswith("python:")
    text = (tmp_path / "whole" / "config.toml").read_text()
    assert 'dataset = "python:' in text and text.startswith("# Not re-runnable from this file alone:")
    manifest = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    assert manifest["rerun"]["from_config"] is False and manifest["command"] == "federate"
    short = tmp_path / "short"
    federate(data, out=short, rounds=K, checkpoint_every=K, parts=2, **opts)
    with pytest.raises(UserError, match="trained on a graph given in Python"):
        resume_federated(short, rounds=N_ROUNDS)
    resumed = commgnn.resume(short, data, epochs=N_ROUNDS)
    assert rows(short) == rows(whole.run_dir)
    untimed = {k: v for k, v in resumed.summary.items() if k not in TIMES and k != "ranks"}
    assert untimed == {k: v for k, v in summary(whole.run_dir).items() if k != "ranks"}


def _strict_rows(run: Path) -> list[dict]:
    """metrics.jsonl read as standard JSON: a bare NaN or Infinity fails."""
    def refuse(name: str) -> None:
        raise AssertionError(f"metrics.jsonl holds a bare {name}")
    return [json.loads(line, parse_constant=refuse) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_damaged_checkpoint_is_refused_before_the_run_is_marked_running(tmp_path, capsys):
    cfg = _config(tmp_path, SMALL)
    out = tmp_path / "run"
    assert main(["federate", "--config", str(cfg), "--rounds", "2", "--checkpoint-every", "1",
                 "--out", str(out)]) == 0
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    path = out / "checkpoints" / latest["dir"] / "rank0.pt"
    path.write_bytes(path.read_bytes()[:-7] + b"damaged")
    status = (out / "status.json").read_text()
    capsys.readouterr()
    assert main(["federate", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert "rank0.pt" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert (out / "status.json").read_text() == status  # not marked running, attempt not bumped


def test_restored_rows_are_standard_json(tmp_path):
    """A non-finite value in the checkpoint's curve (a diverged round) is rewritten as null."""
    cfg = _config(tmp_path, SMALL)
    out = tmp_path / "run"
    assert federate(config=cfg, out=out, rounds=2, checkpoint_every=1) is not None
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    path = out / "checkpoints" / latest["dir"] / "rank0.pt"
    state = torch.load(path, weights_only=True)
    state["curve"][0]["val_acc"] = float("nan")
    torch.save(state, path)
    latest["sha256"]["rank0.pt"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "checkpoints" / "latest.json").write_text(json.dumps(latest))
    res = resume_federated(out, rounds=3)
    assert res is not None
    got = _strict_rows(out)
    assert len(got) == 3 and got[0]["val_acc"] is None and got[1]["val_acc"] is not None


def test_an_elastic_restart_refuses_a_damaged_checkpoint_before_marking_running(tmp_path, monkeypatch):
    """Under torchrun (here one rank, restarted once) each rank checks its own checkpoint
    file before rank 0 marks the run running: a damaged one fails the restart in one line
    naming the file, and the run is never marked running nor counted as an attempt."""
    from commgnn.distributed.context import LaunchInfo, free_port
    from commgnn.federated.options import resolve_federate_config
    from commgnn.runner.federate import federate_torchrun

    cfg_path = _config(tmp_path, SMALL)
    out = tmp_path / "run"
    assert main(["federate", "--config", str(cfg_path), "--rounds", "2", "--checkpoint-every", "1",
                 "--out", str(out)]) == 0
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    path = out / "checkpoints" / latest["dir"] / "rank0.pt"
    path.write_bytes(path.read_bytes()[:-7] + b"damaged")
    status = (out / "status.json").read_text()
    cfg = resolve_federate_config(str(out / "config.toml"), {"out": str(out)}, {})
    info = LaunchInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="127.0.0.1",
                      port=free_port(), external=True, restart_count=1)
    import commgnn.runner.run_dir as run_dir

    written, write = [], run_dir.write_status
    monkeypatch.setattr(run_dir, "write_status", lambda o, state, **kw: (written.append(state), write(o, state, **kw)))
    with pytest.raises(UserError, match="rank0.pt"):
        federate_torchrun(cfg, info)
    assert written == ["failed"]
    after, before = json.loads((out / "status.json").read_text()), json.loads(status)
    # never marked running nor counted as an attempt; the restart failed, and says why
    assert after["state"] == "failed" and "rank0.pt" in after["error"]
    assert after.get("attempt", 0) == before.get("attempt", 0)
