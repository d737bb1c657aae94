"""``[minibatch]``: which sampler, its batches and where the topology lives.

Example::

    [train]
    mode = "minibatch"
    [minibatch]
    sampler = "neighbor"          # neighbor | cluster | saint-node | saint-edge | saint-rw | vrgcn
    batch_size = 1024
    fanout = [15, 10]             # hop 1 first (PyG's num_neighbors order); one per layer
    [minibatch.cluster]
    num_clusters = 40             # per rank
    clusters_per_batch = 4
    [minibatch.saint]
    budget = 2000
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from commgnn.config import deprecated_names, fraction, positive
from commgnn.errors import ConfigError

SAMPLERS = ("neighbor", "cluster", "saint-node", "saint-edge", "saint-rw", "vrgcn")


@dataclass(frozen=True, kw_only=True)
class ClusterGCNConfig:
    """Cluster-GCN batches (``sampler = "cluster"``)."""

    num_clusters: int = 40
    """METIS clusters of each rank's own nodes (computed once)."""
    clusters_per_batch: int = 4
    """Clusters merged into one batch (the edges between them are kept)."""

    def __post_init__(self) -> None:
        positive("minibatch.cluster.num_clusters", self.num_clusters)
        positive("minibatch.cluster.clusters_per_batch", self.clusters_per_batch)


@dataclass(frozen=True, kw_only=True)
class SaintConfig:
    """GraphSAINT subgraphs (``sampler = "saint-node" | "saint-edge" | "saint-rw"``)."""

    budget: int = 2000
    """Nodes (saint-node), edges (saint-edge) or walk roots (saint-rw) drawn per subgraph."""
    walk_length: int = 2
    """saint-rw: steps of each random walk."""
    presample: int = 50
    """Subgraphs drawn before training to estimate the loss and aggregation normalisation."""
    steps: int = 0
    """Subgraphs per epoch; 0 = the rank's own nodes over the mean subgraph size."""

    def __post_init__(self) -> None:
        positive("minibatch.saint.budget", self.budget)
        positive("minibatch.saint.walk_length", self.walk_length)
        positive("minibatch.saint.presample", self.presample)
        positive("minibatch.saint.steps", self.steps, allow_zero=True)


