"""Corruption fuzzing (hypothesis) of a finished run folder: random byte flips, truncations,
splices and appended bytes in each file kind (a checkpoint, ``latest.json``, ``model.pt``,
``predictions.pt``, ``hashes.json``, a partition file, the partition ``meta.json``), then
``train --resume``, ``load_result`` and ``predict``; and in the records that carry no hash
(``manifest.json``, ``config.toml``, a user's model's ``own_model.json``, also replaced by
``{}``), then those and ``commgnn report``.

The property, for every case: the command refuses in one line (exit 2, or one
:class:`~commgnn.errors.UserError` line), or it succeeds with exactly what the intact
folder gives (the resumed losses and accuracies, the loaded weights and predictions): a
change the checksums let through must be one the format does not read (JSON whitespace,
say). No case completes on changed weights, and no case raises anything else. A record
without a hash may be changed into another valid one (an edited ``config.toml`` is the
user's to make): there the property is only one line (exit 2) or success, never a
traceback.

The ``ci`` profile runs a few examples per property (derandomized); the ``slow`` test runs
the same properties with many more, from a fresh seed (``pytest -m slow``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

import commgnn
from commgnn.cli.main import main
from commgnn.errors import UserError
from fuzz_harness import CI, LONG
from helpers import small_graph

CONFIG = """
[data.synthetic]
num_nodes = 200
num_classes = 3
feature_dim = 6
[model]
hidden = 4
layers = 1
[train]
epochs = 4
patience = 0
[runtime]
checkpoint_every = 2
threads = 1
[output]
quiet = true
"""

RESUME_KINDS = ("checkpoint", "latest.json", "partitions/part_0.pt", "partitions/meta.json")
LOAD_KINDS = ("model.pt", "predictions.pt", "hashes.json")
RECORD_KINDS = ("manifest.json", "config.toml")


def _file(run: Path, kind: str) -> Path:
    if kind == "checkpoint":
        meta = json.loads((run / "checkpoints" / "latest.json").read_text())
        return run / "checkpoints" / meta["dir"] / "rank0.pt"
    if kind == "latest.json":
        return run / "checkpoints" / "latest.json"
    return run / kind


def _rows(run: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["epoch"], r["loss"], r["train_acc"], r["val_acc"], r["test_acc"]) for r in rows]


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> tuple[Path, list[tuple], dict, torch.Tensor]:
    """A finished one-rank run, the rows of its intact resume to 6 epochs, its weights and
    predictions."""
    tmp = tmp_path_factory.mktemp("intact")
    cfg = tmp / "c.toml"
    cfg.write_text(CONFIG)
    run = tmp / "run"
    assert main(["train", "--config", str(cfg), "--parts", "1", "--out", str(run)]) == 0
    again = tmp / "again"
    shutil.copytree(run, again)
    assert main(["train", "--resume", str(again), "--epochs", "6"]) == 0
    res = commgnn.load_result(run)
    return run, _rows(again), res.model.state_dict(), res.predictions


@st.composite
def corruption(draw: st.DrawFn, kinds: tuple[str, ...]) -> tuple[str, str, int, int]:
    """``(kind, how, where, value)``: where is a fraction of the file in thousandths."""
    kind = draw(st.sampled_from(kinds))
    how = draw(st.sampled_from(["flip", "truncate", "splice", "append", "object"]
                               if kinds in (RECORD_KINDS, ("own_model.json",)) else
                               ["flip", "truncate", "splice", "append"]))
    return kind, how, draw(st.integers(0, 999)), draw(st.integers(1, 255))


def _damage(run: Path, case: tuple[str, str, int, int], donor: bytes) -> None:
    kind, how, where, value = case
    path = _file(run, kind)
    blob = bytearray(path.read_bytes())
    at = min(len(blob) - 1, len(blob) * where // 1000)
    if how == "flip":
        blob[at] ^= value
    elif how == "truncate":
        del blob[at:]
    elif how == "splice":  # bytes of another file of the run over this one's
        piece = donor[len(donor) * where // 1000:][:value]
        blob[at:at + len(piece)] = piece
    elif how == "append":
        blob += bytes([value]) * (1 + where % 7)
    else:  # a valid record that holds nothing
        blob = bytearray(b"{}")
    path.write_bytes(bytes(blob))


def _copy(run: Path) -> Path:
    dst = Path(tempfile.mkdtemp(prefix="fuzz-run-")) / "run"
    shutil.copytree(run, dst)
    return dst


def _kind(err: str) -> str:
    """The error's gist, for the statistics (--hypothesis-show-statistics)."""
    for gist in ("sha256 mismatch", "is missing", "no sha256", "is corrupt", "cannot read", "run code"):
        if gist in err:
            return gist
    return err.removeprefix("commgnn: error:")[:40]


def _one_line(capfd) -> str:
    err = capfd.readouterr().err.strip()
    assert err.startswith("commgnn: error:") and err.count("\n") == 0, err
    return err


