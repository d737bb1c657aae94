"""A user-space delay line between TAP devices, for kernels built without ``sch_netem``.

Written by hand: netem is the maintained tool, and where the kernel lacks it (many kernels
built for containers and micro-VMs) no maintained library adds a delay, so this does the one
thing netem would: hold every frame a host sends for the one-way delay ``d`` (with uniform
jitter and loss if asked), in order. Rates stay with the kernel's ``tbf``.

Layout for host ``i`` of a cluster made by process ``PID`` (the veth pair of
:mod:`commgnn.cluster.netns` replaced by two TAP devices and this process)::

    namespace commgnn-PID-hi        this process                 root namespace
    eth0 (TAP, tbf rate r) --read--> hold d, in order --write--> cg<PID>v<i> (TAP, on the bridge)
    eth0 (TAP)         <--write----- at once         <--read---- cg<PID>v<i> (tbf rate r)

A frame from host ``a`` to host ``b`` is delayed once (one-way ``d``, round trip ``2d``, as with
netem on ``eth0``) and meets both hosts' tbf, as on the veth links. The frames are at most
:func:`frame_mtu` bytes; a larger MTU than Ethernet's keeps the frame rate, and so this
process's CPU, low at high rates (unlike netem's 1500-byte frames, so TCP's segments, and
with them its initial window in bytes, are larger: a calibrated latency is comparable only
between runs on the same path). A frame is dropped with the probability that any of its
1500-byte packets would be, ``1 - (1 - p)^ceil(len / 1514)``, so ``loss`` means what it
means for netem on 1500-byte frames.

The TAPs are not persistent: they vanish when this process exits, so a killed cluster
leaves none behind. It runs at real-time priority where allowed, so frames leave on time
while the ranks keep the cores busy.

    python -m commgnn.cluster.delayline --pid PID --hosts H --delay-us 5000 [--jitter-us J] [--loss P]
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import heapq
import math
import os
import random
import selectors
import signal
import struct
import sys
import time
from pathlib import Path

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
CLONE_NEWNET = 0x40000000
ETH_FRAME = 1514  # bytes of a full 1500-byte-MTU Ethernet frame, for the loss arithmetic


def frame_mtu(rate_bps: float) -> int:
    """The TAP MTU for a link of ``rate_bps``: half a millisecond of line rate, 1500 to 65000.

    tbf's bucket must hold two frames, so the MTU bounds the burst a link lets through at
    once; half a millisecond keeps it near the 1 ms burst of the veth links.
    """
    return int(min(65000, max(1500, rate_bps / 8 * 0.0005)))


def _setns(fd: int, what: str) -> None:
    """Move this thread into the network namespace open as ``fd`` (Python 3.11 has no os.setns)."""
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into {what}: {os.strerror(err)}")


def open_tap(name: str) -> int:
    """Create a non-persistent TAP ``name`` in this thread's network namespace; its fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_taps(pid: int, hosts: int) -> list[tuple[int, int]]:
    """Per host, ``(fd of eth0 in its namespace, fd of cg<pid>v<i> in the root namespace)``."""
    root_fd = os.open("/proc/self/ns/net", os.O_RDONLY)  # the way back, held before leaving
    fds: list[int] = []
    try:
        for i in range(hosts):
            host_fd = os.open(f"/run/netns/commgnn-{pid}-h{i}", os.O_RDONLY)
            try:
                _setns(host_fd, f"commgnn-{pid}-h{i}")
                fds.append(open_tap("eth0"))
            finally:
                os.close(host_fd)
                _setns(root_fd, "the root namespace")
            fds.append(open_tap(f"cg{pid}v{i}"))
    except BaseException:
        for fd in fds:  # the TAPs made so far go with their descriptors
            os.close(fd)
        raise
    finally:
        os.close(root_fd)
    return [(fds[k], fds[k + 1]) for k in range(0, len(fds), 2)]


