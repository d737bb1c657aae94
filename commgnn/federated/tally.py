"""The federated run's byte and time totals, by direction and kind (fed by the round
engine as messages cross; the per-message transcript is the gate's)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Tally:
    """Bytes and seconds of the run, by direction and kind."""

    uplink: int = 0
    downlink: int = 0
    embeddings: int = 0
    payload_uplink: int = 0
    """Uplink bytes of the update values alone (no keys, shares or unmasking)."""
    evaluation: int = 0
    """Bytes that only evaluation moves: predicted classes to the server, and the
    cross-client embeddings of the evaluation forward pass. Not training traffic, so kept
    apart from the uplink and embedding totals, but they cross the same links."""
    secagg_s: float = 0.0
    train_s: float = 0.0
    """Seconds of local training of the clients hosted here (all of them in one process)."""
    by_client: dict[int, int] = field(default_factory=dict)

    def client(self, c: int, nbytes: int) -> None:
        self.by_client[c] = self.by_client.get(c, 0) + nbytes
