"""The options of ``commgnn federate`` and ``commgnn.federate``, declared once
(:class:`commgnn.options.OptionSet` over :class:`~commgnn.federated.config.FederateConfig`),
and the federate resolver: the one resolver with federate's two conveniences (a codec
parameter alone picks its codec, ``--client-map`` alone picks ``split = "file"``) and its
check that no option given is one the resolved run would ignore."""

from __future__ import annotations

from typing import Any, Mapping

from commgnn.config import deprecated_names
from commgnn.errors import UserError
from commgnn.options import OptionSet, opt


def _root() -> type:
    from commgnn.federated.config import FederateConfig

    return FederateConfig


FEDERATE_OPTIONS = OptionSet("federate", _root, (
    opt("data.dataset", "--dataset", "'synthetic', a dataset name (see `commgnn datasets`), a .pt graph, a graph folder "
        "of .npy files or an OGB raw folder"),
    opt("data.root", "--data-root", "folder with staged datasets (default: $COMMGNN_DATA_ROOT, else PyG downloads)"),
    opt("split.clients", "--clients", "number of clients K (>= 2)"),
    opt("split.method", "--split", "louvain | metis | dirichlet | file (how nodes are given to clients)"),
    opt("split.alpha", "--alpha", "dirichlet: label concentration (small = skewed)"),
    opt("split.path", "--client-map", "split file: .npy/.pt/.csv node -> client map (implies --split file)",
        metavar="PATH"),
    opt("federated.algorithm", "--algorithm", "fedavg | fedprox | local | central"),
    opt("federated.rounds", "--rounds", "communication rounds", resume=True),
    opt("federated.local_epochs", "--local-epochs", "local steps per client per round"),
    opt("federated.lr", "--lr", "clients' SGD learning rate"),
    opt("federated.mu", "--mu", "fedprox: proximal coefficient"),
    opt("federated.participation", "--participation", "fraction of clients drawn each round, in (0, 1]"),
    opt("federated.aggregator", "--aggregator", "mean | median | trimmed_mean | krum"),
    opt("federated.cross_edges", "--cross-edges", "drop | embeddings (edges between clients)"),
    opt("neighgen.enabled", "--neighgen", "mend each client's subgraph with generated missing neighbours before "
        "training (FedSage+-style; [neighgen])", const=True),
    opt("neighgen.rounds", "--neighgen-rounds", "neighgen: FedAvg rounds that train the generator"),
    opt("federated.embedding_bits", "--embedding-bits", "cross_edges embeddings: bits per value (1, 2, 4, 8 or 32)"),
    opt("federated.embedding_noise", "--embedding-noise", "cross_edges embeddings: std of the Gaussian noise added"),
    opt("federated.seed", "--seed", "seed of the split, initialisation, draws and noise", also=("split.seed",)),
    opt("federated.eval_every", "--eval-every", "evaluate every this many rounds"),
    opt("secagg.enabled", "--secure-agg", "secure aggregation: the server learns only the sum of the updates",
        dest="secure_agg", const=True),
    opt("secagg.threshold", "--threshold",
        "secure aggregation: Shamir threshold, a fraction (<= 1) or a client count (> 1)"),
    opt("dp.epsilon", "--dp-epsilon", "client-level differential privacy: target epsilon over the run (0 = off)"),
    opt("dp.delta", "--dp-delta", "DP: target delta"),
    opt("dp.clip", "--dp-clip", "DP: L2 bound on a client's update per round"),
    opt("dp.adaptive_clip", "--dp-adaptive-clip", "DP: move the clip toward a quantile of the update norms "
        "(Andrew et al. 2021); --dp-clip is then its start", const=True),
    opt("dp.target_quantile", "--dp-target-quantile", "adaptive clip: share of updates left unclipped"),
    opt("dp.max_clip", "--dp-max-clip", "adaptive clip: the largest clip (default: --dp-clip, so the clip only "
        "shrinks from its start; it sizes the secure-sum range)"),
    opt("dp.count_stddev", "--dp-count-stddev", "adaptive clip: noise std on the clipped count (default: "
        "participants / 20; must exceed the noise multiplier / 2)"),
    opt("uplink.codec", "--uplink", "fp32 | quant | randomk | rank (how updates travel to the server)"),
    opt("uplink.bits", "--uplink-bits", "bits per transmitted value (without --uplink: implies quant)"),
    opt("uplink.fraction", "--uplink-fraction", "randomk: share of coordinates sent (without --uplink: implies randomk)"),
    opt("uplink.rank", "--uplink-rank", "rank: columns of each projection (without --uplink: implies rank)"),
    opt("uplink.residual_decay", "--uplink-residual-decay",
        "randomk/rank: damp the error-feedback residual by this each round, in (0, 1] (1: plain error feedback)"),
    opt("policy.path", "--policy", "governance policy (organisations, what may cross)", metavar="FILE.toml",
        dest="policy"),
    opt("runtime.parts", "--parts", "ranks: 1 = server and clients in this process; W > 1 = rank 0 serves, "
        "clients spread over ranks 1..W-1 (local gloo ranks)"),
    opt("runtime.threads", "--threads", "intra-op threads per rank (0 = cores / ranks)"),
    opt("runtime.timeout_s", "--timeout", "collective time-out in seconds"),
    opt("runtime.checkpoint_every", "--checkpoint-every", "write a checkpoint every k rounds (0 = never)",
        resume=True),
    opt("output.out", "--out", "run folder (default: runs/federate-<dataset>-<algorithm>-<time>)"),
    opt("output.quiet", "--quiet", "no per-evaluation lines", const=True, resume=True),
), prefixes={"data.synthetic": "synthetic_", "uplink": "uplink_", "secagg": "secagg_", "dp": "dp_",
             "neighgen": "neighgen_"})
