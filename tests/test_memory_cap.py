"""Under a hard memory cap (a fresh memory cgroup), a graph whose in-memory path does not
fit trains from its graph folder (issue 55). Skipped where cgroups cannot be written."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from commgnn.data.config import BigSynthConfig
from commgnn.data.ondisk_check import load_graph_folder
from commgnn.data.synth_large import generate_graph_folder
from commgnn.metrics.memcap import MemoryCgroup, run_capped

CAP = int(3.5 * 2**30)


def _cgroups_or_skip() -> None:
    try:
        MemoryCgroup(CAP).close()
    except OSError as exc:
        pytest.skip(f"no writable memory cgroup here ({exc})")


@pytest.mark.slow  # about two minutes: out-of-core partitioning of 30M edges, then two ranks
@pytest.mark.timeout(900)
def test_a_graph_whose_in_memory_path_exceeds_the_cap_trains_from_its_folder(tmp_path):
    _cgroups_or_skip()
    folder = generate_graph_folder(BigSynthConfig(nodes=300_000, edges=30_000_000, features=32, classes=8), tmp_path / "g")
    data = load_graph_folder(folder)  # the same graph as one file, for the in-memory path
    torch.save({"x": data.x, "edge_index": data.edge_index, "y": data.y, "train_mask": data.train_mask,
                "val_mask": data.val_mask, "test_mask": data.test_mask}, tmp_path / "g.pt")
    del data
    cli = [sys.executable, "-m", "commgnn"]
    # In memory: the launcher holds the graph and METIS's CSR (about 4 GB): killed at the cap.
    mem = run_capped([*cli, "partition", "--dataset", str(tmp_path / "g.pt"), "--parts", "2",
                      "--partition-memory-gb", "100", "--out", str(tmp_path / "parts-mem")], CAP)
    print("in memory:", mem.row())
    assert mem.returncode != 0 and mem.oom_killed, mem.row()
    assert not (tmp_path / "parts-mem" / "meta.json").exists()
    # From the folder: streamed; METIS's estimate is over the cgroup's headroom (which every
    # "available memory" default reads), so it is partitioned out of core; each rank maps its folder.
    # The pre-flight's upper bound (2.9 GB here) is over the headroom left beside the launcher,
    # so the cap itself is given as the job's limit.
    disk = run_capped([*cli, "train", "--dataset", str(folder), "--parts", "2", "--epochs", "1", "--hidden", "16",
                       "--memory-limit-gb", "3.5", "--no-energy", "--no-compute-alone", "--quiet",
                       "--out", str(tmp_path / "run")], CAP)
    print("from the folder:", disk.row(), sorted(disk.per_process_peak.values())[-3:])
    assert disk.returncode == 0 and not disk.oom_killed, disk.row()
    assert disk.peak_cgroup <= CAP
    assert json.loads((tmp_path / "run" / "partitions" / "meta.json").read_text())["method"] == "lp-metis"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["epochs_run"] == 1
