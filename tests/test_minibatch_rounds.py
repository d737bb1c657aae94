"""Mini-batch ranks in lock-step: the one-round feature fetch (the owners' rows, exactly or
within a quantisation step; a rank with nothing to ask still serving; the cache's rows),
one request-reply round and one gradient all-reduce a step whatever the batch, prefetch on
a background communicator, and the gradient and gossip strategies once a step."""

from __future__ import annotations

import pytest
import torch

from commgnn.comm import quant
from commgnn.fetch.config import FetchConfig
from commgnn.sampling.config import SaintConfig, SamplerConfig
from commgnn.trainers import TrainConfig
from helpers import run_on_ranks, small_graph
import mb_ranks
from mb_ranks import mkdir as _mk, random_parts as _parts, small_cfgs as _cfgs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bits", [32, 4])
def test_fetched_rows_equal_the_owners_rows(tmp_path, bits):
    data = small_graph(n=80, f=12)
    res = run_on_ranks(mb_ranks.fetch_rows, 3, tmp_path, data, _parts(80, 3), bits, None, 6)
    for r in res:
        for ids, rows in zip(r["asked"], r["served"]):
            truth = data.x[ids]
            if bits == 32:
                assert torch.equal(rows, truth)
            else:
                step = (truth.max(1).values - truth.min(1).values) / (2 ** bits - 1)
                assert ((rows - truth).abs() <= step[:, None] * (1 + 1e-5) + 1e-6).all()
        # every remote row asked for travelled once, at its codec's size
        assert r["fetched"] == r["n_remote"] == r["requested"]
        per_row = 12 * 4 if bits == 32 else quant.bytes_per_row(12, bits)
    total_rows_bytes = sum(r["rows_bytes"] for r in res)
    assert total_rows_bytes == sum(r["fetched"] for r in res) * per_row


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sparse", [False, True])
def test_a_rank_with_an_all_local_or_empty_batch_still_serves_the_others(tmp_path, sparse):
    # Rank 0 needs nothing remote, twice (5 own rows, then none), while rank 1 asks rank 0
    # for rows: rank 0 must still enter the round, or rank 1 waits for it until the time-out.
    data = small_graph(n=40, f=5)
    res = run_on_ranks(mb_ranks.fetch_one_sided, 2, tmp_path, data, _parts(40, 2), sparse, timeout_s=20.0)
    of_rank0 = (_parts(40, 2) == 0).nonzero().flatten()
    assert torch.equal(res[0][0], data.x[of_rank0[:5]]) and res[0][1].shape == (0, 5)
    for rows in res[1]:
        assert torch.equal(rows, data.x[of_rank0[-5:]])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["lru", "static"])
def test_the_cache_never_serves_a_wrong_row(tmp_path, policy):
    data = small_graph(n=80, f=6)
    res = run_on_ranks(mb_ranks.fetch_rows, 2, tmp_path, data, _parts(80, 2, 1), 32, policy, 12)
    for r in res:
        for ids, rows in zip(r["asked"], r["served"]):
            assert torch.equal(rows, data.x[ids])
        assert r["hits"] > 0  # the cache was used, so the check above covered served hits
        assert r["fetched"] + r["hits"] == r["requested"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sampler, topology", [("neighbor", "replicated"), ("neighbor", "partitioned"),
                                               ("saint-rw", "partitioned")])
