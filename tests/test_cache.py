"""Remote-row caches against naive references: static serving, LRU decisions and rows,
the static rankings, and the offline optima (static best set, Belady's MIN)."""

from __future__ import annotations

import io
import itertools
from collections import Counter, OrderedDict

import pytest
import torch

from commgnn.fetch import (LRUCache, RowCache, StaticCache, belady_hit_rate, capacity_rows, degree_ranking,
                           hotness_ranking, optimal_static_hit_rate)


def random_trace(seed: int, num_nodes: int, steps: int, max_per_step: int, skew: float = 1.0) -> list[torch.Tensor]:
    """Steps of unique ids in random order, Zipf-like popularity so that rows get reused."""
    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, num_nodes + 1, dtype=torch.float64) ** skew
    weights = weights[torch.randperm(num_nodes, generator=g)]
    out = []
    for _ in range(steps):
        k = int(torch.randint(0, max_per_step + 1, (1,), generator=g))
        out.append(torch.multinomial(weights, k, replacement=False, generator=g) if k else
                   torch.zeros(0, dtype=torch.long))
    return out


class RefLRU:
    """OrderedDict LRU at step granularity: front = least recent. At the start of each step
    the previous step's touched ids move to the end in ascending id order (ties by lower id);
    ids touched in the current step are never evicted, and offered ids that do not fit are
    dropped, keeping the first ones offered."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.od, self.touched = capacity, OrderedDict(), set()

    def lookup(self, ids: list[int]) -> list[bool]:
        for v in sorted(self.touched):
            if v in self.od:
                self.od.move_to_end(v)
        hits = [v in self.od for v in ids]
        self.touched = {v for v, h in zip(ids, hits) if h}
        return hits

    def admit(self, ids: list[int]) -> None:
        self.touched |= {v for v in ids if v in self.od}
        new = [v for v in ids if v not in self.od]
        free = self.capacity - len(self.od)
        evictable = [v for v in self.od if v not in self.touched]
        new = new[:min(len(new), free + len(evictable))]
        for v in evictable[:max(0, len(new) - free)]:
            del self.od[v]
        for v in new:
            self.od[v] = True
        self.touched |= set(new)


def run_lru(cache: LRUCache, trace: list[torch.Tensor], X: torch.Tensor) -> list[torch.Tensor]:
    hits = []
    for ids in trace:
        hit, rows = cache.lookup(ids)
        assert torch.equal(rows, X[ids[hit]])
        miss = ids[~hit]
        cache.admit(miss, X[miss])
        hits.append(hit)
    return hits


# ---------------------------------------------------------------- static


def test_static_cache_serves_filled_rows_and_counts() -> None:
    g = torch.Generator().manual_seed(0)
    N, F = 60, 5
    X = torch.randn(N, F, generator=g)
    cached = torch.randperm(N, generator=g)[:17]
    cache = StaticCache(N, cached, F, torch.float32)
    assert isinstance(cache, RowCache) and cache.capacity == 17 and cache.nbytes == 17 * F * 4
    # Before fill() nothing is served (no zero rows passed off as features).
    hit, rows = cache.lookup(torch.arange(N))
    assert not hit.any() and rows.shape == (0, F)
    cache.reset_stats()
    cache.fill(X[cached])
    requests = hits = 0
    for ids in random_trace(1, N, 20, 25):
        hit, rows = cache.lookup(ids)
        assert torch.equal(hit, torch.isin(ids, cached))
        assert torch.equal(rows, X[ids[hit]])
        cache.admit(ids[~hit], torch.randn(int((~hit).sum()), F, generator=g))  # ignored
        requests, hits = requests + ids.numel(), hits + sum(int(v) in set(cached.tolist()) for v in ids)
    assert cache.reset_stats() == {"requests": requests, "hits": hits} and hits > 0
    assert cache.reset_stats() == {"requests": 0, "hits": 0}
    other = StaticCache(N, cached, F, torch.float32)
    other.load_state_dict(cache.state_dict())
    ids = torch.arange(N)
    assert all(torch.equal(a, b) for a, b in zip(other.lookup(ids), cache.lookup(ids)))
    with pytest.raises(ValueError):
        StaticCache(N, torch.tensor([1, 1]), F, torch.float32)
    with pytest.raises(ValueError):
        StaticCache(N, torch.tensor([N]), F, torch.float32)


# ---------------------------------------------------------------- LRU


@pytest.mark.parametrize("capacity", [0, 1, 4, 9, 20])
def test_lru_matches_reference(capacity: int) -> None:
    N, F = 40, 3
    X = torch.randn(N, F, dtype=torch.float64)
    for seed in range(4):
        trace = random_trace(seed, N, 80, 14)
        cache, ref = LRUCache(N, capacity, F, torch.float64), RefLRU(capacity)
        for step, ids in enumerate(trace):
            hit = run_lru(cache, [ids], X)[0]
            assert hit.tolist() == ref.lookup(ids.tolist()), (seed, step)
            ref.admit([v for v, h in zip(ids.tolist(), hit.tolist()) if not h])
            held = cache.id_of_slot[cache.id_of_slot >= 0]
            assert sorted(held.tolist()) == sorted(ref.od), (seed, step)
        stats = cache.reset_stats()
        assert stats["requests"] == sum(t.numel() for t in trace)
        if capacity == 0:
            assert stats["hits"] == 0 and cache.nbytes == 0
        elif capacity >= 9:
            assert stats["hits"] > 0  # the reference agrees, and the test is not vacuous


def test_lru_never_serves_a_wrong_or_stale_row() -> None:
    """Every admission carries a fresh version in column 0; a hit must return the row of the
    id's latest admission, exactly."""
    N, F, capacity = 300, 4, 37
    X = torch.randn(N, F, dtype=torch.float64)
    cache = LRUCache(N, capacity, F, torch.float64)
    latest: dict[int, torch.Tensor] = {}
    version, hits = 0, 0
    for ids in random_trace(7, N, 600, 60, skew=0.8):
        hit, rows = cache.lookup(ids)
        for v, row in zip(ids[hit].tolist(), rows):
            assert torch.equal(row, latest[v])
        hits += int(hit.sum())
        miss = ids[~hit]
        fresh = X[miss].clone()
        fresh[:, 0] = torch.arange(version, version + miss.numel(), dtype=torch.float64)
        version += miss.numel()
        cache.admit(miss, fresh)
        latest.update(zip(miss.tolist(), fresh))
        assert int((cache.id_of_slot >= 0).sum()) <= capacity
        # slot table and slot ids agree both ways
        held = (cache.slot_of >= 0).nonzero().view(-1)
        assert torch.equal(cache.id_of_slot[cache.slot_of[held].long()], held)
        assert held.numel() == int((cache.id_of_slot >= 0).sum())
    assert hits > 0


