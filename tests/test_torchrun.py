"""The same entry point under torchrun (2 ranks on this machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from commgnn.dist.context import free_port

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


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_train_under_torchrun(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "commgnn", "train", "--config", str(cfg), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parts"] == 2 and summary["epochs_run"] == 4
    C = summary["partition"]["comm_volume"]
    assert summary["halo_bytes_per_epoch"] == C * (16 + 8 + 8) * 4
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["launch"]["torchrun"] is True


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
    took = time.monotonic() - t0
    assert res.returncode != 0
    assert took < 60, f"took {took:.0f} s: the ranks waited for the time-out (100 s)"
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("commgnn: error:")]
    assert errors and all("over its budget" in ln for ln in errors), res.stderr[-2000:]
    assert "[rank0]: Traceback" not in res.stderr and "[rank1]: Traceback" not in res.stderr
    assert not out.exists()
