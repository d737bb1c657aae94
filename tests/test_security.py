"""Run folders, checkpoints and partition folders are untrusted input: a file whose pickle
would run a command runs nothing and is refused in one line (exit 2); an altered,
truncated or missing file is refused in one line naming it before anything is loaded."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from commgnn.cli.main import main
from commgnn.errors import IntegrityError
from commgnn.integrity import HASHES, load_run_file, save_run_file
from commgnn.trainers import checkpoint

CONFIG = """
[data.synthetic]
num_nodes = 300
num_classes = 3
feature_dim = 8
[model]
hidden = 8
[train]
epochs = 4
patience = 0
[runtime]
checkpoint_every = 2
timeout_s = 30
[output]
quiet = true
"""


class _Payload:
    """Unpickling this runs ``touch MARKER``: what a malicious file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil(marker: Path) -> bytes:
    """A ``torch.save`` file (zip) whose pickle runs the command when loaded with pickle."""
    import io
    buf = io.BytesIO()
    torch.save({"epoch": 4, "trainer": _Payload(marker)}, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-rank run with a checkpoint, copied per test."""
    tmp = tmp_path_factory.mktemp("finished")
    cfg = tmp / "c.toml"
    cfg.write_text(CONFIG)
    out = tmp / "run"
    assert main(["train", "--config", str(cfg), "--parts", "2", "--out", str(out)]) == 0
    return out


@pytest.fixture
def run(finished, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def _one_line(capfd) -> str:
    err = capfd.readouterr().err.strip()
    assert err and err.count("\n") == 0, err
    return err


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _logs(run: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((run / "logs").glob("*"))}


def _ckpt(run: Path) -> Path:
    meta = json.loads((run / "checkpoints" / "latest.json").read_text())
    return run / "checkpoints" / meta["dir"] / "rank0.pt"


def _rehash_checkpoint(run: Path) -> None:
    """What a careful attacker does: the manifest updated to the planted file's hash."""
    path = run / "checkpoints" / "latest.json"
    meta = json.loads(path.read_text())
    meta["sha256"]["rank0.pt"] = _sha(_ckpt(run))
    path.write_text(json.dumps(meta))


def _rehash_run_file(run: Path, name: str) -> None:
    path = run / HASHES
    meta = json.loads(path.read_text())
    meta["files"][name] = _sha(run / name)
    path.write_text(json.dumps(meta))


def test_the_payload_does_run_under_plain_pickle(tmp_path):
    """The test's payload is live: loaded the old way (weights_only=False) it runs."""
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    path.write_bytes(_evil(marker))
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rehash", [False, True], ids=["as-recorded", "manifest-updated"])
def test_a_malicious_checkpoint_runs_nothing_and_resume_is_refused(run, tmp_path, capfd, rehash):
    marker = tmp_path / "marker"
    _ckpt(run).write_bytes(_evil(marker))
    if rehash:
        _rehash_checkpoint(run)
    capfd.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "6"]) == 2
    err = _one_line(capfd)
    assert "rank0.pt" in err, err
    assert ("run code" in err) if rehash else ("sha256 mismatch" in err), err
    assert not marker.exists()
    # a hash mismatch is refused by the launcher before any rank starts (the run's record is
    # left as it was); a matching hash lets the ranks start, and each refuses to unpickle it
    state = json.loads((run / "status.json").read_text())["state"]
    assert state == ("failed" if rehash else "complete"), state


@pytest.mark.timeout(120)
def test_a_malicious_latest_json_runs_nothing_and_is_refused(run, tmp_path, capfd):
    marker = tmp_path / "marker"
    (run / "checkpoints" / "latest.json").write_bytes(pickle.dumps(_Payload(marker)))
    capfd.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "6"]) == 2
    assert "latest.json is corrupt" in _one_line(capfd)
    assert not marker.exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rehash", [False, True], ids=["as-recorded", "manifest-updated"])
def test_a_malicious_partition_file_runs_nothing_and_is_refused(run, tmp_path, capfd, rehash):
    marker = tmp_path / "marker"
    part = run / "partitions" / "part_0.pt"
    part.write_bytes(_evil(marker))
    if rehash:
        meta_path = run / "partitions" / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["files"]["part_0.pt"] = _sha(part)
        meta_path.write_text(json.dumps(meta))
    capfd.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "6"]) == 2
    assert "part_0.pt" in _one_line(capfd)
    assert not marker.exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["model.pt", "predictions.pt"])
