"""Governance policy of a federation and the gate that enforces it on every payload.

A policy file says which clients belong to which organisation and what may cross from one
organisation to another party::

    [[organisation]]
    name = "bank-a"
    clients = [0, 1]
    [[organisation]]
    name = "bank-b"
    clients = [2]
    [crossing]
    raw_features = "never"                # the only accepted value
    embeddings = "quantised_or_noised"    # never | quantised | noised | quantised_or_noised | quantised_and_noised
    embedding_max_bits = 8
    embedding_min_noise_std = 0.1
    updates = "secure_aggregation"        # secure_aggregation | plain
    [budget]
    per_link_mb = 50.0                    # bytes (1e6) per (src organisation, dst party) over the run; 0 = unlimited

Parties: every organisation is one party, a client not listed is an organisation of its
own named ``client-<i>`` (or an error with ``require_all_listed = true``), and the server
is the party ``"server"``, outside every organisation.

A **crossing** is a payload whose source and destination parties differ. Payloads inside
one organisation (client 0 to client 1 of bank-a) are not crossings: the organisation
already holds both ends, so the gate records them and counts their bytes but does not
restrict them (raw features included) and does not charge them to a budget.

For a crossing, :meth:`PolicyGate.admit` enforces:

* ``raw_features``: never admitted;
* ``embeddings``: the ``crossing.embeddings`` rule, where *quantised* means sent at
  ``bits <= embedding_max_bits`` (bits None or 32 = float32, not quantised) and *noised*
  means Gaussian noise of std >= ``embedding_min_noise_std`` (in the embeddings' own units)
  was added before sending. This is a governance rule, not a privacy proof: quantisation and
  noise limit what an embedding reveals without a formal guarantee (see
  :mod:`commgnn.federated.dp` for the formal one on updates). Quantisation in particular
  hides little: the first layer's rows are ``d^-1/2 x W1`` with ``W1`` the global model,
  which every client holds, so a receiver that collects ``rounds x hidden >= features``
  such rows of one node (a fresh ``W1`` each round) can solve for its raw features up to
  the rounding error; only noise, which averages out over rounds too, slows that down;
* ``update``: with ``updates = "secure_aggregation"`` only securely aggregated (masked)
  updates; with ``plain`` any;
* ``control``: always (small protocol messages: round numbers, key-agreement material);
* ``evaluation``: always (the predicted class of each of the client's own nodes, sent to the
  server for the accuracy and fairness report; labels never leave with them);
* every kind: the link's running byte total must stay within ``per_link_mb``.

A refused payload raises :class:`PolicyViolation` and is neither recorded as admitted nor
counted; it is kept in :attr:`PolicyGate.rejected` for the audit trail.

:meth:`Policy.check_plan` refuses a run whose plan would need what the policy forbids
before any round starts, so that the gate only fires on bugs or tampering.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from commgnn.config import from_dict, load_toml, positive, to_dict
from commgnn.errors import ConfigError, UserError

EmbeddingRule = Literal["never", "quantised", "noised", "quantised_or_noised", "quantised_and_noised"]
EMBEDDING_RULES = ("never", "quantised", "noised", "quantised_or_noised", "quantised_and_noised")
PayloadKind = Literal["raw_features", "embeddings", "update", "control", "evaluation"]
PAYLOAD_KINDS = ("raw_features", "embeddings", "update", "control", "evaluation")
SERVER = "server"
"""The server's party name (outside every organisation)."""
MB = 1_000_000
"""Bytes per MB in budgets (the project's MB is 1e6 bytes)."""

_RESERVED = re.compile(r"client-\d+")


class PolicyViolation(UserError):
    """A payload the governance policy forbids was about to leave its organisation."""