def test_lru_capacity_zero_and_oversized_admit() -> None:
    N, F = 10, 2
    X = torch.randn(N, F)
    zero = LRUCache(N, 0, F, torch.float32)
    ids = torch.tensor([3, 1, 4])
    for _ in range(3):
        hit, rows = zero.lookup(ids)
        assert not hit.any() and rows.shape == (0, F)
        zero.admit(ids, X[ids])
    assert zero.reset_stats() == {"requests": 9, "hits": 0}
    small = LRUCache(N, 2, F, torch.float32)
    small.lookup(ids)
    small.admit(ids, X[ids])  # 3 rows offered, 2 slots: the first two offered are kept
    hit, rows = small.lookup(ids)
    assert hit.tolist() == [True, True, False] and torch.equal(rows, X[ids[:2]])


def test_lru_readmitted_id_is_refreshed_in_place() -> None:
    cache = LRUCache(10, 3, 2, torch.float32)
    ids = torch.tensor([5, 2])
    cache.lookup(ids)
    cache.admit(ids, torch.ones(2, 2))
    cache.admit(torch.tensor([2]), torch.full((1, 2), 7.0))  # same id again: one slot, new row
    assert int((cache.id_of_slot == 2).sum()) == 1
    hit, rows = cache.lookup(torch.tensor([2, 5]))
    assert hit.all() and torch.equal(rows, torch.tensor([[7.0, 7.0], [1.0, 1.0]]))


def test_lru_state_dict_round_trip() -> None:
    N, F, capacity = 50, 3, 8
    X = torch.randn(N, F)
    trace = random_trace(3, N, 60, 10)
    cache = LRUCache(N, capacity, F, torch.float32)
    run_lru(cache, trace[:30], X)
    buf = io.BytesIO()
    torch.save(cache.state_dict(), buf)
    buf.seek(0)
    resumed = LRUCache(N, capacity, F, torch.float32)
    resumed.load_state_dict(torch.load(buf))
    assert resumed.step == cache.step
    assert [h.tolist() for h in run_lru(resumed, trace[30:], X)] == [h.tolist() for h in run_lru(cache, trace[30:], X)]
    assert resumed.reset_stats() == cache.reset_stats()
    assert torch.equal(resumed.slot_of, cache.slot_of) and torch.equal(resumed.last_used, cache.last_used)
    with pytest.raises(ValueError):
        LRUCache(N, capacity + 1, F, torch.float32).load_state_dict(cache.state_dict())


# ---------------------------------------------------------------- rankings


