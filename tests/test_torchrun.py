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
