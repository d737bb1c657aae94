"""Tests of graph validation: every field checked against the whole graph.

Each rule of :func:`commgnn.data.validate_graph` is tested directly (message fragment and
the index it names), through ``load_dataset`` on a user ``.pt`` file, and the main ones
through the CLI in-process (one ``commgnn: error:`` line, exit code 2, nothing written).
"""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch_geometric.data import Data

import conftest
from commgnn.cli.main import main
from commgnn.data import (DataConfig, SyntheticConfig, graph_notes, load_dataset, make_csbm,
                          validate_graph)
from commgnn.data.validate import DEFAULT_MAX_CLASSES, mask_as_bool
from commgnn.errors import ConfigError, DataError
from helpers import small_graph

N = 20


def _masks(n: int = N) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Disjoint masks: nodes 0..9 train, 10..14 val, 15..19 test (for n = 20)."""
    idx = torch.arange(n)
    return idx < n // 2, (idx >= n // 2) & (idx < 3 * n // 4), idx >= 3 * n // 4


def _graph(**changes: Any) -> Data:
    """A valid 20-node ring with 3 classes and disjoint masks; ``changes`` overwrite fields."""
    src = torch.arange(N)
    train, val, test = _masks()
    data = Data(x=torch.randn(N, 4, generator=torch.Generator().manual_seed(0)),
                edge_index=torch.stack([src, (src + 1) % N]), y=src % 3,
                train_mask=train, val_mask=val, test_mask=test)
    for key, value in changes.items():
        data[key] = value
    return data


def _user_file(path: Path, **changes: Any) -> Path:
    """A user graph dict (the fields of :func:`_graph`) saved with torch.save."""
    g = {k: _graph()[k] for k in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")}
    for key, value in changes.items():
        if value is None:
            g.pop(key, None)
        else:
            g[key] = value
    torch.save(g, path)
    return path


def _rejects(data: Data, fragment: str, **kwargs: Any) -> str:
    with pytest.raises(DataError) as info:
        validate_graph(data, **kwargs)
    msg = str(info.value)
    assert fragment in msg, msg
    assert "\n" not in msg
    return msg


def _labels(**at: int) -> torch.Tensor:
    """The ring's labels with ``node<i>=value`` overrides."""
    y = torch.arange(N) % 3
    for key, value in at.items():
        y[int(key.removeprefix("node"))] = value
    return y


# ---------------------------------------------------------------- good graphs pass


def test_valid_graphs_pass_and_return_notes() -> None:
    assert validate_graph(_graph()) == {"isolated_nodes": 0, "self_loops": 0}
    for seed in range(3):
        notes = validate_graph(small_graph(seed=seed))
        assert set(notes) == {"isolated_nodes", "self_loops"} and notes["self_loops"] == 0
    validate_graph(small_graph(n=200, m=800, c=5))
    validate_graph(make_csbm(SyntheticConfig()))  # masks of the CSBM itself
    data = load_dataset(DataConfig())  # the default run's graph
    assert set(data.graph_notes) == {"isolated_nodes", "self_loops"}
    assert data.graph_notes["self_loops"] == 0 and data.graph_notes["isolated_nodes"] < 10


# ---------------------------------------------------------------- 1. masks: length, dtype


@pytest.mark.parametrize("name", ["train_mask", "val_mask", "test_mask"])
def test_wrong_length_mask(name: str, tmp_path: Path) -> None:
    long = torch.zeros(N + 3, dtype=torch.bool)
    long[0] = True
    _rejects(_graph(**{name: long}),
             f"{name} must be a 1-D bool tensor of length {N}, got shape [{N + 3}]")
    path = _user_file(tmp_path / "g.pt", **{name: long})
    with pytest.raises(DataError, match=rf"^{name} must be a 1-D bool tensor of length {N}, "
                                        rf"got shape \[{N + 3}\]"):
        load_dataset(DataConfig(dataset=str(path)))
    short = _user_file(tmp_path / "s.pt", **{name: torch.ones(N - 1, dtype=torch.bool)})
    with pytest.raises(DataError, match=rf"^{name} must be a 1-D bool tensor of length {N}, "
                                        rf"got shape \[{N - 1}\]"):
        load_dataset(DataConfig(dataset=str(short)))


