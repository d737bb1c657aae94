"""The emulated cluster: units, refusal without rights, real shaping, clean-up, a job on it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commgnn.cluster import ClusterConfig, EmulatedNetwork, check_rights
from commgnn.cluster.config import parse_percent, parse_rate, parse_time
from commgnn.errors import ConfigError, UserError


def _can_build() -> str | None:
    """Why this machine cannot build namespaces, or None."""
    try:
        check_rights()
    except UserError as exc:
        return str(exc)
    probe = subprocess.run(["ip", "netns", "add", f"commgnn-{os.getpid()}-h99"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns add failed: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"commgnn-{os.getpid()}-h99"], capture_output=True)
    return None


WHY_NOT = _can_build()
needs_netns = pytest.mark.skipif(WHY_NOT is not None, reason=f"no network namespaces here: {WHY_NOT}")


def test_units_parse_like_tc():
    assert parse_rate("100mbit") == 1e8 and parse_rate("1gbit") == 1e9 and parse_rate("2.5Gbit") == 2.5e9
    assert parse_time("5ms") == pytest.approx(0.005) and parse_time("200us") == pytest.approx(2e-4)
    assert parse_percent("0.1%") == pytest.approx(0.001)
    for bad in ("100", "100mb", "fast"):
        with pytest.raises(ConfigError, match="rate"):
            parse_rate(bad)
    with pytest.raises(ConfigError, match="time"):
        parse_time("5")
    with pytest.raises(ConfigError, match="loss"):
        parse_percent("100%")


@pytest.mark.parametrize("kwargs, message", [
    ({"hosts": 1}, "--hosts"), ({"ranks_per_host": 0}, "--ranks-per-host"), ({"jitter_s": 0.001}, "--jitter"),
    ({"loss": 1.0}, "--loss"), ({"rdzv_port": 80}, "--rdzv-port"),
])
def test_bad_cluster_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ClusterConfig(**kwargs)


def test_addresses_are_in_the_benchmarking_range_and_distinct():
    cfg = ClusterConfig(hosts=64)
    addrs = [cfg.address(i) for i in range(64)]
    assert len(set(addrs)) == 64 and all(a.startswith("198.18.") for a in addrs)
    assert addrs[0] == "198.18.0.1"


def test_without_net_admin_it_refuses_in_one_line():
    with pytest.raises(UserError, match="CAP_NET_ADMIN and CAP_SYS_ADMIN"):
        check_rights("Name:\tpython\nCapEff:\t0000000000000000\n")
    with pytest.raises(UserError, match="CAP_SYS_ADMIN") as info:
        check_rights(f"CapEff:\t{1 << 12:016x}\n")
    assert "CAP_NET_ADMIN" not in str(info.value)
    check_rights(f"CapEff:\t{(1 << 12) | (1 << 21):016x}\n")  # both: no error


@pytest.mark.skipif(shutil.which("capsh") is None or os.geteuid() != 0, reason="needs root and capsh to drop rights")
def test_the_command_without_rights_exits_2_and_builds_nothing():
    res = subprocess.run(["capsh", "--drop=cap_net_admin,cap_sys_admin", "--",
                          "-c", f"{sys.executable} -m commgnn cluster --hosts 2 -- train --epochs 1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "CAP_NET_ADMIN" in res.stderr and "Traceback" not in res.stderr


def test_bad_job_arguments_stop_before_any_namespace(capsys):
    from commgnn.cli.main import main

    assert main(["cluster", "--hosts", "2", "--", "train", "--parts", "3"]) == 2
    assert "--parts 3 differs" in capsys.readouterr().err
    assert main(["cluster", "--hosts", "2", "--", "partition"]) == 2
    # refused for the job, not for this machine's lack of network rights (checked after it)
    assert "give the job after --" in capsys.readouterr().err


def _measure(net: EmulatedNetwork, tmp_path: Path, mbytes: float) -> float:
    out = tmp_path / "rate.txt"
    recv = subprocess.Popen([*net.prefix(1), sys.executable, "-m", "commgnn.cluster.probe", "recv",
                             "--port", "5201", "--out", str(out)])
    try:
        subprocess.run([*net.prefix(0), sys.executable, "-m", "commgnn.cluster.probe", "send",
                        "--to", net.cfg.address(1), "--port", "5201", "--mb", str(mbytes)], check=True, timeout=60)
        recv.wait(timeout=60)
    finally:
        recv.kill()
    return float(out.read_text().split()[0])


@needs_netns
@pytest.mark.timeout(120)
@pytest.mark.parametrize("rate", ["20mbit", "200mbit"])
def test_a_timed_transfer_runs_at_the_shaped_rate(tmp_path, rate):
    cfg = ClusterConfig(hosts=2, rate_bps=parse_rate(rate))
    with EmulatedNetwork(cfg) as net:
        assert "tbf" in net.qdiscs(0) and "tbf" in net.qdiscs(1)
        # ~2 s of payload at the configured rate: the bucket's initial burst is < 1% of it.
        measured = _measure(net, tmp_path, cfg.rate_bps / 8 * 2 / 1e6)
    # TCP/IP headers take ~4% of a 1500-byte frame; within 15% is the contract.
    assert abs(measured - cfg.rate_bps) / cfg.rate_bps < 0.15, f"{measured / 1e6:.1f} Mbit/s at {rate}"


@needs_netns
@pytest.mark.timeout(60)
def test_everything_made_is_removed_on_success_and_on_error():
    cfg = ClusterConfig(hosts=3, rate_bps=1e8)
    with EmulatedNetwork(cfg) as net:
        assert sorted(net.leftovers()) == sorted([*net.namespaces, net.bridge, *net.host_links])
    assert net.leftovers() == []
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedNetwork(cfg) as net2:
            assert len(net2.leftovers()) == 7
            raise RuntimeError("boom")
    assert net2.leftovers() == []


@needs_netns
@pytest.mark.timeout(60)
def test_a_failed_build_removes_what_it_made(monkeypatch):
    from commgnn.cluster import netns

    cfg = ClusterConfig(hosts=2, rate_bps=1e8)
    net = EmulatedNetwork(cfg)
    monkeypatch.setattr(net, "_shape", lambda ns, hv, rate: (_ for _ in ()).throw(OSError("tc: no such qdisc")))
    with pytest.raises(OSError, match="no such qdisc"):
        with net:
            pass
    assert net.leftovers() == [] and netns.remove_stale() == []


@needs_netns
@pytest.mark.timeout(180)
@pytest.mark.slow  # heavy on 2 cores; siblings cover the path in CI
def test_a_job_on_two_hosts_matches_the_local_run_and_ctrl_c_cleans_up(tmp_path):
    toml = tmp_path / "small.toml"
    toml.write_text("[data.synthetic]\nnum_nodes = 800\n")
    train = ["train", "--config", str(toml), "--epochs", "2", "--quiet", "--seed", "3"]
    res = subprocess.run([sys.executable, "-m", "commgnn", "cluster", "--hosts", "2", "--rate", "100mbit",
                          "--", *train, "--out", str(tmp_path / "cl")], capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stderr[-2000:]
    subprocess.run([sys.executable, "-m", "commgnn", *train, "--parts", "2", "--out", str(tmp_path / "loc")],
                   check=True, capture_output=True, timeout=120)
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("cl", "loc"))
    assert json.loads((tmp_path / "cl" / "manifest.json").read_text())["launch"]["torchrun"] is True
    # Same partition, seed and exact exchange: the multi-host path trains the same model.
    for key in ("best_val_acc", "test_acc", "halo_bytes_per_epoch", "grad_bytes_per_epoch"):
        assert a[key] == pytest.approx(b[key], rel=1e-6), key
    assert json.loads((tmp_path / "cl" / "cluster.json").read_text())["rate_bps"] == 1e8

    # Ctrl-C while the ranks run: exit 130, and no namespace, bridge or process stays.
    proc = subprocess.Popen([sys.executable, "-m", "commgnn", "cluster", "--hosts", "2", "--", "train",
                             "--config", str(toml), "--epochs", "10000", "--out", str(tmp_path / "cc")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ns = f"commgnn-{proc.pid}-h1"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (tmp_path / "cc" / "metrics.jsonl").is_file():
        time.sleep(0.2)
    assert ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert f"commgnn-{proc.pid}-" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"cg{proc.pid}" not in subprocess.run(["ip", "link", "show"], capture_output=True, text=True).stdout


@needs_netns
@pytest.mark.slow  # torchrun on two namespaces; the shaping test covers the rate in CI
@pytest.mark.timeout(150)
def test_calibration_on_the_cluster_recovers_the_shaped_rate(tmp_path):
    from commgnn.netmodel import ClusterModel

    out = tmp_path / "net.json"
    res = subprocess.run([sys.executable, "-m", "commgnn", "cluster", "--hosts", "2", "--rate", "50mbit", "--",
                          "calibrate", "--sizes", "1000,100000,1000000", "--out", str(out)],
                         capture_output=True, text=True, timeout=140)
    assert res.returncode == 0, res.stderr[-2000:]
    m = ClusterModel.from_dict(json.loads(out.read_text()))
    assert (m.hosts, m.ranks_per_host) == (2, 1)
    # TCP/IP headers take ~4% of the wire; within 15% of the configured rate
    assert abs(m.inter.rate_bps - 50e6) / 50e6 < 0.15, m.inter


def test_a_train_job_gets_an_out_dir_and_host_placement_when_hosts_hold_several_ranks(tmp_path):
    from commgnn.api.cluster import job_command

    args, out = job_command(["--", "train", "--epochs", "1"], ClusterConfig(hosts=2, ranks_per_host=2))
    assert args[0] == "train" and args[args.index("--place-hosts") + 1] == "2"
    assert args[args.index("--out") + 1] == str(out) and "-p4" in str(out)
    args, out = job_command(["train", "--out", str(tmp_path / "r")], ClusterConfig(hosts=2))
    assert "--place-hosts" not in args and out == tmp_path / "r"
    assert job_command(["calibrate", "--out", "x.json"], ClusterConfig(hosts=2)) == (["calibrate", "--out", "x.json"], None)
    args, out = job_command(["federate", "--rounds", "1"], ClusterConfig(hosts=2))
    assert args[args.index("--out") + 1] == str(out) and out.name.startswith("federate-")


def test_the_python_call_checks_the_job_as_the_command_does():
    """``run_emulated`` runs the job as ``commgnn cluster`` does: the same checks, before
    this machine's network rights are looked at."""
    from commgnn.api.cluster import run_emulated

    with pytest.raises(UserError, match="--parts 3 differs from --hosts x --ranks-per-host = 4"):
        run_emulated(["train", "--parts", "3"], hosts=4)
    with pytest.raises(UserError, match="unrecognized arguments: --no-such-flag"):
        run_emulated(["train", "--no-such-flag"], hosts=2)
    with pytest.raises(UserError, match="--resume is not supported"):
        run_emulated(["federate", "--resume", "x"], hosts=2)