"""Every option of a federated run: the table gives the flags kept from earlier releases
their names and short help; every other field is an option named after it
(``federated.weight_decay``: ``--weight-decay``, ``dp.noise_at``: ``--dp-noise-at``).
``--seed`` sets both ``federated.seed`` and ``split.seed``."""

_IMPLIED_CODEC = (("uplink_fraction", "randomk"), ("uplink_rank", "rank"), ("uplink_bits", "quant"))
"""A codec parameter given without ``--uplink`` (and no codec in the file) picks its codec."""


__getattr__ = deprecated_names(__name__, {"FLAG_KEYS": (lambda: FEDERATE_OPTIONS.flag_keys,
                                                        "FEDERATE_OPTIONS.flag_keys")})
"""``FLAG_KEYS`` (``{argparse dest: dotted key}``), derived from :data:`FEDERATE_OPTIONS`: deprecated."""


def _get(data: Mapping[str, Any], dotted: str) -> Any:
    for head in dotted.split("."):
        if not isinstance(data, Mapping) or head not in data:
            return None
        data = data[head]
    return data


def resolve_federate_config(toml_path: str | None, flags: Mapping[str, Any], env: Mapping[str, str], *,
                            start: Any = None) -> Any:
    """File (checked on its own, strictly), then the options given (``{dest: value}``,
    :data:`FEDERATE_OPTIONS`), then ``COMMGNN_DATA_ROOT`` when no data root is set; one
    :class:`~commgnn.federated.config.FederateConfig`, validated once."""
    FEDERATE_OPTIONS.unknown(list(flags), "the flags of `commgnn federate`")
    flags = {k: v for k, v in flags.items() if v is not None}

    def conveniences(data: dict[str, Any]) -> None:
        if "uplink" not in flags and _get(data, "uplink.codec") in (None, "fp32"):
            implied = [(dest, codec) for dest, codec in _IMPLIED_CODEC if dest in flags]
            if len({codec for _, codec in implied if codec != "quant"}) > 1:
                raise UserError("--uplink-fraction (randomk) and --uplink-rank (rank) name different codecs; "
                                "pick one with --uplink")
            if implied:
                data.setdefault("uplink", {})["codec"] = implied[0][1]
        if "client_map" in flags and "split" not in flags and _get(data, "split.method") is None:
            data.setdefault("split", {})["method"] = "file"

    cfg = FEDERATE_OPTIONS.resolve(toml_path, flags, env, start=start, adjust=conveniences)
    check_flags_apply(cfg, flags)
    return cfg


def check_flags_apply(cfg: Any, flags: Mapping[str, Any]) -> None:
    """An option given that the resolved run would ignore is a :class:`UserError`."""
    fed = cfg.federated
    rules = (
        ("neighgen_rounds", cfg.neighgen.enabled, "--neighgen-rounds applies with --neighgen"),
        ("threshold", cfg.secagg.enabled, "--threshold applies to secure aggregation: add --secure-agg"),
        ("dp_delta", cfg.dp.enabled, "--dp-delta applies with DP on: add --dp-epsilon EPS"),
        ("dp_clip", cfg.dp.enabled, "--dp-clip applies with DP on: add --dp-epsilon EPS"),
        ("dp_adaptive_clip", cfg.dp.enabled, "--dp-adaptive-clip applies with DP on: add --dp-epsilon EPS"),
        ("dp_target_quantile", cfg.dp.adaptive_clip, "--dp-target-quantile applies with --dp-adaptive-clip"),
        ("dp_max_clip", cfg.dp.adaptive_clip, "--dp-max-clip applies with --dp-adaptive-clip"),
        ("dp_count_stddev", cfg.dp.adaptive_clip, "--dp-count-stddev applies with --dp-adaptive-clip"),
        ("uplink_bits", cfg.uplink.codec != "fp32", "--uplink-bits does not apply to --uplink fp32"),
        ("uplink_fraction", cfg.uplink.codec == "randomk",
         f"--uplink-fraction applies to --uplink randomk, not {cfg.uplink.codec}"),
        ("uplink_rank", cfg.uplink.codec == "rank", f"--uplink-rank applies to --uplink rank, not {cfg.uplink.codec}"),
        ("uplink_residual_decay", cfg.uplink.codec in ("randomk", "rank") and cfg.uplink.error_feedback,
         f"--uplink-residual-decay applies to --uplink randomk or rank with error feedback, not {cfg.uplink.codec}"),
        ("mu", fed.algorithm == "fedprox", f"--mu applies to --algorithm fedprox, not {fed.algorithm}"),
        ("alpha", cfg.split.method == "dirichlet", f"--alpha applies to --split dirichlet, not {cfg.split.method}"),
        ("embedding_bits", fed.cross_edges == "embeddings", "--embedding-bits applies with --cross-edges embeddings"),
        ("embedding_noise", fed.cross_edges == "embeddings",
         "--embedding-noise applies with --cross-edges embeddings"),
    )
    for dest, applies, message in rules:
        if dest in flags and not applies:
            raise UserError(message)
