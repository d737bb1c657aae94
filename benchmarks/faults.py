"""Fault benchmark: how `commgnn train` (local launcher, P ranks) ends when something fails.

Four fault kinds, each injected at a random moment of training (once `metrics.jsonl` has
its first epoch, after a further seeded random 0-3 s):

* ``kill-rank``      SIGKILL one random rank. Expected: exit 1, one stderr line
                     ``commgnn: error: rank R of P failed: killed by SIGKILL`` naming that
                     rank, status.json "failed", no summary.json.
* ``term-launcher``  SIGTERM the launcher. Expected: exit 143, one line
                     ``commgnn: terminated (SIGTERM)``, status.json "interrupted".
* ``kill-launcher``  SIGKILL the launcher. Expected: exit -9, nothing printed (it cannot),
                     every rank gone (they die with it through PR_SET_PDEATHSIG).
* ``disk-full``      the run directory lives on a small tmpfs; this process fills it until
                     ENOSPC. Expected: exit 1 or 2 with one ``commgnn: error: ...`` line.

And the integrity and lifecycle cases of :mod:`faults_integrity` (``corrupt-checkpoint``,
``malicious-checkpoint``, ``early-kill-launcher``, ``nan``).

Every kind: no process of the job (launcher, ranks, multiprocessing's resource tracker)
alive 5 s after the fault, and no hang (a trial is killed and marked "hang" after
``--limit`` seconds). Writes ``DATE-faults.csv`` (one row per trial), ``DATE-faults.md``
(a table per kind) and ``DATE-faults.png`` (exit time per trial) into ``--out-dir``.

    python benchmarks/faults.py                     # 20 trials of each kind, 4 ranks
    python benchmarks/faults.py --trials 2 --kinds kill-rank,disk-full
    python benchmarks/faults.py --kinds corrupt-checkpoint,malicious-checkpoint,early-kill-launcher,nan

Needs Linux; ``disk-full`` needs root (it mounts a tmpfs) and is skipped with a note if
the mount fails. Trials run one after another (each job uses every core).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

OLD_KINDS = ("kill-rank", "term-launcher", "kill-launcher", "disk-full")
KINDS = (*OLD_KINDS, "corrupt-checkpoint", "malicious-checkpoint", "early-kill-launcher", "nan")
EXPECTED_EXIT = {"kill-rank": {1}, "term-launcher": {143}, "kill-launcher": {-9}, "disk-full": {1, 2}}
EXPECTED_STATE = {"kill-rank": "failed", "term-launcher": "interrupted"}  # others: recorded only
LEFT_AFTER_S = 5.0
"""Processes of the job still alive this long after the fault are counted as left over."""
POLL_S = 0.02
RANK_LINE = re.compile(r"commgnn rank (\d+) of (\d+): pid (\d+)")
NAMED_RANK = re.compile(r"rank (\d+) of (\d+) failed")

CONFIG = """\
[data]
dataset = "synthetic"

[data.synthetic]
num_nodes = {nodes}
num_classes = 4
feature_dim = 32

[model]
hidden = 16

[train]
epochs = {epochs}
patience = 0

[runtime]
timeout_s = 120

[output]
quiet = true
"""


@dataclass
class Trial:
    """One row of the CSV."""

    kind: str
    trial: int
    delay_s: float = 0.0
    """Sleep between the first epoch in metrics.jsonl and the fault."""
    epochs_at_fault: int = 0
    target_rank: str = ""
    """kill-rank: the rank killed."""
    outcome: str = ""
    """``ok``, ``hang``, ``no-start``, ``skipped`` or the failed checks, ``;``-joined."""
    exit_code: str = ""
    exit_s: str = ""
    """Fault to the launcher's exit (blank: it never exited before the limit)."""
    gone_s: str = ""
    """Fault to no process of the job alive (zombies count as gone)."""
    left_5s: int = 0
    """Processes of the job (launcher included) alive 5 s after the fault; killed afterwards."""
    left_5s_tracker: int = 0
    """Of ``left_5s``: multiprocessing's resource tracker."""
    procs_seen: int = 0
    """Processes of the job seen up to the fault (launcher, ranks, resource tracker, and any
    short-lived helper such as ``git`` caught while the launcher prepared the run)."""
    stderr_lines: int = 0
    one_line: bool = False
    message: str = ""
    """The last stderr line (the run directory's path written as RUN)."""
    message_ok: bool = False
    named_rank: str = ""
    rank_ok: str = ""
    """kill-rank only: the named rank is the one killed."""
    status: str = ""
    """status.json's state once the job ended (``missing``: no file)."""
    summary_json: bool = False
    traceback: bool = False
    """``Traceback`` appears on the launcher's stderr."""
    note: str = ""


