"""The same entry point under torchrun (2 ranks on this machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from commgnn.distributed.context import free_port

CONFIG = """
[data.synthetic]
num_nodes = 1200
num_classes = 4
feature_dim = 16
[model]
hidden = 8
[train]
epochs = 4
[output]
quiet = true
"""


def _ended_fast_with_one_line(res: subprocess.CompletedProcess, took: float, message: str) -> None:
    """The job failed well before its 100 s time-out, every rank's error is one line naming
    ``message``, and no rank printed a traceback."""
    assert res.returncode != 0
    assert took < 60, f"took {took:.0f} s: the ranks waited for the time-out (100 s)"
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("commgnn: error:")]
    assert errors and all(message in ln for ln in errors), res.stderr[-2000:]
    assert "[rank0]: Traceback" not in res.stderr and "[rank1]: Traceback" not in res.stderr


FED = """
[data.synthetic]
num_nodes = 300
num_classes = 3
feature_dim = 8
[federated]
hidden = 16
rounds = 3
[split]
clients = 4
[runtime]
threads = 1
[output]
quiet = true
"""


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
@pytest.mark.slow  # CI time (11 s): three local ranks equal one process in test_federate_cli
def test_federate_under_torchrun_equals_one_process(tmp_path):
    """torchrun's 3 ranks: rank 0 serves, the 4 clients live on ranks 1-2; SecAgg's four
    steps cross processes, and the run equals the one-process run."""
    from commgnn.cli.main import main

    cfg = tmp_path / "fed.toml"
    cfg.write_text(FED)
    one, ranks = tmp_path / "one", tmp_path / "ranks"
    assert main(["federate", "--config", str(cfg), "--secure-agg", "--out", str(one)]) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "3",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "commgnn", "federate", "--config", str(cfg), "--secure-agg", "--out", str(ranks)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    a, b = (json.loads((d / "summary.json").read_text()) for d in (one, ranks))
    assert b["ranks"] == 3 and a["ranks"] == 1
    assert b["uplink_bytes_total"] == a["uplink_bytes_total"] and b["test_acc"] == a["test_acc"]
    rows = lambda d: (d / "metrics.jsonl").read_text().count("\n")  # noqa: E731
    assert rows(ranks) == rows(one) == 3


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
@pytest.mark.timeout(120)
@pytest.mark.slow  # CI time (10 s): the refusal itself is tested without torchrun in test_federate_cli
def test_federate_policy_refusal_under_torchrun_is_fast_and_one_line(tmp_path):
    """A client rank refuses an upload over its link budget: every rank ends at once (the
    server's watchdog, not the collective time-out), no rank prints a traceback, the
    refusal is one line, and no run folder is left."""
    import time

    cfg = tmp_path / "fed.toml"
    cfg.write_text(FED.replace("[runtime]\nthreads = 1", "[runtime]\nthreads = 1\ntimeout_s = 100"))
    policy = tmp_path / "policy.toml"
    policy.write_text('[[organisation]]\nname = "bank-a"\nclients = [0, 1]\n'
                      '[[organisation]]\nname = "bank-b"\nclients = [2, 3]\n'
                      '[crossing]\nupdates = "secure_aggregation"\n[budget]\nper_link_mb = 0.0001\n')
    out = tmp_path / "refused"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "3",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "commgnn", "federate", "--config", str(cfg), "--secure-agg", "--policy", str(policy),
           "--out", str(out)]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=110)
    _ended_fast_with_one_line(res, time.monotonic() - t0, "over its budget")
    assert not out.exists()


# Run as torchrun's script: ranks listed in COMMGNN_TEST_NO_LOAD (or all, with "all") fail
# if they load the graph, so a run that succeeds proves they never did.
NO_LOAD = """
import os, sys
import commgnn.runner.torchrun as run
deny = os.environ.get("COMMGNN_TEST_NO_LOAD", "")
if deny == "all" or os.environ["RANK"] in deny.split(","):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"rank {os.environ['RANK']} loaded the whole graph")
    run.load_dataset = refuse
