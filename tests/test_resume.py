"""Checkpoints and exact resume: after a crash, ``--resume`` (local ranks) or an elastic
restart (``torchrun --max-restarts``) ends with the same per-epoch losses and the same
summary accuracies as a run that was never interrupted."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from commgnn.cli.main import main
from commgnn.distributed.context import free_port

CONFIG = """
[data.synthetic]
num_nodes = 800
num_classes = 4
feature_dim = 16
[model]
hidden = 8
[train]
epochs = 8
patience = 0
[runtime]
checkpoint_every = {every}
timeout_s = 30
[output]
quiet = true
{extra}
"""

CRASH = '[fault]\nrank = 1\nat = "train"\nepoch = 6\naction = "kill"\n'


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _losses(out: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["epoch"], r["loss"], r["val_acc"]) for r in rows]


def _bytes(out: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["epoch"], r["total_bytes"]) for r in rows]


def _accs(out: Path) -> tuple[float, float, int]:
    s = json.loads((out / "summary.json").read_text())
    return s["best_val_acc"], s["test_acc"], s["best_epoch"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run (2 local ranks, exact exchange)."""
    tmp = tmp_path_factory.mktemp("ref")
    out = tmp / "run"
    assert main(["train", "--config", _write(tmp, "ref.toml", CONFIG.format(every=0, extra="")),
                 "--parts", "2", "--out", str(out)]) == 0
    return out


def _crash_then_resume(tmp_path: Path, capfd: pytest.CaptureFixture, levers: list[str], every: int = 4) -> Path:
    out = tmp_path / "run"
    cfg = _write(tmp_path, "crash.toml", CONFIG.format(every=every, extra=CRASH))
    assert main(["train", "--config", cfg, "--parts", "2", "--out", str(out), *levers]) == 1
    assert re.search(r"rank 1 of \d failed: killed by SIGKILL", capfd.readouterr().err)
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["epoch"] == every
    assert [r[0] for r in _losses(out)] == [1, 2, 3, 4, 5]  # epoch 6 never finished
    assert not (out / "summary.json").exists()
    # The fault stays in the run's config but fires only in attempt 0; a resume runs clean.
    assert main(["train", "--resume", str(out)]) == 0
    assert json.loads((out / "status.json").read_text())["state"] == "complete"
    return out


