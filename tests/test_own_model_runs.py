"""What a run records and how it is read back (issue 53, new-user items 2, 3, 6, 7; issue 54
item 1's own-model part).

* A user's own model is recorded by import path and constructor arguments, never pickled:
  ``commgnn.predict``/``load_result`` rebuild it by name, or take ``model=`` when it cannot
  be imported; nothing read from the run folder is unpickled.
* ``commgnn predict`` works on a run of the user's model and on a graph given in Python
  (which must be given again: refused in one line otherwise), and a failed rank's log
  still exists where the error points.
* What is recorded is what ran: ``config.toml``, ``summary.json``, the manifest, the default
  folder name and the HTML report name the Python graph and the user's class.
* The console summary labels modelled figures, early stops, and training and evaluation
  traffic; ``dir(commgnn)`` lists the lazily imported API.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch_geometric.data import Data

import commgnn
from commgnn.errors import RankFailure, UserError
from helpers import small_graph
from own_models import JKGATv2

ROOT = Path(__file__).resolve().parents[1]


def _graph() -> Data:
    g = small_graph(n=160, m=640, f=6, c=3, seed=5)
    return Data(**{k: g[k] for k in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One run of the user's JKNet-style GATv2 on a graph given in Python (2 ranks), in a
    default-named folder."""
    where = tmp_path_factory.mktemp("own")
    data = _graph()
    torch.manual_seed(0)
    cwd = os.getcwd()
    os.chdir(where)
    try:
        res = commgnn.train(data, model=JKGATv2(6, 8, 3), parts=2, epochs=6, lr=0.01, patience=0, quiet=True)
    finally:
        os.chdir(cwd)
    return SimpleNamespace(data=data, res=res, run=where / res.run_dir)


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_what_ran_is_recorded(trained):
    run, res = trained.run, trained.res
    assert re.fullmatch(r"\d{8}-\d{6}-python-JKGATv2-p2", run.name), run.name
    text = (run / "config.toml").read_text()
    assert text.startswith("# Not re-runnable from this file alone:")
    assert "your own JKGATv2 (own_models.JKGATv2" in text
    cfg = tomllib.loads(text)
    assert cfg["data"]["dataset"].startswith("python:")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dataset"] == cfg["data"]["dataset"] and summary["model"] == "JKGATv2"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["dataset"]["fingerprint"].startswith(cfg["data"]["dataset"][len("python:"):])
    assert manifest["model"] == {"name": "JKGATv2", "own": True, "module": "own_models", "qualname": "JKGATv2",
                                 "init": {"d_in": 6, "hidden": 8, "classes": 3, "heads": 2}}
    assert manifest["rerun"]["from_config"] is False and len(manifest["rerun"]["why"]) == 2
    from commgnn.report.html import write_report
    page = write_report([run], run.parent / "report.html").read_text()
    assert "your JKGATv2 (own_models)" in page and "gcn (2 layers" not in page
    assert not list(run.rglob("*.pkl"))  # no pickle in the run folder
    assert type(res.model) is JKGATv2


def test_a_builtin_run_from_the_cli_is_recorded_as_rerunnable(tmp_path):
    from commgnn.cli.main import main

    cfg = tmp_path / "small.toml"
    cfg.write_text("[data.synthetic]\nnum_nodes = 300\nnum_classes = 3\nfeature_dim = 8\n")
    assert main(["train", "--config", str(cfg), "--parts", "1", "--epochs", "2", "--quiet",
                 "--out", str(tmp_path / "run")]) == 0
    text = (tmp_path / "run" / "config.toml").read_text()
    assert not text.startswith("#") and tomllib.loads(text)["data"]["dataset"] == "synthetic"
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["rerun"] == {"from_config": True} and manifest["model"]["name"] == "gcn"


def test_predict_on_a_python_graph_needs_the_graph_and_rebuilds_the_model_by_name(trained, tmp_path, capfd,
                                                                                  monkeypatch):
    from commgnn.cli.main import main

    run = trained.run
    capfd.readouterr()
    assert main(["predict", str(run), "--out", str(tmp_path / "x.pt")]) == 2  # not the synthetic graph
    line = _one_error_line(capfd.readouterr().err)
    assert "graph given in Python" in line and "commgnn.predict(" in line
    assert not (tmp_path / "x.pt").exists()
    # the graph again, from a file: the model is imported by name, nothing is unpickled
    torch.save(trained.data.to_dict(), tmp_path / "g.pt")

    def refuse(*a, **k):
        raise AssertionError("pickle.loads called")
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    assert main(["predict", str(run), "--dataset", str(tmp_path / "g.pt"), "--parts", "1",
                 "--out", str(tmp_path / "p.pt")]) == 0
    monkeypatch.undo()
    expected = torch.load(run / "predictions.pt")
    assert torch.allclose(torch.load(tmp_path / "p.pt"), expected, atol=1e-5)
    scores = commgnn.predict(run, trained.data)  # 2 ranks, the graph from Python
    assert scores.shape == expected.shape and torch.allclose(scores, expected, atol=1e-5)
    again = commgnn.load_result(run)
    assert type(again.model) is JKGATv2 and again.model.hidden == 8
    with torch.no_grad():
        assert torch.allclose(again.model(trained.data.x, trained.data.edge_index), expected, atol=1e-4)