@pytest.mark.parametrize("rehash", [False, True], ids=["as-recorded", "manifest-updated"])
def test_a_malicious_run_file_runs_nothing_and_load_result_refuses_it(run, tmp_path, name, rehash):
    import commgnn
    marker = tmp_path / "marker"
    (run / name).write_bytes(_evil(marker))
    if rehash:
        _rehash_run_file(run, name)
    with pytest.raises(IntegrityError, match=name) as info:
        commgnn.load_result(run)
    assert "\n" not in str(info.value)
    assert not marker.exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rehash", [False, True], ids=["as-recorded", "manifest-updated"])
def test_a_malicious_model_pt_runs_nothing_and_predict_refuses_it(run, tmp_path, capfd, rehash):
    marker = tmp_path / "marker"
    (run / "model.pt").write_bytes(_evil(marker))
    if rehash:
        _rehash_run_file(run, "model.pt")
    capfd.readouterr()
    assert main(["predict", str(run), "--out", str(tmp_path / "p.pt")]) == 2
    assert "model.pt" in _one_line(capfd)
    assert not marker.exists() and not (tmp_path / "p.pt").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["model.pt", "predictions.pt"])
def test_a_truncated_or_flipped_run_file_is_refused_in_one_line(run, tmp_path, capfd, name):
    import commgnn
    path = run / name
    blob = path.read_bytes()
    for bad in (blob[: len(blob) // 2], blob[:-1] + bytes([blob[-1] ^ 1])):
        path.write_bytes(bad)
        with pytest.raises(IntegrityError, match=f"{name} is corrupt"):
            commgnn.load_result(run)
    path.write_bytes(blob)
    assert commgnn.load_result(run).predictions.shape[0] == 300  # intact again: loads
    path.write_bytes(blob[: len(blob) // 2])
    if name == "model.pt":
        capfd.readouterr()
        assert main(["predict", str(run), "--out", str(tmp_path / "p.pt")]) == 2
        assert f"{name} is corrupt" in _one_line(capfd)
    path.unlink()
    with pytest.raises(IntegrityError, match=f"{name} is missing"):
        commgnn.load_result(run)


@pytest.mark.timeout(120)
def test_an_unrecorded_run_file_is_refused(run):
    import commgnn
    (run / HASHES).unlink()
    with pytest.raises(IntegrityError, match="model.pt has no recorded sha256"):
        commgnn.load_result(run)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["flip", "truncate", "missing", "unhashed", "escape"])
def test_a_damaged_checkpoint_is_refused_before_anything_runs(run, capfd, damage):
    path = _ckpt(run)
    latest = run / "checkpoints" / "latest.json"
    if damage == "flip":  # one bit of a weight: loads fine as a zip, changes training
        blob = bytearray(path.read_bytes())
        blob[len(blob) // 2] ^= 0x01
        path.write_bytes(bytes(blob))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "missing":
        path.unlink()
    elif damage == "unhashed":  # a record as written before checkpoints were hashed
        meta = json.loads(latest.read_text())
        del meta["sha256"]
        latest.write_text(json.dumps(meta))
    else:  # a record naming a folder outside checkpoints/
        meta = json.loads(latest.read_text())
        meta["dir"] = "../partitions"
        latest.write_text(json.dumps(meta))
    metrics, logs = (run / "metrics.jsonl").read_text(), _logs(run)
    capfd.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "6"]) == 2
    err = _one_line(capfd)
    want = {"flip": "rank0.pt is corrupt", "truncate": "rank0.pt is corrupt", "missing": "rank0.pt is missing",
            "unhashed": "has no sha256", "escape": "latest.json is corrupt"}[damage]
    assert want in err, err
    assert (run / "metrics.jsonl").read_text() == metrics  # nothing ran: not even the log was cut back
    assert json.loads((run / "status.json").read_text())["state"] == "complete"
    assert _logs(run) == logs  # no rank was started


def test_a_rank_refuses_its_damaged_checkpoint_file_too(run):
    """Under torchrun no launcher checks first: each rank checks its own file as it loads it."""
    path = _ckpt(run)
    path.write_bytes(path.read_bytes()[:-1])
    meta = checkpoint.latest(run)
    with pytest.raises(IntegrityError, match="rank0.pt is corrupt"):
        checkpoint.load_rank(run, meta, 0, parts=2, fingerprint=meta["fingerprint"])


def test_checkpoint_state_round_trips_as_plain_data_and_refuses_objects(tmp_path):
    import random
    state = {"epoch": 3, "np": np.arange(5, dtype=np.uint32), "scalar": np.float64(2.5),
             "rng": np.random.RandomState(7).get_state(), "t": torch.ones(2), "nested": [(1, "a", None), {4}]}
    sha = checkpoint.save_rank(tmp_path, 3, 0, state)
    checkpoint.commit(tmp_path, 3, 1, "fp", [sha])
    meta = checkpoint.latest(tmp_path)
    expected_random = random.getstate()
    random.random()
    got = checkpoint.load_rank(tmp_path, meta, 0, parts=1, fingerprint="fp")
    assert random.getstate() == expected_random  # the process's Python RNG restored
    assert isinstance(got["np"], np.ndarray) and got["np"].dtype == np.uint32 and got["np"].tolist() == [0, 1, 2, 3, 4]
    assert got["scalar"] == 2.5 and isinstance(got["scalar"], np.float64)
    rs = np.random.RandomState()
    rs.set_state(got["rng"])
    assert rs.randint(1 << 30) == np.random.RandomState(7).randint(1 << 30)
    assert got["nested"] == [(1, "a", None), {4}] and torch.equal(got["t"], torch.ones(2))
    # the file itself needs nothing but weights_only=True
    torch.load(tmp_path / "checkpoints" / "epoch-000003" / "rank0.pt", weights_only=True)
    with pytest.raises(TypeError, match=r"state\['bad'\]: a _Payload cannot go into a checkpoint"):
        checkpoint.save_rank(tmp_path, 4, 0, {"epoch": 4, "bad": _Payload(tmp_path / "m")})


def test_run_files_are_written_atomically_with_their_hash(tmp_path):
    sha = save_run_file({"w": torch.ones(3)}, tmp_path, "model.pt")
    assert json.loads((tmp_path / HASHES).read_text())["files"] == {"model.pt": sha}
    assert sha == _sha(tmp_path / "model.pt")
    assert torch.equal(load_run_file(tmp_path, "model.pt")["w"], torch.ones(3))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    (tmp_path / HASHES).write_text("{not json")  # damaged by an earlier attempt: replaced, not fatal
    with pytest.raises(IntegrityError, match="hashes.json is corrupt"):
        load_run_file(tmp_path, "model.pt")
    sha2 = save_run_file(torch.zeros(2), tmp_path, "predictions.pt")
    assert json.loads((tmp_path / HASHES).read_text())["files"] == {"predictions.pt": sha2}


@pytest.mark.timeout(120)
def test_a_partition_file_with_a_sparse_tensor_and_a_matching_hash_is_refused(run, capfd):
    part = run / "partitions" / "part_0.pt"
    payload = torch.load(part, weights_only=True)
    payload["edge_index"] = payload["edge_index"].to_sparse()
    torch.save(payload, part)
    meta_path = run / "partitions" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["files"]["part_0.pt"] = _sha(part)
    meta_path.write_text(json.dumps(meta))
    capfd.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "6"]) == 2
    assert "edge_index has layout torch.sparse_coo" in _one_line(capfd)