def test_prefetch_over_many_steps_trains_exactly_as_without(tmp_path, sampler, topology):
    """With ``fetch.prefetch`` the next step's sampling and fetch run on a background thread
    (its own communicator) while this step computes: over several steps an epoch, with an
    LRU cache in the way and, partitioned, the owners sampling (and GraphSAINT's walks
    stepping) for their peers on that thread too, two ranks train bit for bit as without
    prefetch, with the same cache hits,
    and every step's sample and fetch ran off the training thread."""
    data = small_graph(n=120, m=500)
    parts = _parts(120, 2, 5)
    model, train = _cfgs()
    sampler = SamplerConfig(sampler=sampler, fanout=(3, 3), batch_size=8, topology=topology,
                            saint=SaintConfig(budget=6, steps=4, presample=5))
    runs = {pre: run_on_ranks(mb_ranks.train_minibatch, 2, _mk(tmp_path / str(pre)), data, parts, model, train,
                              sampler, FetchConfig(prefetch=pre, cache_ratio=0.3, cache_policy="lru"), 2)
            for pre in (False, True)}
    for plain, pre in zip(runs[False], runs[True]):
        assert plain["steps"] == pre["steps"] >= 4
        for k, v in plain["state"].items():
            assert torch.equal(pre["state"][k], v), k
        assert [r.val_acc for r in pre["results"]] == [r.val_acc for r in plain["results"]]
        assert [log["cache_hits"] for log in pre["logs"]] == [log["cache_hits"] for log in plain["logs"]]
        assert pre["sent"]["fetch_rows"] == plain["sent"]["fetch_rows"] > 0
        steps = pre["steps"] * 2
        assert pre["background"].get("sample") == pre["background"].get("fetch") == steps, pre["background"]
        assert not plain["background"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("bits", [32, 4])
def test_a_step_fetches_its_remote_rows_in_one_round_whatever_their_number(tmp_path, bits):
    """Per training step, whatever the batch and however many remote rows it needs: one
    request-reply round of three all-to-all exchanges (the P counts, the ids, the rows), one
    all-reduce of the gradient bucket, and no other collective, no per-node message."""
    data = small_graph(n=120, m=500)
    parts = _parts(120, 2, 5)
    model, train = _cfgs()
    remote = []
    for batch in (2, 64):
        sampler = SamplerConfig(sampler="neighbor", fanout=(3, 3), batch_size=batch)
        res = run_on_ranks(mb_ranks.count_collectives, 2, _mk(tmp_path / f"b{batch}"), data, parts, model, train,
                           sampler, FetchConfig(bits=bits))
        for r in res:
            # the rows are 8 features wide, under P2P_ROW_BYTES: one all_to_all_single each
            assert r["counts"] == {"all_to_all_single": 3 * r["steps"], "all_reduce": r["steps"]}, (batch, r)
        remote.append(res[0]["remote"] / res[0]["steps"])
    assert remote[1] > 2 * remote[0]  # the large batch needs many more remote rows a step


@pytest.mark.timeout(300)
def test_gradient_strategies_apply_once_a_step_in_minibatch_mode(tmp_path):
    """``comm.grad`` and ``comm.gossip`` strategies run unchanged in mini-batch mode, one
    synchronisation a step: the all-reduce sends exactly one fp32 gradient bucket a step,
    adapt-then-combine D-PSGD over the full topology (the local SGD step, then the exact
    average) trains as the all-reduce step for step and sends one fp32 model a step, top-k
    sends fewer bytes, and each strategy that keeps ranks in lock-step leaves them equal."""
    from commgnn.comm.config import CommConfig, GossipConfig, GradConfig

    data = small_graph(n=120, m=500)
    parts = _parts(120, 2, 5)
    model, _ = _cfgs()
    # SGD with momentum: the update is linear in the gradient, so averaging the two local
    # steps is the step along the summed gradient
    train = TrainConfig(epochs=3, lr=0.2, optimizer="sgd", momentum=0.9, weight_decay=0.0)
    sampler = SamplerConfig(sampler="neighbor", fanout=(3, 3), batch_size=16)
    comms = {"allreduce": CommConfig(), "topk": CommConfig(grad=GradConfig(strategy="topk", ratio=0.05)),
             "atc-full": CommConfig(gossip=GossipConfig(topology="full", method="dpsgd-atc"))}
    epochs = 2
    runs = {name: run_on_ranks(mb_ranks.train_minibatch, 2, _mk(tmp_path / name), data, parts, model, train,
                               sampler, FetchConfig(), epochs, comm)
            for name, comm in comms.items()}
    for r0, r1 in (runs["allreduce"], runs["topk"]):
        for k, v in r0["state"].items():
            assert torch.equal(v, r1["state"][k]), k
    ref = runs["allreduce"][0]
    for r in runs["atc-full"]:
        for k, v in ref["state"].items():
            torch.testing.assert_close(r["state"][k], v, rtol=1e-4, atol=1e-5)
    assert ref["steps"] >= 2  # several synchronisations an epoch
    steps = ref["steps"] * epochs
    n_params = sum(v.numel() for v in ref["state"].values())
    # two ranks: the ring all-reduce's 2 (P-1)/P n * 4 bytes and D-PSGD's model to one peer
    # are both n * 4 bytes a synchronisation
    for name in ("allreduce", "atc-full"):
        assert [r["sent"]["grad_sync"] for r in runs[name]] == [steps * n_params * 4] * 2, name
    assert runs["topk"][0]["sent"]["grad_sync"] < 0.5 * ref["sent"]["grad_sync"]


@pytest.mark.timeout(120)
def test_a_round_left_in_owner_order_answers_each_request(tmp_path):
    # request_reply_sorted leaves the answers in owner order (the fetcher scatters them into
    # its step buffer from there, saving a copy): back[i] must answer requests[order[i]],
    # the owners must be sorted, and request_reply must be that same round put back in order.
    res = run_on_ranks(mb_ranks.request_rounds, 3, tmp_path, 50)
    for r in res:
        owners, reqs, back, order = r["owners"], r["reqs"], r["back"], r["order"]
        assert torch.equal(torch.sort(order).values, torch.arange(50))
        assert bool((owners[order][1:] >= owners[order][:-1]).all())
        want = torch.stack([reqs, 10 * reqs + owners], dim=1)
        assert torch.equal(back, want[order])
        assert torch.equal(r["plain"], want)
        assert r["plain_bytes"] == r["sorted_bytes"] > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("width", [2, 256])
def test_the_exchange_delivers_every_pairs_rows_in_rank_order(tmp_path, width):
    """Narrow rows go in one ``all_to_all_single``, wide ones point to point (gloo): either
    way rank q receives, in rank order, the ``in_counts[p]`` rows rank p addressed to it."""
    res = run_on_ranks(mb_ranks.exchange, 3, _mk(tmp_path / "x"), width)
    for q, r in enumerate(res):
        expected = torch.cat([torch.full((n, width), float(100 * p + q)) for p, n in enumerate(r["in_counts"])])
        assert torch.equal(r["got"], expected)