@dataclass
class Job:
    """A started `commgnn train` and every process seen in its tree."""

    popen: subprocess.Popen
    run_dir: Path
    stderr_path: Path
    exited_at: list[float] = field(default_factory=list)
    procs: dict[tuple[int, float], psutil.Process] = field(default_factory=dict)

    def __post_init__(self) -> None:
        threading.Thread(target=self._wait, daemon=True).start()
        self.launcher = psutil.Process(self.popen.pid)
        self.procs[(self.launcher.pid, self.launcher.create_time())] = self.launcher

    def _wait(self) -> None:
        self.popen.wait()
        self.exited_at.append(time.monotonic())

    @property
    def exited(self) -> bool:
        return bool(self.exited_at)

    def refresh(self) -> None:
        """Add the launcher's current descendants to the processes tracked."""
        if self.exited:
            return
        try:
            for p in self.launcher.children(recursive=True):
                try:
                    self.procs.setdefault((p.pid, p.create_time()), p)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass

    def alive(self) -> list[psutil.Process]:
        out = []
        for p in self.procs.values():
            if p is self.launcher:
                if not self.exited:
                    out.append(p)
                continue
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def kill_all(self) -> int:
        """SIGKILL every live process of the job; return how many there were."""
        left = self.alive()
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass
        psutil.wait_procs([p for p in left if p is not self.launcher], timeout=5)
        return len(left)

    def rank_pids(self, parts: int) -> dict[int, int]:
        """rank -> pid, from the first line of each rank's log."""
        out = {}
        for r in range(parts):
            try:
                with open(self.run_dir / "logs" / f"rank{r}.log") as fh:
                    m = RANK_LINE.match(fh.readline())
            except OSError:
                continue
            if m and int(m.group(1)) == r:
                out[r] = int(m.group(3))
        return out