@dataclass(frozen=True, kw_only=True)
class SamplerConfig:
    """Mini-batch sampling (used when ``train.mode = "minibatch"``)."""

    sampler: Literal["neighbor", "cluster", "saint-node", "saint-edge", "saint-rw", "vrgcn"] = "neighbor"
    """neighbor (GraphSAGE fan-outs), cluster (Cluster-GCN), saint-node / saint-edge / saint-rw
    (GraphSAINT) or vrgcn (VR-GCN: fan-outs plus historical activations)."""
    batch_size: int = 1024
    """neighbor, vrgcn: seed nodes per batch on the rank with the most training nodes (the
    others take the same number of steps with smaller batches)."""
    fanout: tuple[int, ...] = (15, 10)
    """neighbor, vrgcn: neighbours sampled per node, hop 1 (the last layer) first; -1 = all.
    One entry per model layer. vrgcn does not sample the input layer (its last entry is unused)."""
    replace: bool = False
    """neighbor, vrgcn: sample with replacement (exactly ``fanout`` draws per node)."""
    topology: Literal["auto", "replicated", "partitioned"] = "auto"
    """Where the adjacency lives: every rank holds the whole CSR (``replicated``), or only
    its own nodes' in-edges (``partitioned``): neighbor then asks owners to sample theirs,
    vrgcn and saint-* also for whole in-edge lists (the control variate; the induced
    subgraph) and saint-rw for its walks' steps, and cluster needs no other (its clusters
    and batches are the rank's own nodes).
    ``auto`` = replicated when building the CSR (32 bytes an edge at its peak, 4 kept)
    fits in ``topology_share`` of memory."""
    topology_share: float = 0.25
    """auto: the largest fraction of available memory the replicated CSRs of all local
    ranks together may take while they are built."""
    inference: Literal["auto", "full", "layerwise", "sampled"] = "auto"
    """How evaluation (each epoch) and ``predict`` run the model over every node: ``full``,
    the full-graph forward (all halo rows of a layer exchanged at once); ``layerwise``,
    layer by layer in chunks of ``inference_chunk`` owned rows, each chunk's halo rows
    fetched from their owners (bounded memory, more bytes: a row several chunks need travels
    several times); ``auto`` = layerwise when the full forward of this host's ranks would
    take over half of available memory. Both give the same scores. ``sampled`` (neighbour
    sampler only): evaluation scores only each split's nodes, their neighbours drawn with
    ``fanout`` as in training, in eval mode (estimates, as the peers evaluate papers100M;
    :mod:`commgnn.trainers.sampled_eval`), while ``predict`` and the run's
    ``predictions.pt`` stay exact (layer-wise)."""
    eval_nodes: int = 0
    """sampled: score at most this many nodes of each split (over all ranks), a fixed
    random subset drawn once (each rank its share of the split), and scale the count of
    correct ones up to the split, as the peers estimate papers100M's training accuracy;
    0 = every node. A split of 1.2M training nodes costs about an epoch without backward
    to score in full; 100,000 of them give its accuracy to within about 0.3 points (two
    standard errors)."""
    inference_chunk: int = 8192
    """layerwise: destination rows per chunk. A chunk holds its sources' rows, about
    ``chunk (1 + average degree)`` of them, three times over; fewer rows cost more rounds
    and fetch a halo row that several chunks need more often."""
    cluster: ClusterGCNConfig = field(default_factory=ClusterGCNConfig)
    """``[minibatch.cluster]``."""
    saint: SaintConfig = field(default_factory=SaintConfig)
    """``[minibatch.saint]``."""

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"minibatch.sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        positive("minibatch.batch_size", self.batch_size)
        positive("minibatch.inference_chunk", self.inference_chunk)
        if not self.fanout:
            raise ConfigError("minibatch.fanout needs one entry per layer, got none")
        for k in self.fanout:
            if isinstance(k, bool) or not isinstance(k, int) or (k <= 0 and k != -1):
                raise ConfigError(f"minibatch.fanout entries must be positive integers or -1 (all), got {k!r}")
        fraction("minibatch.topology_share", self.topology_share, open_low=True)
        if self.inference not in ("auto", "full", "layerwise", "sampled"):
            raise ConfigError(f"minibatch.inference must be one of auto, full, layerwise, sampled, "
                              f"got {self.inference!r:.40}")
        if self.inference == "sampled" and self.sampler != "neighbor":
            raise ConfigError(f"minibatch.inference = 'sampled' draws neighbours as the neighbor sampler does; "
                              f"sampler {self.sampler!r} evaluates exactly: use inference = 'auto' or "
                              f"'layerwise'")
        positive("minibatch.eval_nodes", self.eval_nodes, allow_zero=True)
        if self.eval_nodes and self.inference != "sampled":
            raise ConfigError(f"minibatch.eval_nodes = {self.eval_nodes} subsamples the splits of a sampled "
                              f"evaluation: set minibatch.inference = 'sampled' (got {self.inference!r}) "
                              f"or eval_nodes = 0")
        used = self.fanout[:-1] if self.sampler == "vrgcn" else self.fanout  # VR-GCN's last one is unused
        if self.topology == "partitioned" and self.sampler in ("neighbor", "vrgcn") and -1 in used:
            raise ConfigError("minibatch.topology = 'partitioned' needs a positive fan-out per sampled layer "
                              "(not -1)")


__getattr__ = deprecated_names(__name__, {"ClusterConfig": (lambda: ClusterGCNConfig, "ClusterGCNConfig")})
"""``ClusterConfig``, the old name of :class:`ClusterGCNConfig` (renamed so that it is not
confused with the emulated cluster's ``commgnn.cluster.ClusterConfig``): deprecated."""
