"""The streaming LDG partitioner and the partitioning memory cap."""

from __future__ import annotations

import math

import pytest
import torch

from commgnn.cli.main import main
from commgnn.errors import ConfigError, PartitionError
from commgnn.partition import PartitionConfig, assign_parts
from commgnn.partition.api import partition_memory_gb
from commgnn.partition.ldg import SLACK, _fit, lean_adjacency


def community_graph(n: int = 4000, size: int = 50, deg: int = 10, seed: int = 0) -> torch.Tensor:
    """90% of edges inside blocks of ``size`` nodes, then the ids shuffled."""
    g = torch.Generator().manual_seed(seed)
    e = n * deg
    dst = torch.randint(0, n, (e,), generator=g)
    src = torch.randint(0, n, (e,), generator=g)
    local = torch.rand(e, generator=g) < 0.9
    src[local] = ((dst // size) * size + torch.randint(0, size, (e,), generator=g))[local].clamp(max=n - 1)
    perm = torch.randperm(n, generator=g)
    return perm[torch.stack([src, dst])]


def cut(edge_index: torch.Tensor, parts: torch.Tensor) -> int:
    return int((parts[edge_index[0]] != parts[edge_index[1]]).sum())


def test_ldg_balanced_deterministic_and_better_than_random() -> None:
    ei, n, P = community_graph(), 4000, 4
    parts = assign_parts(ei, n, P, PartitionConfig(method="ldg"))
    again = assign_parts(ei, n, P, PartitionConfig(method="ldg"))
    assert torch.equal(parts, again)
    sizes = torch.bincount(parts, minlength=P)
    assert int(sizes.max()) <= math.ceil(n / P * (1 + SLACK)) and int(sizes.min()) > 0
    rand = assign_parts(ei, n, P, PartitionConfig(method="random"))
    # Random cuts ~75% of edges here; the greedy stream must find the blocks.
    assert cut(ei, parts) < 0.5 * cut(ei, rand), (cut(ei, parts), cut(ei, rand))


def test_fit_keeps_every_part_within_capacity() -> None:
    sizes = torch.tensor([8, 0, 5])
    choice = torch.zeros(10, dtype=torch.int64)       # everyone wants part 0, which has 2 slots left
    best = torch.arange(10, dtype=torch.float64)
    out = _fit(choice, best, sizes, cap=10)
    assert torch.equal(sizes, torch.tensor([10, 8, 5]))  # the overflow went to the emptiest part
    assert set(out[[8, 9]].tolist()) == {0}           # the two best scores keep their choice
    assert int((out == 0).sum()) == 2


def test_lean_adjacency_lists_both_directions() -> None:
    ei = torch.tensor([[0, 2, 2], [1, 1, 0]])
    xadj, adj = lean_adjacency(ei, 3)
    assert adj.dtype == torch.int32
    nbrs = [sorted(adj[xadj[v]:xadj[v + 1]].tolist()) for v in range(3)]
    assert nbrs == [[1, 2], [0, 2], [0, 1]]


def test_memory_cap_refuses_with_a_leaner_strategy() -> None:
    ei, n = community_graph(), 4000
    need = partition_memory_gb("metis", n, ei.shape[1])
    assert partition_memory_gb("ldg", n, ei.shape[1]) < need
    with pytest.raises(PartitionError, match="--partitioner ldg"):
        assign_parts(ei, n, 4, PartitionConfig(memory_limit_gb=need * 0.9))
    with pytest.raises(PartitionError, match="--partitioner random"):
        assign_parts(ei, n, 4, PartitionConfig(memory_limit_gb=need * 0.1))
    # Under the cap it runs.
    assert assign_parts(ei, n, 4, PartitionConfig(memory_limit_gb=need * 1.1)).numel() == n
    with pytest.raises(ConfigError, match="memory_limit_gb"):
        PartitionConfig(memory_limit_gb=-1)


def test_cli_partition_over_the_cap_is_one_line_and_writes_nothing(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "parts"
    rc = main(["partition", "--dataset", "synthetic", "--parts", "2", "--partition-memory-gb", "0.0001",
               "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "memory_limit_gb" in err
    assert not out.exists()
