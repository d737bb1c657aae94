"""Secure aggregation of one round (Bonawitz et al., CCS 2017; SecAgg+ of Bell et al.,
CCS 2020): transport-agnostic client and server state machines.

The server learns ``sum_{u in U3} x_u mod 2^m`` (``x_u``: int64 ring elements ``[dim]``)
and nothing else about any single ``x_u`` as long as fewer than ``t`` clients collude with
it (honest-but-curious model; the signature and consistency-check rounds that defend
against an active server are not implemented). Steps, with survivor sets
``U1 ⊇ U2 ⊇ U3 ⊇ R``:

0. **AdvertiseKeys** -- client u makes X25519 pairs ``c_u`` (share encryption) and ``s_u``
   (masks) and sends both public keys; the server sends the list ``U1`` back.
1. **ShareKeys** -- u draws a self-mask seed ``b_u``, Shamir-shares ``b_u`` and
   ``s_u^SK`` t-of-|U1| (x-coordinate ``v + 1`` for client v), encrypts v's two shares with
   the ``c_u``/``c_v`` key and sends the ciphertexts; the server routes them (``U2`` =
   the clients that sent). u keeps its own share.
2. **MaskedInput** -- ``y_u = x_u + PRG(b_u) + sum_{v in U2, v != u} sign(u, v)
   PRG(s_uv) mod 2^m`` with ``sign = +1 if u < v else -1``, packed to ``ceil(dim m / 8)``
   bytes (``U3`` = the clients that sent). Pairwise masks cancel in the sum over U3 except
   those with clients in ``U2 \\ U3``.
3. **Unmasking** -- the server asks each u in U3 for its shares of ``b_v`` (v in U3) and
   of ``s_v^SK`` (v in U2 \\ U3). A client refuses (:class:`SecAggRefusal`) a request for
   both kinds of share of one client, across all requests: with both, the server could
   unmask that client's update. From the responders ``R`` (``|R| >= t``) the server
   reconstructs every ``b_v`` and dropped ``s_v^SK``, recomputes those masks and removes
   them.

With ``neighbours = k`` (SecAgg+) clients mask with, and share keys among, only their
neighbours in a random k-regular graph drawn from a seed every party knows
(:func:`neighbour_graph`); the threshold then counts shares within a neighbourhood
``N[u]`` (u and its k neighbours). Per-client cost drops from O(n) to O(k).

Messages are dataclasses of bytes and tensors; each has ``nbytes``, the size of its
serialised form (client ids 4 bytes, counts 4 bytes, public keys 32, Shamir shares 66,
ciphertexts ``12 + 140 + 16``). :func:`run_round` runs all steps in memory with simulated
dropouts and returns the sum and a :class:`RoundStats` with bytes and seconds per step.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence, TypeVar

import torch
from torch import Tensor

from commgnn.errors import ConfigError, UserError
from commgnn.federated.secagg import masking, ring, shamir
from commgnn.federated.secagg.masking import Entropy, KeyPair

ID_BYTES = 4
"""A client id or a count on the wire (uint32)."""

SHARE_PLAINTEXT_BYTES = 2 * ID_BYTES + 2 * shamir.SHARE_BYTES
"""sender || receiver || share of b_u || share of s_u^SK."""

CIPHERTEXT_BYTES = SHARE_PLAINTEXT_BYTES + masking.AEAD_OVERHEAD
"""One encrypted share message: 12 + 140 + 16 = 168 bytes."""

STEPS = ("advertise", "share_keys", "masked_input", "unmask")
"""Step names used as keys in :class:`RoundStats`."""

T = TypeVar("T")


class SecAggRefusal(RuntimeError):
    """A client refused a server request that would reveal an individual update."""


def _check_id(client: int) -> None:
    if not (isinstance(client, int) and 0 <= client < 2**32 - 1):
        raise ConfigError(f"secure-aggregation client ids must be ints in [0, 2^32 - 2], got {client!r}")


def _abort(step: str, got: int, total: int, t: int, what: str = "clients") -> UserError:
    return UserError(f"secure aggregation aborted at {step}: {got} of {total} {what} remain, fewer than the threshold "
                     f"t = {t}; lower secagg.threshold or reduce dropouts")


def neighbour_graph(clients: Sequence[int], k: int | None, seed: int = 0) -> dict[int, frozenset[int]]:
    """Neighbours of each client: everyone else when ``k`` is None/0 or ``>= n - 1``,
    else a random k-regular Harary graph (clients placed on a ring in an order drawn from
    ``seed``, each linked to the ``k // 2`` nearest on either side, plus the opposite
    client when ``k`` is odd; ``k`` is rounded up to even when ``k`` and ``n`` are odd)."""
    ids = sorted(set(clients))
    n = len(ids)
    if not k or k >= n - 1:
        return {u: frozenset(v for v in ids if v != u) for u in ids}
    if k < 2:
        raise ConfigError(f"secagg neighbours must be 0 (all clients) or >= 2, got {k}")
    gen = torch.Generator().manual_seed(int(seed))
    order = [ids[i] for i in torch.randperm(n, generator=gen).tolist()]
    half = (k + 1) // 2 if n % 2 else k // 2
    graph: dict[int, set[int]] = {u: set() for u in ids}
    for i, u in enumerate(order):
        offsets = list(range(1, half + 1))
        if k % 2 and n % 2 == 0:
            offsets.append(n // 2)
        for off in offsets:
            for v in (order[(i + off) % n], order[(i - off) % n]):
                if v != u:
                    graph[u].add(v)
                    graph[v].add(u)
    return {u: frozenset(vs) for u, vs in graph.items()}


# ----------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class AdvertiseKeys:
    """Client -> server, step 0: the two public keys."""

    client: int
    c_pk: bytes
    s_pk: bytes

    @property
    def nbytes(self) -> int:
        return ID_BYTES + 2 * masking.PUBLIC_KEY_BYTES


@dataclass(frozen=True)
class KeyList:
    """Server -> client, step 0: ``{v: (c_pk, s_pk)}`` of the clients in U1 (its
    neighbours' only, with SecAgg+)."""

    keys: dict[int, tuple[bytes, bytes]]

    @property
    def nbytes(self) -> int:
        return ID_BYTES + len(self.keys) * (ID_BYTES + 2 * masking.PUBLIC_KEY_BYTES)


@dataclass(frozen=True)
class ShareKeys:
    """Client -> server, step 1: ``{receiver: ciphertext}`` of the sender's shares."""

    sender: int
    ciphertexts: dict[int, bytes]

    @property
    def nbytes(self) -> int:
        return 2 * ID_BYTES + sum(ID_BYTES + len(c) for c in self.ciphertexts.values())


@dataclass(frozen=True)
class ShareDelivery:
    """Server -> client, step 1: ``{sender: ciphertext}`` addressed to ``receiver``."""

    receiver: int
    ciphertexts: dict[int, bytes]

    @property
    def nbytes(self) -> int:
        return 2 * ID_BYTES + sum(ID_BYTES + len(c) for c in self.ciphertexts.values())


@dataclass(frozen=True)
class MaskedInput:
    """Client -> server, step 2: ``y_u`` packed, ``uint8 [ceil(dim m / 8)]``."""

    client: int
    payload: Tensor

    @property
    def nbytes(self) -> int:
        return ID_BYTES + int(self.payload.numel())


@dataclass(frozen=True)
class UnmaskRequest:
    """Server -> client, step 3: whose self-mask shares (``b_v``) and whose mask-key
    shares (``s_v^SK``) to reveal."""

    reveal_self_mask: tuple[int, ...]
    reveal_mask_key: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return 2 * ID_BYTES + ID_BYTES * (len(self.reveal_self_mask) + len(self.reveal_mask_key))


@dataclass(frozen=True)
class UnmaskResponse:
    """Client -> server, step 3: ``{v: share}`` of ``b_v`` and of ``s_v^SK``."""

    client: int
    self_mask_shares: dict[int, bytes]
    mask_key_shares: dict[int, bytes]

    @property
    def nbytes(self) -> int:
        count = len(self.self_mask_shares) + len(self.mask_key_shares)
        return 3 * ID_BYTES + count * (ID_BYTES + shamir.SHARE_BYTES)


# ------------------------------------------------------------------------------ client


class SecAggClient:
    """One client's side of a round. Call :meth:`advertise`, :meth:`share_keys`,
    :meth:`masked_input` and :meth:`unmask` in order; ``neighbours`` (SecAgg+) limits
    whom it shares with and masks against (None = every advertised client)."""

    def __init__(self, client: int, *, dim: int, m: int, threshold: int, round_id: int = 0,
                 neighbours: frozenset[int] | None = None, entropy: Entropy = os.urandom) -> None:
        _check_id(client)
        ring.modulus_mask(m)  # validates m
        self.id, self.dim, self.m, self.t, self.round_id = client, dim, m, threshold, round_id
        self.neighbours = neighbours
        self._entropy = entropy
        self._c = KeyPair.generate(entropy)
        self._s = KeyPair.generate(entropy)
        self._keys: dict[int, tuple[bytes, bytes]] = {}
        self._b: bytes | None = None
        self._held_b: dict[int, bytes] = {}   # v -> my share of b_v
        self._held_sk: dict[int, bytes] = {}  # v -> my share of s_v^SK
        self._revealed_b: set[int] = set()
        self._revealed_sk: set[int] = set()
        self._step = 0

    def _expect(self, step: int, name: str) -> None:
        if self._step != step:
            raise RuntimeError(f"client {self.id}: {name} called out of order (at step {self._step})")
        self._step = step + 1

    def _mine(self, v: int) -> bool:
        return v == self.id or self.neighbours is None or v in self.neighbours

    def advertise(self) -> AdvertiseKeys:
        """Step 0: the public keys of ``c_u`` and ``s_u``."""
        self._expect(0, "advertise")
        return AdvertiseKeys(self.id, self._c.public, self._s.public)

    def share_keys(self, keys: KeyList) -> ShareKeys:
        """Step 1: Shamir-share ``b_u`` and ``s_u^SK`` among the advertised (neighbour)
        clients and encrypt each receiver's pair of shares."""
        self._expect(1, "share_keys")
        self._keys = {v: pk for v, pk in keys.keys.items() if self._mine(v)}
        if self._keys.get(self.id) != (self._c.public, self._s.public):
            raise SecAggRefusal(f"client {self.id}: the key list lacks or alters this client's own keys")
        if len({pk for pair in self._keys.values() for pk in pair}) != 2 * len(self._keys):
            raise SecAggRefusal(f"client {self.id}: the key list repeats a public key")
        if len(self._keys) < self.t:
            raise _abort("ShareKeys", len(self._keys), len(keys.keys), self.t, "advertised clients")
        self._b = self._entropy(masking.SEED_BYTES)
        xs = [v + 1 for v in sorted(self._keys)]
        b_sh = shamir.split(self._b, xs, self.t, entropy=self._entropy)
        sk_sh = shamir.split(self._s.private_bytes(), xs, self.t, entropy=self._entropy)
        out = {}
        for v in sorted(self._keys):
            b_v, sk_v = shamir.share_to_bytes(b_sh[v + 1]), shamir.share_to_bytes(sk_sh[v + 1])
            if v == self.id:
                self._held_b[v], self._held_sk[v] = b_v, sk_v
                continue
            key = masking.share_key(self._c.private, self._keys[v][0], self.round_id)
            plain = self.id.to_bytes(ID_BYTES, "big") + v.to_bytes(ID_BYTES, "big") + b_v + sk_v
            out[v] = masking.encrypt(key, plain, sender=self.id, receiver=v, round_id=self.round_id,
                                     entropy=self._entropy)
        return ShareKeys(self.id, out)

    def masked_input(self, x: Tensor, delivery: ShareDelivery) -> MaskedInput:
        """Step 2: store the shares received, then mask ``x`` (int64 ring elements
        ``[dim]``, reduced mod ``2^m`` here) against the clients that shared (U2)."""
        self._expect(2, "masked_input")
        if delivery.receiver != self.id:
            raise SecAggRefusal(f"client {self.id}: got shares addressed to client {delivery.receiver}")
        if x.dtype.is_floating_point or x.dtype.is_complex or x.shape != (self.dim,):
            raise ValueError(f"client {self.id}: input must be an integer tensor of shape ({self.dim},), "
                             f"got {x.dtype} {tuple(x.shape)}")
        for u, ct in delivery.ciphertexts.items():
            if u == self.id or u not in self._keys:
                continue  # not advertised to us (or not a neighbour): ignore
            key = masking.share_key(self._c.private, self._keys[u][0], self.round_id)
            plain = masking.decrypt(key, ct, sender=u, receiver=self.id, round_id=self.round_id)
            if (len(plain) != SHARE_PLAINTEXT_BYTES or int.from_bytes(plain[:ID_BYTES], "big") != u
                    or int.from_bytes(plain[ID_BYTES:2 * ID_BYTES], "big") != self.id):
                raise SecAggRefusal(f"client {self.id}: malformed share message from client {u}")
            body = plain[2 * ID_BYTES:]
            self._held_b[u], self._held_sk[u] = body[:shamir.SHARE_BYTES], body[shamir.SHARE_BYTES:]
        if len(self._held_b) < self.t:
            raise _abort("MaskedInput", len(self._held_b), len(self._keys), self.t, "clients that shared keys")
        assert self._b is not None
        y = ring.add(ring.reduce(x.detach().cpu(), self.m), masking.prg(self._b, self.dim, self.m), self.m)
        for v in sorted(self._held_b):
            if v == self.id:
                continue
            mask = masking.prg(masking.pair_seed(self._s.private, self._keys[v][1], self.round_id), self.dim, self.m)
            y = ring.add(y, mask, self.m) if self.id < v else ring.sub(y, mask, self.m)
        return MaskedInput(self.id, ring.pack(y, self.m))

    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Step 3: reveal the requested shares, refusing any request that (with earlier
        ones) would give the server both ``b_v`` and ``s_v^SK`` of one client."""
        if self._step < 3:
            raise RuntimeError(f"client {self.id}: unmask called before masked_input")
        want_b, want_sk = set(request.reveal_self_mask), set(request.reveal_mask_key)
        both = (want_b & want_sk) | (want_b & self._revealed_sk) | (want_sk & self._revealed_b)
        if both:
            raise SecAggRefusal(f"client {self.id}: refusing to reveal both the self-mask and the mask-key shares "
                                f"of client(s) {sorted(both)}")
        if self.id in want_sk:
            raise SecAggRefusal(f"client {self.id}: refusing to reveal its own mask key while it is alive")
        unknown = (want_b | want_sk) - set(self._held_b)
        if unknown:
            raise SecAggRefusal(f"client {self.id}: holds no shares of client(s) {sorted(unknown)}")
        if len(want_b) < self.t:
            raise SecAggRefusal(f"client {self.id}: only {len(want_b)} surviving clients announced, "
                                f"fewer than t = {self.t}")
        self._revealed_b |= want_b
        self._revealed_sk |= want_sk
        return UnmaskResponse(self.id, {v: self._held_b[v] for v in sorted(want_b)},
                              {v: self._held_sk[v] for v in sorted(want_sk)})


# ------------------------------------------------------------------------------ server


class SecAggServer:
    """The server's side of a round: call :meth:`collect_keys`, :meth:`route_shares`,
    :meth:`collect_masked` and :meth:`finish` with the messages that arrived at each step
    (missing clients count as dropped)."""

    def __init__(self, *, dim: int, m: int, threshold: int, round_id: int = 0,
                 graph: dict[int, frozenset[int]] | None = None) -> None:
        ring.modulus_mask(m)
        if threshold < 1:
            raise ConfigError(f"secure-aggregation threshold must be >= 1, got {threshold}")
        self.dim, self.m, self.t, self.round_id, self.graph = dim, m, threshold, round_id, graph
        self.keys: dict[int, tuple[bytes, bytes]] = {}
        self.u2: tuple[int, ...] = ()
        self.u3: tuple[int, ...] = ()
        self.responders: tuple[int, ...] = ()
        self._y: Tensor | None = None

    @property
    def u1(self) -> tuple[int, ...]:
        return tuple(sorted(self.keys))

    def _nbrs(self, u: int) -> set[int]:
        """N[u] among the advertised clients (u included)."""
        if self.graph is None:
            return set(self.keys)
        return ({u} | set(self.graph.get(u, ()))) & set(self.keys)

    def collect_keys(self, msgs: Iterable[AdvertiseKeys]) -> dict[int, KeyList]:
        """Step 0: record the public keys (U1); return the key list for each client."""
        for msg in msgs:
            _check_id(msg.client)
            if self.graph is not None and msg.client not in self.graph:
                continue  # not in this round's cohort
            self.keys[msg.client] = (msg.c_pk, msg.s_pk)
        if len(self.keys) < self.t:
            raise _abort("AdvertiseKeys", len(self.keys), len(self.graph or self.keys), self.t)
        return {u: KeyList({v: self.keys[v] for v in sorted(self._nbrs(u))}) for u in self.u1}

    def route_shares(self, msgs: Iterable[ShareKeys]) -> dict[int, ShareDelivery]:
        """Step 1: U2 = the senders; return each one's incoming ciphertexts."""
        inbox: dict[int, dict[int, bytes]] = {}
        for msg in msgs:
            if msg.sender not in self.keys:
                continue
            inbox[msg.sender] = {v: ct for v, ct in msg.ciphertexts.items() if v in self._nbrs(msg.sender)}
        self.u2 = tuple(sorted(inbox))
        if len(self.u2) < self.t:
            raise _abort("ShareKeys", len(self.u2), len(self.keys), self.t)
        return {v: ShareDelivery(v, {u: inbox[u][v] for u in self.u2 if v in inbox[u]}) for v in self.u2}

    def collect_masked(self, msgs: Iterable[MaskedInput]) -> dict[int, UnmaskRequest]:
        """Step 2: sum the masked inputs (U3); return each survivor's unmasking request."""
        need = ring.packed_nbytes(self.dim, self.m)
        y = torch.zeros(self.dim, dtype=torch.int64)
        got = []
        for msg in msgs:
            if msg.client not in self.u2 or msg.client in got:
                continue
            if msg.payload.numel() != need:
                raise ValueError(f"client {msg.client}: masked input has {msg.payload.numel()} bytes, expected {need}")
            y = ring.add(y, ring.unpack(msg.payload, self.m, self.dim), self.m)
            got.append(msg.client)
        self.u3 = tuple(sorted(got))
        if len(self.u3) < self.t:
            raise _abort("MaskedInput", len(self.u3), len(self.u2), self.t)
        self._y = y
        alive, dropped = set(self.u3), set(self.u2) - set(self.u3)
        return {u: UnmaskRequest(tuple(sorted(alive & self._nbrs(u))), tuple(sorted(dropped & self._nbrs(u))))
                for u in self.u3}

    def _reconstruct(self, shares: dict[int, bytes], owner: int, kind: str) -> bytes:
        if len(shares) < self.t:
            raise UserError(f"secure aggregation aborted at Unmasking: {len(shares)} shares of client {owner}'s "
                            f"{kind} arrived, fewer than the threshold t = {self.t}; lower secagg.threshold or "
                            f"reduce dropouts")
        pts = {r + 1: shamir.share_from_bytes(shares[r]) for r in sorted(shares)[: self.t]}
        return shamir.secret_to_bytes(shamir.reconstruct(pts))

    def finish(self, responses: Iterable[UnmaskResponse]) -> Tensor:
        """Step 3: reconstruct the self masks of U3 and the mask keys of U2 \\ U3, remove
        every remaining mask; return ``sum_{u in U3} x_u mod 2^m`` (int64 ``[dim]``)."""
        if self._y is None:
            raise RuntimeError("finish called before collect_masked")
        b_shares: dict[int, dict[int, bytes]] = {v: {} for v in self.u3}
        sk_shares: dict[int, dict[int, bytes]] = {v: {} for v in set(self.u2) - set(self.u3)}
        got = []
        for msg in responses:
            if msg.client not in self.u3 or msg.client in got:
                continue
            got.append(msg.client)
            for v, sh in msg.self_mask_shares.items():
                if v in b_shares:
                    b_shares[v][msg.client] = sh
            for v, sh in msg.mask_key_shares.items():
                if v in sk_shares:
                    sk_shares[v][msg.client] = sh
        self.responders = tuple(sorted(got))
        if len(self.responders) < self.t:
            raise _abort("Unmasking", len(self.responders), len(self.u3), self.t)
        y = self._y
        for v in self.u3:
            y = ring.sub(y, masking.prg(self._reconstruct(b_shares[v], v, "self-mask seed"), self.dim, self.m), self.m)
        for v in sorted(sk_shares):
            pair = KeyPair.from_private_bytes(self._reconstruct(sk_shares[v], v, "mask key"))
            if pair.public != self.keys[v][1]:
                raise RuntimeError(f"reconstructed mask key of client {v} does not match its advertised public key")
            for u in sorted(set(self.u3) & self._nbrs(v)):
                mask = masking.prg(masking.pair_seed(pair.private, self.keys[u][1], self.round_id), self.dim, self.m)
                # y_u holds +mask if u < v else -mask: undo it.
                y = ring.sub(y, mask, self.m) if u < v else ring.add(y, mask, self.m)
        return y


# --------------------------------------------------------------------------- in memory


@dataclass
class RoundStats:
    """Bytes and seconds of one in-memory round."""

    up: dict[int, dict[str, int]] = field(default_factory=dict)
    """client -> step -> bytes the client sent."""
    down: dict[int, dict[str, int]] = field(default_factory=dict)
    """client -> step -> bytes the client received."""
    seconds: dict[str, float] = field(default_factory=dict)
    """step -> wall seconds (all clients and the server, run one after another)."""
    u1: tuple[int, ...] = ()
    u2: tuple[int, ...] = ()
    u3: tuple[int, ...] = ()
    responders: tuple[int, ...] = ()

    @property
    def bytes_up(self) -> int:
        """Total client -> server bytes."""
        return sum(sum(s.values()) for s in self.up.values())

    @property
    def bytes_down(self) -> int:
        """Total server -> client bytes."""
        return sum(sum(s.values()) for s in self.down.values())

    def client_bytes(self, client: int) -> int:
        """Bytes one client sent and received over the round."""
        return sum(self.up.get(client, {}).values()) + sum(self.down.get(client, {}).values())


def run_round(inputs: dict[int, Tensor], *, m: int, threshold: int,
              drop_after_advertise: set[int] | frozenset[int] = frozenset(),
              drop_after_share: set[int] | frozenset[int] = frozenset(),
              drop_after_masking: set[int] | frozenset[int] = frozenset(),
              round_id: int = 0, neighbours: int | None = None, graph_seed: int = 0,
              entropy: Entropy = os.urandom) -> tuple[Tensor, RoundStats]:
    """All four steps in memory: ``inputs`` maps client id -> int64 ring elements ``[dim]``
    (reduced mod ``2^m``). Clients in ``drop_after_advertise`` vanish after step 0, those
    in ``drop_after_share`` after sending their shares (their pairwise masks are then
    removed via their reconstructed keys), those in ``drop_after_masking`` after sending
    ``y_u`` (they do not answer the unmasking request). Returns ``sum_{u in U3} x_u mod 2^m``
    and the round's :class:`RoundStats`."""
    if not inputs:
        raise UserError("secure aggregation needs at least one client")
    ids = sorted(inputs)
    for u in ids:
        _check_id(u)
    for name, drop in (("drop_after_advertise", drop_after_advertise), ("drop_after_share", drop_after_share),
                       ("drop_after_masking", drop_after_masking)):
        if set(drop) - set(ids):
            raise UserError(f"{name} names clients with no input: {sorted(set(drop) - set(ids))}")
    dims = {tuple(t.shape) for t in inputs.values()}
    if len(dims) != 1 or len(next(iter(dims))) != 1:
        raise UserError(f"secure-aggregation inputs must be 1-D tensors of one length, got shapes {sorted(dims)}")
    dim = next(iter(dims))[0]
    graph = neighbour_graph(ids, neighbours, graph_seed)
    group = 1 + min(len(g) for g in graph.values())
    if not 1 <= threshold <= group:
        where = "the smallest neighbourhood" if neighbours and group < len(ids) else "the clients"
        raise ConfigError(f"secure-aggregation threshold t = {threshold} must lie in [1, {group}] ({group} = {where}); "
                          f"change secagg.threshold")

    stats = RoundStats(up={u: dict.fromkeys(STEPS, 0) for u in ids}, down={u: dict.fromkeys(STEPS, 0) for u in ids})
    server = SecAggServer(dim=dim, m=m, threshold=threshold, round_id=round_id,
                          graph=graph if neighbours else None)
    clients = {u: SecAggClient(u, dim=dim, m=m, threshold=threshold, round_id=round_id,
                               neighbours=graph[u] if neighbours else None, entropy=entropy) for u in ids}

    def timed(step: str, fn: Callable[[], T]) -> T:
        start = time.perf_counter()
        out = fn()
        stats.seconds[step] = time.perf_counter() - start
        return out

    def step0() -> dict[int, KeyList]:
        adv = [clients[u].advertise() for u in ids]
        for msg in adv:
            stats.up[msg.client]["advertise"] = msg.nbytes
        lists = server.collect_keys(adv)
        for u, kl in lists.items():
            stats.down[u]["advertise"] = kl.nbytes
        return lists

    lists = timed("advertise", step0)
    alive = [u for u in ids if u not in drop_after_advertise]

    def step1() -> dict[int, ShareDelivery]:
        msgs = [clients[u].share_keys(lists[u]) for u in alive]
        for msg in msgs:
            stats.up[msg.sender]["share_keys"] = msg.nbytes
        deliveries = server.route_shares(msgs)
        return deliveries

    deliveries = timed("share_keys", step1)
    alive = [u for u in alive if u not in drop_after_share]
    for u in alive:
        stats.down[u]["share_keys"] = deliveries[u].nbytes

    def step2() -> dict[int, UnmaskRequest]:
        msgs = [clients[u].masked_input(inputs[u], deliveries[u]) for u in alive]
        for msg in msgs:
            stats.up[msg.client]["masked_input"] = msg.nbytes
        return server.collect_masked(msgs)

    requests = timed("masked_input", step2)
    alive = [u for u in alive if u not in drop_after_masking]

    def step3() -> Tensor:
        responses = []
        for u in alive:
            stats.down[u]["unmask"] = requests[u].nbytes
            resp = clients[u].unmask(requests[u])
            stats.up[u]["unmask"] = resp.nbytes
            responses.append(resp)
        return server.finish(responses)

    total = timed("unmask", step3)
    stats.u1, stats.u2, stats.u3, stats.responders = server.u1, server.u2, server.u3, server.responders
    return total, stats