def test_integer_01_masks_are_converted_others_rejected(tmp_path: Path) -> None:
    train, val, test = _masks()
    path = _user_file(tmp_path / "int.pt", train_mask=train.long(), val_mask=val.to(torch.uint8),
                      test_mask=test.int())
    data = load_dataset(DataConfig(dataset=str(path)))
    for key, mask in zip(("train_mask", "val_mask", "test_mask"), (train, val, test)):
        assert data[key].dtype == torch.bool and torch.equal(data[key], mask)

    bad = train.long()
    bad[7] = 2
    path = _user_file(tmp_path / "two.pt", train_mask=bad)
    with pytest.raises(DataError, match=r"^train_mask must hold only 0/1 \(or be bool\), "
                                        r"got value 2 at node 7$"):
        load_dataset(DataConfig(dataset=str(path)))
    path = _user_file(tmp_path / "float.pt", val_mask=val.float())
    with pytest.raises(DataError, match=r"^val_mask must be a bool tensor \(or integers 0/1\), "
                                        r"got dtype torch.float32$"):
        load_dataset(DataConfig(dataset=str(path)))
    path = _user_file(tmp_path / "list.pt", test_mask=test.tolist())
    with pytest.raises(DataError, match=r"test_mask must be a tensor, got list$"):
        load_dataset(DataConfig(dataset=str(path)))
    # validate_graph itself never converts: it wants bool
    _rejects(_graph(train_mask=train.long()), "train_mask must be a 1-D bool tensor of length "
                                              "20, got shape [20] and dtype torch.int64")
    assert mask_as_bool("m", torch.tensor([0, 1, 1]), 3).tolist() == [False, True, True]
    with pytest.raises(DataError, match=r"^m must hold only 0/1 \(or be bool\), got value -1 "
                                        r"at node 1$"):
        mask_as_bool("m", torch.tensor([0, -1, 1]), 3)


# ---------------------------------------------------------------- 2. labels and classes


def test_absurd_label_exceeds_max_classes(tmp_path: Path) -> None:
    y = _labels(node13=10**6)
    msg = _rejects(_graph(y=y), "y has label 1000000 at node 13")
    assert "1000001 classes, more than data.max_classes = 1000" in msg
    # the first label at or over the cap is named, not the largest
    _rejects(_graph(y=_labels(node4=7, node9=50)), "y has label 7 at node 4 (max label 50)",
             max_classes=5)
    validate_graph(_graph(y=_labels(node4=4)), max_classes=5)  # 5 classes: at the cap
    assert validate_graph(_graph(y=y), max_classes=10**7)["self_loops"] == 0

    path = _user_file(tmp_path / "absurd.pt", y=y)
    with pytest.raises(DataError, match=r"^y has label 1000000 at node 13 .*data\.max_classes"):
        load_dataset(DataConfig(dataset=str(path)))
    assert load_dataset(DataConfig(dataset=str(path), max_classes=2_000_000)).num_classes_total \
        == 10**6 + 1


def test_explicit_class_count_bounds_labels(tmp_path: Path) -> None:
    _rejects(_graph(y=_labels(node6=4), num_classes_total=3),
             "y has label 4 at node 6 but num_classes_total = 3 (labels must lie in [0, 3)")
    _rejects(_graph(num_classes_total=5000),
             "num_classes_total = 5000 is more than data.max_classes = 1000")
    _rejects(_graph(num_classes_total="three"), "num_classes_total must be an integer")
    validate_graph(_graph(num_classes_total=7))  # more classes than labels used: fine
    path = _user_file(tmp_path / "nc.pt", num_classes=2000)
    with pytest.raises(DataError, match=r"^num_classes_total = 2000 is more than "
                                        r"data\.max_classes = 1000"):
        load_dataset(DataConfig(dataset=str(path)))
    path = _user_file(tmp_path / "ncbad.pt", num_classes=torch.tensor([3, 4]))
    with pytest.raises(DataError, match=r"num_classes must be an integer"):
        load_dataset(DataConfig(dataset=str(path)))


