"""Each option is declared once (:mod:`commgnn.options`): from a config root's fields and
one table come the flags, ``--help``, the flag-to-key map, the ``--resume`` list, the Python
keywords and the reference. These tests hold every root to it: each field is reachable from
TOML and from Python, each flag sets a field, and the reference lists every key."""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
from typing import Any

import pytest

from commgnn.api import option_sets
from commgnn.cli.main import build_parser, main
from commgnn.config import dump_toml, load_checked_toml, set_path, to_dict
from commgnn.errors import ConfigError
from commgnn.options import OptionSet, default_text, opt

SETS = option_sets()
NOT_OPTIONS = {"help", "config", "resume", "cleanup", "train_args"}
"""Parser arguments that are no config key: help, the file itself, a run to continue, the
emulated cluster's clean-up and its job."""


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part, None)
    return cfg


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_option_names_a_field_once(name):
    s = SETS[name]
    s.check()  # every key a leaf field, no key, keyword or flag twice
    covered = {k for o in s.options for k in o.keys}
    assert covered == set(s.leaves), f"fields without an option: {sorted(set(s.leaves) - covered)}"


@pytest.mark.parametrize("name", ["run", "federate", "cluster", "plan", "calibrate"])
def test_every_field_is_reachable_from_python_and_toml(name, tmp_path):
    s = SETS[name]
    default = s.root()
    for o in s.options:
        value = s.default(o.key)
        if value is None:  # TOML has no null: a key that is off by default is checked by type below
            continue
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        # Python: the keyword sets its key(s)
        cfg = s.resolve(None, {o.dest: value}, {})
        for key in o.keys:
            got = _get(cfg, key)  # the value, or the table __post_init__ widens it into (bits = 32)
            assert got == value or got == _get(default, key) or default_text(got) == default_text(value), \
                (o.dest, key, got)
        # TOML: the key, alone in its table, is accepted and read back
        data: dict[str, Any] = {}
        set_path(data, o.key, list(value) if isinstance(value, tuple) else value)
        path = tmp_path / "one.toml"
        path.write_text(dump_toml(data))
        assert load_checked_toml(s.root, path) == tomllib.loads(path.read_text())


def test_a_keyword_changes_its_field():
    """Non-default values through keywords land where the reference says."""
    run = SETS["run"]
    cfg = run.resolve(None, {"weight_decay": 1e-3, "grad": "topk", "grad_momentum": 0.5, "optimizer": "sgd", "synthetic_num_nodes": 300,
                             "partition_seed": 7, "allow_mask_overlap": True}, {})
    assert cfg.train.weight_decay == 1e-3 and cfg.comm.grad.momentum == 0.5
    assert cfg.data.synthetic.num_nodes == 300 and cfg.partition.seed == 7 and cfg.data.allow_mask_overlap
    fed = SETS["federate"].resolve(None, {"weight_decay": 1e-3, "seed": 5, "dp_noise_at": "server"}, {})
    assert fed.federated.weight_decay == 1e-3 and fed.dp.noise_at == "server"
    assert fed.federated.seed == fed.split.seed == 5  # --seed sets both


def test_weight_decay_is_a_flag_and_a_keyword():
    from commgnn.api.train import _config
    from commgnn.cli.common import given
    from commgnn.runner.config import resolve_config

    assert _config(None, {"weight_decay": 1e-3}).train.weight_decay == 1e-3
    with pytest.raises(ConfigError, match="unknown option 'weight_decy'"):
        _config(None, {"weight_decy": 1e-3})
    ns = build_parser({"train"}).parse_args(["train", "--weight-decay", "0.002", "--no-sparse-setup"])
    cfg = resolve_config(None, given(ns), {})
    assert cfg.train.weight_decay == 0.002 and cfg.comm.halo.sparse_setup is False


def test_commgnn_train_takes_weight_decay(tmp_path):
    """The whole path: ``commgnn.train(weight_decay=...)`` trains and records it."""
    import commgnn

    res = commgnn.train(parts=2, epochs=2, hidden=8, quiet=True, weight_decay=0.0, synthetic_num_nodes=200,
                        energy_track=False, out=tmp_path / "run")
    assert tomllib.loads((res.run_dir / "config.toml").read_text())["train"]["weight_decay"] == 0.0


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_flag_maps_to_a_field():
    subs = _subparsers(build_parser())
    owners = {"train": ["run"], "federate": ["federate"], "cluster": ["cluster"], "plan": ["plan", "run"],
              "calibrate": ["calibrate"], "partition": ["run"]}
    for command, names in owners.items():
        for action in subs[command]._actions:
            if action.dest in NOT_OPTIONS or (command == "partition" and action.dest == "out"):
                continue
            hits = [SETS[n].by_dest[action.dest] for n in names if action.dest in SETS[n].by_dest]
            assert hits, f"commgnn {command} {action.option_strings}: no config key"
            for o in hits:
                for key in o.keys:
                    assert key in SETS[names[0] if o in SETS[names[0]].options else names[1]].leaves


