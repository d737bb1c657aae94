"""``commgnn federate``: federated GNN training (FedAvg / FedProx over graph clients).

    commgnn federate --dataset cora --clients 5 --split louvain --rounds 100 \\
        --secure-agg --dp-epsilon 4 --uplink-bits 8 --policy policy.toml --out runs/fed

Every flag sets one key of :class:`commgnn.federated.config.FederateConfig` (:data:`FLAG_KEYS`)
and overrides ``--config FILE.toml``, which is read strictly (unknown keys are errors).
The run folder holds ``config.toml`` (the resolved config), ``metrics.jsonl`` (one row per
evaluation), ``summary.json`` (the outcome, without the curve) and ``fairness.md``; it is
written as a hidden sibling and renamed into place at the end, so a failed run leaves
nothing behind.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
from pathlib import Path
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


def _participants(cfg: Any, n_clients: int) -> int:
    """Clients drawn per round (as the engine draws them)."""
    return max(1, round(cfg.federated.participation * n_clients))


def preflight(cfg: Any, n_clients: int | None) -> None:
    """Refuse, before any data is loaded or round run, a plan that the policy forbids or a
    secure-aggregation threshold the clients cannot meet (``n_clients`` None: not known yet)."""
    if cfg.policy.path:
        from commgnn.federated.policy import load_policy

        policy = load_policy(cfg.policy.path)
        if n_clients is not None:
            policy.validate_for(n_clients)
        fed = cfg.federated
        policy.check_plan(secure_agg=cfg.secagg.enabled, embeddings_cross=fed.cross_edges == "embeddings",
                          embedding_bits=fed.embedding_bits, embedding_noise=fed.embedding_noise,
                          aggregator=fed.aggregator)
    if cfg.secagg.enabled and n_clients is not None and cfg.federated.algorithm in ("fedavg", "fedprox"):
        k = _participants(cfg, n_clients)
        cfg.secagg.threshold_count(k)
        if cfg.uplink.codec == "fp32":  # the fixed-point ring must hold k clients' sum
            cfg.secagg.check_clients(k)


def default_out_dir(cfg: Any) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = Path(cfg.data.dataset).stem if cfg.data.dataset.endswith(".pt") else cfg.data.dataset
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "graph"
    return Path("runs") / f"federate-{name}-{cfg.federated.algorithm}-{stamp}"


def _check_out_free(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"output directory {out} already exists and is not empty; choose another --out")


# ------------------------------------------------------------------ the command
def _progress(row: dict[str, Any]) -> str:
    text = (f"round {row['round']:>4d}  val {row['val_acc']:.4f}  test {row['test_acc']:.4f}  "
            f"uplink {row['uplink_bytes'] / MB:.3f} MB")
    if "epsilon" in row:
        text += f"  epsilon {row['epsilon']:.3f}"
    return text


def _jsonable(obj: Any) -> Any:
    """``obj`` with tensors and other non-JSON values turned into plain ones."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def cmd_federate(ns: argparse.Namespace) -> int:
    from commgnn.config import dump_toml, replace_path, to_dict
    from commgnn.report.records import prepare_out_dir, write_json

    from commgnn.distributed.context import launch_info_from_env

    flags = {dest: getattr(ns, dest, None) for dest in (*FLAG_KEYS, "seed")}
    cfg = resolve_federate_config(ns.config, flags, os.environ)
    info = launch_info_from_env(os.environ)  # under torchrun (or `commgnn cluster`): its ranks
    if info is not None:
        cfg = replace_path(cfg, "runtime.parts", info.world_size)
    preflight(cfg, None if cfg.split.method == "file" else cfg.split.clients)  # before any data is loaded
    out = Path(cfg.output.out) if cfg.output.out else default_out_dir(cfg)
    cfg = replace_path(cfg, "output.out", str(out))
    if info is None or info.rank == 0:  # under torchrun only the server writes (and checks) the folder
        _check_out_free(out)

    import torch

    from commgnn.distributed.context import threads_per_rank
    from commgnn.federated.engine import Federation
    from commgnn.federated.fairness import fairness_markdown
    from commgnn.federated.run import federate, run_rank

    if info is not None and info.rank != 0:  # a client rank: the server (rank 0) writes the folder
        run_rank(info, cfg, None, torchrun=True)
        return 0
    quiet = cfg.output.quiet
    federation = None
    if cfg.runtime.parts == 1 and info is None:  # server and clients here: the split is known before training
        torch.set_num_threads(threads_per_rank(cfg.runtime, 1))
        federation = Federation(cfg)
        preflight(cfg, int(federation.n_clients))

    staging = prepare_out_dir(out)
    try:
        (staging / "config.toml").write_text(dump_toml(to_dict(cfg)))
        written = 0
        with (staging / "metrics.jsonl").open("w") as metrics:
            def on_eval(row: dict[str, Any]) -> None:
                nonlocal written
                metrics.write(json.dumps(_jsonable(row)) + "\n")
                metrics.flush()
                written += 1
                if not quiet:
                    print(_progress(row), flush=True)

            # W > 1 ranks: rows come back with the server's summary (a callback cannot cross processes)
            if federation is not None:
                summary = federation.run(on_eval=on_eval)
            elif info is not None:  # rank 0 under torchrun: the server, in this process
                summary = run_rank(info, cfg, None, on_eval=on_eval, torchrun=True)
            else:
                summary = federate(cfg)
            assert summary is not None  # this process is the server (or launched the ranks)
            summary = dict(summary)
            curve = summary.pop("curve", None) or []
            if not written:  # rows that did not come through on_eval (another process's)
                metrics.writelines(json.dumps(_jsonable(row)) + "\n" for row in curve)
        write_json(staging / "summary.json", _jsonable(summary))
        (staging / "fairness.md").write_text(fairness_markdown(summary["fairness"]))
        if out.exists():
            out.rmdir()  # empty (checked by prepare_out_dir)
        staging.rename(out)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"cannot write the run folder {out}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    worst = summary.get("worst_client_acc")
    worst_text = "n/a" if worst is None else f"{worst:.4f}"
    line = (f"test accuracy {summary['test_acc']:.4f} (best val round {summary.get('best_round')})  "
            f"worst client {worst_text}  uplink {summary['uplink_bytes_total'] / MB:.3f} MB")
    if "epsilon" in summary:
        line += f"  epsilon {summary['epsilon']:.3f} (delta {summary['delta']:g})"
    print(f"{line} -> {out}")
    return 0