@dataclass(frozen=True, kw_only=True)
class Organisation:
    """One organisation (``[[organisation]]``) and the clients it owns."""

    name: str
    """Organisation name, unique in the policy (``client-<i>`` is reserved for unlisted clients)."""
    clients: tuple[int, ...] = ()
    """Client indices it owns."""

    def __post_init__(self) -> None:
        if isinstance(self.clients, list):
            object.__setattr__(self, "clients", tuple(self.clients))
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"name must be a non-empty string, got {self.name!r}")
        if _RESERVED.fullmatch(self.name):
            raise ConfigError(f"name {self.name!r} is reserved for clients not listed in any organisation; "
                              f"choose another name")
        if self.name == SERVER:
            raise ConfigError(f"name {SERVER!r} is reserved for the server; choose another name")
        if not self.clients:
            raise ConfigError(f"clients of organisation {self.name!r} is empty; list its client indices")
        seen: set[int] = set()
        for c in self.clients:
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ConfigError(f"clients of organisation {self.name!r}: {c!r} is not a client index (>= 0)")
            if c in seen:
                raise ConfigError(f"clients of organisation {self.name!r} lists client {c} twice")
            seen.add(c)


@dataclass(frozen=True, kw_only=True)
class CrossingRules:
    """``[crossing]``: what may leave an organisation."""

    raw_features: str = "never"
    """Raw node features never cross; ``"never"`` is the only accepted value."""
    embeddings: EmbeddingRule = "quantised_or_noised"
    """Condition on embeddings that cross (``never`` forbids them)."""
    embedding_max_bits: int = 8
    """Quantised means sent at this many bits per value or fewer (1..31)."""
    embedding_min_noise_std: float = 0.1
    """Noised means Gaussian noise of at least this std was added (embedding units)."""
    updates: Literal["secure_aggregation", "plain"] = "secure_aggregation"
    """``secure_aggregation``: model updates leave a client only masked for secure
    aggregation; ``plain``: in the clear."""

    def __post_init__(self) -> None:
        if self.raw_features != "never":
            raise ConfigError(f"raw_features must be 'never' (raw features never leave their organisation), "
                              f"got {self.raw_features!r}")
        if self.embeddings not in EMBEDDING_RULES:
            raise ConfigError(f"embeddings: {self.embeddings!r} is not one of {', '.join(EMBEDDING_RULES)}")
        if isinstance(self.embedding_max_bits, bool) or not isinstance(self.embedding_max_bits, int) \
                or not 1 <= self.embedding_max_bits <= 31:
            raise ConfigError(f"embedding_max_bits must be an integer in 1..31 (32 bits is not quantised), "
                              f"got {self.embedding_max_bits!r}")
        positive("embedding_min_noise_std", self.embedding_min_noise_std)
        if self.updates not in ("secure_aggregation", "plain"):
            raise ConfigError(f"updates must be 'secure_aggregation' or 'plain', got {self.updates!r}")

    def embedding_refusal(self, bits: int | None, noise_std: float) -> str | None:
        """Why embeddings sent at ``bits`` (None = float32) with noise ``noise_std`` may not
        cross, or None when they may."""
        quantised = bits is not None and bits <= self.embedding_max_bits
        noised = noise_std >= self.embedding_min_noise_std
        q = f"quantised to <= {self.embedding_max_bits} bits"
        z = f"noised with std >= {self.embedding_min_noise_std:g}"
        rule = self.embeddings
        if rule == "never":
            return "embeddings may not cross organisations (crossing.embeddings = 'never')"
        ok = {"quantised": quantised, "noised": noised, "quantised_or_noised": quantised or noised,
              "quantised_and_noised": quantised and noised}[rule]
        if ok:
            return None
        need = {"quantised": q, "noised": z, "quantised_or_noised": f"{q} or {z}",
                "quantised_and_noised": f"{q} and {z}"}[rule]
        got = f"{'float32' if bits is None else f'{bits} bits'}, noise std {noise_std:g}"
        return f"crossing embeddings must be {need} (got {got})"


