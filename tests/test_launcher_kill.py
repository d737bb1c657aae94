"""A launcher killed at any moment takes every process of its job with it within 5 s: the
fork server (while it still imports torch and PyG, before any rank exists), the ranks and
multiprocessing's helpers.

The job's processes are found by a marker in their environment (every process of the job
inherits the launcher's), by walking ``/proc``, so that a process re-parented after the
launcher's death is still found.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

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
[output]
quiet = true
"""

MARK = "COMMGNN_TEST_JOB"
GRACE_S = 5.0
"""What the README promises: no process of the job lives longer after the launcher died."""


def job_processes(marker: str) -> dict[int, str]:
    """Live (not zombie) processes whose environment holds ``MARK=marker``: pid -> command line."""
    found = {}
    want = f"{MARK}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if want not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours
            continue
        if state not in ("Z", "X"):
            found[int(entry.name)] = cmd
    return found


def start_job(tmp_path: Path, marker: str) -> subprocess.Popen:
    """``commgnn train`` on 2 local ranks, long enough to be killed at any time."""
    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG)
    env = {**os.environ, MARK: marker}
    log = open(tmp_path / "launcher.log", "w")
    return subprocess.Popen([sys.executable, "-m", "commgnn", "train", "--config", str(cfg), "--parts", "2",
                             "--out", str(tmp_path / "run")], stdout=log, stderr=log, env=env)


def kill_and_wait(proc: subprocess.Popen, marker: str) -> tuple[dict[int, str], float]:
    """SIGKILL the launcher; wait up to :data:`GRACE_S` for its job to end. Returns what was
    left then (empty when the job ended) and how long the last process lived."""
    proc.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    proc.wait(timeout=30)
    left = job_processes(marker)
    while left and time.monotonic() - t0 < GRACE_S:
        time.sleep(0.05)
        left = job_processes(marker)
    return left, time.monotonic() - t0


def _is_fork_server(cmd: str) -> bool:
    return "multiprocessing.forkserver import main" in cmd


def run_until(tmp_path: Path, when: str) -> tuple[dict[int, str], dict[int, str], float]:
    """Start a job, kill its launcher at ``when`` (seconds after start, or ``server``: as
    soon as the fork server exists, while it imports torch), wait. Returns (the processes
    of the job seen before the kill, those left :data:`GRACE_S` after it, seconds waited)."""
    marker = uuid.uuid4().hex
    proc = start_job(tmp_path, marker)
    seen: dict[int, str] = {}
    t0 = time.monotonic()
    try:
        if when == "server":
            while not any(_is_fork_server(c) for c in seen.values()):
                if proc.poll() is not None or time.monotonic() - t0 > 120:
                    raise AssertionError("the fork server never started: "
                                         + (tmp_path / "launcher.log").read_text()[-2000:])
                seen.update(job_processes(marker))
                time.sleep(0.01)
        else:
            while time.monotonic() - t0 < float(when):
                seen.update(job_processes(marker))
                time.sleep(0.05)
            assert proc.poll() is None, (tmp_path / "launcher.log").read_text()[-2000:]
        seen.update(job_processes(marker))
        left, waited = kill_and_wait(proc, marker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in left:  # never leave them behind for the next test
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return seen, left, waited


@pytest.mark.timeout(180)
@pytest.mark.parametrize("when", [
    "server",  # the fork server exists and imports torch and PyG; no rank yet
    "2",
    pytest.param("5", marks=pytest.mark.slow),  # CI time (5 s): "2" kills it mid-start as well
    pytest.param("0.5", marks=pytest.mark.slow),
    pytest.param("10", marks=pytest.mark.slow),
])
def test_a_launcher_killed_early_leaves_no_process_of_its_job(tmp_path, when):
    seen, left, waited = run_until(tmp_path, when)
    assert not left, f"{len(left)} process(es) of the job {GRACE_S:.0f} s after the launcher was killed: {left}"
    if when == "server":  # the case that failed: killed while the server still imported torch
        assert any(_is_fork_server(c) for c in seen.values())
        # The server dies with the launcher at once (the kernel kills it), not once its
        # imports end: those take 3.4-3.7 s on an idle 2-core machine, more under load (the
        # 7.6-11.3 s of the report), against 0.07-0.12 s measured here for the job's end.
        assert waited < SERVER_GONE_S, f"the job ended {waited:.2f} s after the launcher was killed"


SERVER_GONE_S = 2.0
"""Bound on the job's end after a launcher killed while its fork server imports torch."""
