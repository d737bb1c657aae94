"""Node reordering for locality (``[partition] reorder``, :mod:`commgnn.partition.reorder`).

1. The orders are permutations, and ``degree`` / ``rcm`` do what they promise (descending
   in-degree; a narrow band on a banded graph whose ids were shuffled).
2. ``reorder_partition`` keeps the graph: the same global edges, features, labels, masks
   and degrees by global id, edges sorted by (target, source), and the owners' send blocks
   still aligned row for row with the peers' halo blocks.
3. Training is unchanged: 2 gloo ranks give the same logits, gradients and weights by
   global id with and without a reorder (float64), and ``commgnn.train`` gives the same
   losses, accuracies and predictions with ``reorder="rcm"`` as with ``"none"``.
4. Configuration: the flag, the TOML key, validation, and mini-batch mode refusing it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from commgnn.comm.config import CommConfig
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import Hooks
from commgnn.errors import ConfigError, PartitionError
from commgnn.models import ModelConfig
from commgnn.partition import LocalPartition, PartitionConfig, assign_parts, build_local_partitions
from commgnn.partition.reorder import (REORDER_METHODS, locality_order, partition_order, reorder_for_locality,
                                       reorder_partition)
from commgnn.trainers import FullGraphTrainer, TrainConfig
from helpers import run_on_ranks, small_graph

METHODS = ("degree", "rcm", "metis")


def banded_graph(n: int = 600, band: int = 3, f: int = 5, c: int = 3, seed: int = 0) -> Data:
    """An undirected band graph (i ~ j for 0 < |i - j| <= band) with its ids shuffled, so
    that the original order is far from local and a good reorder can find the band again."""
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(n).repeat_interleave(band)
    j = i + torch.arange(1, band + 1).repeat(n)
    keep = j < n
    i, j = i[keep], j[keep]
    perm = torch.randperm(n, generator=g)
    ei = perm[torch.stack([torch.cat([i, j]), torch.cat([j, i])])]
    split = torch.randint(0, 4, (n,), generator=g)  # disjoint masks: half train, a quarter each val / test
    masks = torch.stack([split <= 1, split == 2, split == 3])
    data = Data(x=torch.randn(n, f, generator=g), edge_index=ei, y=torch.randint(0, c, (n,), generator=g),
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    data.num_classes_total = c
    return data


def bandwidth(edge_index: torch.Tensor) -> int:
    """``max |src - dst|`` over the edges."""
    return int((edge_index[0] - edge_index[1]).abs().max())


def global_edges(part: LocalPartition) -> set[tuple[int, int]]:
    """The partition's edges as (global source, global target) pairs."""
    ids = torch.cat([part.global_ids, part.halo_global_ids])
    src, dst = ids[part.edge_index[0]], part.global_ids[part.edge_index[1]]
    return set(zip(src.tolist(), dst.tolist()))


def by_global_id(part: LocalPartition) -> dict[str, torch.Tensor]:
    """Owned-node tensors indexed by global id (rows the rank does not own stay zero)."""
    n, idx = part.num_nodes_global, part.global_ids
    out = {}
    for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
        t = getattr(part, name)
        full = torch.zeros((n, *t.shape[1:]), dtype=t.dtype)
        full[idx] = t
        out[name] = full
    deg = torch.full((n,), -1, dtype=torch.int64)
    deg[torch.cat([part.global_ids, part.halo_global_ids])] = part.in_degree
    out["in_degree"] = deg
    return out


# 1. the orders

@pytest.mark.parametrize("method", REORDER_METHODS)
def test_locality_order_is_a_permutation(method):
    data = banded_graph(n=9000, band=2)  # > 2 METIS blocks of 4096
    order = locality_order(data.edge_index, 9000, method)
    assert order.dtype == torch.int64 and order.shape == (9000,)
    assert torch.equal(torch.sort(order).values, torch.arange(9000))
    if method != "none":
        assert not torch.equal(order, torch.arange(9000))