def _graph(**changes) -> dict:
    from helpers import small_graph
    g = small_graph(n=40, m=120, f=4, c=3, seed=2)
    return {**{k: g[k] for k in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")}, **changes}


@pytest.mark.parametrize("field,layout", [("edge_index", "coo"), ("edge_index", "csr"), ("y", "coo"),
                                          ("train_mask", "coo")])
def test_a_graph_field_with_a_sparse_layout_is_refused_in_one_line(tmp_path, capfd, field, layout):
    g = _graph()
    g[field] = g[field].to_sparse() if layout == "coo" else g[field].to_sparse_csr()
    path = tmp_path / "g.pt"
    torch.save(g, path)
    assert main(["train", "--dataset", str(path), "--parts", "1", "--epochs", "1", "--quiet",
                 "--out", str(tmp_path / "run")]) == 2
    err = _one_line(capfd)
    assert f"{field} has layout torch.sparse_" in err and "dense (strided)" in err, err
    assert not (tmp_path / "run").exists()


def test_sparse_features_are_still_densified(tmp_path):
    """Sparse node features were accepted (and made dense) before; they still are."""
    import commgnn
    from torch_geometric.data import Data
    g = _graph()
    g["x"] = g["x"].to_sparse()
    res = commgnn.train(Data(**g), parts=1, out=tmp_path / "run", epochs=1, quiet=True)
    assert res.predictions.shape == (40, 3)


def test_the_validator_refuses_a_sparse_field_of_a_data_object():
    from torch_geometric.data import Data
    from commgnn.data.validate import validate_graph
    from commgnn.errors import DataError
    g = _graph()
    g["edge_index"] = g["edge_index"].to_sparse()
    with pytest.raises(DataError, match="edge_index has layout torch.sparse_coo"):
        validate_graph(Data(**g))