def test_a_flag_that_maps_to_nothing_is_refused():
    bad = OptionSet("bad", lambda: _Tiny, (opt("nope.x", "--x"),))
    with pytest.raises(ValueError, match="no leaf field"):
        bad.check()
    twice = OptionSet("twice", lambda: _Tiny, (opt("a", "--a"), opt("b", "--a", dest="bb")))
    with pytest.raises(ValueError, match="declared twice"):
        twice.check()


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Tiny:
    a: int = 1
    """A."""
    b: int = 2
    """B."""


@pytest.mark.parametrize("name", sorted(SETS))
def test_the_reference_lists_every_key_with_its_default_and_type(name):
    s = SETS[name]
    rows = s.reference()
    assert {r["key"] for r in rows} == set(s.leaves)
    for r in rows:
        assert r["type"] and r["default"] and r["help"], r
        assert "(" not in r["default"] or r["default"].startswith("("), r  # no tuple reprs
    run = {r["key"]: r for r in SETS["run"].reference()}
    assert run["minibatch.fanout"]["default"] == "15,10" and run["minibatch.fanout"]["type"] == "list of int"
    assert run["train.weight_decay"]["flag"] == "--weight-decay" and run["train.weight_decay"]["keyword"] == "weight_decay"
    assert run["output.quiet"]["default"] == "off" and run["partition.objective"]["type"] == "'cut' | 'vol'"


def test_help_groups_flags_by_table_and_writes_defaults_as_users_do(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "(default: 15,10)" in text and "(15, 10)" not in text
    sections = re.split(r"\n(?=\S[^\n]*:\n)", text)
    titles = [sec.split("\n", 1)[0] for sec in sections]
    for table in ("[data]:", "[model]:", "[train]:", "[comm.halo]:", "[comm.grad]:", "[minibatch]:", "[fetch]:"):
        assert table in titles, titles
    ungrouped = next(sec for sec in sections if sec.startswith("options:"))
    assert re.findall(r"^  (--[\w-]+)", ungrouped, re.M) == ["--config", "--resume"]
    biggest = max(len(re.findall(r"^  -", sec, re.M)) for sec in sections)
    assert biggest < 39  # no one section of everything
    assert "--gc-freeze, --no-gc-freeze" in text and "(default: off)" in text


def test_the_resume_list_comes_from_the_declarations(tmp_path, capsys):
    run = SETS["run"]
    assert set(run.resume_dests) == {"epochs", "quiet", "timeout", "threads", "port", "checkpoint_every",
                                     "memory_limit_gb", "force", "gc_freeze"}
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "manifest.json").write_text("{}")
    assert main(["train", "--resume", str(tmp_path), "--weight-decay", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "--weight-decay cannot be given with it" in err and "only --epochs" in err and "--[no-]gc-freeze" in err


def test_one_resume_check_for_train_federate_and_python(tmp_path, capsys):
    """``OptionSet.check_resume`` is the one rule: the same line from ``commgnn train
    --resume``, ``commgnn federate --resume``, ``commgnn.resume`` and ``resume_federated``."""
    import commgnn
    from commgnn.api.federate import resume_federated
    from commgnn.errors import UserError
    from commgnn.federated.options import FEDERATE_OPTIONS

    run, fed = SETS["run"], FEDERATE_OPTIONS
    run.check_resume({"epochs": 3, "quiet": True, "lr": None})  # None: not given
    with pytest.raises(UserError, match=r"^--resume continues the run as its config.toml says: --lr cannot be "
                                        r"given with it \(only --epochs, .* may change\)$"):
        run.check_resume({"epochs": 3, "lr": 0.1})
    with pytest.raises(UserError, match="--config cannot be given with it"):
        run.check_resume({"config": "x.toml"})
    with pytest.raises(UserError, match=r"--clients cannot be given with it \(only --rounds"):
        fed.check_resume({"clients": 3})
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(UserError, match="--lr cannot be given with it"):
        commgnn.resume(tmp_path, lr=0.1)
    fed_dir = tmp_path / "fed"
    fed_dir.mkdir()
    (fed_dir / "config.toml").write_text("[federated]\n")
    with pytest.raises(UserError, match="--clients cannot be given with it"):
        resume_federated(fed_dir, clients=3)
    with pytest.raises(UserError, match="--clients cannot be given with it"):
        commgnn.resume(fed_dir, clients=3)
    assert main(["train", "--resume", str(tmp_path), "--config", str(tmp_path / "config.toml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_flag_keys_stays_a_deprecated_derived_name():
    """``FLAG_KEYS`` was replaced by ``OptionSet.flag_keys``; the old names still answer, for
    one release, with a DeprecationWarning."""
    import commgnn.federated.options as fed_options
    import commgnn.runner.config as run_config
    from commgnn.federated.options import FEDERATE_OPTIONS
    from commgnn.runner.config import RUN_OPTIONS

    keys = RUN_OPTIONS.flag_keys
    assert keys["epochs"] == "train.epochs" and keys["energy_track"] == "energy.track"
    assert keys["weight_decay"] == "train.weight_decay" and FEDERATE_OPTIONS.flag_keys["secure_agg"] == "secagg.enabled"
    with pytest.warns(DeprecationWarning, match="RUN_OPTIONS.flag_keys"):
        assert run_config.FLAG_KEYS == keys
    with pytest.warns(DeprecationWarning, match="FEDERATE_OPTIONS.flag_keys"):
        assert fed_options.FLAG_KEYS == FEDERATE_OPTIONS.flag_keys