def test_degree_order_is_descending_in_degree_and_stable():
    ei = torch.tensor([[1, 2, 3, 0, 2, 3, 0], [0, 0, 0, 2, 1, 1, 3]])  # in-degrees 3, 2, 1, 1
    order = locality_order(ei, 5, "degree")
    assert order.tolist() == [0, 1, 2, 3, 4]  # ties (2, 3) keep their order; node 4 has none
    ei = torch.tensor([[0, 0, 1, 1, 2], [4, 3, 4, 3, 4]])
    assert locality_order(ei, 5, "degree").tolist() == [4, 3, 0, 1, 2]


def test_rcm_restores_the_band_of_a_shuffled_banded_graph():
    n, band = 2000, 4
    data = banded_graph(n=n, band=band)
    assert bandwidth(data.edge_index) > n // 2  # shuffled: far from local
    order = locality_order(data.edge_index, n, "rcm")
    inv = torch.empty_like(order)
    inv[order] = torch.arange(n)
    assert bandwidth(inv[data.edge_index]) <= 2 * band
    # The same inside one rank's partition (owned rows only; P = 1: all of them).
    part = build_local_partitions(data, torch.zeros(n, dtype=torch.int64), 1)[0]
    assert bandwidth(part.edge_index) > n // 2
    assert bandwidth(reorder_for_locality(part, "rcm").edge_index) <= 2 * band


def test_bad_orders_and_methods_are_refused():
    part = build_local_partitions(small_graph(), torch.zeros(60, dtype=torch.int64), 1)[0]
    with pytest.raises(PartitionError, match="not a permutation"):
        reorder_partition(part, torch.zeros(60, dtype=torch.int64))
    with pytest.raises(PartitionError, match=r"shape \[60\]"):
        reorder_partition(part, torch.arange(59))
    with pytest.raises(PartitionError, match="unknown reorder method 'bfs'"):
        locality_order(part.edge_index, 60, "bfs")
    assert reorder_for_locality(part, "none") is part


# 2. reorder_partition keeps the graph

@pytest.mark.parametrize("method", METHODS)
def test_reorder_partition_keeps_the_graph_and_the_halo_alignment(method):
    data = banded_graph(n=600, band=3)
    P = 3
    parts = assign_parts(data.edge_index, 600, P, PartitionConfig(method="random", seed=2))
    plain = build_local_partitions(data, parts, P)
    if method == "metis":  # ~150 owned rows per rank: small blocks so that METIS has work to do
        from commgnn.partition.reorder import metis_order

        done = []
        for p in plain:
            own = p.edge_index[:, p.edge_index[0] < p.num_owned]
            done.append(reorder_partition(p, metis_order(own, p.num_owned, block=32)))
    else:
        done = [reorder_for_locality(p, method) for p in plain]
    moved = 0
    for a, b in zip(plain, done):
        assert torch.equal(torch.sort(b.global_ids).values, a.global_ids)
        moved += int((b.global_ids != a.global_ids).sum())
        assert global_edges(b) == global_edges(a)
        assert b.edge_index.shape == a.edge_index.shape
        ga, gb = by_global_id(a), by_global_id(b)
        for name in ga:
            assert torch.equal(ga[name], gb[name]), name
        # sorted by target, then source
        key = b.edge_index[1] * (b.num_owned + b.num_halo) + b.edge_index[0]
        assert bool((key[1:] > key[:-1]).all())
        assert torch.equal(b.halo_global_ids, a.halo_global_ids)
        assert (b.send_counts, b.recv_counts) == (a.send_counts, a.recv_counts)
        # the owned-to-owned subgraph of the reordered rows is what partition_order saw
        if method == "rcm":
            own_a = a.edge_index[:, a.edge_index[0] < a.num_owned]
            own_b = b.edge_index[:, b.edge_index[0] < b.num_owned]
            assert bandwidth(own_b) < bandwidth(own_a)
    assert moved > 0  # not vacuous: rows did move
    # Owner r's send block for peer q holds, row for row, q's halo block owned by r.
    for r, owner in enumerate(done):
        starts = torch.cumsum(torch.tensor([0, *owner.send_counts]), 0)
        for q, peer in enumerate(done):
            if q == r:
                continue
            sent = owner.global_ids[owner.send_index[starts[q]:starts[q + 1]]]
            hstart = sum(peer.recv_counts[:r])
            assert torch.equal(sent, peer.halo_global_ids[hstart:hstart + peer.recv_counts[r]]), (r, q)