def _round_trips(net: EmulatedNetwork, count: int = 21) -> list[float]:
    echo = subprocess.Popen([*net.prefix(1), sys.executable, "-m", "commgnn.cluster.probe", "echo",
                             "--count", str(count)])
    try:
        res = subprocess.run([*net.prefix(0), sys.executable, "-m", "commgnn.cluster.probe", "rtt", "--to",
                              net.cfg.address(1), "--count", str(count)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr[-1000:]
        echo.wait(timeout=10)
    finally:
        echo.kill()
    return [float(x) for x in res.stdout.split()[1:]]  # the first also pays for ARP


@needs_netns
@pytest.mark.timeout(150)
@pytest.mark.parametrize("delayline", [None, True], ids=["auto", "delayline"])
def test_a_delay_doubles_into_the_round_trip_and_keeps_the_rate(tmp_path, delayline):
    from commgnn.cluster.netns import netem_available

    if delayline and not netem_available():
        pytest.skip("no netem here: 'auto' already runs the delay line")
    base = min(_round_trips_of(ClusterConfig(hosts=2, rate_bps=1e8)))
    cfg = ClusterConfig(hosts=2, rate_bps=1e8, delay_s=0.005)
    with EmulatedNetwork(cfg, delayline=delayline) as net:
        # netem where the kernel has it, the user-space delay line where it does not (or forced)
        assert net.delayline or "netem" in net.qdiscs(0)
        assert net.delayline or delayline is None
        rtts = _round_trips(net)
        measured = _measure(net, tmp_path, cfg.rate_bps / 8 * 2 / 1e6)
        made = [*net.namespaces, net.bridge, *net.host_links]
        assert sorted(net.leftovers()) == sorted(made)
        line = net._proc
    # 5 ms each way: the round trip grows by 10 ms (one direction only would be 5, twice 20).
    # Minima, not medians: a loaded machine's scheduling only ever adds to a round trip (CI saw
    # the median grow by 11.15 ms), so the fastest of 21 is the floor the delay itself sets.
    assert 9.9 <= min(rtts) - base <= 12.0, (base, rtts)
    assert abs(measured - cfg.rate_bps) / cfg.rate_bps < 0.15, f"{measured / 1e6:.1f} Mbit/s with 5 ms"
    assert net.leftovers() == []
    assert line is None or line.poll() is not None  # the delay line stopped, and its TAPs went with it


def _round_trips_of(cfg: ClusterConfig, **kw: object) -> list[float]:
    with EmulatedNetwork(cfg, **kw) as net:  # type: ignore[arg-type]
        return _round_trips(net)


@needs_netns
@pytest.mark.timeout(120)
def test_the_delay_line_keeps_sub_millisecond_delays_and_outlives_ctrl_c_until_closed():
    base = min(_round_trips_of(ClusterConfig(hosts=2, rate_bps=1e8)))
    cfg = ClusterConfig(hosts=2, rate_bps=1e8, delay_s=0.0005)
    with EmulatedNetwork(cfg, delayline=True) as net:
        line = net._proc
        assert line is not None
        # a terminal's Ctrl-C reaches the process group: the line must keep the links up
        # while the ranks shut down, until the cluster itself closes
        os.kill(line.pid, signal.SIGINT)
        time.sleep(0.3)
        assert line.poll() is None and net.failure() is None
        extra = min(_round_trips(net)) - base
        # 0.5 ms each way: +1 ms (epoll's whole-millisecond timeouts would make even the
        # fastest round trip ~2 ms longer); minima for the reason given above
        assert 0.9 <= extra <= 1.6, extra
        line.kill()  # a crash while the cluster is up is reported, not waited out
        line.wait(timeout=10)
        assert "delay line exited" in (net.failure() or "")
    assert net.leftovers() == []


def _pipes(n: int) -> tuple[list[tuple[int, int]], list[int]]:
    """``n`` (inner, outer) pairs whose outer end is a pipe's write end, and the read ends."""
    pairs, reads = [], []
    for _ in range(n):
        r, w = os.pipe()
        os.set_blocking(r, False)
        pairs.append((-1, w))
        reads.append(r)
    return pairs, reads


def test_the_delay_line_holds_frames_in_order_and_drops_like_per_packet_loss():
    from commgnn.cluster.delayline import DelayLine, frame_mtu

    assert frame_mtu(1e8) == 6250 and frame_mtu(1e6) == 1500 and frame_mtu(1e10) == 65000
    pairs, reads = _pipes(2)
    line = DelayLine(pairs, delay_s=0.010, jitter_s=0.004, seed=1)
    for k in range(200):
        line._hold(k % 2, b"%04d" % k, now=k * 1e-4)
    releases = sorted(r for r, *_ in line.held)
    assert releases[0] >= 0.006 and releases[-1] <= 199e-4 + 0.014
    line._release_due(now=0.005)  # nothing is due before the delay less the jitter
    with pytest.raises(BlockingIOError):
        os.read(reads[0], 1)
    line._release_due(now=1.0)  # everything is due: each host's frames come out in the order they went in
    for host in (0, 1):
        data = os.read(reads[host], 1 << 16)
        assert [int(data[i:i + 4]) for i in range(0, len(data), 4)] == list(range(host, 200, 2))
    # loss p per 1500-byte packet: a frame of k such packets survives with (1 - p)^k
    for size, keep in ((1514, 0.8), (3 * 1514, 0.8 ** 3)):
        lossy = DelayLine(_pipes(1)[0], delay_s=0.0, loss=0.2, seed=2)
        for _ in range(4000):
            lossy._hold(0, b"x" * size, now=0.0)
        assert abs(len(lossy.held) / 4000 - keep) < 0.03, (size, len(lossy.held))