def test_a_failed_prediction_rank_points_at_a_log_that_exists(trained, monkeypatch):
    monkeypatch.setenv("COMMGNN_TEST_BOOM", "1")  # the ranks get the launcher's environment
    with pytest.raises(RankFailure, match=r"failed: RuntimeError: boom") as info:
        commgnn.predict(trained.run, trained.data)
    log = Path(re.search(r"\(log: (.+\.log)\)", str(info.value)).group(1))
    assert log.is_file() and "boom in the user's forward" in log.read_text()


def test_a_run_folder_never_runs_code(trained, tmp_path):
    """A stranger's folder: an ``own_model.json`` naming a function, and a pickled model
    from an older commgnn whose unpickling would write a marker file."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    record = json.loads((run / "own_model.json").read_text())
    (run / "own_model.json").write_text(json.dumps({**record, "module": "os", "qualname": "system",
                                                    "class": "system", "init": {"command": "touch x"}}))
    with pytest.raises(UserError, match="not an nn.Module class; nothing was built"):
        commgnn.load_result(run)
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    (run / "own_model.json").unlink()
    (run / "model_module.pkl").write_bytes(pickle.dumps(Payload()))
    for call in (lambda: commgnn.load_result(run), lambda: commgnn.predict(run, trained.data)):
        with pytest.raises(UserError, match=r"model_module.pkl.*not loaded.*pass an instance"):
            call()
    assert not marker.exists()
    res = commgnn.load_result(run, model=JKGATv2(6, 8, 3))  # the user's own class, given
    assert torch.equal(res.model.out.weight, trained.res.model.out.weight)


MAIN_SCRIPT = textwrap.dedent("""\
    import sys, torch, commgnn
    from torch import nn
    from torch_geometric.nn import SAGEConv
    from commgnn.errors import UserError
    sys.path.insert(0, TESTS)
    from helpers import small_graph

    class Mine(nn.Module):  # defined in __main__: cannot be imported by name
        def __init__(self, d, h, c):
            super().__init__()
            self.c1, self.c2 = SAGEConv(d, h), SAGEConv(h, c)
        def forward(self, x, ei):
            return self.c2(torch.relu(self.c1(x, ei)), ei)

    data = small_graph(n=120, m=480, f=5, c=3, seed=1)
    if MODE == "train":
        res = commgnn.train(data, model=Mine(5, 8, 3), parts=2, epochs=3, quiet=True, out=OUT)
        print("TRAINED", tuple(res.predictions.shape))
    else:
        try:
            commgnn.load_result(OUT)
        except UserError as exc:
            print("REFUSED", exc)
        res = commgnn.load_result(OUT, model=Mine(5, 8, 3))
        scores = commgnn.predict(OUT, data, model=Mine(5, 8, 3))
        print("SAME", bool(torch.allclose(scores, res.predictions, atol=1e-5)), type(res.model).__name__)
    """)


def test_a_model_defined_in_main_is_passed_again_by_the_user(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COMMGNN_ENERGY": "0"}

    def run(mode: str) -> str:
        code = f"TESTS = {str(ROOT / 'tests')!r}\nOUT = {str(tmp_path / 'run')!r}\nMODE = {mode!r}\n" + MAIN_SCRIPT
        res = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=240,
                             env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout
    assert "TRAINED (120, 3)" in run("train")
    out = run("read")  # a new process: the class is known only to the user's script
    refused = next(ln for ln in out.splitlines() if ln.startswith("REFUSED"))
    assert "Mine, defined in __main__" in refused and "model=Mine" in refused
    assert "SAME True Mine" in out
    record = json.loads((tmp_path / "run" / "own_model.json").read_text())
    assert record["module"] == "__main__" and record["importable"] is False and record["init"] is None


def test_resume_of_an_own_model_run_without_its_class_is_refused_in_one_line(trained, tmp_path, capfd):
    from commgnn.cli.main import main

    record = json.loads((trained.run / "own_model.json").read_text())
    assert record["init"] == {"d_in": 6, "hidden": 8, "classes": 3, "heads": 2}
    import shutil
    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    (run / "own_model.json").write_text(json.dumps({**record, "init": None}))
    with pytest.raises(UserError, match=r"constructor arguments could not be recorded; pass an instance: "
                                         r"commgnn.resume\(.*model=JKGATv2\(\.\.\.\)\)"):
        commgnn.resume(run, trained.data)
    capfd.readouterr()
    assert main(["train", "--resume", str(run)]) == 2
    assert "commgnn.resume(" in _one_error_line(capfd.readouterr().err)


def test_the_summary_says_what_is_modelled_and_why_training_stopped(capsys):
    from commgnn.report.console import print_summary
    from commgnn.runner.rank import _how_it_ended

    summary = {"model": "gcn", "dataset": "cora", "parts": 4, "epochs_run": 40, "epochs_planned": 200,
               "stopped_early": {"reason": "patience", "patience": 10, "epoch": 40}, "one_host": True,
               "best_epoch": 30, "best_val_acc": 0.8, "test_acc": 0.79, "halo_bytes_per_epoch": 2e6,
               "halo_bytes_per_epoch_max_rank": 7e5, "eval_halo_bytes_per_epoch": 1e6, "grad_bytes_per_epoch": 5e4,
               "total_bytes": 40 * 3.05e6, "epoch_time_s": 0.02, "comm_time_frac": 0.2, "wait_time_frac": 0.1,
               "peak_rss_mb": 400, "partition": {"edge_cut": 10, "comm_volume": 20},
               "energy": {"measured": True, "cpu_kwh": 1e-3, "ram_kwh": 1e-4, "network_kwh": 0.0221,
                          "network_j_per_byte": 6.5e-7}, "co2_g": 3.0}
    print_summary(summary, "/tmp/run")
    err = re.sub(r"[ \t]*│[ \t]*", "  ", capsys.readouterr().err)  # cells apart by two spaces
    assert re.search(r"epochs run \(best\)\s+40 of 200 \(30\)", err)
    assert re.search(r"stopped early\s+after epoch 40: no better validation accuracy for 10 epochs", err)
    assert re.search(r"halo bytes / epoch, training \(all ranks\)\s+2.00 MB", err)
    assert re.search(r"halo bytes / epoch, evaluation \(all ranks\)\s+1.00 MB", err)
    assert re.search(r"network bytes / epoch \(all traffic, all ranks\)\s+3.05 MB", err)
    assert re.search(r"network \(modelled\)\s+1.1 Wh / 22.1 Wh", err)
    assert re.search(r"network energy \(modelled, not measured\)\s+22.1 Wh = bytes x 6.5e-07 J/byte; these "
                     r"ranks shared one host \(loopback\)", err)
    assert not re.search(r"network(?! \(modelled| energy \(modelled| bytes)", err.split("run directory")[0]
                         .replace("network_", ""))  # every network energy figure is labelled
    # how a run ended, from the trainer's own counters
    cfg = SimpleNamespace(train=SimpleNamespace(patience=10, epochs=200))
    ctx = SimpleNamespace(local_world_size=4, world_size=4)
    early = _how_it_ended(ctx, cfg, SimpleNamespace(epoch=40, since_best=10))
    assert early == {"epochs_planned": 200, "stopped_early": {"reason": "patience", "patience": 10, "epoch": 40},
                     "one_host": True}
    assert _how_it_ended(SimpleNamespace(local_world_size=2, world_size=4), cfg,
                         SimpleNamespace(epoch=200, since_best=10))["stopped_early"] is None


def test_a_real_run_records_its_early_stop(trained):
    summary = trained.res.summary
    assert summary["epochs_planned"] == 6 and summary["epochs_run"] == 6  # patience = 0: never early
    assert summary["stopped_early"] is None and summary["one_host"] is True


def test_dir_lists_the_lazily_imported_api():
    code = "import commgnn; d = dir(commgnn); print(sorted(set(commgnn.__all__) - set(d)), 'train' in d)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.stdout.split() == ["[]", "True"], res.stderr
    for name in ("train", "CommConfig", "predict", "load_result", "RunConfig"):
        assert name in commgnn.__all__ and name in dir(commgnn)


def test_resume_rebuilds_the_model_by_name_from_its_starting_weights(trained, tmp_path):
    """No checkpoint: the resumed run starts again from epoch 0 with the recorded starting
    weights (own_model_init.pt) and the class imported by name, and repeats the run."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    res = commgnn.resume(run, trained.data)
    assert type(res.model) is JKGATv2

    def losses(path: Path) -> list[float]:
        return [json.loads(line)["loss"] for line in (path / "metrics.jsonl").read_text().splitlines()]
    assert losses(run) == losses(trained.run)
    assert torch.equal(torch.load(run / "model.pt")["out.weight"], torch.load(trained.run / "model.pt")["out.weight"])


