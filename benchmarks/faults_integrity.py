"""The fault benchmark's integrity and lifecycle cases (``benchmarks/faults.py --kinds ...``):

* ``corrupt-checkpoint``   one byte of a random rank's checkpoint file of a finished run
                           XOR-ed with a random value, then ``train --resume``. Expected: exit 2,
                           one line naming that file, no epoch run.
* ``malicious-checkpoint`` a random rank's checkpoint replaced by a ``torch.save`` file whose
                           pickle would create a marker file, its sha256 in ``latest.json``
                           updated to match (a careful attacker), then ``train --resume``.
                           Expected: exit 2, one line naming the file, no marker file.
* ``early-kill-launcher``  ``commgnn train`` SIGKILLed at a seeded uniform 0.5-10 s after it
                           started (before, during or after the fork server's imports and the
                           ranks' start). Expected: no process of the job 5 s after the kill.
* ``nan``                  a graph whose features are all 3e38. Expected: exit 1, one line
                           ``training diverged at epoch 1``, status failed, no summary.json.

Every process of a trial carries a marker in its environment, so the job's processes are
found by walking ``/proc`` (a process re-parented after its launcher died included).
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from faults import LEFT_AFTER_S, POLL_S, Trial

NEW_KINDS = ("corrupt-checkpoint", "malicious-checkpoint", "early-kill-launcher", "nan")
EXPECTED_EXIT = {"corrupt-checkpoint": {2}, "malicious-checkpoint": {2}, "early-kill-launcher": {-9}, "nan": {1}}
EXPECTED_STATE = {"nan": "failed"}
MARK = "COMMGNN_FAULT_TRIAL"

BASE_CONFIG = """\
[data.synthetic]
num_nodes = {nodes}
num_classes = 4
feature_dim = 32
[model]
hidden = 16
[train]
epochs = 4
patience = 0
[runtime]
timeout_s = 120
checkpoint_every = 2
[output]
quiet = true
"""

NAN_CONFIG = """\
[model]
hidden = 16
[train]
epochs = 20
patience = 0
[runtime]
timeout_s = 120
[output]
quiet = true
"""


class _Payload:
    """Unpickling this creates the marker file: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def prepare(work: Path, *, parts: int, nodes: int, kinds: list[str]) -> dict[str, Path]:
    """What the new kinds need, made once: a finished run with a checkpoint (resume cases)
    and a graph file of huge features (``nan``)."""
    made: dict[str, Path] = {}
    if {"corrupt-checkpoint", "malicious-checkpoint"} & set(kinds):
        cfg = work / "config-base.toml"
        cfg.write_text(BASE_CONFIG.format(nodes=nodes))
        base = work / "base-run"
        res = subprocess.run([sys.executable, "-m", "commgnn", "train", "--config", str(cfg), "--parts", str(parts),
                              "--out", str(base)], capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise SystemExit(f"faults: the base run failed: {res.stderr[-2000:]}")
        made["base"] = base
    if "nan" in kinds:
        import torch

        g = torch.Generator().manual_seed(0)
        n = 600
        graph = {"x": torch.full((n, 8), 3e38), "edge_index": torch.randint(0, n, (2, 4 * n), generator=g),
                 "y": torch.randint(0, 3, (n,), generator=g)}
        order = torch.randperm(n, generator=g)
        for name, lo, hi in (("train_mask", 0, n // 2), ("val_mask", n // 2, 3 * n // 4), ("test_mask", 3 * n // 4, n)):
            mask = torch.zeros(n, dtype=torch.bool)
            mask[order[lo:hi]] = True
            graph[name] = mask
        made["nan_graph"] = work / "huge-features.pt"
        torch.save(graph, made["nan_graph"])
        made["nan_config"] = work / "config-nan.toml"
        made["nan_config"].write_text(NAN_CONFIG)
    return made


def job_processes(marker: str) -> list[int]:
    """Live processes whose environment holds ``MARK=marker``."""
    want = f"{MARK}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if want not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def _checkpoint(run: Path, rank: int) -> Path:
    meta = json.loads((run / "checkpoints" / "latest.json").read_text())
    return run / "checkpoints" / meta["dir"] / f"rank{rank}.pt"


def run_trial(kind: str, trial: int, *, parts: int, seed: int, trial_dir: Path, made: dict[str, Path],
              limit_s: float) -> Trial:
    rng = random.Random(f"{seed}-{kind}-{trial}")
    row = Trial(kind=kind, trial=trial)
    trial_dir.mkdir(parents=True, exist_ok=True)
    marker_file = trial_dir / "marker"
    run = trial_dir / "run"
    before_rows = 0
    if kind in ("corrupt-checkpoint", "malicious-checkpoint"):
        shutil.copytree(made["base"], run)
        before_rows = (run / "metrics.jsonl").read_text().count("\n")
        rank = rng.randrange(parts)
        row.target_rank = str(rank)
        path = _checkpoint(run, rank)
        if kind == "corrupt-checkpoint":
            data = bytearray(path.read_bytes())
            at = rng.randrange(len(data))
            data[at] ^= rng.randrange(1, 256)
            path.write_bytes(bytes(data))
            row.note = f"byte {at} of {len(data)}"
        else:
            import hashlib

            import torch

            buf = io.BytesIO()
            torch.save({"epoch": 4, "trainer": _Payload(marker_file)}, buf)
            path.write_bytes(buf.getvalue())
            latest = run / "checkpoints" / "latest.json"
            meta = json.loads(latest.read_text())
            meta["sha256"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
            latest.write_text(json.dumps(meta))
        cmd = [sys.executable, "-m", "commgnn", "train", "--resume", str(run), "--epochs", "6"]
    elif kind == "nan":
        cmd = [sys.executable, "-m", "commgnn", "train", "--config", str(made["nan_config"]), "--dataset",
               str(made["nan_graph"]), "--parts", str(parts), "--out", str(run)]
    else:  # early-kill-launcher
        cmd = [sys.executable, "-m", "commgnn", "train", "--config", str(made["normal_config"]), "--parts",
               str(parts), "--out", str(run)]
        row.delay_s = round(rng.uniform(0.5, 10.0), 3)
    marker = uuid.uuid4().hex
    env = {**os.environ, MARK: marker}
    stderr_path = trial_dir / "stderr.txt"
    with open(stderr_path, "wb") as err, open(trial_dir / "stdout.txt", "wb") as out:
        t_start = time.monotonic()
        popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=trial_dir, env=env,
                                 start_new_session=True)
    seen: set[int] = set()
    t0 = t_start
    try:
        if kind == "early-kill-launcher":
            while time.monotonic() - t_start < row.delay_s and popen.poll() is None:
                seen.update(job_processes(marker))
                time.sleep(0.05)
            seen.update(job_processes(marker))
            row.procs_seen = len(seen)
            t0 = time.monotonic()
            if popen.poll() is not None:
                row.outcome, row.note = "no-start", f"the launcher ended by itself (exit {popen.returncode})"
            else:
                os.kill(popen.pid, signal.SIGKILL)
        exited_at = gone_at = None
        left_5s: list[int] | None = None
        while True:
            now = time.monotonic()
            if exited_at is None and popen.poll() is not None:
                exited_at = now
            alive = job_processes(marker)
            seen.update(alive)
            if kind == "early-kill-launcher" and left_5s is None and now - t0 >= LEFT_AFTER_S:
                left_5s = alive
            if exited_at is not None and not alive:
                gone_at = now
                break
            if now - t0 >= limit_s:
                break
            time.sleep(POLL_S)
        if kind != "early-kill-launcher":
            row.procs_seen = len(seen)
        survivors = job_processes(marker)
        row.left_5s = len(left_5s if left_5s is not None else survivors)
        if exited_at is not None:
            row.exit_s = f"{exited_at - t0:.3f}"
        if gone_at is not None:
            row.gone_s = f"{gone_at - t0:.3f}"
        elif not row.outcome:
            row.outcome = "hang"
            row.note = (row.note + "; " if row.note else "") + f"killed at the {limit_s:g} s limit"
    finally:
        for pid in job_processes(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if popen.poll() is None:
            popen.kill()
        popen.wait()
    _judge(row, popen.returncode, stderr_path, run, marker_file, before_rows)
    return row


def _judge(row: Trial, code: int | None, stderr_path: Path, run: Path, marker_file: Path, before_rows: int) -> None:
    row.exit_code = "" if code is None else str(code)
    text = stderr_path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    row.stderr_lines = len(lines)
    row.one_line = len(lines) == 1
    row.message = lines[-1].strip().replace(str(run), "RUN") if lines else ""
    row.traceback = "Traceback" in text
    try:
        row.status = str(json.loads((run / "status.json").read_text()).get("state"))
    except (OSError, ValueError):
        row.status = "missing"
    row.summary_json = (run / "summary.json").exists()
    bad = []
    if row.kind in ("corrupt-checkpoint", "malicious-checkpoint"):
        names_file = f"rank{row.target_rank}.pt" in row.message
        row.message_ok = row.one_line and row.message.startswith("commgnn: error: ") and names_file
        rows_now = (run / "metrics.jsonl").read_text().count("\n") if (run / "metrics.jsonl").is_file() else 0
        if rows_now != before_rows:
            bad.append("an epoch ran")
        if marker_file.exists():
            bad.append("CODE RAN")
            row.note = (row.note + "; " if row.note else "") + "the marker file was created"
    elif row.kind == "nan":
        row.message_ok = row.one_line and "training diverged at epoch 1" in row.message
        if row.summary_json:
            bad.append("summary.json")
    else:
        row.message_ok = not lines  # a SIGKILLed launcher prints nothing
    if row.outcome:
        return
    if code is None or code not in EXPECTED_EXIT[row.kind]:
        bad.append(f"exit {code}")
    if not row.message_ok:
        bad.append("message")
    if row.left_5s:
        bad.append(f"{row.left_5s} left")
    if row.kind in EXPECTED_STATE and row.status != EXPECTED_STATE[row.kind]:
        bad.append(f"status {row.status}")
    if row.traceback:
        bad.append("traceback")
    row.outcome = ";".join(bad) or "ok"
