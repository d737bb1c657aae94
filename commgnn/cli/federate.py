"""``commgnn federate``: federated GNN training (FedAvg / FedProx over graph clients).

    commgnn federate --dataset cora --clients 5 --split louvain --rounds 100 \\
        --secure-agg --dp-epsilon 4 --uplink-bits 8 --policy policy.toml --out runs/fed

Every flag sets one key of :class:`commgnn.federated.config.FederateConfig` (:data:`FLAG_KEYS`)
and overrides ``--config FILE.toml``, which is read strictly (unknown keys are errors).
The command parses its arguments and calls :func:`commgnn.api.federate.run_federation`
(``--resume RUN_DIR``: :func:`commgnn.api.federate.resume_federated`); the run folder, its
files and the failure rules are those of :mod:`commgnn.runner.federate`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Mapping

from commgnn.errors import UserError

FLAG_KEYS: dict[str, str] = {
    "dataset": "data.dataset",
    "data_root": "data.root",
    "clients": "split.clients",
    "split": "split.method",
    "alpha": "split.alpha",
    "client_map": "split.path",
    "algorithm": "federated.algorithm",
    "rounds": "federated.rounds",
    "local_epochs": "federated.local_epochs",
    "lr": "federated.lr",
    "mu": "federated.mu",
    "participation": "federated.participation",
    "aggregator": "federated.aggregator",
    "cross_edges": "federated.cross_edges",
    "embedding_bits": "federated.embedding_bits",
    "embedding_noise": "federated.embedding_noise",
    "eval_every": "federated.eval_every",
    "secure_agg": "secagg.enabled",
    "threshold": "secagg.threshold",
    "dp_epsilon": "dp.epsilon",
    "dp_delta": "dp.delta",
    "dp_clip": "dp.clip",
    "dp_adaptive_clip": "dp.adaptive_clip",
    "dp_target_quantile": "dp.target_quantile",
    "dp_max_clip": "dp.max_clip",
    "dp_count_stddev": "dp.count_stddev",
    "uplink": "uplink.codec",
    "uplink_bits": "uplink.bits",
    "uplink_fraction": "uplink.fraction",
    "uplink_rank": "uplink.rank",
    "uplink_residual_decay": "uplink.residual_decay",
    "policy": "policy.path",
    "out": "output.out",
    "parts": "runtime.parts",
    "threads": "runtime.threads",
    "checkpoint_every": "runtime.checkpoint_every",
    "quiet": "output.quiet",
    "neighgen": "neighgen.enabled",
    "neighgen_rounds": "neighgen.rounds",
}
"""argparse dest -> dotted FederateConfig key (``--seed`` sets two: :data:`SEED_KEYS`)."""

SEED_KEYS = ("federated.seed", "split.seed")

MB = 1e6


class _DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to each flag's help, X read from a default FederateConfig
    only when help is shown (help that already says ``default:`` keeps its words)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        from commgnn.cli.main import _default_text

        text = action.help
        key = SEED_KEYS[0] if action.dest == "seed" else FLAG_KEYS.get(action.dest)
        if not key or text is None or text == argparse.SUPPRESS or "default:" in text:
            return text
        from commgnn.federated.config import FederateConfig

        value: Any = FederateConfig()
        for part in key.split("."):
            value = getattr(value, part)
        return f"{text} (default: {_default_text(value)})".replace("%", "%%")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("federate", help="federated training: clients keep their subgraphs, a server averages "
                                        "their updates (FedAvg / FedProx, secure aggregation, DP)",
                       formatter_class=_DefaultsFormatter)
    p.add_argument("--config", help="TOML file with [data] [split] [federated] [neighgen] [uplink] [secagg] [dp] "
                                    "[policy] [output]; flags override it")
    d = p.add_argument_group("data and split ([data], [split])")
    d.add_argument("--dataset", help="'synthetic', a dataset name (see `commgnn datasets`) or a .pt graph")
    d.add_argument("--data-root", dest="data_root",
                   help="folder with staged datasets (default: $COMMGNN_DATA_ROOT, else PyG downloads)")
    d.add_argument("--clients", type=int, help="number of clients K (>= 2)")
    d.add_argument("--split", help="louvain | metis | dirichlet | file (how nodes are given to clients)")
    d.add_argument("--alpha", type=float, help="dirichlet: label concentration (small = skewed)")
    d.add_argument("--client-map", dest="client_map", metavar="PATH",
                   help="split file: .npy/.pt/.csv node -> client map (implies --split file)")
    f = p.add_argument_group("algorithm ([federated])")
    f.add_argument("--algorithm", help="fedavg | fedprox | local | central")
    f.add_argument("--rounds", type=int, help="communication rounds")
    f.add_argument("--local-epochs", dest="local_epochs", type=int, help="local steps per client per round")
    f.add_argument("--lr", type=float, help="clients' SGD learning rate")
    f.add_argument("--mu", type=float, help="fedprox: proximal coefficient")
    f.add_argument("--participation", type=float, help="fraction of clients drawn each round, in (0, 1]")
    f.add_argument("--aggregator", help="mean | median | trimmed_mean | krum")
    f.add_argument("--cross-edges", dest="cross_edges", help="drop | embeddings (edges between clients)")
    f.add_argument("--neighgen", action="store_const", const=True,
                   help="mend each client's subgraph with generated missing neighbours before training "
                        "(FedSage+-style; [neighgen])")
    f.add_argument("--neighgen-rounds", dest="neighgen_rounds", type=int,
                   help="neighgen: FedAvg rounds that train the generator (default 20)")
    f.add_argument("--embedding-bits", dest="embedding_bits", type=int,
                   help="cross_edges embeddings: bits per value (1, 2, 4, 8 or 32)")
    f.add_argument("--embedding-noise", dest="embedding_noise", type=float,
                   help="cross_edges embeddings: std of the Gaussian noise added")
    f.add_argument("--seed", type=int, help="seed of the split, initialisation, draws and noise")
    f.add_argument("--eval-every", dest="eval_every", type=int, help="evaluate every this many rounds")
    s = p.add_argument_group("privacy and uplink ([secagg], [dp], [uplink], [policy])")
    s.add_argument("--secure-agg", dest="secure_agg", action="store_const", const=True,
                   help="secure aggregation: the server learns only the sum of the updates")
    s.add_argument("--threshold", type=float,
                   help="secure aggregation: Shamir threshold, a fraction (<= 1) or a client count (> 1)")
    s.add_argument("--dp-epsilon", dest="dp_epsilon", type=float,
                   help="client-level differential privacy: target epsilon over the run (0 = off)")
    s.add_argument("--dp-delta", dest="dp_delta", type=float, help="DP: target delta")
    s.add_argument("--dp-clip", dest="dp_clip", type=float, help="DP: L2 bound on a client's update per round")
    s.add_argument("--dp-adaptive-clip", dest="dp_adaptive_clip", action="store_const", const=True,
                   help="DP: move the clip toward a quantile of the update norms (Andrew et al. 2021); "
                        "--dp-clip is then its start")
    s.add_argument("--dp-target-quantile", dest="dp_target_quantile", type=float,
                   help="adaptive clip: share of updates left unclipped (default 0.5)")
    s.add_argument("--dp-max-clip", dest="dp_max_clip", type=float,
                   help="adaptive clip: the largest clip (default: --dp-clip, so the clip only shrinks from its start; "
                        "it sizes the secure-sum range)")
    s.add_argument("--dp-count-stddev", dest="dp_count_stddev", type=float,
                   help="adaptive clip: noise std on the clipped count (default: participants / 20; "
                        "must exceed the noise multiplier / 2)")
    s.add_argument("--uplink", help="fp32 | quant | randomk | rank (how updates travel to the server)")
    s.add_argument("--uplink-bits", dest="uplink_bits", type=int,
                   help="bits per transmitted value (without --uplink: implies quant)")
    s.add_argument("--uplink-fraction", dest="uplink_fraction", type=float,
                   help="randomk: share of coordinates sent (without --uplink: implies randomk)")
    s.add_argument("--uplink-rank", dest="uplink_rank", type=int,
                   help="rank: columns of each projection (without --uplink: implies rank)")
    s.add_argument("--uplink-residual-decay", dest="uplink_residual_decay", type=float,
                   help="randomk/rank: damp the error-feedback residual by this each round, in (0, 1] "
                        "(default 1: plain error feedback)")
    s.add_argument("--policy", metavar="FILE.toml", help="governance policy (organisations, what may cross)")
    r = p.add_argument_group("ranks ([runtime])")
    r.add_argument("--parts", type=int, help="ranks: 1 = server and clients in this process; W > 1 = rank 0 "
                                            "serves, clients spread over ranks 1..W-1 (local gloo ranks)")
    r.add_argument("--threads", type=int, help="intra-op threads per rank (0 = cores / ranks)")
    r.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, metavar="K",
                   help="checkpoint every rank's state every K rounds (0 = never), for --resume")
    r.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a stopped federated run from its newest checkpoint, with its own config "
                        "(only --rounds, --quiet and --checkpoint-every may change)")
    o = p.add_argument_group("output ([output])")
    o.add_argument("--out", help="run folder (default: runs/federate-<dataset>-<algorithm>-<time>)")
    o.add_argument("--quiet", action="store_const", const=True, help="no per-evaluation lines")


# ------------------------------------------------------------------ configuration
_IMPLIED_CODEC = (("uplink_fraction", "randomk"), ("uplink_rank", "rank"), ("uplink_bits", "quant"))
"""A codec parameter given without ``--uplink`` (and no codec in the file) picks its codec."""


def _get(data: Mapping[str, Any], dotted: str) -> Any:
    for head in dotted.split("."):
        if not isinstance(data, Mapping) or head not in data:
            return None
        data = data[head]
    return data


def resolve_federate_config(toml_path: str | None, flags: Mapping[str, Any], env: Mapping[str, str]) -> Any:
    """File (checked on its own, strictly), then the flags given, then ``COMMGNN_DATA_ROOT``
    when no data root is set; one :class:`FederateConfig`, validated once."""
    from commgnn.config import from_dict, load_checked_toml, replace_path, set_path
    from commgnn.federated.config import FederateConfig

    data: dict[str, Any] = {}
    if toml_path:
        data = load_checked_toml(FederateConfig, toml_path)
    flags = {k: v for k, v in flags.items() if v is not None}
    if "uplink" not in flags and _get(data, "uplink.codec") in (None, "fp32"):
        implied = [(dest, codec) for dest, codec in _IMPLIED_CODEC if dest in flags]
        if len({codec for _, codec in implied if codec != "quant"}) > 1:
            raise UserError("--uplink-fraction (randomk) and --uplink-rank (rank) name different codecs; "
                            "pick one with --uplink")
        if implied:
            flags["uplink"] = implied[0][1]
    if "client_map" in flags and "split" not in flags and _get(data, "split.method") is None:
        flags["split"] = "file"
    for dest, key in FLAG_KEYS.items():
        if dest in flags:
            set_path(data, key, flags[dest])
    if "seed" in flags:
        for key in SEED_KEYS:
            set_path(data, key, flags["seed"])
    cfg = from_dict(FederateConfig, data)
    if cfg.data.root is None and env.get("COMMGNN_DATA_ROOT"):
        cfg = replace_path(cfg, "data.root", env["COMMGNN_DATA_ROOT"])
    _check_flags_apply(cfg, flags)
    return cfg


def _check_flags_apply(cfg: Any, flags: Mapping[str, Any]) -> None:
    """A flag given on the command line that the resolved run would ignore is an error."""
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


def __getattr__(name: str) -> Any:
    """The run folder's name and the pre-flight live in :mod:`commgnn.runner.federate` (the
    run itself in :mod:`commgnn.api.federate`); their old names here are imported on first
    use, so that building the parser stays cheap."""
    if name in ("default_out_dir", "preflight"):
        from commgnn.runner import federate

        return getattr(federate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cmd_federate(ns: argparse.Namespace) -> int:
    from commgnn.api.federate import resume_federated, run_federation

    flags = {dest: getattr(ns, dest, None) for dest in (*FLAG_KEYS, "seed")}
    if getattr(ns, "resume", None):
        given = {dest for dest, value in flags.items() if value is not None} - {"rounds", "quiet", "checkpoint_every"}
        if given or ns.config:
            name = "config" if ns.config else sorted(given)[0]
            raise UserError(f"--resume continues the run as its config.toml says; --{name.replace('_', '-')} "
                            f"cannot be given with it (only --rounds, --quiet and --checkpoint-every)")
        result = resume_federated(ns.resume, rounds=flags["rounds"], quiet=flags["quiet"],
                                  checkpoint_every=flags["checkpoint_every"], env=os.environ)
    else:
        result = run_federation(resolve_federate_config(ns.config, flags, os.environ), env=os.environ)
    if result is None:  # a torchrun rank other than 0: the server reports
        return 0
    summary, out = result.summary, result.run_dir
    worst = summary.get("worst_client_acc")
    worst_text = "n/a" if worst is None else f"{worst:.4f}"
    line = (f"test accuracy {summary['test_acc']:.4f} (best val round {summary.get('best_round')})  "
            f"worst client {worst_text}  uplink {summary['uplink_bytes_total'] / MB:.3f} MB")
    if "epsilon" in summary:
        line += f"  epsilon {summary['epsilon']:.3f} (delta {summary['delta']:g})"
    print(f"{line} -> {out}")
    return 0