def test_partition_order_uses_only_owned_to_owned_edges():
    data = small_graph(n=80, m=300, seed=3)
    parts = assign_parts(data.edge_index, 80, 2, PartitionConfig(method="random", seed=0))
    p = build_local_partitions(data, parts, 2)[0]
    own = p.edge_index[:, p.edge_index[0] < p.num_owned]
    assert own.size(1) < p.edge_index.size(1)  # there are halo edges to leave out
    assert torch.equal(partition_order(p, "degree"), locality_order(own, p.num_owned, "degree"))


# 3. training is unchanged

MODELS = ("gcn", "sage", "gat")
STEPS = 3


def reorder_parity_rank(ctx: DistContext, data, parts) -> dict:
    """Per (model, reorder): this rank's first-step logits and loss, synced gradients and
    the weights after STEPS Adam steps, with the global ids of the logits' rows."""
    out = {}
    for name in MODELS:
        for method in ("none", "rcm", "degree"):
            part = build_local_partitions(data, parts, ctx.world_size)[ctx.rank]
            part = reorder_for_locality(part, method)
            trainer = FullGraphTrainer(ctx, part, ModelConfig(name=name, layers=2, hidden=8, heads=2, dropout=0.0),
                                       TrainConfig(dtype="float64", lr=0.01, epochs=STEPS), Hooks(),
                                       comm_cfg=CommConfig())
            loss, logits = trainer.compute_gradients()
            grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
            total = float(ctx.all_reduce(loss.clone().reshape(1)))
            trainer.optimizer.step()
            for _ in range(STEPS - 1):
                trainer.train_step()
            out[name, method] = {"ids": part.global_ids.clone(), "logits": logits, "loss": total,
                                 "grads": grads, "final": trainer.model.state_dict(),
                                 "acc": trainer.evaluate()}
    return out


@pytest.mark.timeout(180)
def test_two_rank_training_is_the_same_with_a_reorder(tmp_path):
    data = banded_graph(n=300, band=3, f=6)
    parts = assign_parts(data.edge_index, 300, 2, PartitionConfig(method="random", seed=1))
    per_rank = run_on_ranks(reorder_parity_rank, 2, tmp_path, data, parts)
    for name in MODELS:
        ref_logits = torch.zeros(300, 3, dtype=torch.float64)
        for res in per_rank:
            ref_logits[res[name, "none"]["ids"]] = res[name, "none"]["logits"]
        for method in ("rcm", "degree"):
            assert any(not torch.equal(res[name, method]["ids"], res[name, "none"]["ids"]) for res in per_rank)
            logits = torch.zeros(300, 3, dtype=torch.float64)
            for res in per_rank:
                logits[res[name, method]["ids"]] = res[name, method]["logits"]
            torch.testing.assert_close(logits, ref_logits, atol=1e-10, rtol=0, msg=f"{name} {method}")
            for res in per_rank:
                ref, got = res[name, "none"], res[name, method]
                assert got["loss"] == pytest.approx(ref["loss"], abs=1e-10)
                assert torch.equal(got["acc"], ref["acc"])
                for n, g in ref["grads"].items():
                    torch.testing.assert_close(got["grads"][n], g, atol=1e-10, rtol=0, msg=f"{name} {method} {n}")
                for n, w in ref["final"].items():
                    torch.testing.assert_close(got["final"][n], w, atol=1e-10, rtol=0, msg=f"{name} {method} {n}")


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(240)
def test_commgnn_train_with_rcm_matches_the_plain_run(tmp_path):
    import commgnn

    data = banded_graph(n=400, band=4, f=6)
    data = Data(x=data.x, edge_index=data.edge_index, y=data.y, train_mask=data.train_mask,
                val_mask=data.val_mask, test_mask=data.test_mask)
    runs = {}
    for method in ("none", "rcm"):
        runs[method] = commgnn.train(data, model="gcn", parts=2, epochs=5, hidden=8, dropout=0.0, quiet=True,
                                     partitioner="random", reorder=method, out=tmp_path / method)
    plain, rcm = _metrics(runs["none"].run_dir), _metrics(runs["rcm"].run_dir)
    assert len(plain) == len(rcm) == 5
    for a, b in zip(plain, rcm):
        for key in ("loss", "train_acc", "val_acc", "test_acc"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), (a["epoch"], key)
        assert b["halo_bytes"] == a["halo_bytes"]  # same rows exchanged
    # predictions.pt is in the graph's own node order either way
    torch.testing.assert_close(runs["rcm"].predictions, runs["none"].predictions, atol=1e-5, rtol=0)
    manifest = json.loads((runs["rcm"].run_dir / "manifest.json").read_text())
    assert manifest["partition"]["reorder"] == "rcm"
    assert 'reorder = "rcm"' in (runs["rcm"].run_dir / "config.toml").read_text()