@dataclass(frozen=True, kw_only=True)
class Budget:
    """``[budget]``: bytes allowed per link over the run."""

    per_link_mb: float = 0.0
    """MB (1e6 bytes) allowed per (source organisation, destination party) link over the
    whole run, all payload kinds together; 0 = unlimited."""

    def __post_init__(self) -> None:
        positive("per_link_mb", self.per_link_mb, allow_zero=True)

    @property
    def per_link_bytes(self) -> float:
        """The budget in bytes (inf when unlimited)."""
        return self.per_link_mb * MB if self.per_link_mb > 0 else math.inf


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A federation's governance policy (see the module docstring)."""

    organisation: tuple[Organisation, ...] = ()
    """The organisations (``[[organisation]]`` tables)."""
    crossing: CrossingRules = field(default_factory=CrossingRules)
    """What may cross (``[crossing]``)."""
    budget: Budget = field(default_factory=Budget)
    """Byte budgets (``[budget]``)."""
    require_all_listed: bool = False
    """True: every client of the run must be listed in an organisation (an unlisted client
    is an error instead of an organisation of its own)."""

    def __post_init__(self) -> None:
        orgs = tuple(o if isinstance(o, Organisation) else Organisation(**o) for o in self.organisation)
        object.__setattr__(self, "organisation", orgs)
        if isinstance(self.crossing, dict):
            object.__setattr__(self, "crossing", CrossingRules(**self.crossing))
        if isinstance(self.budget, dict):
            object.__setattr__(self, "budget", Budget(**self.budget))
        names: set[str] = set()
        owner: dict[int, str] = {}
        for org in orgs:
            if org.name in names:
                raise ConfigError(f"organisation: the name {org.name!r} is used twice")
            names.add(org.name)
            for c in org.clients:
                if c in owner:
                    raise ConfigError(f"organisation: client {c} is in both {owner[c]!r} and {org.name!r} "
                                      f"(a client belongs to at most one organisation)")
                owner[c] = org.name

    @functools.cached_property
    def _owner(self) -> dict[int, str]:
        # cached_property writes the instance __dict__ directly, so it works on a frozen dataclass.
        return {c: org.name for org in self.organisation for c in org.clients}

    def organisation_of(self, client: int) -> str:
        """The organisation of ``client``: its listed one, else ``client-<i>`` (its own), or a
        :class:`ConfigError` when the policy has ``require_all_listed = true``."""
        if isinstance(client, bool) or not isinstance(client, int) or client < 0:
            raise ValueError(f"client must be an index >= 0, got {client!r}")
        name = self._owner.get(client)
        if name is not None:
            return name
        if self.require_all_listed:
            raise ConfigError(f"policy: client {client} is in no organisation and require_all_listed = true; "
                              f"list it under an [[organisation]]")
        return f"client-{client}"

    def party_of(self, dst: int | str) -> str:
        """The party of a destination: ``"server"`` or the client's organisation."""
        return SERVER if dst == SERVER else self.organisation_of(dst)  # type: ignore[arg-type]

    def validate_for(self, n_clients: int) -> None:
        """Check the policy against a run of ``n_clients`` clients: every listed client must
        exist, and with ``require_all_listed`` every client must be listed."""
        positive("number of clients", n_clients)
        for org in self.organisation:
            extra = [c for c in org.clients if c >= n_clients]
            if extra:
                raise ConfigError(f"policy: organisation {org.name!r} lists client {extra[0]} but the run has "
                                  f"{n_clients} clients (0..{n_clients - 1})")
        if self.require_all_listed:
            missing = [c for c in range(n_clients) if c not in self._owner]
            if missing:
                raise ConfigError(f"policy: client {missing[0]} is in no organisation and require_all_listed = "
                                  f"true ({len(missing)} unlisted); list every client under an [[organisation]]")

    def check_plan(self, *, secure_agg: bool, embeddings_cross: bool, embedding_bits: int | None,
                   embedding_noise: float, aggregator: str = "mean") -> None:
        """Refuse a run whose plan needs what the policy forbids (one-line
        :class:`ConfigError`). ``embeddings_cross``: some embeddings travel between
        organisations (cross-organisation edges with halo exchange); ``embedding_bits``:
        their width (None or 32 = float32); ``embedding_noise``: the std of the noise added
        to them; ``aggregator``: the server's aggregation rule (robust rules need each
        client's update, which secure aggregation hides)."""
        rules = self.crossing
        if rules.updates == "secure_aggregation" and not secure_agg:
            raise ConfigError("policy forbids plain updates (crossing.updates = 'secure_aggregation'): "
                              "pass --secure-agg")
        if secure_agg and aggregator != "mean":
            raise ConfigError(f"aggregator {aggregator!r} needs each client's update, which secure aggregation "
                              f"hides: use aggregator 'mean' with --secure-agg"
                              + ("" if rules.updates == "secure_aggregation" else ", or drop --secure-agg"))
        if embeddings_cross:
            why = rules.embedding_refusal(embedding_bits, embedding_noise)
            if why is not None:
                if rules.embeddings == "never":
                    raise ConfigError(f"policy: {why}; use a split with no edge between organisations or "
                                      f"train without cross-client exchange")
                raise ConfigError(f"policy: {why}; set the embedding bits or noise accordingly")