def is_tracker(p: psutil.Process) -> bool:
    try:
        return "resource_tracker" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def metric_lines(run_dir: Path) -> int:
    try:
        with open(run_dir / "metrics.jsonl", "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def fill_disk(path: Path) -> int:
    """Write ``path`` until its file system is full (ENOSPC); return the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            block = b"\0" * chunk
            while True:
                try:
                    written += os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return written


def mount_tmpfs(where: Path, size_mb: int) -> str | None:
    """Mount a tmpfs of ``size_mb`` MiB at ``where``; None on success, else why not."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None if res.returncode == 0 else (res.stderr.strip() or f"mount exited {res.returncode}")


def unmount(where: Path) -> None:
    for args in (["umount", str(where)], ["umount", str(where)], ["umount", "-l", str(where)]):
        try:
            if subprocess.run(args, capture_output=True, timeout=30, check=False).returncode == 0:
                return
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(1)
    print(f"faults: could not unmount {where}", file=sys.stderr)


def disk_epochs(tmpfs_mb: int) -> int:
    """Epochs that keep the launcher's disk pre-flight (partitions + 4 kB a metrics line +
    1 MB) inside half the tmpfs (the staging copy and logs need room too)."""
    return max(1000, int((tmpfs_mb * (1 << 20) / 2 - 2e6) / 4096))


def run_trial(kind: str, trial: int, *, parts: int, seed: int, trial_dir: Path, config: Path,
              setup_limit_s: float, limit_s: float) -> Trial:
    rng = random.Random(f"{seed}-{kind}-{trial}")
    row = Trial(kind=kind, trial=trial, delay_s=round(rng.uniform(0.0, 3.0), 3))
    target = rng.randrange(parts)
    if kind == "kill-rank":
        row.target_rank = str(target)
    trial_dir.mkdir(parents=True, exist_ok=True)
    mount = trial_dir / "mnt" if kind == "disk-full" else None
    if mount is not None:
        why = mount_tmpfs(mount, TMPFS_MB)
        if why is not None:
            row.outcome, row.note = "skipped", f"tmpfs mount failed: {why}"
            return row
    job: Job | None = None
    try:
        run_dir = (mount or trial_dir) / "run"
        stderr_path = trial_dir / "stderr.txt"
        cmd = [sys.executable, "-m", "commgnn", "train", "--config", str(config), "--parts", str(parts),
               "--out", str(run_dir)]
        with open(stderr_path, "wb") as err, open(trial_dir / "stdout.txt", "wb") as out:
            popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=trial_dir,
                                     start_new_session=True)  # our Ctrl-C is not the job's
        job = Job(popen, run_dir, stderr_path)
        # -- wait for training, then the random delay -----------------------------------
        start = time.monotonic()
        while not job.exited and metric_lines(run_dir) < 1 and time.monotonic() - start < setup_limit_s:
            job.refresh()
            time.sleep(0.05)
        end = time.monotonic() + row.delay_s
        while not job.exited and time.monotonic() < end:
            job.refresh()
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        job.refresh()
        if job.exited or metric_lines(run_dir) < 1:
            row.outcome = "no-start"
            row.note = "the job ended before training" if job.exited else \
                f"no epoch within {setup_limit_s:.0f} s"
            job.kill_all()
            _finish(row, job, parts, target)
            return row
        row.epochs_at_fault = metric_lines(run_dir)
        row.procs_seen = len(job.procs)
        # -- the fault ----------------------------------------------------------------
        if kind == "kill-rank":
            pids = job.rank_pids(parts)
            if target not in pids:
                row.outcome, row.note = "no-start", f"no pid for rank {target} in its log"
                job.kill_all()
                return row
            t0 = time.monotonic()
            os.kill(pids[target], signal.SIGKILL)
        elif kind == "term-launcher":
            t0 = time.monotonic()
            os.kill(job.popen.pid, signal.SIGTERM)
        elif kind == "kill-launcher":
            t0 = time.monotonic()
            os.kill(job.popen.pid, signal.SIGKILL)
        else:
            assert mount is not None
            filled = fill_disk(mount / "filler.bin")
            t0 = time.monotonic()  # the moment the disk is full
            row.note = f"filled {filled / 2**20:.1f} MiB"
        # -- watch the job end --------------------------------------------------------
        left_5s: list[psutil.Process] | None = None
        gone_at = None
        last_refresh = 0.0
        while True:
            now = time.monotonic()
            if now - last_refresh > 0.25:
                job.refresh()
                last_refresh = now
            alive = job.alive()
            if left_5s is None and now - t0 >= LEFT_AFTER_S:
                left_5s = alive
            if not alive:
                gone_at = now
                break
            if now - t0 >= limit_s:
                break
            time.sleep(POLL_S)
        survivors = job.alive() if gone_at is None else []
        if left_5s is None:  # all gone before the 5 s mark, or a limit under 5 s was hit
            left_5s = survivors
        row.left_5s = len(left_5s)
        row.left_5s_tracker = sum(is_tracker(p) for p in left_5s)
        launcher_exited = job.exited
        if launcher_exited:
            row.exit_s = f"{job.exited_at[0] - t0:.3f}"
        if gone_at is not None:
            row.gone_s = f"{gone_at - t0:.3f}"
        else:
            row.outcome = "hang"
            row.note = (row.note + "; " if row.note else "") + f"killed at the {limit_s:g} s limit: " + \
                ", ".join(_describe(p, job) for p in survivors)
        job.kill_all()
        _finish(row, job, parts, target)
        if not launcher_exited:
            row.exit_code = ""  # it did not exit by itself (-9 would be our kill)
        return row
    finally:
        if job is not None:
            job.kill_all()
        if mount is not None:
            try:  # keep the run's records (not its partitions) for a look after the unmount
                if (mount / "run").is_dir():
                    shutil.copytree(mount / "run", trial_dir / "run",
                                    ignore=shutil.ignore_patterns("partitions", "filler.bin"), dirs_exist_ok=True)
            except OSError:
                pass
            finally:
                unmount(mount)


def _describe(p: psutil.Process, job: Job) -> str:
    if p is job.launcher:
        return f"launcher {p.pid}"
    return f"{'resource tracker' if is_tracker(p) else 'rank'} {p.pid}"


def _finish(row: Trial, job: Job, parts: int, target: int) -> None:
    """Fill in what the job left: exit code, stderr, status.json, summary.json; judge."""
    code = job.popen.returncode
    row.exit_code = "" if code is None else str(code)
    text = job.stderr_path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    row.stderr_lines = len(lines)
    row.one_line = len(lines) == 1
    row.message = lines[-1].strip().replace(str(job.run_dir), "RUN") if lines else ""
    row.traceback = "Traceback" in text
    m = NAMED_RANK.search(row.message)
    row.named_rank = m.group(1) if m else ""
    try:
        row.status = str(json.loads((job.run_dir / "status.json").read_text()).get("state"))
    except (OSError, ValueError):
        row.status = "missing"
    row.summary_json = (job.run_dir / "summary.json").exists()
    if row.kind == "kill-rank":
        row.message_ok = row.one_line and row.message == \
            f"commgnn: error: rank {target} of {parts} failed: killed by SIGKILL"
        row.rank_ok = str(row.named_rank == str(target))
    elif row.kind == "term-launcher":
        row.message_ok = row.one_line and row.message == "commgnn: terminated (SIGTERM)"
    elif row.kind == "kill-launcher":
        row.message_ok = not lines  # a SIGKILLed process prints nothing
    else:
        row.message_ok = row.one_line and row.message.startswith("commgnn: error: ")
    if row.outcome:
        return
    bad = []
    if code is None or code not in EXPECTED_EXIT[row.kind]:
        bad.append(f"exit {code}")
    if not row.message_ok:
        bad.append("message")
    if row.rank_ok == "False":
        bad.append("rank")
    if row.left_5s:
        bad.append(f"{row.left_5s} left")
    if row.kind in EXPECTED_STATE and row.status != EXPECTED_STATE[row.kind]:
        bad.append(f"status {row.status}")
    if row.kind in ("kill-rank", "term-launcher", "disk-full") and row.summary_json:
        bad.append("summary.json")
    if row.traceback:
        bad.append("traceback")
    row.outcome = ";".join(bad) or "ok"


