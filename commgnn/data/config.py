"""Configs of the data layer: which graph to load and how to build a synthetic one.

Both are frozen and validate themselves on construction, so a bad value fails with a
one-line :class:`~commgnn.errors.ConfigError` naming its full key (``data.train_ratio``,
``data.synthetic.num_nodes``) before any data is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commgnn.config import fraction, positive
from commgnn.errors import ConfigError


_INT64_MAX = 2**63 - 1


def _seed_range(name: str, seed: int) -> None:
    """Seeds go to ``torch.manual_seed``, which takes 64-bit values."""
    if seed > _INT64_MAX:
        raise ConfigError(f"{name} must be below 2**63, got {seed:.3e}")


@dataclass(frozen=True, kw_only=True)
class SyntheticConfig:
    """A contextual stochastic block model (CSBM), see :func:`commgnn.data.make_csbm`."""

    num_nodes: int = 20_000
    """Number of nodes N; classes are balanced (sizes differ by at most one)."""
    num_classes: int = 8
    """Number of classes C (at least 2)."""
    avg_degree: float = 10.0
    """Mean directed in-degree after symmetrisation: the graph has round(N * avg_degree / 2)
    undirected edges, stored as twice as many directed ones. At most N / (2 C), so that the
    same-class blocks stay sparse enough to sample without duplicates."""
    homophily: float = 0.8
    """Fraction of (undirected) edges whose endpoints share a class, in [0, 1]; met exactly
    up to rounding of the edge count."""
    feature_dim: int = 64
    """Feature dimension F."""
    feature_noise: float = 1.0
    """Per-coordinate std of the Gaussian noise around each class centroid. Centroid
    coordinates are drawn with std 1/sqrt(F), so centroids have norm ~1 and two centroids
    are ~sqrt(2) apart whatever F is: at the default 1.0 the features alone separate the
    classes only weakly and the graph (homophily) carries much of the signal. 0 gives
    noiseless features (each node sits on its centroid)."""
    seed: int = 0
    """Seed of the generator; the same config always yields the same graph."""

    def __post_init__(self) -> None:
        positive("data.synthetic.num_nodes", self.num_nodes)
        positive("data.synthetic.num_classes", self.num_classes)
        if self.num_classes < 2:
            raise ConfigError(f"data.synthetic.num_classes must be >= 2, got {self.num_classes}")
        if self.num_classes > self.num_nodes:
            raise ConfigError(f"data.synthetic.num_classes ({self.num_classes}) must not exceed "
                              f"data.synthetic.num_nodes ({self.num_nodes})")
        positive("data.synthetic.avg_degree", self.avg_degree)
        max_degree = self.num_nodes / (2 * self.num_classes)
        if self.avg_degree > max_degree:
            raise ConfigError(f"data.synthetic.avg_degree must be <= num_nodes / (2 * num_classes) "
                              f"= {max_degree:g} for this graph, got {self.avg_degree:g} "
                              f"(raise num_nodes or lower avg_degree)")
        fraction("data.synthetic.homophily", self.homophily)
        positive("data.synthetic.feature_dim", self.feature_dim)
        positive("data.synthetic.feature_noise", self.feature_noise, allow_zero=True)
        positive("data.synthetic.seed", self.seed, allow_zero=True)
        _seed_range("data.synthetic.seed", self.seed)


def _integer(name: str, value: int, *, low: int) -> None:
    """Raise a :class:`ConfigError` unless ``value`` is an int (not a bool) >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r:.60}")
    if value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")