def parse_policy(data: Mapping[str, Any]) -> Policy:
    """A :class:`Policy` from a parsed TOML table; unknown keys and wrong types are
    :class:`ConfigError` naming ``policy.<key>``."""
    return from_dict(Policy, data, path="policy")


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy TOML file."""
    return parse_policy(load_toml(path))


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """Plain values of ``policy`` in the file's layout (to write beside a run's results;
    :func:`parse_policy` reads it back to an equal policy)."""
    return {"organisation": [{"name": o.name, "clients": list(o.clients)} for o in policy.organisation],
            "crossing": to_dict(policy.crossing), "budget": to_dict(policy.budget),
            "require_all_listed": policy.require_all_listed}


# ------------------------------------------------------------------ enforcement
@dataclass(frozen=True, kw_only=True)
class Payload:
    """One message about to leave a client, as the gate sees it."""

    kind: PayloadKind
    """``raw_features``, ``embeddings``, ``update``, ``control`` or ``evaluation``."""
    src_client: int
    """Sending client."""
    dst: int | str
    """``"server"`` or the receiving client's index."""
    nbytes: int
    """Bytes on the wire."""
    bits: int | None = None
    """Bits per value (None = float32, unquantised)."""
    noise_std: float = 0.0
    """Std of the Gaussian noise added before sending (0 = none)."""
    secure: bool = False
    """True when the payload is masked for secure aggregation."""

    def __post_init__(self) -> None:
        # A malformed payload is the trainer's bug, not the user's: ValueError.
        if self.kind not in PAYLOAD_KINDS:
            raise ValueError(f"payload kind must be one of {', '.join(PAYLOAD_KINDS)}, got {self.kind!r}")
        if isinstance(self.src_client, bool) or not isinstance(self.src_client, int) or self.src_client < 0:
            raise ValueError(f"src_client must be a client index >= 0, got {self.src_client!r}")
        if self.dst != SERVER and (isinstance(self.dst, bool) or not isinstance(self.dst, int) or self.dst < 0):
            raise ValueError(f"dst must be 'server' or a client index >= 0, got {self.dst!r}")
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int) or self.nbytes < 0:
            raise ValueError(f"nbytes must be an integer >= 0, got {self.nbytes!r}")
        if self.bits is not None and (isinstance(self.bits, bool) or not isinstance(self.bits, int)
                                      or not 1 <= self.bits <= 32):
            raise ValueError(f"bits must be None or an integer in 1..32, got {self.bits!r}")
        if not (isinstance(self.noise_std, (int, float)) and math.isfinite(self.noise_std) and self.noise_std >= 0):
            raise ValueError(f"noise_std must be a finite number >= 0, got {self.noise_std!r}")


