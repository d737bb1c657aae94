"""Emulated hosts: Linux network namespaces on one bridge, each link shaped with ``tc``.

Written by hand (no maintained Python library builds namespaces and qdiscs): it calls the
``ip`` and ``tc`` tools of iproute2. The layout for a cluster made by process ``PID``::

    root namespace:   bridge cg<PID>br
                        |-- veth cg<PID>v0  <->  eth0 in namespace commgnn-<PID>-h0  (198.18.0.1/15)
                        |-- veth cg<PID>v1  <->  eth0 in namespace commgnn-<PID>-h1  (198.18.0.2/15)
                        ...

Shaping, per host, like a full-duplex NIC port of rate ``r``: ``tbf rate r`` on ``eth0``
(what the host sends) and on ``cg<PID>v<i>`` (what it receives). A delay or loss puts
``netem delay d [jitter j] loss p rate r`` on ``eth0`` instead of the tbf there, so a
packet between two hosts is delayed once (one-way ``d``, round trip ``2d``). Many kernels
built for containers lack ``sch_netem``; there the veth pairs become TAP pairs joined by
the user-space delay line of :mod:`commgnn.cluster.delayline`, which holds what each host
sends for ``d``, while tbf keeps the rates.

Everything made is recorded as it is made and removed by :meth:`EmulatedNetwork.close`
(on success, error and Ctrl-C); :func:`remove_stale` removes what a killed process left.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from commgnn.cluster.config import ClusterConfig
from commgnn.cluster.delayline import frame_mtu
from commgnn.errors import UserError

CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
_NS_RE = re.compile(r"^commgnn-(\d+)-h\d+$")


def check_rights(status_text: str | None = None) -> None:
    """Refuse (one line) unless this process may make namespaces, links and qdiscs."""
    if status_text is None:
        status_text = Path("/proc/self/status").read_text()
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)$", status_text, re.M)
    caps = int(m.group(1), 16) if m else 0
    missing = [name for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
               if not caps >> bit & 1]
    if missing:
        raise UserError(f"commgnn cluster needs root (or {' and '.join(missing)}) to build network namespaces, "
                        "veth links and tc qdiscs; run it as root, or run the ranks on real machines with torchrun")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise UserError(f"commgnn cluster needs the '{tool}' tool (iproute2); install it, e.g. "
                            "apt-get install iproute2")


def run_tool(args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an iproute2/tc command; ``check``: raise :class:`OSError` with its stderr on failure."""
    res = subprocess.run(list(args), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise OSError(f"{' '.join(args)}: {res.stderr.strip() or f'exit {res.returncode}'}")
    return res


def namespace_pids(ns: str) -> list[int]:
    """The processes running in the network namespace ``ns`` (none once it is gone)."""
    out = run_tool(["ip", "netns", "pids", ns], check=False).stdout.split()
    return [int(p) for p in out if p.isdigit()]


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (tried on the loopback of a scratch namespace)."""
    ns = f"commgnn-{os.getpid()}-probe"
    try:
        run_tool(["ip", "netns", "add", ns])
        return run_tool(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                    check=False).returncode == 0
    finally:
        run_tool(["ip", "netns", "del", ns], check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove the namespaces and bridges of clusters whose process is gone; their names."""
    removed = []
    names = run_tool(["ip", "netns", "list"], check=False).stdout.split()
    for name in names:
        m = _NS_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            run_tool(["ip", "netns", "del", name], check=False)
            removed.append(name)
    for line in run_tool(["ip", "-o", "link", "show", "type", "bridge"], check=False).stdout.splitlines():
        m = re.match(r"^\d+:\s+cg(\d+)br[:@]", line)
        if m and not _pid_alive(int(m.group(1))):
            run_tool(["ip", "link", "del", f"cg{m.group(1)}br"], check=False)
            removed.append(f"cg{m.group(1)}br")
    return removed


class EmulatedNetwork:
    """H namespaces on a bridge with shaped links; a context manager that always cleans up.

    ``cfg.hosts`` namespaces ``commgnn-<pid>-h<i>`` each hold ``eth0`` with address
    ``cfg.address(i)``; :meth:`prefix` is the command prefix that runs a program on host i.
    """

    def __init__(self, cfg: ClusterConfig, *, owner_pid: int | None = None, delayline: bool | None = None) -> None:
        """``delayline``: True forces the user-space delay line for a delay or loss (for tests
        on kernels that have netem), False forbids it, None uses it only without netem."""
        self.cfg = cfg
        self.pid = os.getpid() if owner_pid is None else owner_pid
        self.bridge = f"cg{self.pid}br"
        self.namespaces = [f"commgnn-{self.pid}-h{i}" for i in range(cfg.hosts)]
        self.host_links = [f"cg{self.pid}v{i}" for i in range(cfg.hosts)]
        self._made: list[tuple[str, str]] = []  # ("ns"|"link"|"proc", name), in creation order
        self._proc: subprocess.Popen[str] | None = None
        self._want_delayline = delayline
        self._failure: str | None = None
        self.delayline = False
        """Whether delay and loss go through :mod:`commgnn.cluster.delayline` (no netem here)."""

    def __enter__(self) -> "EmulatedNetwork":
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prefix(self, host: int) -> list[str]:
        """Command prefix that runs a program inside host ``host``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[host]]

    def build(self) -> None:
        check_rights()
        cfg = self.cfg
        # Without sch_netem a delay or loss goes through the user-space delay line.
        want = self._want_delayline
        has_netem = netem_available() if cfg.needs_netem and want is not True else True
        self.delayline = cfg.needs_netem and (want is True or (want is None and not has_netem))
        if not has_netem and not self.delayline:
            raise UserError("this kernel has no netem qdisc (sch_netem), and the delay line was turned off: "
                            "--delay and --loss cannot be emulated")
        run_tool(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._made.append(("link", self.bridge))
        run_tool(["ip", "link", "set", self.bridge, "up"])
        for ns in self.namespaces:
            run_tool(["ip", "netns", "add", ns])
            self._made.append(("ns", ns))
        if self.delayline:
            self._start_delayline()
        for i, (ns, hv) in enumerate(zip(self.namespaces, self.host_links)):
            if not self.delayline:
                run_tool(["ip", "link", "add", hv, "type", "veth", "peer", "name", f"cg{self.pid}p{i}"])
                self._made.append(("link", hv))
                run_tool(["ip", "link", "set", f"cg{self.pid}p{i}", "netns", ns])
                run_tool(["ip", "-n", ns, "link", "set", f"cg{self.pid}p{i}", "name", "eth0"])
            else:
                mtu = str(frame_mtu(min(cfg.rate_of(h) for h in range(cfg.hosts))))  # one MTU on the bridge
                run_tool(["ip", "-n", ns, "link", "set", "eth0", "mtu", mtu])
                run_tool(["ip", "link", "set", hv, "mtu", mtu])
            run_tool(["ip", "-n", ns, "addr", "add", f"{cfg.address(i)}/15", "dev", "eth0"])
            run_tool(["ip", "-n", ns, "link", "set", "eth0", "up"])
            run_tool(["ip", "-n", ns, "link", "set", "lo", "up"])
            run_tool(["ip", "link", "set", hv, "master", self.bridge])
            run_tool(["ip", "link", "set", hv, "up"])
            self._shape(ns, hv, cfg.rate_of(i))

    def _start_delayline(self) -> None:
        """Start the delay line; it makes each host's TAP pair and holds it until stopped."""
        cfg = self.cfg
        # Its own session: the terminal's Ctrl-C must not cut the links while the ranks shut down.
        proc = subprocess.Popen([sys.executable, "-m", "commgnn.cluster.delayline", "--pid", str(self.pid),
                                 "--hosts", str(cfg.hosts), "--delay-us", f"{cfg.delay_s * 1e6:.0f}",
                                 "--jitter-us", f"{cfg.jitter_s * 1e6:.0f}", "--loss", repr(cfg.loss),
                                 "--parent", str(os.getpid())],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self._proc = proc
        self._made.append(("proc", str(proc.pid)))
        assert proc.stdout is not None
        ready = proc.stdout.readline() if select.select([proc.stdout], [], [], 60.0)[0] else ""
        if not ready.startswith("ready"):
            lines = self._reap().strip().splitlines()
            raise OSError(f"the delay line did not start: {lines[-1] if lines else 'no reply within 60 s'}")

    def failure(self) -> str | None:
        """Why the delay line stopped while the cluster is up (its last error line), else None."""
        if self._proc is not None and self._proc.poll() is not None:
            code = self._proc.returncode
            lines = self._reap().strip().splitlines()
            self._failure = f"the delay line exited ({code}): {lines[-1] if lines else 'no message'}"
        return self._failure

    def _reap(self) -> str:
        """Stop the delay line (SIGTERM, then SIGKILL after 5 s) and close its pipes; its stderr."""
        proc, self._proc = self._proc, None
        if proc is None:
            return ""
        if proc.poll() is None:
            proc.terminate()
        try:
            return proc.communicate(timeout=5)[1] or ""
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.communicate()[1] or ""

    def _tbf(self, rate: float) -> list[str]:
        # burst: 1 ms at line rate (at least two frames), so even small messages see the
        # rate, as on a real port (tbf splits GSO super-packets larger than the bucket into
        # frames); queue: 100 ms at line rate, as a switch port holds.
        frame = frame_mtu(min(self.cfg.rate_of(h) for h in range(self.cfg.hosts))) + 14 if self.delayline else 1514
        burst = max(int(rate / 8 * 0.001), 2 * frame)
        return ["tbf", "rate", f"{int(rate)}bit", "burst", str(burst), "latency", "100ms"]

    def _shape(self, ns: str, hv: str, rate: float) -> None:
        """Host link ``hv`` / ``ns``'s ``eth0`` at ``rate`` bits/s each way (``--host-rate``)."""
        cfg = self.cfg
        run_tool(["tc", "qdisc", "add", "dev", hv, "root", *self._tbf(rate)])  # what the host receives
        if not cfg.needs_netem or self.delayline:
            run_tool(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *self._tbf(rate)])
            return
        netem = ["netem", "delay", f"{cfg.delay_s * 1e6:.0f}us"]
        if cfg.jitter_s:
            netem += [f"{cfg.jitter_s * 1e6:.0f}us"]
        if cfg.loss:
            netem += ["loss", f"{cfg.loss * 100:g}%"]
        # The queue must hold a bandwidth-delay product of packets, or netem drops them.
        limit = max(1000, int(rate / 8 * (cfg.delay_s + cfg.jitter_s + 0.1) / 1000))
        netem += ["rate", f"{int(rate)}bit", "limit", str(limit)]
        run_tool(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *netem])

    def pids(self, host: int) -> list[int]:
        """The processes running in host ``host``'s namespace."""
        return namespace_pids(self.namespaces[host])

    def qdiscs(self, host: int) -> str:
        """``tc qdisc show`` of both ends of host ``host``'s link (for reports and tests)."""
        inside = run_tool(["ip", "netns", "exec", self.namespaces[host], "tc", "qdisc", "show", "dev", "eth0"]).stdout
        outside = run_tool(["tc", "qdisc", "show", "dev", self.host_links[host]]).stdout
        return inside + outside

    def close(self) -> None:
        """Remove everything made, newest first; deleting a namespace deletes its veth pair."""
        while self._made:
            kind, name = self._made.pop()
            if kind == "proc":  # the delay line: its TAPs go with it
                self._reap()
            elif kind == "ns":
                run_tool(["ip", "netns", "del", name], check=False)
            else:
                run_tool(["ip", "link", "del", name], check=False)

    def leftovers(self) -> list[str]:
        """Objects of this cluster that still exist (empty after :meth:`close`)."""
        names = set(run_tool(["ip", "netns", "list"], check=False).stdout.split())
        links = run_tool(["ip", "-o", "link", "show"], check=False).stdout
        left = [ns for ns in self.namespaces if ns in names]
        left += [ln for ln in [self.bridge, *self.host_links] if re.search(rf"^\d+:\s+{ln}[:@]", links, re.M)]
        return left
