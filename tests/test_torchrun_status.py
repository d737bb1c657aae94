"""``status.json`` under torchrun for every way a worker or the agent ends (the real
``torchrun`` on 127.0.0.1, 2 ranks): rank 0 killed, another rank killed, the agent killed,
the agent stopped by SIGTERM. Who writes what: :mod:`commgnn.runner.torchrun`."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commgnn.distributed.context import free_port

CONFIG = """
[data.synthetic]
num_nodes = 600
num_classes = 3
feature_dim = 8
[model]
hidden = 8
[train]
epochs = 100000
patience = 0
[runtime]
timeout_s = 60
threads = 1
[output]
quiet = true
"""

pytestmark = pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path, dict[int, int]]:
    """torchrun with 2 ranks training a long run; returns (agent, run folder, rank -> pid)
    once both ranks train."""
    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "commgnn", "train", "--config", str(cfg), "--out", str(out)]
    log = open(tmp_path / "agent.log", "w")
    agent = subprocess.Popen(cmd, stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        metrics = out / "metrics.jsonl"
        if metrics.is_file() and metrics.read_text().count("\n") >= 2:
            ranks = {_rank_of(p): p for p in _children(agent.pid)}
            if set(ranks) >= {0, 1}:
                return agent, out, ranks
        if agent.poll() is not None:
            break
        time.sleep(0.2)
    agent.kill()
    raise AssertionError("training did not start: " + (tmp_path / "agent.log").read_text()[-3000:])


def _final_status(out: Path, limit_s: float = 15.0) -> dict:
    deadline = time.monotonic() + limit_s
    while True:
        status = json.loads((out / "status.json").read_text())
        if status["state"] != "running" or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def _end(agent: subprocess.Popen, ranks: dict[int, int]) -> None:
    """Wait for the agent and check that no rank is left 5 s later."""
    try:
        agent.wait(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    t0 = time.monotonic()
    while any(_alive(p) for p in ranks.values()) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert not any(_alive(p) for p in ranks.values())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("victim", [0, pytest.param(1, marks=pytest.mark.slow)])  # 1: CI time, same path
def test_a_killed_rank_is_named_in_status(tmp_path, victim):
    """SIGKILL of rank 0 or of rank 1: the run is ``failed`` and names the dead rank (the
    surviving rank writes it when rank 0 is the one killed), not ``interrupted`` by the
    SIGTERM the agent sends the survivor, and not left ``running``."""
    agent, out, ranks = _start(tmp_path)
    import os

    os.kill(ranks[victim], signal.SIGKILL)
    _end(agent, ranks)
    assert agent.returncode != 0
    status = _final_status(out)
    assert status["state"] == "failed", status
    assert status["error"].startswith(f"rank {victim} of 2 died without an error"), status
    assert not (out / "summary.json").exists()


@pytest.mark.timeout(240)
def test_a_killed_agent_is_recorded_and_its_ranks_end(tmp_path):
    """SIGKILL of the torchrun agent: its ranks end within 5 s (the kernel sends them
    SIGTERM) and rank 0 records the agent's death."""
    agent, out, ranks = _start(tmp_path)
    agent.kill()
    _end(agent, ranks)
    status = _final_status(out)
    assert status["state"] == "failed", status
    assert status["error"] == f"the torchrun agent (pid {agent.pid}) died; its workers stopped", status


@pytest.mark.timeout(240)
@pytest.mark.slow  # the path the SIGTERM tests of the local launcher share
def test_an_agent_stopped_by_sigterm_is_interrupted(tmp_path):
    agent, out, ranks = _start(tmp_path)
    agent.send_signal(signal.SIGTERM)
    _end(agent, ranks)
    status = _final_status(out)
    assert status["state"] == "interrupted" and status["signal"] == "SIGTERM", status
