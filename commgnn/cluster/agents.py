"""Run a ``commgnn train`` job across the hosts of an emulated cluster with torchrun.

Each host runs one torchrun agent inside its namespace (``--nnodes H --nproc-per-node R``,
c10d rendezvous whose store host 0 serves on its veth address), so the multi-machine path
of ``torch.distributed`` runs for real: the rendezvous, the TCP store and every gloo
connection cross the shaped links (``GLOO_SOCKET_IFNAME=eth0``). The agents inherit this
process's stdout and stderr.

Failure handling: the first agent to exit non-zero gives the others ``grace_s`` to stop
on their own (torchrun's rendezvous and commgnn's watchdog end them), then they are
killed; Ctrl-C and SIGTERM stop every agent. The namespaces and links go in every case,
and any process still inside a namespace is killed before its namespace is deleted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Mapping, Sequence

from commgnn.cluster.config import ClusterConfig
from commgnn.cluster.cpu import HostCPUs
from commgnn.cluster.netns import EmulatedNetwork
from commgnn.cluster.straggle import Stragglers


def torchrun_command(cfg: ClusterConfig, host: int, run_id: str, job_args: Sequence[str]) -> list[str]:
    """The torchrun command line of host ``host`` (run inside its namespace)."""
    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(cfg.hosts), "--nproc-per-node", str(cfg.ranks_per_host),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{cfg.address(0)}:{cfg.rdzv_port}",
            "--rdzv-id", run_id,
            # Host 0 serves the rendezvous store: inside a namespace the machine's hostname
            # does not resolve to the veth address, so torchrun cannot find that out itself.
            "--rdzv-conf", f"is_host={1 if host == 0 else 0},join_timeout=120",
            "--local-addr", cfg.address(host), "--max-restarts", "0",
            "-m", "commgnn", *job_args]


def _is_agent(pid: int) -> bool:
    """Whether ``pid`` is a torchrun agent (or gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"torch.distributed.run" in fh.read()
    except OSError:
        return True


def _kill_namespace_processes(net: EmulatedNetwork) -> None:
    for host in range(len(net.namespaces)):
        for pid in net.pids(host):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _stop(procs: list[subprocess.Popen[bytes]], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass


def _wait_all(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)


def run_cluster(cfg: ClusterConfig, job_args: Sequence[str], *, env: Mapping[str, str] | None = None,
                grace_s: float = 30.0) -> int:
    """Build the cluster, run ``commgnn *job_args`` (a train or calibrate job) on it, tear it
    down; the exit code.

    The code is 0 when every host's agent succeeded, else the first non-zero code seen
    (2 for a user error the ranks reported, 130 after Ctrl-C, 143 after SIGTERM).
    """
    base_env = dict(os.environ if env is None else env)
    base_env.update(GLOO_SOCKET_IFNAME="eth0", TP_SOCKET_IFNAME="eth0", PYTHONUNBUFFERED="1")
    # c10d warns on every connection that the namespace cannot reverse-resolve its peer.
    base_env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        base_env.pop(var, None)  # a launcher's own variables must not leak into the agents
    procs: list[subprocess.Popen[bytes]] = []
    stragglers: Stragglers | None = None
    # the CPU cgroups first: a machine that cannot set them refuses before any link is made
    with (HostCPUs(cfg.host_cpus) if cfg.host_cpus else contextlib.nullcontext()) as cpus, \
            EmulatedNetwork(cfg) as net:
        print(f"commgnn cluster: {cfg.describe()} (namespaces {net.namespaces[0]}..)", flush=True)
        run_id = f"commgnn-{net.pid}"
        try:
            for host in range(cfg.hosts):
                procs.append(subprocess.Popen([*net.prefix(host), *torchrun_command(cfg, host, run_id, job_args)],
                                              env=base_env, start_new_session=True,
                                              preexec_fn=cpus.enter_fn(host) if cpus is not None else None))
            if cfg.stragglers:  # the ranks, not the agents: torchrun's rendezvous keep-alive must go on
                stragglers = Stragglers(cfg.stragglers, lambda h: [p for p in net.pids(h) if not _is_agent(p)]).start()
            failed_at: float | None = None
            code = 0
            while any(p.poll() is None for p in procs):
                for p in procs:
                    if p.returncode not in (None, 0) and not code:
                        code, failed_at = p.returncode, time.monotonic()
                why = net.failure()
                if why is not None:  # the hosts lost their links: no rank can finish
                    print(f"commgnn cluster: {why}", file=sys.stderr, flush=True)
                    code = code or 1
                    break
                if failed_at is not None and time.monotonic() - failed_at > grace_s:
                    break
                time.sleep(0.2)
            for p in procs:
                if p.returncode not in (None, 0) and not code:
                    code = p.returncode
            if any(p.poll() is None for p in procs):
                _stop(procs, signal.SIGTERM)
                _wait_all(procs, 10.0)
            return code
        except KeyboardInterrupt:
            _stop(procs, signal.SIGINT)
            _wait_all(procs, 15.0)
            raise
        finally:
            if stragglers is not None:  # nothing stays stopped
                stragglers.stop()
            _stop(procs, signal.SIGKILL)
            _kill_namespace_processes(net)
            _wait_all(procs, 5.0)
