"""Runtime: a dead rank never hangs the others; user errors cross process boundaries."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch

from commgnn.distributed.context import (LaunchInfo, RuntimeConfig, check_port_free, free_port, init_distributed,
                                  launch_info_from_env, pick_device, shutdown, threads_per_rank)
from commgnn.distributed.spawn import spawn_ranks
from commgnn.distributed.watchdog import _parent_of
from commgnn.errors import RankFailure, UserError


def dying_rank(info: LaunchInfo, victim: int, timeout_s: float, marker_dir: str) -> None:
    ctx = init_distributed(info, RuntimeConfig(parts=info.world_size, timeout_s=timeout_s, threads=1))
    t = torch.ones(4)
    for step in range(1000):
        if ctx.rank == victim and step == 3:
            os._exit(17)  # dies without a word, as a crashed or killed process would
        try:
            ctx.all_reduce(t)
        except Exception:
            # Survivors must get here on their own, within the time-out.
            open(os.path.join(marker_dir, f"failed{ctx.rank}"), "w").close()
            raise
    shutdown(ctx)


def test_dead_rank_names_it_and_others_fail_fast(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankFailure, match=r"^rank 2 of 3 failed: exited with code 17$"):
        # grace longer than the time-out: survivors must end by themselves, not be killed
        spawn_ranks(dying_rank, (2, 60.0, str(tmp_path)), nprocs=3, master_addr="127.0.0.1",
                    port=free_port(), grace_s=30.0)
    elapsed = time.monotonic() - t0
    assert elapsed < 25.0, f"took {elapsed:.1f}s"  # start-up included; far below the 60 s time-out


def user_error_rank(info: LaunchInfo) -> None:
    if info.rank == 1:
        raise UserError("rank one did not like its input")
    time.sleep(60)


def test_user_error_in_a_rank_is_a_user_error():
    t0 = time.monotonic()
    with pytest.raises(UserError, match="rank one did not like its input"):
        spawn_ranks(user_error_rank, (), nprocs=2, master_addr="127.0.0.1", port=free_port(), grace_s=1.0)
    assert time.monotonic() - t0 < 30


def test_port_in_use_is_reported():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(UserError, match=f"port {port} on 127.0.0.1 is already in use"):
            check_port_free("127.0.0.1", port)


def test_torchrun_environment_is_parsed():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29555"}
    info = launch_info_from_env(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.port) == (3, 8, 1, 2, 29555)
    assert info.external and info.master_addr == "10.0.0.1"
    assert launch_info_from_env({}) is None
    with pytest.raises(UserError, match="bad torchrun environment"):
        launch_info_from_env({"RANK": "x", "WORLD_SIZE": "2"})


def test_threads_share_the_cores():
    cores = len(os.sched_getaffinity(0))
    assert threads_per_rank(RuntimeConfig(), 1) == cores
    assert threads_per_rank(RuntimeConfig(), 2 * cores) == 1
    assert threads_per_rank(RuntimeConfig(threads=3), 4) == 3


@pytest.mark.parametrize("gpus", [0, 1, 2, 4])
def test_ranks_get_their_own_gpu_share_one_only_under_gloo_or_run_on_the_cpu(monkeypatch, gpus):
    """Which device each of 4 local ranks gets, for every device/backend setting, with
    ``gpus`` GPUs visible (torch.cuda's answers patched: this machine may have none)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)

    def devices(**kw: str) -> list[str]:
        return [str(pick_device(RuntimeConfig(parts=4, **kw), r, 4)) for r in range(4)]

    assert devices(device="cpu") == ["cpu"] * 4
    # auto: CUDA only when every local rank has a GPU of its own, never shared
    assert devices() == (["cuda:0", "cuda:1", "cuda:2", "cuda:3"] if gpus >= 4 else ["cpu"] * 4)
    if gpus >= 4:
        for backend in ("auto", "nccl", "gloo"):
            assert devices(device="cuda", backend=backend) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    elif gpus:
        # gloo lets the ranks share the GPUs round-robin; NCCL (and auto, which would pick it) refuses
        assert devices(device="cuda", backend="gloo") == [f"cuda:{r % gpus}" for r in range(4)]
        for backend in ("auto", "nccl"):
            with pytest.raises(UserError, match=f"4 local ranks and {gpus} GPU.*runtime.backend = 'gloo'"):
                devices(device="cuda", backend=backend)
    else:
        for backend in ("auto", "gloo", "nccl"):
            with pytest.raises(UserError, match="torch sees no GPU"):
                devices(device="cuda", backend=backend)


def test_host_payloads_go_to_the_device_only_under_nccl():
    from commgnn.distributed.context import DistContext

    def ctx(backend: str, device: str) -> DistContext:
        return DistContext(rank=0, world_size=2, local_rank=0, local_world_size=2, device=torch.device(device),
                           backend=backend, timeout_s=1.0)

    assert ctx("nccl", "cuda:1").comm_device == torch.device("cuda:1")
    assert ctx("gloo", "cuda:0").comm_device == torch.device("cpu")  # gloo stages device tensors itself
    assert ctx("gloo", "cpu").comm_device == torch.device("cpu")


def many_tensors_rank(info: LaunchInfo, tensors: dict[str, torch.Tensor], out_dir: str) -> None:
    # what reached this rank, the environment it runs in, and where its output goes
    if os.environ.get("COMMGNN_TEST_LAUNCH") == "second":  # the first launch's is not captured
        print(f"rank {info.rank} says second", flush=True)
    total = sum(float(t.sum()) for t in tensors.values())
    with open(os.path.join(out_dir, f"rank{info.rank}.txt"), "w") as f:
        f.write(f"{len(tensors)} {total} {os.environ.get('COMMGNN_TEST_LAUNCH', '-')} {os.getppid()}")


def test_ranks_get_many_tensors_and_the_launchers_current_environment_and_streams(tmp_path, monkeypatch,
                                                                                   capfd):
    # 300 tensors: multiprocessing's pickler would send each as a file descriptor, and the
    # fork server passes at most 256
    tensors = {f"t{i}": torch.full((3,), float(i)) for i in range(300)}
    for value in ("first", "second"):  # the fork server outlives the first launch
        monkeypatch.setenv("COMMGNN_TEST_LAUNCH", value)
        kw = {"cuda": False}  # the fork server's path also where there is a GPU
        if value == "first":  # the server (if it starts now) gets streams this test does not capture
            with capfd.disabled():
                spawn_ranks(many_tensors_rank, (tensors, str(tmp_path)), nprocs=2, master_addr="127.0.0.1",
                            port=free_port(), **kw)
        else:
            capfd.readouterr()
            spawn_ranks(many_tensors_rank, (tensors, str(tmp_path)), nprocs=2, master_addr="127.0.0.1",
                        port=free_port(), **kw)
            # the ranks write where the launcher writes now
            assert sorted(capfd.readouterr().out.splitlines()) == [f"rank {r} says {value}" for r in range(2)]
        for r in range(2):
            n, total, env, parent = (tmp_path / f"rank{r}.txt").read_text().split()
            assert (int(n), float(total), env) == (300, 3 * sum(range(300)), value)
            # spawned by this process, or forked by a fork server that this process started
            assert int(parent) == os.getpid() or _parent_of(int(parent)) == os.getpid()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
@pytest.mark.parametrize("launcher, alive", [("parent", True), ("grandparent", True), ("stranger", False)])
def test_a_rank_whose_launcher_is_gone_exits_at_once(launcher, alive):
    import subprocess
    import sys

    from commgnn.distributed.watchdog import EXIT_PEER_FAILED

    # The child's parent is this process; its grandparent is this process's parent (the
    # fork server case). Anyone else means the launcher died before the rank started.
    pid = {"parent": os.getpid(), "grandparent": os.getppid(), "stranger": 999999}[launcher]
    res = subprocess.run([sys.executable, "-c", "from commgnn.distributed.watchdog import die_with_launcher as d; "
                          f"print(d({pid}))"], capture_output=True, text=True, timeout=60)
    if alive:
        assert (res.returncode, res.stdout.strip()) == (0, str(os.getpid())), res.stderr
    else:
        assert res.returncode == EXIT_PEER_FAILED and res.stdout == ""


def sleeping_rank(info: LaunchInfo, out_dir: str) -> None:
    # never reaches init_distributed: no watchdog runs yet
    with open(os.path.join(out_dir, f"pid{info.rank}"), "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    time.sleep(120)


@pytest.mark.timeout(120)
def test_a_killed_launcher_takes_its_ranks_and_fork_server_before_they_start_training(tmp_path):
    import signal
    import subprocess
    import sys

    import psutil

    script = ("import sys; sys.path.insert(0, sys.argv[1]); from test_launch import sleeping_rank; "
              "from commgnn.distributed.spawn import spawn_ranks; from commgnn.distributed.context import free_port; "
              "spawn_ranks(sleeping_rank, (sys.argv[2],), nprocs=2, master_addr='127.0.0.1', port=free_port())")
    launcher = subprocess.Popen([sys.executable, "-c", script, os.path.dirname(__file__), str(tmp_path)])
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob("pid*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = {int(x) for f in tmp_path.glob("pid*") for x in f.read_text().split()} - {launcher.pid}
    assert len(pids) >= 2  # the ranks, and the fork server where there is one
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait(timeout=10)
    t0 = time.monotonic()
    while _running(pids):
        assert time.monotonic() - t0 < 5, "a rank or the fork server outlived the launcher by 5 s"
        time.sleep(0.05)


def _running(pids: set[int]) -> bool:
    import psutil

    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            pass
    return False


def napping_rank(info: LaunchInfo, out_dir: str, nap_s: float) -> None:
    with open(os.path.join(out_dir, f"nap{info.rank}"), "w") as f:
        f.write(str(os.getppid()))
    time.sleep(nap_s)


@pytest.mark.timeout(120)
def test_a_sigterm_to_the_fork_server_leaves_its_ranks_running(tmp_path):
    # A SIGTERM to the job's process group reaches the fork server too; the ranks (and the
    # launcher) handle theirs. Were the server to die of it, the kernel would kill every rank.
    import signal
    import sys
    import threading

    if not sys.platform.startswith("linux"):
        pytest.skip("the fork server is used on Linux")

    def kill_server() -> None:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("nap*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        for parent in {int(f.read_text()) for f in tmp_path.glob("nap*")} - {os.getpid()}:
            os.kill(parent, signal.SIGTERM)
            (tmp_path / "signalled").touch()

    killer = threading.Thread(target=kill_server)
    killer.start()
    spawn_ranks(napping_rank, (str(tmp_path), 3.0), nprocs=2, master_addr="127.0.0.1", port=free_port(),
                cuda=False)
    killer.join()
    assert (tmp_path / "signalled").exists()  # the ranks' parent was a fork server, and it got SIGTERM


def _start_method_here(q) -> None:  # type: ignore[no-untyped-def]
    from commgnn.distributed.forkserver import start_context

    q.put(start_context(cuda=False).get_start_method())


def test_the_fork_server_is_used_only_where_it_is_safe():
    import multiprocessing as mp
    import sys
    import threading

    from commgnn.distributed.forkserver import start_context

    assert start_context(cuda=True).get_start_method() == "spawn"  # CUDA is never forked
    here = start_context(cuda=False).get_start_method()
    assert here == ("forkserver" if sys.platform.startswith("linux") else "spawn")
    if here == "forkserver":
        # a fork of this launcher does not share its server: its ranks are spawned
        q = mp.get_context("fork").Queue()
        p = mp.get_context("fork").Process(target=_start_method_here, args=(q,))
        p.start()
        try:
            assert q.get(timeout=30) == "spawn"
            p.join(10)
            assert p.exitcode == 0
        finally:
            p.kill()
        # nor does a thread other than the main one (the server would die with that thread)
        seen: list[str] = []
        t = threading.Thread(target=lambda: seen.append(start_context(cuda=False).get_start_method()))
        t.start()
        t.join(10)
        assert seen == ["spawn"]


def test_prestart_starts_the_server_that_the_launch_then_uses(tmp_path):
    import sys
    from multiprocessing import forkserver

    from commgnn.distributed.forkserver import prestart

    prestart(cuda=True)  # CUDA ranks are spawned: nothing to start for them
    if not sys.platform.startswith("linux"):
        return
    prestart(cuda=False)
    pid = forkserver._forkserver._forkserver_pid
    assert pid is not None and os.path.exists(f"/proc/{pid}")
    spawn_ranks(napping_rank, (str(tmp_path), 0.0), nprocs=2, master_addr="127.0.0.1", port=free_port(),
                cuda=False)
    assert {int(f.read_text()) for f in tmp_path.glob("nap*")} == {pid}  # both ranks forked by it
