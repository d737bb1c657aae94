"""``commgnn federate``: federated GNN training (FedAvg / FedProx over graph clients).

    commgnn federate --dataset cora --clients 5 --split louvain --rounds 100 \\
        --secure-agg --dp-epsilon 4 --uplink-bits 8 --policy policy.toml --out runs/fed

Every flag sets a key of :class:`commgnn.federated.config.FederateConfig`
(:data:`commgnn.federated.options.FEDERATE_OPTIONS`) and overrides ``--config FILE.toml``,
which is read strictly (unknown keys are errors).
The run folder holds ``config.toml`` (the resolved config), ``metrics.jsonl`` (one row per
evaluation), ``summary.json`` (the outcome, without the curve) and ``fairness.md``; it is
written as a hidden sibling and renamed into place at the end, so a failed run leaves
nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

from commgnn.cli.common import add_federate_arguments, given
from commgnn.errors import UserError
from commgnn.federated.options import FLAG_KEYS, SEED_KEYS, default_out_dir, resolve_federate_config  # noqa: F401

MB = 1e6


def add_parser(sub: Any, help: str) -> None:
    add_federate_arguments(sub.add_parser("federate", help=help))


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


def run(ns: argparse.Namespace) -> int:
    return cmd_federate(ns)


def cmd_federate(ns: argparse.Namespace) -> int:
    from commgnn.config import dump_toml, replace_path, to_dict
    from commgnn.report.records import prepare_out_dir, write_json

    from commgnn.distributed.context import launch_info_from_env

    cfg = resolve_federate_config(ns.config, given(ns), os.environ)
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