# 4. configuration

def test_config_flag_and_toml_key(tmp_path):
    from commgnn.runner.config import RunConfig, resolve_config
    from commgnn.cli.main import build_parser
    from commgnn.trainers.config import TrainConfig as TC

    assert PartitionConfig().reorder == "none"
    with pytest.raises(ConfigError, match="reorder: 'bfs' is not one of 'none', 'degree', 'rcm', 'metis'"):
        PartitionConfig(reorder="bfs")
    ns = build_parser().parse_args(["train", "--reorder", "rcm"])
    assert resolve_config(None, {"reorder": ns.reorder}, {}).partition.reorder == "rcm"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--reorder", "bfs"])
    toml = tmp_path / "c.toml"
    toml.write_text('[partition]\nreorder = "degree"\n')
    assert resolve_config(str(toml), {}, {}).partition.reorder == "degree"
    toml.write_text('[partition]\nreorder = "bfs"\n')
    with pytest.raises(ConfigError, match="partition.reorder"):
        resolve_config(str(toml), {}, {})
    mb = dict(train=TC(mode="minibatch"), model=ModelConfig(name="sage"))
    RunConfig(**mb)  # fine without a reorder
    with pytest.raises(ConfigError, match="partition.reorder = 'rcm' .*mini-batch"):
        RunConfig(partition=PartitionConfig(reorder="rcm"), **mb)


@pytest.mark.timeout(120)
def test_train_reorders_the_ranks_partition_once(tmp_path, monkeypatch):
    """One local rank runs in this process, so the hook in ``run_rank`` can be watched:
    it reorders the loaded partition, and predictions.pt is still in global node order."""
    import commgnn
    import commgnn.runner.rank as rank_mod

    calls = []

    def spy(part, method):
        out = reorder_for_locality(part, method)
        calls.append((method, out.global_ids.clone()))
        return out

    monkeypatch.setattr(rank_mod, "reorder_for_locality", spy)
    data = banded_graph(n=200, band=3, f=4)
    data = Data(x=data.x, edge_index=data.edge_index, y=data.y, train_mask=data.train_mask,
                val_mask=data.val_mask, test_mask=data.test_mask)
    res = {m: commgnn.train(data, model="sage", parts=1, epochs=2, hidden=8, dropout=0.0, quiet=True,
                            reorder=m, out=tmp_path / m) for m in ("none", "degree")}
    assert [m for m, _ in calls] == ["none", "degree"]
    assert torch.equal(calls[0][1], torch.arange(200))
    assert not torch.equal(calls[1][1], torch.arange(200))  # the trainer got renumbered rows
    torch.testing.assert_close(res["degree"].predictions, res["none"].predictions, atol=1e-5, rtol=0)
