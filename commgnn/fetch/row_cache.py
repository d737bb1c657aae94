"""Per-rank caches of remote feature rows: a static one (PaGraph, GNNLab) and an LRU one.

In mini-batch training a rank owns the feature rows of its own nodes; every step it needs
the rows of some other ranks' nodes (the *remote rows*), which a collective fetches. A
cache of remote rows on the rank turns some of those fetches into local reads. A step is::

    hit, rows_hit = cache.lookup(ids)          # ids: [n] unique remote ids of this step
    rows_miss = fetch(ids[~hit])               # the collective, outside this module
    cache.admit(ids[~hit], rows_miss)          # a dynamic cache may keep some of them

Two families of policy are implemented:

* :class:`StaticCache` -- contents chosen once before training and never changed. PaGraph
  (Lin et al., "PaGraph: Scaling GNN Training on Large Graphs via Computation-aware
  Caching", SoCC 2020) caches the highest-degree nodes; GNNLab (Yang et al., "GNNLab: A
  Factored System for Sample-based GNN Training over GPUs", EuroSys 2022) the nodes most
  often requested in a few pre-sampled epochs. Both rankings are in
  :mod:`commgnn.fetch.policies`; this class only serves the chosen rows.
* :class:`LRUCache` -- a dynamic cache that evicts the least recently used row, with
  recency counted in *steps* (one :meth:`~LRUCache.lookup` = one step): all rows touched in
  one step are equally recent, and ties are broken by the lower global id so that the
  policy is deterministic and can be checked against a reference implementation.

Both keep a direct-mapped slot table ``slot_of: [num_nodes] int32`` (global id -> row slot,
``-1`` = absent; 4 MB for a million nodes) next to the row storage ``rows: [capacity, F]``,
so a lookup is one gather and one index, never a Python loop. The invariant that makes a
served row always the right one: ``slot_of[v] = s >= 0`` only while slot ``s`` holds the row
last admitted (or filled) for ``v``; eviction clears ``slot_of`` before the slot is reused.

The offline optima these caches are measured against are in :mod:`commgnn.fetch.optimal`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

_INT64_MAX = torch.iinfo(torch.int64).max


@runtime_checkable
class RowCache(Protocol):
    """A per-rank cache of remote feature rows (see the module docstring for one step)."""

    capacity: int
    """Rows the cache can hold."""

    @property
    def nbytes(self) -> int:
        """Bytes of row storage (``capacity * F * element_size``)."""
        ...

    def lookup(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """``ids: [n]`` int64 unique global ids requested this step -> ``(hit [n] bool,
        rows [hit.sum(), F])``, the rows in the order of ``ids[hit]``. Counts requests and hits."""
        ...

    def admit(self, ids: Tensor, rows: Tensor) -> None:
        """Rows just fetched for missed ids (``ids: [m]``, ``rows: [m, F]``); a dynamic
        policy may insert them, a static one ignores them."""
        ...

    def reset_stats(self) -> dict[str, int]:
        """``{"requests": R, "hits": H}`` since the last reset; then zeroes both."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly (contents, recency, counters)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...


