"""One securely aggregated sum over a :class:`~commgnn.federated.transport.Transport`.

The four SecAgg steps (:mod:`commgnn.federated.secagg.protocol`), each one gather of the
clients' messages at the server and one scatter of the server's replies:

    AdvertiseKeys -> KeyList -> ShareKeys -> ShareDelivery -> MaskedInput
                  -> UnmaskRequest -> UnmaskResponse -> sum of the survivors' inputs

Inputs are ring elements ``int64 [d']`` (an uplink codec's codes reduced mod ``2^m``). The
server counts every message's bytes per client and direction; it never sees one client's
unmasked input. In one process the same code runs with every move a no-op.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from torch import Tensor

from commgnn.federated.secagg import ring
from commgnn.federated.secagg.protocol import STEPS, SecAggClient, SecAggServer, neighbour_graph
from commgnn.federated.transport import Transport


@dataclass
class SumStats:
    """Bytes per client and step, both directions, and the protocol's wall time (server)."""

    up: dict[int, dict[str, int]] = field(default_factory=dict)
    down: dict[int, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0
    survivors: tuple[int, ...] = ()

    def count(self, where: dict[int, dict[str, int]], msgs: dict[int, object], step: str) -> None:
        for c, msg in msgs.items():
            where.setdefault(c, dict.fromkeys(STEPS, 0))[step] += int(msg.nbytes)  # type: ignore[attr-defined]


def secure_sum(t: Transport, mine: dict[int, Tensor], *, dim: int, cohort: list[int], m: int, threshold: int,
               round_id: int, neighbours: int | None, graph_seed: int) -> tuple[Tensor | None, SumStats]:
    """Sum ``mine`` (this rank's clients' codes, ``int64 [dim]``) with every other rank's, securely.

    Returns the sum mod ``2^m`` on the server (None elsewhere) and, on the server, the
    bytes of every message. ``cohort`` lists every participating client (on every rank).
    """
    graph = neighbour_graph(cohort, neighbours, graph_seed) if neighbours else None
    clients = {c: SecAggClient(c, dim=dim, m=m, threshold=threshold, round_id=round_id,
                               neighbours=graph[c] if graph else None) for c in mine}
    server = SecAggServer(dim=dim, m=m, threshold=threshold, round_id=round_id, graph=graph) if t.is_server else None
    stats = SumStats()
    start = time.perf_counter()

    def step(outgoing: dict[int, object], handle, name: str, reply: str) -> dict[int, object]:  # type: ignore[no-untyped-def]
        arrived = t.gather_dicts(outgoing)
        replies = None
        if server is not None:
            assert arrived is not None
            stats.count(stats.up, arrived, name)
            replies = handle(list(arrived.values()))
            stats.count(stats.down, replies, reply)
        return t.scatter_dicts(replies)

    keys = step({c: cl.advertise() for c, cl in clients.items()},
                lambda msgs: server.collect_keys(msgs), "advertise", "advertise")  # type: ignore[union-attr]
    shares = step({c: clients[c].share_keys(keys[c]) for c in clients if c in keys},
                  lambda msgs: server.route_shares(msgs), "share_keys", "share_keys")  # type: ignore[union-attr]
    requests = step({c: clients[c].masked_input(ring.reduce(mine[c], m), shares[c]) for c in clients if c in shares},
                    lambda msgs: server.collect_masked(msgs), "masked_input", "unmask")  # type: ignore[union-attr]
    responses = t.gather_dicts({c: clients[c].unmask(requests[c]) for c in clients if c in requests})
    total: Tensor | None = None
    if server is not None:
        assert responses is not None
        stats.count(stats.up, responses, "unmask")
        total = server.finish(list(responses.values()))
        stats.survivors = server.u3
    stats.seconds = time.perf_counter() - start
    return total, stats