def prop_resume(intact, capfd, case) -> None:
    run, rows, _, _ = intact
    work = _copy(run)
    try:
        _damage(work, case, (run / "model.pt").read_bytes())
        capfd.readouterr()
        rc = main(["train", "--resume", str(work), "--epochs", "6"])
        if rc == 0:  # let through: then it must have changed nothing the run reads
            assert _rows(work) == rows, case
            event(f"resume: {case[0]} {case[1]}: harmless")
        else:
            assert rc == 2, (rc, case)
            event(f"resume: {case[0]}: refused ({_kind(_one_line(capfd))})")
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)


def prop_load(intact, capfd, tmp_path, case) -> None:
    run, _, weights, predictions = intact
    work = _copy(run)
    try:
        _damage(work, case, (run / "checkpoints" / "latest.json").read_bytes())
        try:
            res = commgnn.load_result(work)
        except UserError as exc:
            assert "\n" not in str(exc), case
            event(f"load: {case[0]}: refused")
        else:
            event(f"load: {case[0]} {case[1]}: harmless")
            got = res.model.state_dict()
            assert got.keys() == weights.keys() and all(torch.equal(got[k], weights[k]) for k in got), case
            assert torch.equal(res.predictions, predictions), case
        if case[0] != "predictions.pt":  # predict reads model.pt (and hashes.json)
            capfd.readouterr()
            out = tmp_path / "p.pt"
            rc = main(["predict", str(work), "--out", str(out)])
            if rc == 0:
                assert torch.equal(torch.load(out, weights_only=True), predictions), case
            else:
                assert rc == 2, (rc, case)
                _one_line(capfd)
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)


def _one_line_or_done(rc: int, capfd, case) -> None:
    if rc != 0:
        assert rc == 2, (rc, case)
        event(f"{case[0]}: refused ({_kind(_one_line(capfd))})")


def prop_records(run: Path, capfd, tmp_path, case, *, report: bool = True) -> None:
    """A record without a hash, damaged: every command refuses in one line or succeeds."""
    work = _copy(run)
    try:
        _damage(work, case, (run / "summary.json").read_bytes())
        try:
            commgnn.load_result(work)
        except UserError as exc:
            assert "\n" not in str(exc), case
        capfd.readouterr()
        _one_line_or_done(main(["predict", str(work), "--parts", "1", "--out", str(tmp_path / "p.pt")]), capfd, case)
        if report:
            _one_line_or_done(main(["report", str(work), "--out", str(tmp_path / "r.html")]), capfd, case)
        _one_line_or_done(main(["train", "--resume", str(work), "--epochs", "5"]), capfd, case)
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def own_run(tmp_path_factory) -> Path:
    """A finished one-rank run of a user's model (``own_model.json``), on a graph file."""
    from own_models import JKGATv2

    tmp = tmp_path_factory.mktemp("own")
    g = small_graph(n=120, m=480, f=6, c=3, seed=2)
    torch.save({k: g[k] for k in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")}, tmp / "g.pt")
    res = commgnn.train(str(tmp / "g.pt"), model=JKGATv2(6, 4, 3), parts=1, epochs=3, quiet=True, out=tmp / "run",
                        checkpoint_every=2, threads=1)
    return res.run_dir


@pytest.mark.timeout(600)
@settings(CI, max_examples=8)
@given(case=corruption(RECORD_KINDS))
@example(case=("manifest.json", "truncate", 500, 1))  # what the reviewer saw: a traceback
@example(case=("manifest.json", "object", 0, 1))
@example(case=("config.toml", "truncate", 500, 1))
def test_a_damaged_record_is_refused_in_one_line_or_harmless(intact, capfd, tmp_path, case):
    prop_records(intact[0], capfd, tmp_path, case)


@pytest.mark.timeout(600)
@settings(CI, max_examples=4)
@given(case=corruption(("own_model.json",)))
@example(case=("own_model.json", "object", 0, 1))
def test_a_damaged_own_model_record_is_refused_in_one_line_or_harmless(own_run, capfd, tmp_path, case):
    prop_records(own_run, capfd, tmp_path, case, report=False)


@pytest.mark.timeout(600)
@settings(CI, max_examples=12)
@given(case=corruption(RESUME_KINDS))
def test_a_corrupt_file_is_refused_or_harmless_on_resume(intact, capfd, case):
    prop_resume(intact, capfd, case)


@pytest.mark.timeout(600)
@settings(CI, max_examples=12)
@given(case=corruption(LOAD_KINDS))
def test_a_corrupt_file_is_refused_or_harmless_on_load_and_predict(intact, capfd, tmp_path, case):
    prop_load(intact, capfd, tmp_path, case)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(LONG, max_examples=150)
@given(case=corruption(RESUME_KINDS))
def test_a_corrupt_file_is_refused_or_harmless_on_resume_long(intact, capfd, case):
    prop_resume(intact, capfd, case)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(LONG, max_examples=150)
@given(case=corruption(LOAD_KINDS))
def test_a_corrupt_file_is_refused_or_harmless_on_load_and_predict_long(intact, capfd, tmp_path, case):
    prop_load(intact, capfd, tmp_path, case)
