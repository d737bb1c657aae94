"""Heterogeneous emulated hosts: per-host link rates, CPU shares and transient stragglers."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from commgnn.cli.main import main
from commgnn.cluster import ClusterConfig, EmulatedNetwork
from commgnn.cluster.config import parse_rate
from commgnn.cluster.cpu import HostCPUs
from commgnn.cluster.straggle import Stragglers
from commgnn.errors import ConfigError, UserError
from test_cluster import _measure, needs_netns


@pytest.mark.parametrize("kwargs, message", [
    ({"hosts": 3, "host_cpus": (0.5, 0.5)}, "--host-cpus gives 2 values for 3 hosts"),
    ({"hosts": 2, "host_cpus": (0.5, 0.0)}, "--host-cpus must be between 0.01"),
    ({"hosts": 2, "host_rates_bps": (1e9,)}, "--host-rate gives 1 values for 2 hosts"),
    ({"hosts": 2, "straggle": ("2:every=5s:for=1s",)}, "names host 2"),
    ({"hosts": 2, "straggle": ("1:every=1s:for=1s",)}, "must be above 0 and below every="),
    ({"hosts": 2, "straggle": ("1:every=5s",)}, "HOST:every=TIME:for=TIME"),
])
def test_bad_host_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ClusterConfig(**kwargs)


def test_host_flags_parse_and_describe_the_cluster(capsys):
    from commgnn.api.cluster import cluster_config

    cfg = cluster_config(hosts=4, host_cpus="0.5,0.5,0.5,0.125", host_rate="1gbit,1gbit,1gbit,100mbit",
                         straggle="3:every=5s:for=1s")
    assert cfg.host_cpus == (0.5, 0.5, 0.5, 0.125) and cfg.rate_of(3) == 1e8 and cfg.rate_of(0) == 1e9
    assert cfg.stragglers == ((3, 5.0, 1.0),)
    assert cfg.describe() == ("4 hosts x 1 ranks, 1 Gbit/s,1 Gbit/s,1 Gbit/s,100 Mbit/s, cores 0.5,0.5,0.5,0.125, "
                              "host 3 stopped 1 s every 5 s")
    # a bad list is argparse's one line, exit 2, before anything is built
    with pytest.raises(SystemExit) as exc:
        main(["cluster", "--hosts", "2", "--host-rate", "1gbit,fast", "--", "train"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "--host-rate: a rate is a number" in err and len(err.splitlines()) == 1


def test_cpu_shares_beyond_the_machine_are_refused_in_one_line():
    with pytest.raises(UserError, match="adds up to 3 cores and this machine has 2"):
        HostCPUs((1.5, 1.5), cores=2)
    with pytest.raises(UserError, match="adds up to 5 cores and this machine has 4"):
        HostCPUs((2.5, 2.5), cores=4)


def _cgroups_writable() -> str | None:
    try:
        with HostCPUs((0.5,)):
            return None
    except UserError as exc:
        return str(exc)


WHY_NO_CGROUP = _cgroups_writable()


@pytest.mark.skipif(WHY_NO_CGROUP is not None, reason=f"no writable CPU cgroup here: {WHY_NO_CGROUP}")
@pytest.mark.timeout(60)
def test_a_host_runs_at_its_cpu_share_and_its_cgroup_goes_with_the_job():
    """A child that spins for 1.2 s of wall time inside a 0.25-core host gets about 0.3 s of
    CPU (the kernel's quota), where it would get 1.2 s unlimited."""
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.2: pass\n"
    with HostCPUs((0.25,)) as cpus:
        assert cpus.quota(0) == pytest.approx(0.25)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", spin], preexec_fn=cpus.enter_fn(0), check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        path = cpus.paths[0]
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert 0.1 < cpu_s < 0.5, f"{cpu_s:.2f} s of CPU in 1.2 s at a quarter of a core"
    assert not path.exists()


@pytest.mark.timeout(60)
def test_a_straggler_is_stopped_on_schedule_and_continued_at_the_end():
    """A child printing a clock every 20 ms is stopped for 0.3 s every 0.6 s: its clock
    shows gaps of about 0.3 s, the log has each pause, and stop() leaves it running."""
    tick = "import time\nwhile True:\n    print(time.monotonic(), flush=True)\n    time.sleep(0.02)\n"
    child = subprocess.Popen([sys.executable, "-c", tick], stdout=subprocess.PIPE, text=True)
    try:
        stragglers = Stragglers([(0, 0.6, 0.3)], lambda host: [child.pid]).start()
        time.sleep(1.9)
        stragglers.stop()
        time.sleep(0.2)
        assert child.poll() is None and _state(child.pid) != "T"  # continued, not left stopped
    finally:
        child.kill()
    clock = [float(line) for line in child.communicate()[0].split()]
    gaps = sorted((b - a for a, b in zip(clock, clock[1:])), reverse=True)
    assert len(stragglers.log) >= 2 and all(h == 0 and 0.25 < length < 0.5 for h, _, length in stragglers.log)
    assert gaps[1] > 0.25 and gaps[len(stragglers.log)] < 0.2  # one gap a pause, none besides


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@needs_netns
@pytest.mark.timeout(120)
def test_each_host_gets_its_own_link_rate(tmp_path):
    """Host 1 behind 20 Mbit/s, host 0 at 200 Mbit/s: a transfer into host 1 runs at 20."""
    cfg = ClusterConfig(hosts=2, host_rates_bps=(parse_rate("200mbit"), parse_rate("20mbit")))
    with EmulatedNetwork(cfg) as net:
        assert "200Mbit" in net.qdiscs(0) and "20Mbit" in net.qdiscs(1)
        measured = _measure(net, tmp_path, 20e6 / 8 * 2 / 1e6)
    assert abs(measured - 20e6) / 20e6 < 0.15, f"{measured / 1e6:.1f} Mbit/s into the 20 Mbit/s host"
    assert os.getpid() > 0


WAITER = """
import signal, sys, threading
from commgnn.distributed.watchdog import block_sigterm, wait_sigterm
block_sigterm()
print("ready", flush=True)
for _ in range(int(sys.argv[1])):
    if wait_sigterm(0.1):
        print("SIGTERM", flush=True)
        break
print("done", flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signals, expected", [(("STOP", "CONT"), ["ready", "done"]), (("TERM",), ["ready", "SIGTERM", "done"])])
def test_a_paused_rank_is_not_taken_for_a_sigterm(signals, expected):
    """A rank stopped and continued (a straggler's pause, Ctrl-Z and fg) while its watchdog
    waits for SIGTERM: CPython's sigtimedwait returns a garbage struct then, which the
    watchdog took for a SIGTERM and ended the job; a real SIGTERM still counts."""
    import signal as sg

    child = subprocess.Popen([sys.executable, "-c", WAITER, "30"], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    for name in signals:
        time.sleep(0.3)
        os.kill(child.pid, getattr(sg, f"SIG{name}"))
    out, _ = child.communicate(timeout=30)
    assert ["ready", *out.split()] == expected


def _late_exchange(ctx, split: bool) -> dict:
    """Rank 1 reaches a halo exchange 0.4 s after rank 0; rank 0's seconds by phase."""
    from dataclasses import replace as dc_replace

    import torch
    from commgnn.comm.halo.alltoall import AllToAllHalo
    from commgnn.distributed.events import Hooks, TimeEvent
    from commgnn.partition import build_local_partition
    from commgnn.trainers.fullgraph import halo_plan
    from helpers import small_graph

    ctx = dc_replace(ctx, split_wait=split)
    data = small_graph(n=40, m=160)
    parts = torch.arange(40) % 2
    part = build_local_partition(data, parts, 2, ctx.rank)
    hooks, times = Hooks(), {"wait": 0.0, "comm": 0.0}
    hooks.subscribe(lambda ev: times.__setitem__(ev.phase, times.get(ev.phase, 0.0) + ev.seconds)
                    if isinstance(ev, TimeEvent) else None)
    halo = AllToAllHalo(ctx, halo_plan(part), hooks)
    if ctx.rank == 1:
        time.sleep(0.4)
    got = halo.exchange(data.x[part.global_ids].float(), 0)
    return {"times": times, "ok": bool(torch.equal(got, data.x[part.halo_global_ids].float()))}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("split", [pytest.param(False, marks=pytest.mark.slow), True])  # CI time: the default path
def test_the_wait_for_a_late_rank_is_timed_apart_from_the_transfer(tmp_path, split):
    """``runtime.split_wait``: rank 0's 0.4 s wait for the late rank is counted as ``wait``
    and the transfer alone as ``comm``; without it, all of it is ``comm``."""
    from helpers import run_on_ranks

    res = run_on_ranks(_late_exchange, 2, tmp_path, split)
    assert all(r["ok"] for r in res)
    early = res[0]["times"]
    if split:
        assert early["wait"] > 0.3 and early["comm"] < 0.2, early
    else:
        assert early["wait"] == 0.0 and early["comm"] > 0.3, early
