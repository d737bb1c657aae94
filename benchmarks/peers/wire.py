"""The neutral byte meter of the peers' bench: the kernel's interface counters.

Every emulated host's link is a veth pair whose root-namespace end ``cg<PID>v<i>``
(:mod:`commgnn.cluster.netns`) counts, in ``/sys/class/net/<if>/statistics``, every frame
the host sends (``rx_bytes`` of that end) and receives (``tx_bytes``). Neither system under
test can see or change those counters. :class:`WireMeter` samples them every
``interval_s`` in a thread, with the monotonic clock, so that a system's epochs (timed by
the lines it prints, :mod:`benchmarks.peers.procs`) can be cut out of the record.

The counters are Ethernet frames without preamble and FCS: a TCP payload of ``b`` bytes
in segments of ``mss`` costs ``b (1 + 66 / mss)`` bytes with Linux's timestamps option
(14 Ethernet + 20 IP + 32 TCP) plus the ACKs going the other way; :func:`framing` measures
that ratio on the emulated link itself rather than assuming it.
"""

from __future__ import annotations

import bisect
import threading
import time
from pathlib import Path
from typing import Sequence

SYS = Path("/sys/class/net")


def read_counters(links: Sequence[str]) -> tuple[int, int]:
    """``(sent, received)`` bytes of the hosts behind the root-side ends ``links``, summed."""
    sent = received = 0
    for link in links:
        stats = SYS / link / "statistics"
        sent += int((stats / "rx_bytes").read_text())  # the root end receives what the host sends
        received += int((stats / "tx_bytes").read_text())
    return sent, received


class WireMeter:
    """Samples the summed bytes the hosts sent, ``(t, sent)``, every ``interval_s``."""

    def __init__(self, links: Sequence[str], interval_s: float = 0.2) -> None:
        self.links, self.interval_s = list(links), interval_s
        self.t: list[float] = []
        self.sent: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "WireMeter":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        try:
            sent, _ = read_counters(self.links)
        except OSError:  # the links went away with the namespaces
            return
        self.t.append(time.monotonic())
        self.sent.append(sent)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def at(self, t: float) -> float:
        """Bytes sent by all hosts up to monotonic time ``t`` (linear between samples)."""
        if not self.t:
            return 0.0
        i = bisect.bisect_left(self.t, t)
        if i == 0:
            return float(self.sent[0])
        if i >= len(self.t):
            return float(self.sent[-1])
        t0, t1, s0, s1 = self.t[i - 1], self.t[i], self.sent[i - 1], self.sent[i]
        return s0 + (s1 - s0) * (t - t0) / max(t1 - t0, 1e-9)

    def between(self, t0: float, t1: float) -> float:
        return self.at(t1) - self.at(t0)

    @property
    def total(self) -> int:
        return self.sent[-1] - self.sent[0] if self.sent else 0


def framing(prefix_a: Sequence[str], prefix_b: Sequence[str], address_b: str, links: Sequence[str],
            payload: int = 64 << 20) -> float:
    """Wire bytes per TCP payload byte on the emulated link: ``payload`` bytes sent from
    host a to host b over one TCP connection (both directions' frames counted, ACKs
    included), measured with the counters. ``prefix_*``: the commands that run a program in
    each host's namespace."""
    import subprocess
    import sys

    port = 29999
    recv = subprocess.Popen([*prefix_b, sys.executable, "-c", _RECV.format(port=port, address=address_b)],
                            stdout=subprocess.PIPE, text=True)
    assert recv.stdout is not None
    recv.stdout.readline()  # listening
    before = read_counters(links)[0]  # every frame sent is received once
    subprocess.run([*prefix_a, sys.executable, "-c", _SEND.format(port=port, address=address_b, n=payload)],
                   check=True)
    got = int(recv.stdout.readline())
    recv.wait()
    after = read_counters(links)[0]
    if got != payload:
        raise OSError(f"framing probe: {got} of {payload} bytes arrived")
    return (after - before) / payload


_RECV = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(({address!r}, {port})); s.listen(1)
print("listening", flush=True)
c, _ = s.accept(); n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print(n, flush=True)
"""

_SEND = """
import socket, time
for _ in range(100):
    try:
        s = socket.create_connection(({address!r}, {port})); break
    except OSError: time.sleep(0.05)
buf = bytes(1 << 20); left = {n}
while left:
    k = min(left, len(buf)); s.sendall(buf[:k]); left -= k
s.close()
"""
