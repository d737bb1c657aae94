"""Local means local: during a run of local ranks, no listening socket of the job (the
launcher's store, the fork server, every rank's gloo sockets) is on a non-loopback address."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp{,6}


def _tree(root: int) -> set[int]:
    """``root`` and every process below it (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, []))
    return seen


def _socket_inodes(pids: set[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])  # little-endian 32-bit word
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))  # four little-endian words
    return ipaddress.IPv6Address(words)


def listening(pids: set[int]) -> list[tuple[str, int]]:
    """``(address, port)`` of every listening TCP socket held by ``pids``."""
    inodes = _socket_inodes(pids)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == _LISTEN and int(cols[9]) in inodes:
                addr, port = cols[1].split(":")
                found.append((str(_address(addr)), int(port, 16)))
    return found


def _loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def test_the_proc_reader_sees_a_wildcard_socket_and_a_loopback_one():
    """The reader itself can fail: a socket on every interface is reported as such."""
    with socket.socket() as wild, socket.socket() as local:
        wild.bind(("0.0.0.0", 0))
        wild.listen()
        local.bind(("127.0.0.1", 0))
        local.listen()
        got = dict((port, addr) for addr, port in listening({os.getpid()}))
        assert got[wild.getsockname()[1]] == "0.0.0.0" and not _loopback("0.0.0.0")
        assert got[local.getsockname()[1]] == "127.0.0.1" and _loopback("127.0.0.1")


def _network_interface() -> str | None:
    """A non-loopback interface with an IPv4 address (SIOCGIFADDR), or None."""
    import fcntl
    import struct
    from commgnn.distributed.context import loopback_interface

    lo = loopback_interface()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            if name == lo:
                continue
            try:
                fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                return name
            except OSError:
                continue
    return None


@pytest.mark.timeout(180)
# the environment's own GLOO_SOCKET_IFNAME overridden for a loopback run: outside CI (-m slow),
# to keep the suite under 10 minutes on 2 cores
@pytest.mark.parametrize("gloo_ifname", ["", pytest.param("network", marks=pytest.mark.slow)],
                         ids=["default", "GLOO_SOCKET_IFNAME-network"])
def test_a_local_run_listens_only_on_loopback(tmp_path, gloo_ifname):
    """Also with ``GLOO_SOCKET_IFNAME`` naming a network interface in the environment (gloo
    would listen there; on a host whose name resolves to 127.0.0.1 that is the way to show
    a launcher that leaves gloo's choice alone)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("[data.synthetic]\nnum_nodes = 4000\nnum_classes = 4\nfeature_dim = 16\n"
                   "[model]\nhidden = 8\n[train]\nepochs = 400\npatience = 0\n"
                   "[runtime]\ntimeout_s = 60\n[output]\nquiet = true\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "COMMGNN_ENERGY": "0"}
    env.pop("GLOO_SOCKET_IFNAME", None)  # the launcher must choose loopback itself
    if gloo_ifname:
        name = _network_interface()
        if name is None:
            pytest.skip("no network interface with an IPv4 address")
        env["GLOO_SOCKET_IFNAME"] = name
    proc = subprocess.Popen([sys.executable, "-m", "commgnn", "train", "--config", str(cfg), "--parts", "2",
                             "--out", str(tmp_path / "run")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    seen: set[tuple[str, int]] = set()
    ranks_seen = 0
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            pids = _tree(proc.pid)
            seen.update(listening(pids))
            # the ranks are up and training once metrics arrive: sample a while longer
            if (tmp_path / "run" / "metrics.jsonl").is_file() and \
                    (tmp_path / "run" / "metrics.jsonl").stat().st_size > 0:
                ranks_seen += 1
                if ranks_seen > 20:
                    break
            time.sleep(0.05)
    finally:
        proc.kill()
        err = proc.communicate(timeout=30)[1]
    assert ranks_seen > 0, f"the run never trained: {err[-2000:]}"
    assert seen, "no listening socket found: the reader is broken"
    # the store, and the ranks' gloo listeners (at least one per rank)
    assert len(seen) >= 3, seen
    wide = sorted(s for s in seen if not _loopback(s[0]))
    assert not wide, f"listening beyond loopback: {wide}"