class PolicyGate:
    """Admit or refuse each payload under a :class:`Policy`, keeping a transcript and byte
    totals. Thread-safe: a lock serialises the check and the accounting, so concurrent
    senders cannot overrun a budget together."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.transcript: list[Payload] = []
        """Every admitted payload, in order."""
        self.rejected: list[tuple[Payload, str]] = []
        """Every refused payload with the reason (the audit trail)."""
        self._link: dict[tuple[str, str], int] = {}
        self._client: dict[int, int] = {}
        self._round_cost: dict[int, int] = {}
        self._to_server: dict[int, int] = {}
        self._lock = threading.Lock()

    def link_of(self, payload: Payload) -> tuple[str, str]:
        """(source organisation, destination party) of ``payload``."""
        return self.policy.organisation_of(payload.src_client), self.policy.party_of(payload.dst)

    def _refusal(self, payload: Payload, link: tuple[str, str]) -> str | None:
        src, dst = link
        if src == dst:
            return None  # inside one organisation: not a crossing (module docstring)
        rules = self.policy.crossing
        if payload.kind == "raw_features":
            return "raw features never leave their organisation"
        if payload.kind == "embeddings":
            bits = None if payload.bits == 32 else payload.bits
            why = rules.embedding_refusal(bits, payload.noise_std)
            if why is not None:
                return why
        if payload.kind == "update" and rules.updates == "secure_aggregation" and not payload.secure:
            return "updates may leave a client only securely aggregated (crossing.updates = 'secure_aggregation')"
        limit = self.policy.budget.per_link_bytes
        used = self._link.get(link, 0)
        if used + payload.nbytes > limit:
            return (f"link {src} -> {dst} would carry {used + payload.nbytes} bytes, over its budget of "
                    f"{self.policy.budget.per_link_mb:g} MB")
        return None

    def check(self, payload: Payload) -> None:
        """Raise :class:`PolicyViolation` if the policy forbids ``payload``, recording nothing:
        what a sender asks before the payload leaves (the receiver then admits it with :meth:`admit`)."""
        link = self.link_of(payload)
        with self._lock:
            why = self._refusal(payload, link)
        if why is not None:
            raise PolicyViolation(f"policy violation: {payload.kind} from client {payload.src_client} "
                                  f"({link[0]}) to {payload.dst} ({link[1]}): {why}")

    def admit(self, payload: Payload) -> None:
        """Record ``payload`` if the policy allows it, else raise :class:`PolicyViolation`
        (and record it in :attr:`rejected`, leaving the totals unchanged)."""
        link = self.link_of(payload)
        with self._lock:
            why = self._refusal(payload, link)
            if why is not None:
                self.rejected.append((payload, why))
                raise PolicyViolation(f"policy violation: {payload.kind} from client {payload.src_client} "
                                      f"({link[0]}) to {payload.dst} ({link[1]}): {why}")
            self.transcript.append(payload)
            self._link[link] = self._link.get(link, 0) + payload.nbytes
            self._client[payload.src_client] = self._client.get(payload.src_client, 0) + payload.nbytes
            if payload.dst == "server":
                self._to_server[payload.src_client] = self._to_server.get(payload.src_client, 0) + payload.nbytes

    def reserve(self, costs: Mapping[int, int], what: str) -> None:
        """Raise :class:`PolicyViolation`, recording nothing, if the bytes ``costs`` (client ->
        bytes it is about to send the server) would take a link over its budget: the server
        asks before a round or an evaluation starts, so that none starts that would end over
        budget."""
        by_link: dict[tuple[str, str], int] = {}
        for c, n in costs.items():
            link = (self.policy.organisation_of(c), self.policy.party_of("server"))
            by_link[link] = by_link.get(link, 0) + int(n)
        limit = self.policy.budget.per_link_bytes
        with self._lock:
            for (src, dst), n in sorted(by_link.items()):
                used = self._link.get((src, dst), 0)
                if src != dst and used + n > limit:
                    raise PolicyViolation(f"policy violation: {what} would take link {src} -> {dst} to {used + n} "
                                          f"bytes, over its budget of {self.policy.budget.per_link_mb:g} MB; "
                                          f"stopped before it started")

    def round_costs(self, active: list[int], first: int) -> dict[int, int]:
        """Each active client's bytes for the next round: the most it has sent in one round so
        far (its key and share messages included), or ``first`` (its payload alone) before
        its first round."""
        return {c: self._round_cost.get(c, first) for c in active}

    def to_server(self) -> dict[int, int]:
        """Admitted bytes each client sent the server."""
        with self._lock:
            return dict(self._to_server)

    def learn_round(self, before: Mapping[int, int]) -> None:
        """Record what each client sent the server in the round that began at
        :meth:`to_server` totals ``before`` (its embeddings to other clients are not part of
        that link)."""
        for c, n in self.to_server().items():
            sent = n - before.get(c, 0)
            if sent > self._round_cost.get(c, 0):
                self._round_cost[c] = sent

    def bytes_by_link(self) -> dict[tuple[str, str], int]:
        """Admitted bytes per (source organisation, destination party); intra-organisation
        traffic appears under (org, org)."""
        with self._lock:
            return dict(self._link)

    def bytes_by_client(self) -> dict[int, int]:
        """Admitted bytes sent by each client."""
        with self._lock:
            return dict(self._client)

    def state_dict(self) -> dict[str, Any]:
        """The transcript, refusals and byte totals as plain lists (for a checkpoint)."""
        with self._lock:
            return {"transcript": [asdict(p) for p in self.transcript],
                    "rejected": [[asdict(p), why] for p, why in self.rejected],
                    "link": [[s, d, n] for (s, d), n in self._link.items()],
                    "client": [[c, n] for c, n in self._client.items()],
                    "round_cost": [[c, n] for c, n in self._round_cost.items()],
                    "to_server": [[c, n] for c, n in self._to_server.items()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (each payload is validated again)."""
        with self._lock:
            self.transcript = [Payload(**p) for p in state["transcript"]]
            self.rejected = [(Payload(**p), str(why)) for p, why in state["rejected"]]
            self._link = {(str(s), str(d)): int(n) for s, d, n in state["link"]}
            self._client = {int(c): int(n) for c, n in state["client"]}
            self._round_cost = {int(c): int(n) for c, n in state["round_cost"]}
            self._to_server = {int(c): int(n) for c, n in state["to_server"]}

    def report(self) -> dict[str, Any]:
        """A JSON-able summary for the run report."""
        with self._lock:
            return {"admitted": len(self.transcript), "rejected": len(self.rejected),
                    "bytes_by_link": {f"{s}->{d}": n for (s, d), n in sorted(self._link.items())},
                    "bytes_by_client": {str(c): n for c, n in sorted(self._client.items())},
                    "per_link_mb": self.policy.budget.per_link_mb}