def _assert_active(out: Path, levers: list[str]) -> None:
    """The lever acted after the checkpoint (epoch 3), so its state mattered to the resume."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    late = [r for r in rows if r["epoch"] > 4]
    if "adaptive" in levers:  # widths below the initial 8 bits were solved
        assert any(min(min(w) for w in r["bits"].values()) < 8 for r in late), [r["bits"] for r in rows]
    if "skip" in levers:  # rows were kept, not resent
        assert all(r["skip_sent_frac"] < 0.9 for r in late), [r["skip_sent_frac"] for r in rows]
    if "tracking" in levers:  # the ranks' models differ: gossip, not an exact average
        assert all(r["consensus_distance"] > 0 for r in late), [r["consensus_distance"] for r in rows]
    if "lru" in levers:  # the cache served remote rows after the checkpoint
        assert all(r["cache_hits"] > 0 for r in late), [r["cache_hits"] for r in rows]
    if "powersgd" in levers:  # compressing: fewer gradient bytes than the plain first steps
        assert all(r["grad_bytes"] < rows[0]["grad_bytes"] / 2 for r in late), [r["grad_bytes"] for r in rows]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("levers", [
    ["--grad", "topk", "--ratio", "0.1"],
    ["--bits", "4"],
    ["--staleness", "pipeline"],
    # re-solving at epochs 3 and 6, either side of the checkpoint, under a budget that binds
    # (slow: CI time; maxk-adaptive-bits below runs the same solver and its state in CI)
    pytest.param(["--bits", "adaptive", "--budget-mb", "0.01", "--adapt-every", "3"], marks=pytest.mark.slow),
    # MaxK pairs whose values the solver sizes: the fixed index bytes it budgets per row
    ["--activation", "maxk", "--maxk-k", "4", "--bits", "adaptive", "--budget-mb", "0.011", "--adapt-every", "3"],
    # (slow: CI time; its state is a halo RNG stream, as 4-bit-halo's, which runs in CI)
    pytest.param(["--sample-rate", "0.5"], marks=pytest.mark.slow),
    # without dropout, so that rows change little and most are not resent (with it, all were)
    ["--staleness", "skip", "--stale-threshold", "0.05", "--dropout", "0"],
    # compressing from step 2, so that its error and P/Q memories exist at the crash: they are
    # laid out in DDP's rebuilt bucket order, which the resumed run's new DDP does not start in
    ["--grad", "powersgd", "--powersgd-rank", "1", "--grad-start", "2"],
    # local SGD from step 2, the models averaged every 4 steps: the averager's step counter
    ["--grad", "localsgd", "--grad-start", "2"],
    # mini-batch on 2 ranks: sampler stream, the LRU cache of remote rows, VR-GCN's history
    # (slow: CI time, about 18 s; test_minibatch's and test_cache's resume tests cover the state)
    pytest.param(["--mode", "minibatch", "--sampler", "vrgcn", "--fanout", "2,2", "--batch-size", "64",
                  "--cache-ratio", "0.3", "--cache-policy", "lru"], marks=pytest.mark.slow),
    # gossip on 4 ranks (on 2, every round is an exact average): the exponential graph's
    # peer of each round, and gradient tracking's tracker and last gradient
    # (slow: CI time, about 17 s; gossip state round-trips in test_grad_sync)
    pytest.param(["--parts", "4", "--gossip", "exponential", "--gossip-method", "tracking"],
                 marks=pytest.mark.slow),
    pytest.param(["--gossip", "ring"], marks=pytest.mark.slow),  # CI time (5 s); gossip state is tested in test_grad_sync
], ids=["topk-error-feedback", "4-bit-halo", "pipelined-halo", "adaptive-bits", "maxk-adaptive-bits", "sampled-halo",
        "skip-unchanged", "powersgd", "localsgd", "minibatch-vrgcn-lru-cache", "gossip-tracking-4-ranks", "gossip-dpsgd"])
def test_resume_with_a_stateful_lever_equals_the_uninterrupted_run(tmp_path, capfd, levers):
    ref = tmp_path / "ref"
    assert main(["train", "--config", _write(tmp_path, "r.toml", CONFIG.format(every=0, extra="")),
                 "--parts", "2", "--out", str(ref), *levers]) == 0
    _assert_active(ref, levers)
    # a checkpoint after epoch 3: an odd round, so that a gossip round counter reset to 0 would
    # pick other peers on the exponential graph of 4 ranks (its peers repeat every 2 rounds)
    out = _crash_then_resume(tmp_path, capfd, levers, every=3)
    assert _losses(out) == _losses(ref)
    assert _accs(out) == _accs(ref)
    # and the same bytes: a state lost without changing the values (a cold cache, widths
    # solved again, rows resent) shows here
    assert _bytes(out) == _bytes(ref)


@pytest.mark.timeout(180)
def test_exact_resume_after_a_crash_equals_the_uninterrupted_run(tmp_path, capfd, reference):
    out = _crash_then_resume(tmp_path, capfd, [])
    assert _losses(out) == _losses(reference)
    assert _accs(out) == _accs(reference)


def test_a_corrupt_checkpoint_is_refused_in_one_line(tmp_path, capfd):
    out = tmp_path / "run"
    cfg = _write(tmp_path, "c.toml", CONFIG.format(every=2, extra=""))
    assert main(["train", "--config", cfg, "--parts", "1", "--out", str(out), "--epochs", "4"]) == 0
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    (out / "checkpoints" / latest["dir"] / "rank0.pt").write_bytes(b"not a checkpoint")
    capfd.readouterr()
    assert main(["train", "--resume", str(out), "--epochs", "6"]) == 2
    err = capfd.readouterr().err.strip()
    assert err.count("\n") == 0 and "rank0.pt is corrupt" in err, err


@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
@pytest.mark.slow  # CI time (13 s): the exact resume after a crash runs in CI on the local launcher
def test_elastic_restart_under_torchrun_completes_and_matches(tmp_path, reference):
    out = tmp_path / "run"
    cfg = _write(tmp_path, "crash.toml", CONFIG.format(every=2, extra=CRASH))
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--max-restarts", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
           "-m", "commgnn", "train", "--config", cfg, "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=220)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "commgnn-fault: kill at train 6" in res.stderr  # the crash did happen
    assert json.loads((out / "status.json").read_text())["state"] == "complete"
    assert _losses(out) == _losses(reference)
    assert _accs(out) == _accs(reference)


@pytest.mark.timeout(180)
def test_your_own_model_on_a_python_graph_resumes_from_python(tmp_path, capfd):
    import commgnn
    from commgnn.errors import RankFailure
    from helpers import small_graph
    from test_api import _OwnModel
    from torch_geometric.data import Data

    g = small_graph(n=200, m=800, f=6, c=3, seed=3)
    data = Data(**{k: g[k] for k in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")})
    make_model = _seeded(_OwnModel, 6, 8, 3)
    base = CONFIG.format(every=4, extra="")
    ref = commgnn.train(data, model=make_model(), parts=2, out=tmp_path / "ref",
                        config=_write(tmp_path, "b.toml", base))
    crash = _write(tmp_path, "c.toml", CONFIG.format(every=4, extra=CRASH))
    with pytest.raises(RankFailure, match="rank 1 of 2 failed: killed by SIGKILL"):
        commgnn.train(data, model=make_model(), parts=2, out=tmp_path / "run", config=crash)
    capfd.readouterr()
    # from the CLI there is no graph to resume on: one line that says what to do
    from commgnn.cli.main import main
    assert main(["train", "--resume", str(tmp_path / "run")]) == 2
    assert "commgnn.resume(" in capfd.readouterr().err
    res = commgnn.resume(tmp_path / "run", data, model=make_model())  # _OwnModel keeps no arguments
    assert type(res.model) is _OwnModel
    assert _losses(res.run_dir) == _losses(ref.run_dir)
    assert _accs(res.run_dir) == _accs(ref.run_dir)


def _seeded(cls, *args):
    import torch

    def make():
        torch.manual_seed(0)
        return cls(*args)
    return make


def test_lever_state_returns_to_the_run_device_but_generator_states_stay_on_cpu():
    """Checkpoints load onto the CPU; the levers' tensors go back to the run's device (here
    the ``meta`` device stands in for a GPU), generator states stay CPU byte tensors."""
    from commgnn.trainers.checkpoint import state_to_device

    gen = torch.Generator().get_state()
    state = {"inner": {"residual": torch.ones(3), "gen": gen, "ages": [torch.zeros(2, dtype=torch.long)]},
             "powersgd": {"error_dict": {0: torch.ones(4)}, "iter": 7}, "pair": (torch.ones(1), 2), "none": None}
    out = state_to_device(state, torch.device("meta"))
    assert out["inner"]["residual"].device.type == "meta" and out["inner"]["ages"][0].device.type == "meta"
    assert out["powersgd"]["error_dict"][0].device.type == "meta" and out["powersgd"]["iter"] == 7
    assert out["pair"][0].device.type == "meta" and out["pair"][1] == 2 and isinstance(out["pair"], tuple)
    assert out["inner"]["gen"] is gen and out["none"] is None
    torch.Generator().set_state(out["inner"]["gen"])  # still loadable


@pytest.mark.timeout(120)
def test_checkpoint_files_are_tensors_only_and_hashed_in_latest_json(tmp_path):
    """Every rank's file loads with ``weights_only=True`` (PowerSGD's NumPy generator state
    included, as tagged tensors) and ``latest.json`` records its SHA-256."""
    import hashlib
    out = tmp_path / "run"
    cfg = _write(tmp_path, "h.toml", CONFIG.format(every=4, extra=""))
    assert main(["train", "--config", cfg, "--parts", "2", "--out", str(out), "--epochs", "4",
                 "--grad", "powersgd", "--powersgd-rank", "1", "--grad-start", "2"]) == 0
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert sorted(latest["sha256"]) == ["rank0.pt", "rank1.pt"]
    for name, sha in latest["sha256"].items():
        path = out / "checkpoints" / latest["dir"] / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
        state = torch.load(path, weights_only=True)
        assert state["epoch"] == 4 and "python" in state["host_rng"] and "numpy" in state["host_rng"]
        assert "rng" in state["trainer"]["grad_sync"]["powersgd"]  # PowerSGD's NumPy RandomState
