"""Property-based fuzzing (hypothesis) of what ``commgnn train`` accepts from users.

Inputs, valid and broken, generated at random:

* user graph files (``--dataset g.pt``): tensors of wrong shapes and dtypes, NaN/inf
  features, out-of-range or negative edge ids, bad masks and labels, missing keys,
  non-tensor values, other containers, and files that are no torch files at all;
* masks and labels alone, edited entry by entry (values, dtypes, lengths, [N, k] masks,
  dropped masks), with ``data.max_classes``, ``data.allow_mask_overlap`` and the split
  ratios from a config file;
* TOML configs: random subsets of the real keys of ``RunConfig`` (walked from the
  dataclasses, so new keys are fuzzed too) with values of the right and wrong types,
  unknown keys, and syntactically broken text;
* partition directories (``--partition-dir``) made by ``commgnn partition`` and then
  corrupted: files deleted, truncated or with flipped bytes, ``meta.json`` fields edited,
  part files re-saved with bad contents and a matching sha256;
* gossip topology files (``--gossip FILE``): edge lists, GraphML and GML, valid or not.

The property, for every input: ``main(["train", ...])`` either succeeds (return code 0,
the run directory holds ``summary.json`` and ``status.json`` with state ``complete``) or
returns 2 with exactly one line on stderr, ``commgnn: error: ...``, and leaves neither the
``--out`` directory nor a hidden staging sibling behind. No traceback, no exception out
of ``main``, no hang (per-test time-out).

Runs are in-process (``--parts 1``) on graphs of at most 40 nodes with a one-layer model
of width 4, so an example takes well under a second. The ``ci`` profile (derandomized,
so CI is reproducible) runs a few dozen examples per property; ``test_fuzz_long``
(marked ``slow``: ``pytest -m slow tests/test_fuzz.py``) runs the same properties with
the ``long`` profile (500 examples each, a fresh random seed every time). A failure
prints the falsifying case and a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st


from fuzz_configs import (ConfigCase, PartitionFixture, TopoCase, config_cases, corrupt,  # noqa: F401
                          corruptions, partition_fixture, prop_config, prop_partition_dir, prop_topology,
                          topo_cases)
from fuzz_graphs import (I64, MASKS, GraphCase, GraphSpec, LabelCase, build_graph, graph_cases,  # noqa: F401
                         label_cases, prop_graph_file, prop_masks_labels)
from fuzz_harness import CI, LONG, Harness  # noqa: F401

@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths in fuzzed configs resolve inside tmp_path; no torchrun or data-root
    variables from the caller's shell leak into the runs."""
    monkeypatch.chdir(tmp_path)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RESTART_COUNT", "COMMGNN_DATA_ROOT"):
        monkeypatch.delenv(var, raising=False)


# --------------------------------------------------------------------------- tests

@pytest.fixture
def harness(capfd: pytest.CaptureFixture, tmp_path: Path) -> Harness:
    return Harness(capfd, tmp_path)


@pytest.fixture(scope="module")
def tiny_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("graph") / "g.pt"
    torch.save(build_graph(GraphSpec(n=24, f=3, c=3, e=60, seed=7)), path)
    return path


PROPERTIES: dict[str, tuple[st.SearchStrategy, Callable[[Harness, Path, PartitionFixture, Any], None]]] = {
    "graph_file": (graph_cases(), lambda h, g, fx, c: prop_graph_file(h, c)),
    "masks_labels": (label_cases(), lambda h, g, fx, c: prop_masks_labels(h, c)),
    "config": (config_cases(), lambda h, g, fx, c: prop_config(h, g, c)),
    "partition_dir": (st.lists(corruptions(), min_size=1, max_size=3),
                      lambda h, g, fx, c: prop_partition_dir(h, fx, c)),
    "topology": (topo_cases(), lambda h, g, fx, c: prop_topology(h, g, c)),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(PROPERTIES))
@CI
@given(data=st.data())
def test_fuzz(name: str, data: st.DataObject, harness: Harness, tiny_graph: Path,
              partition_fixture: PartitionFixture) -> None:
    strategy, body = PROPERTIES[name]
    body(harness, tiny_graph, partition_fixture, data.draw(strategy, label=name))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", sorted(PROPERTIES))
@LONG
@given(data=st.data())
def test_fuzz_long(name: str, data: st.DataObject, harness: Harness, tiny_graph: Path,
                   partition_fixture: PartitionFixture) -> None:
    """The same properties with the ``long`` profile (pytest -m slow tests/test_fuzz.py)."""
    strategy, body = PROPERTIES[name]
    body(harness, tiny_graph, partition_fixture, data.draw(strategy, label=name))


# Explicit examples: the bugs fuzzing found (kept as regressions, each a traceback or a
# wrong outcome before its fix) and the few cases that need two ranks.

def _spec(n: int = 6, **kw: Any) -> GraphSpec:
    return GraphSpec(n=n, f=2, c=2, e=8, seed=0, **kw)


