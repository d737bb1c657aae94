"""A graph folder as a run's input (issue 55): the launcher streams it and never loads it,
partitions it out of core, and the ranks train exactly as on the same graph in memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import commgnn
from commgnn.data.config import BigSynthConfig
from commgnn.data.ondisk_check import load_graph_folder
from commgnn.data.synth_large import generate_graph_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("big") / "g"
    return generate_graph_folder(BigSynthConfig(nodes=3000, edges=60_000, features=12, classes=4,
                                                community_size=200, train_fraction=0.3), out)


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(180)
def test_two_ranks_on_a_folder_train_as_on_the_same_graph_in_memory(folder, tmp_path, monkeypatch):
    import commgnn.runner.local as local

    opts = dict(parts=2, epochs=3, quiet=True, hidden=16, partitioner="random", energy_track=False)
    mem = commgnn.train(load_graph_folder(folder), out=tmp_path / "mem", **opts)

    def no_loading(*_a, **_k):  # the folder path must not load the graph in the launcher
        raise AssertionError("the launcher loaded the graph folder into memory")

    monkeypatch.setattr(local, "load_dataset", no_loading)
    disk = commgnn.train(str(folder), out=tmp_path / "disk", **opts)
    meta = json.loads((disk.run_dir / "partitions" / "meta.json").read_text())
    assert meta["version"] == 2 and meta["layout"] == "folders"
    assert sorted(p.name for p in (disk.run_dir / "partitions").iterdir()) == ["meta.json", "part_0", "part_1"]
    assert len(_losses(disk.run_dir)) == 3 and _losses(disk.run_dir) == _losses(mem.run_dir)
    a, b = disk.model.state_dict(), mem.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # predict reads the run's own rank folders: the graph is not loaded, the scores are the run's
    import importlib

    monkeypatch.setattr(importlib.import_module("commgnn.api.predict"), "load_dataset", no_loading)
    scores = commgnn.predict(disk.run_dir)
    assert torch.allclose(scores, torch.load(disk.run_dir / "predictions.pt", weights_only=True), atol=1e-6)


@pytest.mark.timeout(120)
def test_metis_over_the_cap_partitions_out_of_core_instead(folder, tmp_path, capfd):
    done = commgnn.partition_graph(tmp_path / "parts", str(folder), parts=2, partition_memory_gb=0.001)
    err = capfd.readouterr().err
    meta = json.loads((tmp_path / "parts" / "meta.json").read_text())
    assert meta["method"] == "lp-metis" and "out of core with lp-metis" in err
    # on this community graph the out-of-core cut is far below a random split's (about half)
    assert done.report["edge_cut"] / meta["num_edges"] < 0.3
    again = commgnn.partition_graph(tmp_path / "parts2", str(folder), parts=2)  # METIS fits here
    assert json.loads((tmp_path / "parts2" / "meta.json").read_text())["method"] == "metis"
    assert done.report["edge_cut"] <= 1.5 * again.report["edge_cut"]  # lp-metis within 1.5x of METIS


@pytest.mark.timeout(240)
def test_the_papers_path_on_a_small_folder(folder, tmp_path):
    """What the papers100M-shaped run uses, on a small folder: rank folders that read their
    features from the graph's x.npy (``partition.features = "source"``), a partitioned
    topology, evaluation by sampling, no ``predictions.pt``; ``predict`` then scores the
    run exactly, as a copied-features partition of the same graph and seed does."""
    src = commgnn.partition_graph(tmp_path / "src", str(folder), parts=2, partitioner="lp-metis",
                                  partition_features="source")
    assert not (tmp_path / "src" / "part_0" / "x.npy").exists()
    copied = commgnn.partition_graph(tmp_path / "copy", str(folder), parts=2, partitioner="lp-metis")
    assert src.report == copied.report
    opts = dict(parts=2, epochs=2, quiet=True, hidden=16, energy_track=False, mode="minibatch", fanout=(4, 4),
                batch_size=64, topology="partitioned")
    runs = {}
    for name in ("src", "copy"):
        runs[name] = commgnn.train(str(folder), out=tmp_path / f"run-{name}", partition_dir=str(tmp_path / name),
                                   inference="sampled" if name == "src" else "layerwise",
                                   predictions=name != "src", **opts)
    assert runs["src"].predictions is None and not (runs["src"].run_dir / "predictions.pt").exists()
    a, b = runs["src"].model.state_dict(), runs["copy"].model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same training, whichever features file
    assert 0 < runs["src"].summary["test_acc"] <= 1
    for line in (runs["src"].run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)  # each step's wall time (the slowest rank's), in order: about the loop's
        assert len(m["step_s"]) == m["steps"] and min(m["step_s"]) > 0
        assert 0.8 * m["train_loop_s"] <= sum(m["step_s"]) <= 1.5 * m["train_loop_s"]
    scores = commgnn.predict(runs["src"].run_dir)
    assert torch.allclose(scores, runs["copy"].predictions, atol=1e-6)