@dataclass(frozen=True, kw_only=True)
class BigSynthConfig:
    """A large synthetic graph written to disk chunk by chunk, see
    :func:`commgnn.data.synth_large.generate_graph_folder`: power-law expected degrees
    (Chung-Lu), edges mostly inside many small communities nested in groups, labels that
    follow the communities and features that follow the labels."""

    nodes: int = 100_000
    """Number of nodes N (>= 2); ogbn-products' shape is 2,449,029 nodes and 123,718,280
    edges, papers100M's 111,059,956 and 1,615,685,872."""
    edges: int = 5_000_000
    """Number of directed edges E written (even, > 0): the graph is undirected and each of
    its E / 2 edges is stored in both directions."""
    features: int = 100
    """Feature dimension F (>= 1)."""
    classes: int = 47
    """Number of classes C (>= 2, at most 32767 so that labels fit int16)."""
    train_fraction: float = 0.08
    """Share of the nodes in ``split/train.npy``, in [0, 1]."""
    valid_fraction: float = 0.02
    """Share of the nodes in ``split/valid.npy``, in [0, 1]."""
    test_fraction: float = 0.10
    """Share of the nodes in ``split/test.npy``, in [0, 1]; the three fractions sum to at
    most 1 and the sets are disjoint (the rest of the nodes are in none)."""
    community_size: int = 1000
    """Mean number of nodes per community (>= 2); sizes are uniform in [0.5, 1.5] times it
    (at least 2), and a community as large as N is the whole graph. Keep it well above the
    mean degree E / N (the default suits degrees up to ~50): a denser community repeats
    node pairs more often (multi-edges are kept, see the generator)."""
    communities_per_group: int = 16
    """Communities per group (>= 1): each run of this many consecutive communities forms a
    group, which takes the in-community stubs of hubs that their own community is too
    small to hold, so that hub edges stay local too."""
    mixing: float = 0.2
    """Fraction of every node's expected degree whose edges go anywhere in the graph, in
    [0, 1]; the rest stays in the node's community (or, for hubs, its group). Hubs raise
    the realised share (recorded as ``stats.global_share`` in meta.json): at the defaults a
    4-way METIS partition cuts roughly 10-30% of the edges."""
    degree_exponent: float = 2.3
    """Power-law exponent of the expected degrees, in (1, 10]: P(w > x) ~ x^(1 - exponent),
    clipped at min(sqrt(E), N / 10). Real graphs have 2.1-2.5."""
    label_noise: float = 0.1
    """Probability that a node's label is redrawn uniformly from the C classes instead of
    its community's class, in [0, 1]; 0 gives labels that follow communities exactly."""
    feature_noise: float = 1.0
    """Per-coordinate std of the Gaussian noise around each class centroid (>= 0); centroid
    coordinates have std 1/sqrt(F), so centroids are ~sqrt(2) apart: at 1.0 the features
    alone separate the classes only weakly and the neighbourhood carries much of the signal."""
    x_dtype: str = "float32"
    """Storage dtype of ``x.npy``: ``"float32"`` or ``"float16"``."""
    seed: int = 0
    """Seed; the same config (``chunk`` included) always writes the same bytes (with the
    same numpy version)."""
    chunk: int = 1 << 20
    """Undirected edges drawn per block (>= 1; each block has its own seed), and about
    the number of feature values per feature block. Bounds the generator's working memory
    besides its per-node arrays."""

    def __post_init__(self) -> None:
        k = "data.big."
        _integer(k + "nodes", self.nodes, low=2)
        _integer(k + "edges", self.edges, low=2)
        if self.edges % 2:
            raise ConfigError(f"{k}edges must be even (each undirected edge is written in both "
                              f"directions), got {self.edges}")
        _integer(k + "features", self.features, low=1)
        _integer(k + "classes", self.classes, low=2)
        if self.classes > 32767:
            raise ConfigError(f"{k}classes must be at most 32767, got {self.classes}")
        for name in ("train_fraction", "valid_fraction", "test_fraction", "mixing", "label_noise"):
            fraction(k + name, getattr(self, name))
        total = self.train_fraction + self.valid_fraction + self.test_fraction
        if total > 1 + 1e-9:
            raise ConfigError(f"{k}train_fraction + valid_fraction + test_fraction must be <= 1, "
                              f"got {total:g}")
        _integer(k + "community_size", self.community_size, low=2)
        _integer(k + "communities_per_group", self.communities_per_group, low=1)
        positive(k + "degree_exponent", self.degree_exponent)
        if not 1 < self.degree_exponent <= 10:
            raise ConfigError(f"{k}degree_exponent must lie in (1, 10], got {self.degree_exponent}")
        positive(k + "feature_noise", self.feature_noise, allow_zero=True)
        if self.x_dtype not in ("float32", "float16"):
            raise ConfigError(f"{k}x_dtype must be 'float32' or 'float16', got {self.x_dtype!r}")
        _integer(k + "seed", self.seed, low=0)
        _seed_range(k + "seed", self.seed)
        _integer(k + "chunk", self.chunk, low=1)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which graph to load (see :func:`commgnn.data.load_dataset`) and how to split it."""

    dataset: str = "synthetic"
    """``"synthetic"`` (a CSBM built from ``synthetic``), a registered dataset name
    (case-insensitive, e.g. ``"cora"``; see :func:`commgnn.data.dataset_names`), the
    path of a user graph file ending in ``.pt``, or the path of a folder: a graph folder of
    ``.npy`` files (:mod:`commgnn.data.ondisk`) or the raw folder OGB downloads for a
    node-property dataset (:mod:`commgnn.data.ogb_raw`)."""
    root: str | None = None
    """Folder holding the staged datasets, laid out like ``shared/datasets`` (one folder
    per dataset or dataset group). It is only read: each dataset is copied into
    ``cache_dir`` first. None: PyG downloads the dataset into ``cache_dir`` instead."""
    cache_dir: str | None = None
    """Writable folder for dataset copies, PyG's processed files and downloads.
    None: ``~/.cache/commgnn``."""
    train_ratio: float = 0.6
    """Share of each class's labelled nodes used for training, in (0, 1). Only for graphs
    that come without split masks (the default split is 60/20/20)."""
    val_ratio: float = 0.2
    """Share of each class's labelled nodes used for validation, in (0, 1); the test set
    is the rest, so ``train_ratio + val_ratio`` must be < 1."""
    split_seed: int = 0
    """Seed of the stratified split (independent of the synthetic graph's seed)."""
    normalize_features: bool = False
    """Scale each node's feature row to sum 1 (PyG's ``NormalizeFeatures``), as PyG's
    examples do for bag-of-words features such as Amazon's and Coauthor's."""
    max_classes: int = 1000
    """Most classes a graph may have (> 0). The class count is ``num_classes_total`` where
    the graph sets it (a ``.pt`` file's ``num_classes``), else the largest label + 1; a
    graph over the cap is refused, naming the first node whose label reaches it. Guards
    against one absurd label (say 10**6) silently building a model with a million outputs."""
    allow_mask_overlap: bool = False
    """Accept train/val/test masks that share nodes, with a warning naming the two masks,
    the number of shared nodes and the first one. False (default): such a graph is refused,
    since evaluating on training nodes inflates the accuracy."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    """Parameters of the synthetic graph, used when ``dataset = "synthetic"``."""

    def __post_init__(self) -> None:
        if not self.dataset.strip():
            raise ConfigError("data.dataset must not be empty (use 'synthetic', a dataset name "
                              "or a path to a .pt graph file)")
        for key in ("root", "cache_dir"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ConfigError(f"data.{key} must be a non-empty path or left out, got ''")
        fraction("data.train_ratio", self.train_ratio, open_low=True, open_high=True)
        fraction("data.val_ratio", self.val_ratio, open_low=True, open_high=True)
        if self.train_ratio + self.val_ratio >= 1:
            raise ConfigError(f"data.train_ratio + data.val_ratio must be < 1 to leave test nodes, "
                              f"got {self.train_ratio} + {self.val_ratio}")
        positive("data.split_seed", self.split_seed, allow_zero=True)
        _seed_range("data.split_seed", self.split_seed)
        if isinstance(self.max_classes, bool) or not isinstance(self.max_classes, int):
            raise ConfigError(f"data.max_classes must be an integer, got {self.max_classes!r}")
        positive("data.max_classes", self.max_classes)
        if self.max_classes > _INT64_MAX:  # compared with int64 label tensors
            raise ConfigError(f"data.max_classes must be at most 2**63 - 1, got {self.max_classes:.3e}")
        if not isinstance(self.allow_mask_overlap, bool):
            raise ConfigError(f"data.allow_mask_overlap must be true or false, "
                              f"got {self.allow_mask_overlap!r}")
        if not isinstance(self.synthetic, SyntheticConfig):
            raise ConfigError(f"data.synthetic: expected a SyntheticConfig table, "
                              f"got {type(self.synthetic).__name__}")
        if (self.dataset.strip().lower() == "synthetic"
                and self.synthetic.num_classes > self.max_classes):
            raise ConfigError(f"data.synthetic.num_classes ({self.synthetic.num_classes}) must "
                              f"not exceed data.max_classes ({self.max_classes})")