from commgnn.cli.main import main
sys.exit(main())
"""


def _torchrun(tmp_path, ranks: int, args: list[str], deny: str, timeout: float = 240):
    import os

    script = tmp_path / "no_load.py"
    script.write_text(NO_LOAD)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), *args]
    env = {**os.environ, "COMMGNN_TEST_NO_LOAD": deny}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
@pytest.mark.timeout(300)
@pytest.mark.slow  # CI time (10 s): the torchrun entry point runs in CI from a partition directory
def test_train_under_torchrun_where_only_rank_0_loads_the_graph(tmp_path):
    """The train entry point under torchrun. Rank 0 partitions and sends rank 1 its
    partition: rank 1 runs with graph loading disabled, and the run trains exactly as the
    local launcher's (which loads partition files)."""
    from commgnn.cli.main import main

    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG)
    res = _torchrun(tmp_path, 2, ["train", "--config", str(cfg), "--out", str(tmp_path / "tr")], deny="1")
    assert res.returncode == 0, res.stderr[-2000:]
    assert main(["train", "--config", str(cfg), "--parts", "2", "--out", str(tmp_path / "local")]) == 0
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("tr", "local"))
    assert a["parts"] == b["parts"] == 2 and a["epochs_run"] == 4
    C = a["partition"]["comm_volume"]
    assert a["halo_bytes_per_epoch"] == b["halo_bytes_per_epoch"] == C * (16 + 8 + 8) * 4
    assert a["test_acc"] == b["test_acc"] and a["best_val_acc"] == b["best_val_acc"]
    losses = lambda d: [json.loads(ln)["loss"] for ln in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert losses("tr") == losses("local") and len(losses("tr")) == 4
    manifest = json.loads((tmp_path / "tr" / "manifest.json").read_text())
    assert manifest["dataset"]["num_nodes"] == 1200 and manifest["launch"]["torchrun"] is True


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
@pytest.mark.timeout(300)
def test_torchrun_with_a_partition_dir_loads_no_graph_at_all(tmp_path):
    """`commgnn partition` once; then no rank loads the graph (each reads its own file), and
    the manifest still describes the graph, from the directory's meta.json."""
    from commgnn.cli.main import main

    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG)
    parts = tmp_path / "parts"
    assert main(["partition", "--config", str(cfg), "--parts", "2", "--out", str(parts)]) == 0
    res = _torchrun(tmp_path, 2, ["train", "--config", str(cfg), "--partition-dir", str(parts),
                                  "--out", str(tmp_path / "tr")], deny="all")
    assert res.returncode == 0, res.stderr[-2000:]
    manifest = json.loads((tmp_path / "tr" / "manifest.json").read_text())
    meta = json.loads((parts / "meta.json").read_text())
    assert manifest["dataset"]["fingerprint"] == meta["graph_fingerprint"]
    assert manifest["dataset"]["num_nodes"] == 1200 and manifest["dataset"]["num_edges"] == meta["num_edges"]
    assert json.loads((tmp_path / "tr" / "summary.json").read_text())["epochs_run"] == 4


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
@pytest.mark.timeout(120)
@pytest.mark.slow  # CI time (8 s): a failing rank ends the local launcher's job fast in test_lifecycle
def test_torchrun_bad_graph_on_rank_0_ends_every_rank_with_its_one_line_error(tmp_path):
    """Rank 0 finds the dataset missing while the others wait for their partitions: every
    rank ends at once (not at the collective time-out) with rank 0's one-line error."""
    import time

    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG + "[runtime]\ntimeout_s = 100\n")
    t0 = time.monotonic()
    res = _torchrun(tmp_path, 2, ["train", "--config", str(cfg), "--dataset", str(tmp_path / "missing.pt"),
                                  "--out", str(tmp_path / "tr")], deny="1", timeout=110)
    _ended_fast_with_one_line(res, time.monotonic() - t0, "missing.pt")
    assert not (tmp_path / "tr").exists()


def test_the_local_launcher_with_a_partition_dir_does_not_load_the_graph(tmp_path, monkeypatch):
    """A directory that records the run's [data] table: the launcher takes the graph's
    description from meta.json; one made from other data settings is still checked."""
    import commgnn.runner.local as run_mod
    from commgnn.cli.main import main

    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG)
    parts = tmp_path / "parts"
    assert main(["partition", "--config", str(cfg), "--parts", "1", "--out", str(parts)]) == 0  # 1 rank: in process

    def refuse(*args, **kwargs):
        raise AssertionError("the launcher loaded the whole graph")
    monkeypatch.setattr(run_mod, "load_dataset", refuse)
    out = tmp_path / "local"
    assert main(["train", "--config", str(cfg), "--parts", "1", "--partition-dir", str(parts), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset"]["num_nodes"] == 1200 and manifest["dataset"]["num_features"] == 16
    other = tmp_path / "other.toml"
    other.write_text(CONFIG.replace("num_nodes = 1200", "num_nodes = 1300"))
    with pytest.raises(AssertionError, match="loaded the whole graph"):  # other data: checked
        main(["train", "--config", str(other), "--parts", "1", "--partition-dir", str(parts),
              "--out", str(tmp_path / "other")])
