"""``runtime.gc_freeze``: the set-up heap is kept out of full garbage collections during the
epochs, and handed back after.

Why it exists: ranks running the same code reach a full collection at the same epoch, and
8 local ranks on 2 cores collecting at once made one 1.2 s epoch out of 0.16 s ones
(``benchmarks/results/cost-model/2026-12-05-twin-flags.md``). Off by default: the later
epochs of frozen runs measured 3.8% slower
(``benchmarks/results/cost-model/2026-12-05-twin-flags-gc-freeze-ab*.md``).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

import commgnn
from commgnn.cli.main import _flags, build_parser
from commgnn.errors import ConfigError
from commgnn.runner.config import RunConfig, resolve_config
from commgnn.runner.rank import frozen_heap
from helpers import small_graph


def test_frozen_heap_hides_the_objects_alive_at_its_start_and_hands_them_back():
    before = [[i] for i in range(5000)]  # lists: always tracked
    assert gc.get_freeze_count() == 0
    seen = len(gc.get_objects())
    with frozen_heap(True):
        assert gc.get_freeze_count() >= len(before)
        assert len(gc.get_objects()) < seen - len(before) + 100  # a full collection would not scan them
        during = [[j] for j in range(100)]
        assert len(gc.get_objects()) >= len(during)
    assert gc.get_freeze_count() == 0 and len(gc.get_objects()) >= seen
    with frozen_heap(False):
        assert gc.get_freeze_count() == 0


def test_frozen_heap_leaves_a_process_that_froze_objects_itself_as_it_was():
    mine = [[i] for i in range(1000)]
    gc.freeze()  # e.g. a pre-forking server that calls commgnn.train(parts=1)
    try:
        held = gc.get_freeze_count()
        with frozen_heap(True):
            later = [[j] for j in range(100)]
            assert gc.get_freeze_count() == held  # not frozen again, so not handed back either
        assert gc.get_freeze_count() == held and len(mine) + len(later) == 1100
    finally:
        gc.unfreeze()


def test_frozen_heap_unfreezes_when_the_epochs_raise():
    with pytest.raises(RuntimeError):
        with frozen_heap(True):
            raise RuntimeError("a rank failed")
    assert gc.get_freeze_count() == 0


def test_the_flags_and_the_toml_key_set_it(tmp_path):
    assert RunConfig().runtime.gc_freeze is False  # off by default: its measured effect is mixed
    parser = build_parser()
    assert resolve_config(None, _flags(parser.parse_args(["train", "--gc-freeze"])), {}).runtime.gc_freeze is True
    assert "gc_freeze" not in _flags(parser.parse_args(["train"]))  # unset: the config decides
    toml = tmp_path / "run.toml"
    toml.write_text("[runtime]\ngc_freeze = true\n")
    assert resolve_config(str(toml), {}, {}).runtime.gc_freeze is True
    off = _flags(parser.parse_args(["train", "--no-gc-freeze"]))
    assert resolve_config(str(toml), off, {}).runtime.gc_freeze is False  # the flag wins over the file
    toml.write_text("[runtime]\ngc_freeze = false\n")
    on = _flags(parser.parse_args(["train", "--gc-freeze"]))
    assert resolve_config(str(toml), on, {}).runtime.gc_freeze is True
    toml.write_text("[runtime]\ngc_freez = false\n")
    with pytest.raises(ConfigError, match="gc_freez"):
        resolve_config(str(toml), {}, {})


class _FreezeProbe(torch.nn.Module):
    """A user's model that writes, on every forward, how many objects the collector has
    frozen in this rank (one file per process)."""

    def __init__(self, d_in: int, classes: int, log_dir: str) -> None:
        from torch_geometric.nn import GCNConv

        super().__init__()
        self.conv = GCNConv(d_in, classes)
        self.log_dir = log_dir

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        with open(Path(self.log_dir, str(os.getpid())), "a") as fh:
            fh.write(f"{gc.get_freeze_count()}\n")
        return self.conv(x, edge_index)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("freeze", [True, False])
def test_ranks_train_with_the_set_up_heap_frozen_when_told_to(tmp_path, freeze):
    data = small_graph(n=120, m=480, f=5, c=3, seed=1)
    data = Data(**{k: data[k] for k in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")})
    logs = tmp_path / "logs"
    logs.mkdir()
    commgnn.train(data, model=_FreezeProbe(5, 3, str(logs)), parts=2, epochs=2, patience=0, quiet=True,
                  out=tmp_path / "run", gc_freeze=freeze)
    # the most objects frozen during any forward of each process (the export's forwards, after
    # the epochs, see the heap handed back)
    peak = [max(map(int, f.read_text().split())) for f in logs.iterdir()]
    assert len(peak) >= 2  # both ranks ran forwards
    if freeze:
        assert min(peak) > 1000  # torch, PyG and the graph: far more than a few objects
    else:
        assert max(peak) == 0