TMPFS_MB = 64


def main() -> int:
    global TMPFS_MB
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20, help="trials per fault kind (default 20)")
    ap.add_argument("--parts", type=int, default=4, help="ranks P (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault moments and ranks (default 0)")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results" / "faults"),
                    help="where DATE-faults.{csv,md,png} go (default benchmarks/results/faults/faults)")
    ap.add_argument("--work-dir", default=None,
                    help="run directories go here and are kept (default: a temporary folder, removed)")
    ap.add_argument("--limit", type=float, default=90.0, help="seconds after the fault before a trial is a hang")
    ap.add_argument("--setup-limit", type=float, default=180.0, help="seconds to wait for the first epoch")
    ap.add_argument("--nodes", type=int, default=3000, help="nodes of the synthetic graph (default 3000)")
    ap.add_argument("--tmpfs-mb", type=int, default=64, help="size of disk-full's tmpfs in MiB (default 64)")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds or args.trials < 1 or args.parts < 2:
        print(f"faults: need --trials >= 1, --parts >= 2 and --kinds from {', '.join(KINDS)}", file=sys.stderr)
        return 2
    TMPFS_MB = args.tmpfs_mb
    keep = args.work_dir is not None
    work = Path(args.work_dir) if keep else Path(tempfile.mkdtemp(prefix="commgnn-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    work = work.resolve()
    configs = {}
    for name, epochs in (("normal", 100_000), ("disk", disk_epochs(TMPFS_MB))):
        configs[name] = work / f"config-{name}.toml"
        configs[name].write_text(CONFIG.format(nodes=args.nodes, epochs=epochs))
    commgnn_cmd = (f"python -m commgnn train --config CONFIG --parts {args.parts} --out RUN")
    rows: list[Trial] = []
    skipped: dict[str, str] = {}
    made: dict[str, Path] = {}
    if set(kinds) - set(OLD_KINDS):
        import faults_integrity

        made = faults_integrity.prepare(work, parts=args.parts, nodes=args.nodes, kinds=kinds)
        made["normal_config"] = configs["normal"]
    try:
        for t in range(args.trials):  # kinds interleaved: a drift in machine load hits all alike
            for kind in kinds:
                if kind in skipped:
                    continue
                trial_dir = work / f"{kind}-{t:03d}"
                if kind in OLD_KINDS:
                    row = run_trial(kind, t, parts=args.parts, seed=args.seed, trial_dir=trial_dir,
                                    config=configs["disk" if kind == "disk-full" else "normal"],
                                    setup_limit_s=args.setup_limit, limit_s=args.limit)
                else:
                    row = faults_integrity.run_trial(kind, t, parts=args.parts, seed=args.seed, trial_dir=trial_dir,
                                                     made=made, limit_s=args.limit)
                if row.outcome == "skipped":
                    skipped[kind] = row.note
                    print(f"{kind}: skipped ({row.note})", flush=True)
                    continue
                rows.append(row)
                print(f"{kind} #{t}: {row.outcome}, exit {row.exit_code or 'none'} after "
                      f"{row.exit_s or '-'} s, no process after {row.gone_s or '-'} s, "
                      f"left {row.left_5s}, {row.message or '(no stderr)'!r}", flush=True)
                if not keep:
                    shutil.rmtree(trial_dir, ignore_errors=True)
    except KeyboardInterrupt:
        print("faults: interrupted; reporting the trials done", file=sys.stderr)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if not rows and not skipped:
        return 1
    from faults_report import write_report  # it imports this module's Trial

    stem = write_report(rows, kinds, skipped, args, commgnn_cmd, tmpfs_mb=TMPFS_MB,
                        disk_epochs=disk_epochs(TMPFS_MB))
    print(f"wrote {stem}.csv, .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