EVIL = "from pathlib import Path\nPath({marker!r}).write_text('ran')\nfrom own_models import JKGATv2\n"


def _plant(run: Path, module: str) -> None:
    record = json.loads((run / "own_model.json").read_text())
    (run / "own_model.json").write_text(json.dumps({**record, "module": module}))


@pytest.mark.parametrize("cwd_is", ["run folder", pytest.param("its parent", marks=pytest.mark.slow)])
def test_a_module_in_the_run_folder_or_the_current_directory_is_never_imported(trained, tmp_path, cwd_is):
    """A stranger's folder names a module it ships (``evil.py``), and the command runs with
    the current directory on ``sys.path`` (``python -m``): refused in one line, nothing of
    the module runs."""
    import shutil

    run = tmp_path / "stranger" / "run"
    shutil.copytree(trained.run, run)
    marker = tmp_path / "MARKER"
    for where in (run, run.parent):
        (where / "evil.py").write_text(EVIL.format(marker=str(marker)))
    _plant(run, "evil")
    torch.save(trained.data.to_dict(), tmp_path / "g.pt")
    cwd = run if cwd_is == "run folder" else run.parent
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "COMMGNN_ENERGY": "0"}
    res = subprocess.run([sys.executable, "-m", "commgnn", "predict", str(run), "--dataset", str(tmp_path / "g.pt"),
                          "--parts", "1", "--out", str(tmp_path / "p.pt")],
                         capture_output=True, text=True, timeout=240, env=env, cwd=cwd)
    assert not marker.exists()
    assert res.returncode == 2, res.stderr[-3000:]
    line = _one_error_line(res.stderr)
    assert "evil" in line and "not imported" in line and "model=JKGATv2" in line, line
    assert not (tmp_path / "p.pt").exists()