class _SlotCache:
    """What both caches share: the slot table, the row storage, lookup and the counters."""

    def __init__(self, num_nodes: int, capacity: int, num_features: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        if num_nodes < 0 or capacity < 0 or num_features < 0:
            raise ValueError(f"num_nodes, capacity and num_features must be >= 0, got "
                             f"{num_nodes}, {capacity}, {num_features}")
        if num_nodes >= 2**31:
            raise ValueError(f"num_nodes={num_nodes} does not fit the int32 slot table")
        self.num_nodes, self.capacity, self.num_features = num_nodes, capacity, num_features
        self.slot_of = torch.full((num_nodes,), -1, dtype=torch.int32, device=device)
        """``[num_nodes]`` int32: slot holding each global id's row, ``-1`` = not cached."""
        self.rows = torch.zeros((capacity, num_features), dtype=dtype, device=device)
        """``[capacity, F]``: the cached rows, one per slot."""
        self.requests = 0
        """Ids looked up since the last :meth:`reset_stats`."""
        self.hits = 0
        """Of those, ids served from the cache."""

    @property
    def nbytes(self) -> int:
        """Bytes of row storage (the slot table is bookkeeping and not counted)."""
        return self.rows.numel() * self.rows.element_size()

    def lookup(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """``ids: [n]`` -> ``(hit [n] bool, rows [hit.sum(), F])`` in the order of ``ids[hit]``."""
        ids = ids.to(self.slot_of.device, torch.long)
        self._begin_step()
        slot = self.slot_of[ids]
        hit = slot >= 0
        hit_slots = slot[hit].long()
        self._touch(hit_slots)
        self.requests += ids.numel()
        self.hits += hit_slots.numel()
        return hit, self.rows[hit_slots]

    def _begin_step(self) -> None:
        """Hook: called at the start of every lookup."""

    def _touch(self, slots: Tensor) -> None:
        """Hook: the slots just served."""

    def reset_stats(self) -> dict[str, int]:
        """``{"requests": R, "hits": H}`` since the last reset; then zeroes both."""
        out = {"requests": self.requests, "hits": self.hits}
        self.requests = self.hits = 0
        return out

    def _check_rows(self, ids: Tensor, rows: Tensor) -> None:
        if ids.dim() != 1 or rows.shape != (ids.numel(), self.num_features):
            raise ValueError(f"expected ids [m] and rows [m, {self.num_features}], got "
                             f"{tuple(ids.shape)} and {tuple(rows.shape)}")

    def _check_state(self, state: dict[str, Any], kind: str) -> None:
        got = (state.get("kind"), state.get("num_nodes"), state.get("capacity"), state.get("num_features"))
        want = (kind, self.num_nodes, self.capacity, self.num_features)
        if got != want:
            raise ValueError(f"cache state (kind, num_nodes, capacity, num_features) = {got} "
                             f"does not match this cache's {want}")


class StaticCache(_SlotCache):
    """Fixed contents (PaGraph's high-degree rows, GNNLab's pre-sampled hot rows).

    ``ids: [capacity]`` are the global ids to cache (unique, in ``[0, num_nodes)``), usually
    from :func:`~commgnn.fetch.policies.degree_ranking` or
    :func:`~commgnn.fetch.policies.hotness_ranking`. The caller fetches their rows once at
    set-up and hands them to :meth:`fill`; after that :meth:`admit` is a no-op.
    """

    def __init__(self, num_nodes: int, ids: Tensor, num_features: int, dtype: torch.dtype,
                 *, device: torch.device | str = "cpu") -> None:
        ids = ids.to(device, torch.long).reshape(-1)
        super().__init__(num_nodes, ids.numel(), num_features, dtype, device)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
            raise ValueError(f"cache ids must lie in [0, {num_nodes})")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("cache ids must be unique")
        self.ids = ids
        """``[capacity]`` int64: the cached global ids; slot ``s`` holds ``ids[s]``."""
        self.filled = False
        """Whether :meth:`fill` ran; until then the slot table stays empty (no zero rows served)."""

    def fill(self, rows: Tensor) -> None:
        """``rows: [capacity, F]``, the rows of :attr:`ids` in that order."""
        self._check_rows(self.ids, rows)
        self.rows.copy_(rows)
        # Mapped only now, so a lookup before fill() misses instead of serving zeros.
        self.slot_of[self.ids] = torch.arange(self.capacity, dtype=torch.int32, device=self.ids.device)
        self.filled = True

    def admit(self, ids: Tensor, rows: Tensor) -> None:
        """Static: the contents never change after :meth:`fill`."""

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "static", "num_nodes": self.num_nodes, "capacity": self.capacity,
                "num_features": self.num_features, "ids": self.ids.clone(), "rows": self.rows.clone(),
                "filled": self.filled, "requests": self.requests, "hits": self.hits}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_state(state, "static")
        if not torch.equal(state["ids"].to(self.ids.device), self.ids):
            raise ValueError("cache state holds other ids than this StaticCache")
        self.slot_of.fill_(-1)
        self.filled = False
        if state["filled"]:
            self.fill(state["rows"])
        self.requests, self.hits = int(state["requests"]), int(state["hits"])


class LRUCache(_SlotCache):
    """Dynamic cache: evicts the least recently used rows, recency counted in steps.

    Each :meth:`lookup` is one step; served rows are stamped with the step. :meth:`admit`
    places offered rows in free slots first, then in the slots of the rows with the oldest
    stamp (ties: lower global id first). Rows used in the current step (hits, and rows
    already admitted this step) are never evicted: when the offered rows do not fit around
    them, only the first ones offered are kept (so never more than ``capacity``).
    """

    def __init__(self, num_nodes: int, capacity: int, num_features: int, dtype: torch.dtype,
                 *, device: torch.device | str = "cpu") -> None:
        super().__init__(num_nodes, capacity, num_features, dtype, device)
        self.id_of_slot = torch.full((capacity,), -1, dtype=torch.long, device=device)
        """``[capacity]`` int64: global id held by each slot, ``-1`` = free."""
        self.last_used = torch.full((capacity,), -1, dtype=torch.long, device=device)
        """``[capacity]`` int64: step of each slot's last use, ``-1`` = free."""
        self.step = 0
        """Lookups so far (the recency clock)."""
        # The free-slot keys: negative and distinct, so free slots come first, lowest slot first.
        self._free_key = torch.arange(capacity, dtype=torch.long, device=device) - capacity

    def _begin_step(self) -> None:
        self.step += 1

    def _touch(self, slots: Tensor) -> None:
        self.last_used[slots] = self.step

    def admit(self, ids: Tensor, rows: Tensor) -> None:
        """Insert fetched rows (``ids: [m]`` unique, ``rows: [m, F]``) as the policy allows."""
        self._check_rows(ids, rows)
        dev = self.slot_of.device
        ids, rows = ids.to(dev, torch.long), rows.to(dev, self.rows.dtype)
        # An id already cached (admitted twice) is refreshed in place, never given a 2nd slot:
        # two slots for one id would leave a stale mapping behind after one is evicted.
        cur = self.slot_of[ids].long()
        present = cur >= 0
        if bool(present.any()):
            self.rows[cur[present]] = rows[present]
            self.last_used[cur[present]] = self.step
            ids, rows = ids[~present], rows[~present]
        # Free slots and rows not used this step may be overwritten; the rest is protected.
        eligible = self.last_used < self.step
        keep = min(ids.numel(), int(eligible.sum()))
        if keep == 0:
            return
        ids, rows = ids[:keep], rows[:keep]
        # One ordering key: free slots (negative keys) first, then (last_used, id) ascending;
        # distinct ids make the keys distinct, so topk's choice is deterministic.
        key = torch.where(self.id_of_slot >= 0, self.last_used * self.num_nodes + self.id_of_slot,
                          self._free_key)
        key = key.masked_fill(~eligible, _INT64_MAX)
        slots = torch.topk(key, keep, largest=False, sorted=True).indices
        old = self.id_of_slot[slots]
        self.slot_of[old[old >= 0]] = -1  # unmap the evicted before the slots are reused
        self.rows[slots] = rows
        self.id_of_slot[slots] = ids
        self.last_used[slots] = self.step
        self.slot_of[ids] = slots.to(torch.int32)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "lru", "num_nodes": self.num_nodes, "capacity": self.capacity,
                "num_features": self.num_features, "rows": self.rows.clone(),
                "id_of_slot": self.id_of_slot.clone(), "last_used": self.last_used.clone(),
                "step": self.step, "requests": self.requests, "hits": self.hits}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_state(state, "lru")
        dev = self.slot_of.device
        self.rows.copy_(state["rows"])
        self.id_of_slot.copy_(state["id_of_slot"].to(dev))
        self.last_used.copy_(state["last_used"].to(dev))
        self.step, self.requests, self.hits = int(state["step"]), int(state["requests"]), int(state["hits"])
        # The slot table is derived from id_of_slot (not stored: it is num_nodes long).
        self.slot_of.fill_(-1)
        held = (self.id_of_slot >= 0).nonzero().view(-1)
        self.slot_of[self.id_of_slot[held]] = held.to(torch.int32)