def reserve_everywhere(gate: Any, transport: Any, what: str,
                       costs: Callable[[PolicyGate], dict[int, int]]) -> dict[int, int] | None:
    """Under a byte budget the server asks ``gate`` (:meth:`PolicyGate.reserve`), before any
    byte of ``what`` moves, whether ``costs(gate)`` fit; it broadcasts the answer over
    ``transport`` and every rank raises the same :class:`PolicyViolation` if not. Returns
    the server's per-client byte totals before ``what`` (for :meth:`PolicyGate.learn_round`;
    None on other ranks, or without a budget)."""
    if not isinstance(gate, PolicyGate) or math.isinf(gate.policy.budget.per_link_bytes):
        return None
    why = None
    if transport.is_server:
        try:
            gate.reserve(costs(gate), what)
        except PolicyViolation as err:
            why = str(err)
    why = transport.broadcast(why)
    if why:
        raise PolicyViolation(why)
    return gate.to_server() if transport.is_server else None


class CountingGate:
    """No policy: admit everything, keep the same transcript and byte totals as a gate."""

    def __init__(self) -> None:
        self.transcript: list[Payload] = []
        self._client: dict[int, int] = {}

    def admit(self, payload: Payload) -> None:
        self.transcript.append(payload)
        self._client[payload.src_client] = self._client.get(payload.src_client, 0) + payload.nbytes

    def bytes_by_client(self) -> dict[int, int]:
        return dict(self._client)

    def state_dict(self) -> dict[str, Any]:
        """The transcript and byte totals as plain lists (for a checkpoint)."""
        return {"transcript": [asdict(p) for p in self.transcript], "client": [[c, n] for c, n in self._client.items()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output."""
        self.transcript = [Payload(**p) for p in state["transcript"]]
        self._client = {int(c): int(n) for c, n in state["client"]}

    def report(self) -> dict[str, Any]:
        return {"admitted": len(self.transcript), "rejected": 0,
                "bytes_by_client": {str(c): n for c, n in sorted(self._client.items())}}
