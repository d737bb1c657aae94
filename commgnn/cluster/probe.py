"""A timed TCP transfer between two emulated hosts: does the link run at its shaped rate?
And a UDP ping-pong: does a round trip take the configured delay twice?

Written by hand (a socket pair; iperf3 is not a Python dependency). The receiver reads
until the sender closes; the rate is payload bits over the receiver's time from the first
to the last byte, so connection set-up and a slow start do not count as link time.

    ip netns exec H1 python -m commgnn.cluster.probe recv --port 5201 --out r.txt
    ip netns exec H0 python -m commgnn.cluster.probe send --to 198.18.0.2 --port 5201 --mb 8
    ip netns exec H1 python -m commgnn.cluster.probe echo --port 5202 --count 20
    ip netns exec H0 python -m commgnn.cluster.probe rtt --to 198.18.0.2 --port 5202 --count 20
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

CHUNK = 1 << 16


def receive(port: int, out: Path, timeout_s: float = 60.0) -> float:
    """Accept one connection, read it to the end; write and return its rate in bit/s."""
    with socket.create_server(("0.0.0.0", port)) as srv:
        srv.settimeout(timeout_s)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(timeout_s)
            first = conn.recv(CHUNK)
            t0, total = time.perf_counter(), 0
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    break
                total += len(data)
            elapsed = time.perf_counter() - t0
    rate = total * 8 / elapsed if elapsed > 0 and first else 0.0
    out.write_text(f"{rate:.1f} {total} {elapsed:.4f}\n")
    return rate


def send(host: str, port: int, nbytes: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:  # the receiver may still be starting
        try:
            conn = socket.create_connection((host, port), timeout=timeout_s)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    buf = b"\0" * CHUNK
    with conn:
        sent = 0
        while sent < nbytes:
            conn.sendall(buf[: min(CHUNK, nbytes - sent)])
            sent += min(CHUNK, nbytes - sent)


def echo(port: int, count: int, timeout_s: float = 30.0) -> None:
    """Send back the first ``count`` datagrams that arrive on ``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", port))
        sock.settimeout(timeout_s)
        for _ in range(count):
            data, peer = sock.recvfrom(64)
            sock.sendto(data, peer)


def rtt(host: str, port: int, count: int, timeout_s: float = 30.0) -> list[float]:
    """``count`` round trips of a small datagram to an :func:`echo`, in seconds each."""
    times: list[float] = []
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.5)
        while len(times) < count and time.monotonic() < deadline:
            t0 = time.perf_counter()
            sock.sendto(b"%d" % len(times), (host, port))
            try:
                sock.recvfrom(64)  # the echo may not be up yet: then try again
            except TimeoutError:
                continue
            times.append(time.perf_counter() - t0)
    if len(times) < count:
        raise TimeoutError(f"{len(times)} of {count} round trips to {host}:{port} came back")
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m commgnn.cluster.probe")
    sub = ap.add_subparsers(dest="role", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--port", type=int, default=5201)
    r.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--port", type=int, default=5201)
    s.add_argument("--mb", type=float, default=8.0)
    e = sub.add_parser("echo")
    e.add_argument("--port", type=int, default=5202)
    e.add_argument("--count", type=int, default=20)
    t = sub.add_parser("rtt", help="print each round trip in ms")
    t.add_argument("--to", required=True)
    t.add_argument("--port", type=int, default=5202)
    t.add_argument("--count", type=int, default=20)
    ns = ap.parse_args(argv)
    if ns.role == "recv":
        receive(ns.port, ns.out)
    elif ns.role == "send":
        send(ns.to, ns.port, int(ns.mb * 1e6))
    elif ns.role == "echo":
        echo(ns.port, ns.count)
    else:
        print(" ".join(f"{1e3 * x:.3f}" for x in rtt(ns.to, ns.port, ns.count)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