def test_a_package_inside_the_run_folder_is_refused_even_on_sys_path(trained, tmp_path, monkeypatch):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    marker = tmp_path / "MARKER"
    (run / "evilpkg").mkdir()
    (run / "evilpkg" / "__init__.py").write_text(EVIL.format(marker=str(marker)))
    _plant(run, "evilpkg")
    monkeypatch.syspath_prepend(str(run))  # even where the run folder is on sys.path
    with pytest.raises(UserError, match=r"evilpkg .*run folder.*not imported.*model=JKGATv2"):
        commgnn.load_result(run)
    assert not marker.exists() and "evilpkg" not in sys.modules


@pytest.mark.parametrize("damaged", ["model.pt", "own_model_init.pt"])
def test_the_weights_are_checked_before_the_class_is_imported(trained, tmp_path, monkeypatch, damaged):
    """A module found where imports are allowed (an installed location) is imported only
    after the run's weights passed their sha256 check."""
    import shutil
    from commgnn.errors import IntegrityError

    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    lib = tmp_path / "lib"
    lib.mkdir()
    marker = tmp_path / "MARKER"
    (lib / "planted_model.py").write_text(EVIL.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.delitem(sys.modules, "planted_model", raising=False)
    _plant(run, "planted_model")
    blob = bytearray((run / damaged).read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (run / damaged).write_bytes(bytes(blob))
    for call in (lambda: commgnn.load_result(run), lambda: commgnn.predict(run, trained.data, parts=1)):
        with pytest.raises(IntegrityError, match=damaged):
            call()
        assert not marker.exists()
    (run / damaged).write_bytes((trained.run / damaged).read_bytes())  # intact: the import is allowed
    assert type(commgnn.load_result(run).model).__name__ == "JKGATv2" and marker.exists()


def test_the_run_folder_appears_with_its_own_model_files(tmp_path, monkeypatch):
    """``own_model.json`` and ``own_model_init.pt`` (hashed) are in the staging folder when
    it is renamed into place: no reader ever sees the run folder without them."""
    from commgnn.runner import run_dir as run_dir_mod

    seen: dict[str, object] = {}
    commit = run_dir_mod.commit_out_dir

    def spy(staging: Path, out: Path) -> None:
        seen["files"] = sorted(p.name for p in staging.iterdir())
        seen["hashed"] = sorted(json.loads((staging / "hashes.json").read_text())["files"]) \
            if (staging / "hashes.json").is_file() else []
        commit(staging, out)
    monkeypatch.setattr(run_dir_mod, "commit_out_dir", spy)
    res = commgnn.train(_graph(), model=JKGATv2(6, 4, 3), parts=1, epochs=1, quiet=True, out=tmp_path / "run")
    assert {"own_model.json", "own_model_init.pt", "hashes.json"} <= set(seen["files"]), seen
    assert seen["hashed"] == ["own_model_init.pt"]
    assert json.loads((res.run_dir / "own_model.json").read_text())["qualname"] == "JKGATv2"