REGRESSIONS: list[tuple[str, Any]] = [
    # A non-UTF-8 config, arrays nested 5000 deep, a 5000-digit integer: tomllib raised
    # UnicodeDecodeError / RecursionError / ValueError, not TOMLDecodeError.
    ("config", ConfigCase(tree={}, unknown=(), edit=("bom", 0, ""))),
    ("config", ConfigCase(tree={}, unknown=(), edit=("deep", 4800, ""))),
    ("config", ConfigCase(tree={}, unknown=(), edit=("replace", 0, "a = " + "9" * 5000))),
    # NaN passed positive() (nan < 0 is False) and reached torch's optimiser; inf and 1e300
    # overflowed float32 inside the rank (run directory left behind).
    ("config", ConfigCase(tree={"train": {"lr": math.nan}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"train": {"weight_decay": math.nan}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"train": {"lr": math.inf}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"train": {"lr": 1e300}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"runtime": {"timeout_s": math.inf}}, unknown=(), edit=None)),
    # Integers beyond 64 bits: float() overflow, torch.manual_seed overflow, int64 compares.
    ("config", ConfigCase(tree={"train": {"lr": 10**400}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"train": {"seed": 10**30}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"train": {"seed": I64[1]}, "comm": {"halo": {"bits": 8}}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"data": {"max_classes": 10**30}}, unknown=(), edit=None)),
    ("config", ConfigCase(tree={"partition": {"seed": 2**64}}, unknown=(), edit=None)),
    # An absurd label in a graph without masks: the split's bincount asked for terabytes.
    ("masks_labels", LabelCase(spec=_spec(), y_edits=((1, 2**40),), mask_edits=(), mask_forms=(), lengths=(),
                               dropped=MASKS, num_classes=None, max_classes=None, allow_overlap=None, ratios=None)),
    # A sparse x with an index outside its size: to_dense() wrote out of bounds (a later
    # segfault); now torch.load checks sparse invariants.
    ("graph_file", GraphCase(spec=_spec(27), mutations=(("dtype", ("x", "bfloat16")),
                                                        ("int_value", ("edge_index", 72, "big")), ("sparse_x", ())),
                             raw="flipped", raw_arg=[13044, 5911])),
    # A corrupt zip whose error (UnicodeDecodeError) cannot be rebuilt from a message string.
    ("graph_file", GraphCase(spec=_spec(18), mutations=(("drop", ("edge_index",)),), raw="flipped", raw_arg=[7371])),
    # meta.json with invalid UTF-8; a report whose per-rank lists are not lists of ints.
    ("partition_dir", [("flip", "meta.json", [5, 6, 7])]),
    ("partition_dir", [("edit_report", "nodes", None)]),
    ("partition_dir", [("edit_report", "halo_in", "ab")]),
    # Part files re-saved with a matching sha256 but bad contents reached the trainer.
    ("partition_dir", [("forge_part", "y", "float")]),
    ("partition_dir", [("forge_part", "y", "negative")]),
    ("partition_dir", [("forge_part", "x", "nan")]),
    # GML node ids of mixed types: sorted() raised TypeError.
    ("topology", TopoCase(suffix=".gml", nodes=(0, "a"), edges=(), junk=None, method=None)),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, case", REGRESSIONS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(REGRESSIONS)])
def test_fuzz_regressions(name: str, case: Any, harness: Harness, tiny_graph: Path,
                          partition_fixture: PartitionFixture) -> None:
    PROPERTIES[name][1](harness, tiny_graph, partition_fixture, case)


@pytest.mark.timeout(120)
def test_corrupt_two_part_dir_is_refused_before_ranks_start(harness: Harness,
                                                           partition_fixture: PartitionFixture) -> None:
    """Every rank's file is checked by the launcher: a corrupt part_1.pt or meta.json of a
    2-part directory is one line, before any rank is spawned (so this is quick)."""
    for c in [("flip", "part_1.pt", [100]), ("truncate", "meta.json", [10]),
              ("edit_report", "halo_in", "x"), ("forge_part", "x", "nan")]:
        with harness.workspace() as ws:
            pdir = ws / "in" / "parts"
            shutil.copytree(partition_fixture.two, pdir)
            corrupt(pdir, c)
            rc, _ = harness.train(ws, "--dataset", str(partition_fixture.graph), "--parts", "2",
                                  "--partition-dir", str(pdir))
            assert rc == 2, c


@pytest.mark.timeout(120)
def test_gossip_files_with_two_ranks(harness: Harness, tiny_graph: Path) -> None:
    """A valid two-rank topology file trains; a disconnected one, only read inside the
    ranks, is still one line with exit 2 and no run directory (two spawns, ~10 s)."""
    with harness.workspace() as ws:
        (ws / "in" / "ok.txt").write_text("0 1\n")
        rc, _ = harness.train(ws, "--dataset", str(tiny_graph), "--parts", "2", "--gossip", str(ws / "in" / "ok.txt"))
        assert rc == 0
    with harness.workspace() as ws:
        (ws / "in" / "split.gml").write_text("graph [\n node [ id 0 ]\n node [ id 1 ]\n]\n")
        rc, err = harness.train(ws, "--dataset", str(tiny_graph), "--parts", "2",
                                "--gossip", str(ws / "in" / "split.gml"))
        assert rc == 2 and "not connected" in err
