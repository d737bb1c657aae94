"""Tests of commgnn.data: configs, CSBM, splits, validation and fingerprints.

Loading real and user graphs is tested in ``test_data_loading.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch_geometric.data import Data

from commgnn.config import from_dict, to_dict
from commgnn.data import (DataConfig, SyntheticConfig, fingerprint, load_dataset, make_csbm,
                          stratified_split, validate_graph)
from commgnn.errors import ConfigError, DataError

SMALL = SyntheticConfig(num_nodes=3000, num_classes=5, avg_degree=12.0, feature_dim=16)


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_nodes=0), "data.synthetic.num_nodes must be > 0, got 0"),
    (dict(num_nodes=-5), "data.synthetic.num_nodes must be > 0, got -5"),
    (dict(num_classes=0), "data.synthetic.num_classes must be > 0, got 0"),
    (dict(num_classes=1), "data.synthetic.num_classes must be >= 2, got 1"),
    (dict(num_nodes=4, num_classes=8, avg_degree=0.1),
     "data.synthetic.num_classes (8) must not exceed data.synthetic.num_nodes (4)"),
    (dict(avg_degree=0.0), "data.synthetic.avg_degree must be > 0, got 0.0"),
    (dict(num_nodes=100, num_classes=5, avg_degree=11.0),
     "data.synthetic.avg_degree must be <= num_nodes / (2 * num_classes) = 10 for this graph, "
     "got 11"),
    (dict(homophily=1.5), "data.synthetic.homophily must lie in [0, 1], got 1.5"),
    (dict(homophily=-0.1), "data.synthetic.homophily must lie in [0, 1], got -0.1"),
    (dict(feature_dim=0), "data.synthetic.feature_dim must be > 0, got 0"),
    (dict(feature_noise=-1.0), "data.synthetic.feature_noise must be >= 0, got -1.0"),
    (dict(seed=-1), "data.synthetic.seed must be >= 0, got -1"),
])
def test_synthetic_config_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        SyntheticConfig(**kwargs)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("kwargs, message", [
    (dict(train_ratio=0.0), "data.train_ratio must lie in (0, 1), got 0.0"),
    (dict(train_ratio=1.0), "data.train_ratio must lie in (0, 1), got 1.0"),
    (dict(val_ratio=0.0), "data.val_ratio must lie in (0, 1), got 0.0"),
    (dict(train_ratio=0.7, val_ratio=0.3),
     "data.train_ratio + data.val_ratio must be < 1 to leave test nodes, got 0.7 + 0.3"),
    (dict(dataset=" "), "data.dataset must not be empty"),
    (dict(root=""), "data.root must be a non-empty path or left out"),
    (dict(cache_dir=""), "data.cache_dir must be a non-empty path or left out"),
    (dict(split_seed=-3), "data.split_seed must be >= 0, got -3"),
    (dict(max_classes=0), "data.max_classes must be > 0, got 0"),
    (dict(max_classes=4), "data.synthetic.num_classes (8) must not exceed data.max_classes (4)"),
])
def test_data_config_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        DataConfig(**kwargs)
    assert str(info.value).startswith(message)


def test_config_from_dict_round_trip_and_nested_errors() -> None:
    raw = {"dataset": "cora", "root": "/data", "train_ratio": 0.5,
           "synthetic": {"num_nodes": 500, "homophily": 0.3}}
    cfg = from_dict(DataConfig, raw, path="data")
    assert cfg.synthetic == SyntheticConfig(num_nodes=500, homophily=0.3)
    assert cfg.cache_dir is None and cfg.val_ratio == 0.2
    assert from_dict(DataConfig, to_dict(cfg), path="data") == cfg
    with pytest.raises(ConfigError, match=r"^data\.synthetic\.num_nodes must be > 0, got 0$"):
        from_dict(DataConfig, {"synthetic": {"num_nodes": 0}}, path="data")
    with pytest.raises(ConfigError, match=r"unknown config key 'data\.synthetic\.nodes'"):
        from_dict(DataConfig, {"synthetic": {"nodes": 5}}, path="data")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.root = "/elsewhere"  # type: ignore[misc]


# ---------------------------------------------------------------- CSBM


def _edge_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.t().tolist()))


def test_csbm_is_deterministic_by_seed() -> None:
    a, b = make_csbm(SMALL), make_csbm(SMALL)
    for key in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(a[key], b[key]), key
    c = make_csbm(dataclasses.replace(SMALL, seed=1))
    assert not torch.equal(a.y, c.y)
    assert _edge_set(a.edge_index) != _edge_set(c.edge_index)
    assert not torch.equal(a.x, c.x)


def test_csbm_edges_are_symmetric_coalesced_and_simple() -> None:
    data = make_csbm(SMALL)
    ei = data.edge_index
    assert ei.dtype == torch.int64 and ei.shape[0] == 2
    assert int(ei.min()) >= 0 and int(ei.max()) < SMALL.num_nodes
    assert not (ei[0] == ei[1]).any(), "self loop"
    keys = ei[0] * SMALL.num_nodes + ei[1]
    assert torch.equal(keys, torch.sort(keys).values), "not coalesced (sorted)"
    assert torch.unique(keys).numel() == keys.numel(), "duplicate edge"
    assert _edge_set(ei) == _edge_set(ei.flip(0)), "not symmetric"


@pytest.mark.parametrize("homophily", [0.0, 0.3, 0.8, 1.0])
def test_csbm_homophily_degree_and_balance(homophily: float) -> None:
    cfg = dataclasses.replace(SMALL, homophily=homophily)
    data = make_csbm(cfg)
    ei, y = data.edge_index, data.y
    measured = (y[ei[0]] == y[ei[1]]).float().mean().item()
    assert abs(measured - homophily) <= 0.03
    assert abs(ei.size(1) / cfg.num_nodes - cfg.avg_degree) <= 0.1 * cfg.avg_degree
    counts = torch.bincount(y, minlength=cfg.num_classes)
    assert counts.numel() == cfg.num_classes
    assert int(counts.max() - counts.min()) <= 1


def test_csbm_features_and_masks() -> None:
    data = make_csbm(dataclasses.replace(SMALL, feature_noise=0.0))
    assert data.x.dtype == torch.float32 and data.x.shape == (SMALL.num_nodes, SMALL.feature_dim)
    # Without noise every node sits on its class centroid: one distinct row per class.
    rows = torch.unique(data.x, dim=0)
    assert rows.size(0) == SMALL.num_classes
    for cls in range(SMALL.num_classes):
        members = data.x[data.y == cls]
        assert torch.equal(members, members[:1].expand_as(members))
    noisy = make_csbm(SMALL)
    std = (noisy.x - data.x).std().item()
    assert abs(std - SMALL.feature_noise) < 0.05
    n = SMALL.num_nodes
    assert int(noisy.train_mask.sum()) == pytest.approx(0.6 * n, abs=SMALL.num_classes)
    assert int(noisy.val_mask.sum()) == pytest.approx(0.2 * n, abs=SMALL.num_classes)
    assert not (noisy.train_mask & noisy.val_mask).any()
    validate_graph(noisy)


def test_load_dataset_synthetic_uses_config_split(cache_dir) -> None:
    cfg = DataConfig(synthetic=SMALL, train_ratio=0.3, val_ratio=0.3, split_seed=7,
                     cache_dir=str(cache_dir))
    data = load_dataset(cfg)
    assert data.name == "synthetic" and data.num_classes_total == SMALL.num_classes
    n = SMALL.num_nodes
    assert int(data.train_mask.sum()) == pytest.approx(0.3 * n, abs=SMALL.num_classes)
    assert int(data.test_mask.sum()) == pytest.approx(0.4 * n, abs=SMALL.num_classes)
    expected = stratified_split(data.y, 0.3, 0.3, seed=7)
    assert torch.equal(data.train_mask, expected[0])
    assert list(cache_dir.iterdir()) == []  # nothing to cache for a synthetic graph


# ---------------------------------------------------------------- splits


def test_stratified_split_proportions_and_disjointness() -> None:
    y = torch.cat([torch.full((100,), 0), torch.full((50,), 1), torch.full((10,), 2),
                   torch.full((7,), -1)])
    y = y[torch.randperm(y.numel(), generator=torch.Generator().manual_seed(3))]
    train, val, test = stratified_split(y, 0.6, 0.2, seed=0)
    for cls, (n_tr, n_va, n_te) in {0: (60, 20, 20), 1: (30, 10, 10), 2: (6, 2, 2)}.items():
        in_cls = y == cls
        assert (int((train & in_cls).sum()), int((val & in_cls).sum()),
                int((test & in_cls).sum())) == (n_tr, n_va, n_te)
    assert not (train & val).any() and not (train & test).any() and not (val & test).any()
    assert torch.equal(train | val | test, y >= 0), "labelled nodes must be covered exactly"
    assert train.dtype == torch.bool and train.shape == y.shape


def test_stratified_split_determinism_and_seed() -> None:
    y = torch.arange(600) % 4
    a = stratified_split(y, 0.5, 0.25, seed=11)
    b = stratified_split(y, 0.5, 0.25, seed=11)
    c = stratified_split(y, 0.5, 0.25, seed=12)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_stratified_split_excludes_unlabelled_and_masked() -> None:
    y = torch.tensor([0, 1, -1, 0, 1, -1, 0, 1, 0, 1])
    keep = torch.ones(10, dtype=torch.bool)
    keep[0] = False
    train, val, test = stratified_split(y, 0.6, 0.2, seed=0, labelled_mask=keep)
    covered = train | val | test
    assert not covered[[0, 2, 5]].any()
    assert covered.sum() == 7
    with pytest.raises(DataError, match="labels must be a 1-D integer tensor"):
        stratified_split(torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(DataError, match="split ratios"):
        stratified_split(y, 0.8, 0.4)


# ---------------------------------------------------------------- validate_graph


def _graph(n: int = 10) -> Data:
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 2
    train, val, test = stratified_split(y, 0.6, 0.2)
    return Data(x=torch.randn(n, 3, generator=gen), edge_index=torch.tensor([[0, 1], [1, 2]]),
                y=y, train_mask=train, val_mask=val, test_mask=test)


def _nan_graph() -> Data:
    data = _graph()
    data.x[7, 0] = float("nan")
    data.x[7, 2] = float("inf")
    data.x[9, 1] = float("-inf")
    return data


def _set(**changes: object) -> Data:
    data = _graph()
    for key, value in changes.items():
        data[key] = value
    return data


@pytest.mark.parametrize("data, message", [
    (_set(edge_index=torch.tensor([[0, 1, 2]])),
     "edge_index must be a [2, E] integer tensor, got shape [1, 3]"),
    (_set(edge_index=torch.tensor([[0.0], [1.0]])),
     "edge_index must be a [2, E] integer tensor, got shape [2, 1] and dtype torch.float32"),
    (_set(edge_index=torch.tensor([[0, -1], [1, 2]])), "edge_index has negative node id -1"),
    (_set(edge_index=torch.tensor([[0, 12], [1, 2]])),
     "edge_index has node id 12 but the graph has 10 nodes"),
    (_nan_graph(), "x has 3 NaN/inf values, first at node 7"),
    (_set(x=torch.zeros(10, 3, dtype=torch.long)), "x must be floating point"),
    (_set(y=torch.zeros(9, dtype=torch.long)), "y must have one label per node (10)"),
    (_set(val_mask=torch.zeros(9, dtype=torch.bool)),
     "val_mask must be a 1-D bool tensor of length 10, got shape [9]"),
    (_set(test_mask=torch.zeros(10, 2, dtype=torch.bool)),
     "test_mask must be a 1-D bool tensor of length 10, got shape [10, 2]"),
    (_set(train_mask=torch.zeros(10, dtype=torch.bool)), "graph has no training nodes"),
    (_set(y=torch.full((10,), -1)), "train_mask contains"),
    (_set(val_mask=torch.zeros(10, dtype=torch.bool)), "graph has no validation nodes"),
    (_set(test_mask=torch.ones(10, dtype=torch.bool)), "train_mask and test_mask share 6 nodes, "
                                                       "first at node"),
    (_set(y=torch.tensor([0, 1, 0, 1, 0, 5000, 0, 1, 0, 1])),
     "y has label 5000 at node 5 (max label 5000), so the graph would have 5001 classes"),
    (Data(x=torch.zeros(0, 3), edge_index=torch.zeros(2, 0, dtype=torch.long),
          y=torch.zeros(0, dtype=torch.long)), "graph has zero nodes"),
    (Data(x=torch.zeros(4, 3), y=torch.zeros(4, dtype=torch.long)),
     "graph has no tensor 'edge_index'"),
])
def test_validate_graph_errors(data: Data, message: str) -> None:
    with pytest.raises(DataError) as info:
        validate_graph(data)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_validate_graph_accepts_and_missing_mask() -> None:
    validate_graph(_graph())  # a good graph passes
    data = _graph()
    del data.test_mask
    with pytest.raises(DataError, match="graph has no tensor 'test_mask'"):
        validate_graph(data)


# ---------------------------------------------------------------- fingerprint


def test_fingerprint_tracks_content() -> None:
    base = _graph()
    fp = fingerprint(base)
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert fingerprint(base.clone()) == fp
    changed = []
    for key in ("edge_index", "x", "y", "train_mask", "val_mask", "test_mask"):
        data = base.clone()
        t = data[key]
        if t.dtype == torch.bool:
            t[0] = ~t[0]
        elif key == "edge_index":
            t[1, 1] = 3
        else:
            t[0] = t[0] + 1
        changed.append(fingerprint(data))
    assert fp not in changed and len(set(changed)) == len(changed)
    assert fingerprint(_graph(11)) != fp
    assert fingerprint(make_csbm(SMALL)) == fingerprint(make_csbm(SMALL))


def test_normalize_features_makes_rows_sum_to_one_and_changes_the_fingerprint() -> None:
    small = SyntheticConfig(num_nodes=200, num_classes=2, avg_degree=4)
    raw = load_dataset(DataConfig(synthetic=small))
    norm = load_dataset(DataConfig(synthetic=small, normalize_features=True))
    assert (norm.x >= 0).all()
    torch.testing.assert_close(norm.x.sum(dim=1), torch.ones(200))
    assert not torch.allclose(raw.x.sum(dim=1), torch.ones(200))
    assert torch.equal(raw.edge_index, norm.edge_index) and torch.equal(raw.y, norm.y)
    # partitions store features, so a saved partition of the raw graph must not be reused
    assert fingerprint(raw) != fingerprint(norm)