def test_degree_and_hotness_rankings() -> None:
    g = torch.Generator().manual_seed(5)
    N = 200
    degree = torch.randint(0, 6, (N,), generator=g)  # many ties
    candidates = torch.randint(0, N, (90,), generator=g)  # duplicates, unsorted
    for cap in (0, 1, 10, 40, 1000):
        want = sorted(set(candidates.tolist()), key=lambda v: (-int(degree[v]), v))[:cap]
        assert degree_ranking(candidates, degree, cap).tolist() == want
    counts = torch.randint(0, 4, (N,), generator=g) * (torch.rand(N, generator=g) < 0.5)
    for cap in (0, 3, 25, 1000):
        want = sorted((v for v in range(N) if counts[v] > 0), key=lambda v: (-int(counts[v]), v))[:cap]
        assert hotness_ranking(counts, cap).tolist() == want


def test_capacity_rows() -> None:
    assert capacity_rows(1.0, 100, 4) == 2500
    assert capacity_rows(0.000012, 3, 4) == 1  # 12 bytes, one 12-byte row exactly
    assert capacity_rows(0.0000119, 3, 4) == 0
    assert capacity_rows(2.5, 128, 2) == 2_500_000 // 256
    assert capacity_rows(0, 8, 4) == 0
    with pytest.raises(ValueError):
        capacity_rows(-1.0, 8, 4)


# ---------------------------------------------------------------- offline optima


def naive_min_hits(trace: list[list[int]], capacity: int) -> int:
    """Belady's MIN by scanning, a step at a time: count the step's hits against the held
    rows, then keep, of the held and the requested ids, the `capacity` whose next requesting
    step is soonest (ids never requested again are dropped)."""
    cache: set[int] = set()
    hits = 0
    for t, step in enumerate(trace):
        hits += len(cache & set(step))

        def next_step(u: int) -> int:
            return next((j for j in range(t + 1, len(trace)) if u in trace[j]), len(trace))
        pool = [u for u in cache | set(step) if next_step(u) < len(trace)]
        cache = set(sorted(pool, key=next_step)[:capacity])
    return hits


def exhaustive_optimum(trace: list[list[int]], capacity: int) -> int:
    """Max hits over every cache evolution: a step's hits are |S ∩ step|, then any subset of
    S ∪ step of size <= capacity may be kept."""
    best = {frozenset(): 0}
    for step in trace:
        nxt: dict[frozenset, int] = {}
        for s, h in best.items():
            h += len(s & set(step))
            pool = sorted(s | set(step))
            for k in range(min(capacity, len(pool)) + 1):
                for keep in itertools.combinations(pool, k):
                    key = frozenset(keep)
                    nxt[key] = max(nxt.get(key, -1), h)
        best = nxt
    return max(best.values())


def test_optimal_static_hit_rate_brute_force() -> None:
    assert optimal_static_hit_rate([], 5) == 0.0
    for seed in range(5):
        trace = random_trace(seed, 30, 25, 8)
        total = sum(t.numel() for t in trace)
        counts = Counter(v for t in trace for v in t.tolist())
        for cap in (0, 1, 5, 12, 100):
            want = sum(c for _, c in counts.most_common(cap)) / total
            assert optimal_static_hit_rate(trace, cap) == pytest.approx(want, abs=1e-12)


def test_belady_brute_force_and_bounds() -> None:
    assert belady_hit_rate([], 3) == 0.0
    # One slot holding a, then [b, a], then [b]: a step-level cache hits a and keeps b.
    ab = [torch.tensor([0]), torch.tensor([1, 0]), torch.tensor([1])]
    assert belady_hit_rate(ab, 1) == pytest.approx(2 / 4)
    N, F = 25, 2
    X = torch.randn(N, F)
    for seed in range(6):
        trace = random_trace(seed, N, 40, 9)
        steps = [t.tolist() for t in trace]
        total = sum(map(len, steps))
        for cap in (0, 1, 3, 7, 30):
            got = belady_hit_rate(trace, cap)
            assert got == pytest.approx(naive_min_hits(steps, cap) / total, abs=1e-12)
            cache = LRUCache(N, cap, F, torch.float32)
            run_lru(cache, trace, X)
            lru = cache.reset_stats()
            assert lru["hits"] / lru["requests"] <= got + 1e-12 <= 1.0 + 1e-12
    # MIN is the optimum: equal to an exhaustive search over cache contents on tiny traces
    # (this is what a request-by-request MIN on the flattened trace would fail).
    for seed in range(10):
        trace = random_trace(100 + seed, 6, 7, 4)
        flat = [v for t in trace for v in t.tolist()]
        if not flat:
            continue
        for cap in (1, 2, 3):
            want = exhaustive_optimum([t.tolist() for t in trace], cap) / len(flat)
            assert belady_hit_rate(trace, cap) == pytest.approx(want, abs=1e-12)
