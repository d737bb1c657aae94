"""A timed TCP transfer between two emulated hosts: does the link run at its shaped rate?

Written by hand (a socket pair; iperf3 is not a Python dependency). The receiver reads
until the sender closes; the rate is payload bits over the receiver's time from the first
to the last byte, so connection set-up and a slow start do not count as link time.

    ip netns exec H1 python -m commgnn.cluster.probe recv --port 5201 --out r.txt
    ip netns exec H0 python -m commgnn.cluster.probe send --to 198.18.0.2 --port 5201 --mb 8
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
    ns = ap.parse_args(argv)
    if ns.role == "recv":
        receive(ns.port, ns.out)
    else:
        send(ns.to, ns.port, int(ns.mb * 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