class DelayLine:
    """Moves frames between TAP pairs; ``inner -> outer`` held ``delay_s`` (± ``jitter_s``).

    Frames of one host leave in the order they came (a release time is never earlier than
    the host's previous one), as netem does when it also shapes a rate.
    """

    def __init__(self, pairs: list[tuple[int, int]], *, delay_s: float, jitter_s: float = 0.0,
                 loss: float = 0.0, seed: int = 0) -> None:
        self.pairs = pairs
        self.delay_s, self.jitter_s, self.loss = delay_s, jitter_s, loss
        self.rng = random.Random(seed)
        self.held: list[tuple[float, int, int, bytes]] = []  # (release, seq, fd, frame), a heap
        self.last_release = [0.0] * len(pairs)
        self.seq = 0
        self.frames = self.dropped = 0
        self.stopped = False

    def _hold(self, host: int, frame: bytes, now: float) -> None:
        self.frames += 1
        if self.loss and self.rng.random() < 1 - (1 - self.loss) ** math.ceil(len(frame) / ETH_FRAME):
            self.dropped += 1
            return
        jitter = self.rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0
        release = max(now + self.delay_s + jitter, self.last_release[host])
        self.last_release[host] = release
        self.seq += 1
        heapq.heappush(self.held, (release, self.seq, self.pairs[host][1], frame))

    @staticmethod
    def _write(fd: int, frame: bytes) -> None:
        try:
            os.write(fd, frame)
        except OSError as exc:  # a full or downed device drops the frame, as a NIC would
            if exc.errno not in (errno.EAGAIN, errno.ENOBUFS, errno.EIO, errno.ENETDOWN):
                raise

    def _release_due(self, now: float) -> None:
        while self.held and self.held[0][0] <= now:
            _, _, fd, frame = heapq.heappop(self.held)
            self._write(fd, frame)

    def serve(self) -> None:
        """Run until :attr:`stopped` (set by SIGTERM/SIGINT)."""
        # select(2), not epoll: epoll rounds a timeout up to whole milliseconds, which would
        # add up to 1 ms to every frame and release them in 1 ms bunches.
        sel = selectors.SelectSelector()
        for host, (inner, outer) in enumerate(self.pairs):
            sel.register(inner, selectors.EVENT_READ, (host, True))
            sel.register(outer, selectors.EVENT_READ, (host, False))
        while not self.stopped:
            timeout = max(0.0, self.held[0][0] - time.monotonic()) if self.held else 0.5
            for key, _ in sel.select(timeout):
                host, upward = key.data
                for _ in range(64):  # drain a burst, but let the others and the clock in
                    try:
                        frame = os.read(key.fd, 65536)
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        if exc.errno == errno.EIO:  # the device is not up (yet, or any more): back off
                            time.sleep(0.001)  # at real-time priority a retry loop would starve the host
                            break
                        if exc.errno == errno.EAGAIN:
                            break
                        raise
                    if upward:
                        self._hold(host, frame, time.monotonic())
                    else:
                        self._write(self.pairs[host][0], frame)
            self._release_due(time.monotonic())


def _realtime() -> bool:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))  # type: ignore[attr-defined]
        return True
    except (OSError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m commgnn.cluster.delayline", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--pid", type=int, required=True, help="the cluster's owner pid (names its namespaces)")
    ap.add_argument("--hosts", type=int, required=True)
    ap.add_argument("--delay-us", type=float, required=True)
    ap.add_argument("--jitter-us", type=float, default=0.0)
    ap.add_argument("--loss", type=float, default=0.0, help="fraction of 1500-byte packets lost")
    ap.add_argument("--seed", type=int, default=0, help="seed of the jitter and loss draws")
    ap.add_argument("--parent", type=int, default=0, help="the owner's pid: exit at once if it is gone")
    ns = ap.parse_args(argv)
    # Die with the cluster that started this (PR_SET_PDEATHSIG), so a killed owner leaves no
    # line; if the owner died before that was set, this is already an orphan: leave.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    if ns.parent and os.getppid() != ns.parent:
        return 1
    missing = [h for h in range(ns.hosts) if not Path(f"/run/netns/commgnn-{ns.pid}-h{h}").exists()]
    if missing:
        print(f"delayline: namespace commgnn-{ns.pid}-h{missing[0]} does not exist", file=sys.stderr)
        return 2
    line = DelayLine(open_taps(ns.pid, ns.hosts), delay_s=ns.delay_us * 1e-6, jitter_s=ns.jitter_us * 1e-6,
                     loss=ns.loss, seed=ns.seed)

    def stop(*_: object) -> None:
        line.stopped = True

    signal.signal(signal.SIGTERM, stop)
    # Ctrl-C is the owner's to handle: the ranks shut down over the links first, then the
    # owner stops this line (SIGTERM). It runs in its own session besides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rt = _realtime()
    print(f"ready realtime={int(rt)}", flush=True)  # the parent configures the TAPs from here on
    line.serve()
    print(f"delayline: {line.frames} frames held, {line.dropped} dropped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
