"""Small checks of the command line's configuration, help, console output and byte matrix."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from typing import Any

import pytest
import torch
from rich.console import Console

from commgnn.runner.config import RUN_OPTIONS, RunConfig, config_from_partition_dir, resolve_config
from commgnn.cli.main import main
from commgnn.config import from_dict
from commgnn.distributed.context import DistContext
from commgnn.distributed.events import CommEvent, Hooks
from commgnn.errors import ConfigError, PartitionError
from commgnn.metrics import Meter
from commgnn.metrics.meter import CLASSES
from commgnn.models import ModelConfig
from commgnn.partition import PartitionConfig, assign_parts, build_local_partition
from commgnn.report.console import EpochProgress, plain_epochs, print_summary
from commgnn.trainers import FullGraphTrainer, TrainConfig
from helpers import run_on_ranks, small_graph

SMALL = """
[data.synthetic]
num_nodes = 400
num_classes = 3
avg_degree = 6.0
feature_dim = 8
[model]
hidden = 8
[train]
epochs = 2
[output]
quiet = true
"""


# 1. a saved partition directory's own settings are the run's

def test_config_from_partition_dir_takes_the_directory_settings(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(SMALL)
    parts = tmp_path / "parts"
    assert main(["partition", "--config", str(toml), "--parts", "2", "--objective", "vol", "--seed", "3",
                 "--out", str(parts)]) == 0
    meta = json.loads((parts / "meta.json").read_text())
    assert (meta["method"], meta["objective"], meta["seed"]) == ("metis", "vol", 3)
    cfg = resolve_config(str(toml), {"parts": 2, "partition_dir": str(parts)}, {})
    assert cfg.partition.objective == "cut"  # what the flags alone say
    got = config_from_partition_dir(cfg)
    assert (got.partition.method, got.partition.objective, got.partition.seed) == ("metis", "vol", 3)
    assert got.partition.dir == str(parts) and replace(got, partition=cfg.partition) == cfg
    # the directory wins over flags that say otherwise
    other = resolve_config(str(toml), {"parts": 2, "partition_dir": str(parts), "partitioner": "random"}, {})
    assert config_from_partition_dir(other).partition.method == "metis"
    # no directory: nothing changes; a broken one is a one-line partition error
    assert config_from_partition_dir(resolve_config(None, {}, {})) == RunConfig()
    meta["objective"] = "nope"
    (parts / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match=r"meta.json records an invalid partition setting .*objective"):
        config_from_partition_dir(cfg)
    with pytest.raises(PartitionError, match="not found"):
        config_from_partition_dir(replace(cfg, partition=replace(cfg.partition, dir=str(tmp_path / "none"))))


# 3. an error inside an optional table names its own key

def test_error_inside_an_optional_table_names_the_key():
    with pytest.raises(ConfigError) as exc:
        resolve_config(None, {"gossip": "ring", "gossip_method": "nope"}, {})
    msg = str(exc.value)
    assert msg.startswith("comm.gossip.method: 'nope' is not one of ") and "'pushsum'" in msg, msg
    with pytest.raises(ConfigError, match=r"^comm.gossip.average_every must be >= 0"):
        resolve_config(None, {"gossip": "ring", "gossip_average_every": -1}, {})
    with pytest.raises(ConfigError, match=r"^unknown config key 'comm.gossip.topolgy'"):
        from_dict(RunConfig, {"comm": {"gossip": {"topolgy": "ring"}}})
    with pytest.raises(ConfigError, match=r"^comm.gossip: expected a table, got int"):
        from_dict(RunConfig, {"comm": {"gossip": 3}})
    with pytest.raises(ConfigError, match=r"^comm.halo.bits.forward must be one of"):
        from_dict(RunConfig, {"comm": {"halo": {"bits": {"forward": 3}}}})


def test_unknown_gossip_method_on_the_command_line_is_one_line(tmp_path, capsys):
    assert main(["train", "--gossip", "ring", "--gossip-method", "nope", "--parts", "2", "--epochs", "1",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("commgnn: error: comm.gossip.method: 'nope' is not one of 'dpsgd'"), err
    assert "\n" not in err and not (tmp_path / "run").exists()


# 4. the file is validated on its own before flags are merged

@pytest.mark.parametrize("text, flags, expected", [
    ('[model]\nhidden = "sixteen"\n', {"hidden": 16}, r"model.hidden: expected int, got str \('sixteen'\)"),
    ("[model]\nhiden = 3\n", {"hidden": 16}, "unknown config key 'model.hiden'"),
    ('[comm.gossip]\nmethod = 3\n', {"gossip_method": "pushsum"}, "comm.gossip.method"),
    ('[comm.halo]\nbits = "eight"\n', {"bits": 8}, "comm.halo.bits: expected int or a table or 'adaptive'"),
    ('[comm.halo.staleness]\nmax_age = 1.5\n', {"max_age": 2}, "comm.halo.staleness.max_age: expected int"),
])
def test_the_file_is_checked_before_flags_override_it(tmp_path, text, flags, expected):
    f = tmp_path / "run.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=expected) as exc:
        resolve_config(str(f), flags, {})
    assert str(exc.value).startswith(f"config file {f}: ")


def test_a_file_that_flags_complete_is_accepted(tmp_path):
    """Only keys and types are checked alone: settings that belong together may come from both."""
    f = tmp_path / "run.toml"
    f.write_text('[comm.halo]\nbits = "adaptive"\n[comm.grad]\nmomentum = 0.9\n')
    cfg = resolve_config(str(f), {"budget_mb": 0.5, "grad": "topk", "optimizer": "sgd"}, {})
    assert cfg.comm.halo.budget_mb == 0.5 and cfg.comm.grad.momentum == 0.9


# 5. --help shows the config defaults

def test_help_shows_the_config_defaults(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    d = RunConfig()
    for flag, help_text, value in [
        ("--hidden HIDDEN", "hidden width", d.model.hidden),
        ("--epochs EPOCHS", "maximum epochs", d.train.epochs),
        ("--lr LR", "learning rate", d.train.lr),
        ("--dropout DROPOUT", "dropout rate", d.model.dropout),
        ("--timeout TIMEOUT", "collective time-out in seconds", f"{d.runtime.timeout_s:g}"),
        ("--parts PARTS", "number of partitions / ranks P", d.runtime.parts),
        ("--objective OBJECTIVE", "METIS objective: cut | vol", d.partition.objective),
        ("--staleness STALENESS", "none | pipeline | skip", d.comm.halo.staleness.mode),
        ("--grad GRAD", "signsgd", d.comm.grad.strategy),
    ]:
        assert f"{flag} {help_text} (default: {value})" in text or \
            re.search(re.escape(flag) + r" [^-]*" + re.escape(f"{help_text} (default: {value})"), text), flag
    assert "--quiet no progress bar or table (default: off)" in text
    assert "(default: dpsgd)" in text  # --gossip-method: the table's own default
    assert text.count("(default:") >= len(RUN_OPTIONS.flag_keys) - 3  # every config flag shows one
    with pytest.raises(SystemExit):
        main(["partition", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"--seed SEED partitioner seed (default: {PartitionConfig().seed})" in text


def test_default_reads_the_default_config():
    default = RUN_OPTIONS.default
    assert default("model.hidden") == RunConfig().model.hidden
    assert default("runtime.timeout_s") == RunConfig().runtime.timeout_s
    assert default(RUN_OPTIONS.by_dest["bits"].key) == 32  # as written in TOML, not the widened table
    assert default(RUN_OPTIONS.by_dest["gossip_method"].key) == "dpsgd"  # an optional table's own default
    assert default("partition.seed") == RunConfig().partition.seed
    for key in RUN_OPTIONS.flag_keys.values():
        default(key)
    with pytest.raises(KeyError):
        default("model.nope")


# 2. without a terminal: plain progress lines, nothing wrapped or cut

def _row(epoch: int) -> dict[str, Any]:
    return {"epoch": epoch, "loss": 1.0 / epoch, "val_acc": 0.5, "test_acc": 0.4,
            "halo_bytes": 123_456, "grad_bytes": 789}


def test_progress_without_a_terminal_prints_plain_lines():
    buf = io.StringIO()
    with EpochProgress(200, enabled=True, console=Console(file=buf)) as progress:
        for e in range(1, 201):
            progress.update(_row(e))
    lines = buf.getvalue().splitlines()
    assert [int(line.split()[1].split("/")[0]) for line in lines] == list(range(20, 201, 20))
    assert lines[-1] == "epoch 200/200  loss 0.0050  val 0.500  test 0.400  halo 123.46 KB/ep  grad 789 B/ep"
    # an early stop: the last epoch run is shown too
    buf = io.StringIO()
    with EpochProgress(200, enabled=True, console=Console(file=buf)) as progress:
        for e in range(1, 31):
            progress.update(_row(e))
    assert [line.split()[1] for line in buf.getvalue().splitlines()] == ["20/200", "30/200"]
    assert sorted(plain_epochs(3)) == [1, 2, 3] and len(plain_epochs(1000)) == 10
    buf = io.StringIO()
    with EpochProgress(5, enabled=False, console=Console(file=buf)) as progress:
        progress.update(_row(1))
    assert buf.getvalue() == ""


def test_summary_is_not_wrapped_without_a_terminal(capsys):
    summary = {"model": "gcn", "dataset": "a-very-long-dataset-name/" * 6, "parts": 2, "epochs_run": 5,
               "best_epoch": 3, "best_val_acc": 0.5, "test_acc": 0.4, "halo_bytes_per_epoch": 1e6,
               "halo_bytes_per_epoch_max_rank": 5e5, "grad_bytes_per_epoch": 1234, "total_bytes": 1e9,
               "epoch_time_s": 0.01, "comm_time_frac": 0.1, "wait_time_frac": 0.02, "peak_rss_mb": 300,
               "partition": {"edge_cut": 10, "comm_volume": 20}}
    out = "/tmp/" + "a-long-run-directory-[name]/" * 8
    print_summary(summary, out)  # stderr, captured: no terminal
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == f"run directory: {out}"
    assert lines[0] == f"commgnn: gcn on {summary['dataset']}, 2 ranks"
    assert any("halo bytes / epoch (busiest rank)" in line and "500.00 KB" in line for line in lines)


# 7. collectives are attributed to ring pairs in bytes_by_pair

def pairs_rank(ctx: DistContext, data: Any, parts: torch.Tensor) -> dict[str, Any]:
    hooks = Hooks()
    meter = Meter(ctx, 2)
    hooks.subscribe(meter)
    sent = torch.zeros(len(CLASSES), dtype=torch.float64)

    def count(ev: Any) -> None:
        if isinstance(ev, CommEvent):
            sent[CLASSES.index(ev.kind)] += ev.nbytes
    hooks.subscribe(count)
    part = build_local_partition(data, parts, ctx.world_size, ctx.rank)
    trainer = FullGraphTrainer(ctx, part, ModelConfig(name="gcn", hidden=8), TrainConfig(epochs=3, patience=0),
                               hooks)
    meter.end_setup()
    epochs = [meter.end_epoch(r.time_s).bytes_sum for r in trainer.run()]
    return {"totals": meter.totals(), "epochs": epochs, "setup": meter.setup, "sent": sent.tolist()}


def test_bytes_by_pair_holds_collectives_in_ring_pairs(tmp_path):
    data = small_graph(n=90, m=360)
    P = 3
    parts = assign_parts(data.edge_index, data.num_nodes, P, PartitionConfig(method="random"))
    res = run_on_ranks(pairs_rank, P, tmp_path, data, parts, timeout_s=120)
    totals = res[0]["totals"]
    for i, c in enumerate(CLASSES):
        pairs = torch.tensor(totals["bytes_by_pair"][c])
        total = sum(e[c] for e in res[0]["epochs"]) + res[0]["setup"][c]
        assert int(pairs.sum()) == total == sum(totals["bytes_by_layer"][c].values()), c
        for r in range(P):  # each row is what that rank sent
            assert int(pairs[r].sum()) == res[r]["sent"][i], (c, r)
            assert pairs[r, r] == 0
    for c in ("grad_sync", "control"):
        pairs = torch.tensor(totals["bytes_by_pair"][c])
        assert pairs.sum() > 0, c
        ring = torch.zeros(P, P, dtype=torch.bool)
        ring[torch.arange(P), (torch.arange(P) + 1) % P] = True
        assert (pairs[~ring] == 0).all() and (pairs[ring] > 0).all(), (c, pairs)