def test_max_classes_config() -> None:
    assert DataConfig().max_classes == DEFAULT_MAX_CLASSES == 1000
    for bad, message in ((0, "data.max_classes must be > 0, got 0"),
                         (-4, "data.max_classes must be > 0, got -4"),
                         ("many", "data.max_classes must be an integer, got 'many'"),
                         (True, "data.max_classes must be an integer, got True")):
        with pytest.raises(ConfigError) as info:
            DataConfig(max_classes=bad)  # type: ignore[arg-type]
        assert str(info.value).startswith(message)
    with pytest.raises(ConfigError, match=r"data\.synthetic\.num_classes \(8\) must not exceed "
                                          r"data\.max_classes \(5\)"):
        DataConfig(max_classes=5)
    DataConfig(dataset="g.pt", max_classes=5)  # the synthetic table is unused then
    with pytest.raises(ConfigError, match="data.allow_mask_overlap must be true or false"):
        DataConfig(allow_mask_overlap="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("name, first", [("train_mask", 2), ("val_mask", 11), ("test_mask", 16)])
def test_unlabelled_nodes_in_any_mask(name: str, first: int, tmp_path: Path) -> None:
    y = _labels(**{f"node{first}": -1, f"node{first + 2}": -5})
    _rejects(_graph(y=y), f"{name} contains 2 unlabelled nodes (label < 0), first at node {first}")
    # a user file's masks are used as given: an unlabelled node in one is an error too
    path = _user_file(tmp_path / "u.pt", y=y)
    with pytest.raises(DataError, match=rf"^{name} contains 2 unlabelled nodes \(label < 0\), "
                                        rf"first at node {first}$"):
        load_dataset(DataConfig(dataset=str(path)))
    # unlabelled nodes outside every mask are fine
    train, val, test = _masks()
    test = test.clone()
    test[first] = test[first + 2] = False
    for mask in (train, val):
        mask[first] = mask[first + 2] = False
    validate_graph(_graph(y=y, train_mask=train, val_mask=val, test_mask=test))


def test_labels_must_be_integers() -> None:
    _rejects(_graph(y=torch.zeros(N)), "y must hold integer class labels, got dtype torch.float32")


# ---------------------------------------------------------------- 3. empty evaluation sets


@pytest.mark.parametrize("name, what, fix", [
    ("val_mask", "validation", "raise data.val_ratio"),
    ("test_mask", "test", "lower data.train_ratio + data.val_ratio"),
])
def test_empty_evaluation_set(name: str, what: str, fix: str, tmp_path: Path) -> None:
    empty = torch.zeros(N, dtype=torch.bool)
    msg = _rejects(_graph(**{name: empty}), f"graph has no {what} nodes ({name} is all False)")
    assert fix in msg and f"put nodes in {name}" in msg
    path = _user_file(tmp_path / "e.pt", **{name: empty})
    with pytest.raises(DataError, match=rf"^graph has no {what} nodes \({name} is all False\)"):
        load_dataset(DataConfig(dataset=str(path)))


def test_generated_split_too_small_for_evaluation(tmp_path: Path) -> None:
    # two nodes per class: 60/20/20 rounds to 1/0/1 per class, 50/25/25 to 1/1/0
    path = _user_file(tmp_path / "tiny.pt", train_mask=None, val_mask=None, test_mask=None,
                      y=torch.arange(N) % 10)
    with pytest.raises(DataError, match=r"^graph has no validation nodes .*raise data\.val_ratio"):
        load_dataset(DataConfig(dataset=str(path)))
    with pytest.raises(DataError, match=r"^graph has no test nodes \(test_mask is all False\): "
                                        r"for a generated split lower data\.train_ratio"):
        load_dataset(DataConfig(dataset=str(path), train_ratio=0.5, val_ratio=0.25))


# ---------------------------------------------------------------- 4. overlapping masks


@pytest.mark.parametrize("a, b, shared, first", [
    ("train_mask", "val_mask", [12, 14], 12),
    ("train_mask", "test_mask", [19, 16, 17], 16),
    ("val_mask", "test_mask", [13, 11], 11),
])
def test_overlapping_masks(a: str, b: str, shared: list[int], first: int, tmp_path: Path) -> None:
    train, val, test = _masks()
    masks = {"train_mask": train, "val_mask": val, "test_mask": test}
    masks[a] = masks[a].clone()
    masks[b] = masks[b].clone()
    masks[a][shared] = True
    masks[b][shared] = True
    what = f"{a} and {b} share {len(shared)} nodes, first at node {first}"  # all >= 2
    msg = _rejects(_graph(**masks), what)
    assert "data.allow_mask_overlap = true" in msg
    with pytest.warns(UserWarning, match=f"^{what}; accepted because data.allow_mask_overlap"):
        assert validate_graph(_graph(**masks), allow_mask_overlap=True)["isolated_nodes"] == 0

    path = _user_file(tmp_path / "o.pt", **masks)
    with pytest.raises(DataError, match=f"^{what} "):
        load_dataset(DataConfig(dataset=str(path)))
    with pytest.warns(UserWarning, match=what):
        data = load_dataset(DataConfig(dataset=str(path), allow_mask_overlap=True))
    assert torch.equal(data[a] & data[b], (masks[a] & masks[b]))


# ---------------------------------------------------------------- 5. notes


def test_graph_notes_count_isolated_nodes_and_self_loops(tmp_path: Path) -> None:
    # edges 0-1, 1-2, loops at 2, 5 and 5 again, loop only at 7: isolated = all but 0, 1, 2
    ei = torch.tensor([[0, 1, 2, 5, 5, 7], [1, 2, 2, 5, 5, 7]])
    data = _graph(edge_index=ei)
    expected = {"isolated_nodes": N - 3, "self_loops": 4}
    assert graph_notes(data) == expected
    assert validate_graph(data) == expected
    assert graph_notes(_graph(edge_index=torch.zeros(2, 0, dtype=torch.long))) == \
        {"isolated_nodes": N, "self_loops": 0}
    loaded = load_dataset(DataConfig(dataset=str(_user_file(tmp_path / "n.pt", edge_index=ei))))
    assert loaded.graph_notes == expected  # counted as loaded, before the loops are dropped
    assert loaded.edge_index.tolist() == [[0, 1], [1, 2]]


# ---------------------------------------------------------------- 6. unreadable files


@pytest.mark.parametrize("content, message", [
    (b"hello, this is a text file\n",
     "not a torch file saved with torch.save: bad.pt (27 bytes, starting b'hello, t') is "
     "neither a zip archive nor a pickle"),
    (bytes(range(101, 201)), "not a torch file saved with torch.save: bad.pt (100 bytes"),
    (b"", "not a torch file saved with torch.save: bad.pt (0 bytes, starting b'')"),
    ("truncated", "(corrupt or truncated? save a dict of tensors with torch.save)"),
    ([1, 2, 3], "must hold a dict or a torch_geometric Data with x, edge_index and y; got list"),
    (torch.zeros(3), "must hold a dict or a torch_geometric Data with x, edge_index and y; "
                     "got Tensor"),
    (7, "must hold a dict or a torch_geometric Data with x, edge_index and y; got int"),
    ({"x": torch.zeros(2), "extra": Path("/")}, "it holds a pathlib.PosixPath object; only "
                                                "tensors, numbers, strings, lists, dicts"),
])
def test_unreadable_graph_file(content: object, message: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "truncated":
        _user_file(path)
        blob = path.read_bytes()
        path.write_bytes(blob[: len(blob) // 2])
    else:
        torch.save(content, path)
    with pytest.raises(DataError) as info:
        load_dataset(DataConfig(dataset=str(path)))
    msg = str(info.value)
    assert message in msg and str(path) in msg and "\n" not in msg, msg
    assert len(msg.replace(str(path), "")) < 300


# ---------------------------------------------------------------- the CLI


def _cli_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    train, val, test = _masks()
    long = torch.cat([train, torch.ones(3, dtype=torch.bool)])
    overlap = test.clone()
    overlap[12] = True
    text = tmp_path / "text.pt"
    text.write_text("not torch at all\n")
    return {
        "wrong-length mask": (_user_file(tmp_path / "long.pt", train_mask=long),
                              "train_mask must be a 1-D bool tensor of length 20, got shape [23]"),
        "absurd label": (_user_file(tmp_path / "absurd.pt", y=_labels(node13=10**6)),
                         "y has label 1000000 at node 13"),
        "empty val": (_user_file(tmp_path / "noval.pt", val_mask=torch.zeros(N, dtype=torch.bool)),
                      "graph has no validation nodes (val_mask is all False)"),
        "overlap": (_user_file(tmp_path / "overlap.pt", test_mask=overlap),
                    "val_mask and test_mask share 1 node, first at node 12"),
        "unlabelled val": (_user_file(tmp_path / "unl.pt", y=_labels(node11=-1)),
                           "val_mask contains 1 unlabelled node (label < 0), first at node 11"),
        "text file": (text, "not a torch file saved with torch.save: text.pt"),
    }


@pytest.mark.parametrize("case", ["wrong-length mask", "absurd label", "empty val", "overlap",
                                  "unlabelled val", "text file"])
def test_cli_bad_graph_is_one_line_exit_2(case: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path, fragment = _cli_cases(tmp_path)[case]
    out = tmp_path / "run"
    capsys.readouterr()
    rc = main(["train", "--dataset", str(path), "--parts", "1", "--epochs", "1", "--quiet",
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("commgnn: error: "), err
    assert fragment in err, err
    assert not out.exists()


def test_cli_allowed_overlap_warns_and_runs(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    train, val, test = _masks()
    test = test.clone()
    test[3] = True
    path = _user_file(tmp_path / "overlap.pt", test_mask=test)
    cfg = tmp_path / "run.toml"
    cfg.write_text("[data]\nallow_mask_overlap = true\n[model]\nhidden = 4\n")
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = main(["train", "--config", str(cfg), "--dataset", str(path), "--parts", "1",
                   "--epochs", "1", "--quiet", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert (out / "manifest.json").is_file()
    assert any("train_mask and test_mask share 1 node, first at node 3" in str(w.message)
               for w in caught)


# ---------------------------------------------------------------- 7. test set-up


def test_dataset_root_prefers_env_and_says_where_it_looked(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    env_root, sibling = tmp_path / "env_root", tmp_path / "sibling"
    env_root.mkdir()
    sibling.mkdir()
    monkeypatch.setattr(conftest, "SHARED_DATASETS", sibling)
    env = {"COMMGNN_DATA_ROOT": str(env_root)}
    root, reason = conftest.find_dataset_root(env)
    assert root is None
    assert reason.startswith(f"shared datasets not found: tried {env_root}, {sibling}; ")
    assert "Set COMMGNN_DATA_ROOT to" in reason
    _, reason = conftest.find_dataset_root({})
    assert f"tried {sibling};" in reason and "COMMGNN_DATA_ROOT (unset)" in reason
    (sibling / "README.md").write_text("x")
    assert conftest.find_dataset_root(env) == (sibling, "")
    (env_root / "README.md").write_text("x")
    assert conftest.find_dataset_root(env) == (env_root, "")  # the env var wins
    assert conftest.find_dataset_root({})[0] == sibling


def test_pytest_prints_skip_reasons() -> None:
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    addopts = tomllib.loads(pyproject.read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "-rs" in addopts.split() and "-m 'not slow'" in addopts
