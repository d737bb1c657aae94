"""commgnn plan: probes, ranking by predicted time to accuracy, a config train accepts."""

from __future__ import annotations

import json
import tomllib

import pytest

from commgnn.runner.config import resolve_config
from commgnn.cli.main import main
from commgnn.comm.config import BitsConfig
from commgnn.netmodel import ClusterModel
from commgnn.planner import candidates, choose, plan, still_rising


def test_the_grid_fits_the_model():
    gcn = candidates(resolve_config(None, {"model": "gcn"}, {}))
    assert "precompute + transform-first" in gcn and "mini-batch neighbour" not in gcn
    sage = candidates(resolve_config(None, {"model": "sage", "layers": 3}, {}))
    assert sage["mini-batch neighbour"]["minibatch.fanout"] == [15, 10, 5]
    assert "precompute + transform-first" not in sage


def test_a_probe_is_scored_with_the_measured_compute_scale_and_its_set_up(tmp_path):
    """The default compute scale is the exact probe's alone/shared ratio, at most 1 (cores /
    ranks only where it was not measured); the time to accuracy starts with the set-up,
    which the per-epoch estimate leaves out."""
    import os

    from commgnn.planner import _score, measured_compute_scale

    m = ClusterModel.written(1, 2, 1e9)
    pairs = {"halo_fwd": [[0, 1000], [1000, 0]]}
    (tmp_path / "summary.json").write_text(json.dumps({
        "bytes_by_pair": pairs, "bytes_by_layer": {"halo_fwd": {"0": 2000, "other": 0}},
        "peak_rss_mb_by_rank": [1.0, 1.0], "compute_shared_over_alone": 4.0, "setup_s": 2.0}))
    rows = [{"epoch": e, "val_acc": 0.5, "total_bytes": 1000, "bytes": {"halo_fwd": 1000}, "epoch_s": 1.0,
             "time_busiest_s": {"compute": 0.8, "comm": 0.1}} for e in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scale = measured_compute_scale(tmp_path, 2)
    assert scale == 0.25
    vals, cum, comm, _, setup = _score(tmp_path, m, scale)
    assert setup == pytest.approx(0.25 * 2.0)
    assert cum[0] == pytest.approx(setup + 0.25 * 0.8 + comm)  # set-up, then epoch 1
    assert cum[1] - cum[0] == pytest.approx(0.25 * 0.8 + comm)
    assert _score(tmp_path, m, 1.0)[1][0] == pytest.approx(2.0 + 0.8 + comm)
    # what the probe link's model left unexplained joins every epoch's communication (not the
    # set-up), half overlapping it: here comm << 0.3, so each epoch gains 0.3 - comm / 2
    from commgnn.netmodel.predict import with_overhead

    joined = _score(tmp_path, m, scale, 0.3)[1]
    step = with_overhead(comm, 0.3) - comm
    assert step == pytest.approx(0.3 - comm / 2)
    assert joined[0] == pytest.approx(cum[0] + step) and joined[1] == pytest.approx(cum[1] + 2 * step)
    # priced beside the probes' own link (the same model here): no excess price hides the
    # overhead, so it adds in full
    beside = _score(tmp_path, m, scale, 0.3, reference=m)[1]
    assert beside[0] == pytest.approx(cum[0] + 0.3) and beside[1] == pytest.approx(cum[1] + 0.6)
    # hosts that share the probes' cores: no epoch is shorter than the probe's own compute
    # (0.8 s here, against 0.25 x 0.8 + comm priced with scaled compute)
    floored = _score(tmp_path, m, scale, shared_cores=True)[1]
    assert 0.25 * 0.8 + comm < 0.8
    assert floored[0] == pytest.approx(setup + 0.8) and floored[1] - floored[0] == pytest.approx(0.8)
    assert _score(tmp_path, m, 1.0, shared_cores=True)[1] == pytest.approx(_score(tmp_path, m, 1.0)[1])
    summary = json.loads((tmp_path / "summary.json").read_text())
    summary["compute_shared_over_alone"] = 0.5  # alone slower than shared (noise): never scaled up
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert measured_compute_scale(tmp_path, 2) == 1.0
    del summary["compute_shared_over_alone"]  # not measured
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert measured_compute_scale(tmp_path, 64) == pytest.approx(min(1.0, (os.cpu_count() or 1) / 64))


@pytest.mark.slow  # two probe runs; the grid and argument tests run in CI
@pytest.mark.timeout(240)
def test_plans_are_ranked_by_predicted_time_to_target_and_the_best_is_a_train_config(tmp_path, capsys):
    toml = tmp_path / "small.toml"
    toml.write_text("[data.synthetic]\nnum_nodes = 1500\n")
    base = resolve_config(str(toml), {}, {})
    slow = ClusterModel.written(2, 1, 10e6)  # 10 Mbit/s: bytes dominate
    ranked = plan(base, slow, tolerance=2.0, probe_epochs=6, workdir=tmp_path / "wd", names=["4-bit halo"],
                  log=lambda *_: None)
    by = {r.name: r for r in ranked}
    assert set(by) == {"exact", "4-bit halo"}
    # training halos shrink 8x; evaluation stays exact
    assert by["4-bit halo"].bytes_per_epoch < by["exact"].bytes_per_epoch / 1.5
    assert by["4-bit halo"].comm_s < by["exact"].comm_s
    reached = [r.time_to_target_s for r in ranked if r.time_to_target_s is not None]
    assert reached == sorted(reached) and by["exact"].time_to_target_s is not None
    # with the probes' link calibrated, each plan's residual there (times the compute scale)
    # is added to its epochs; the probes in the workdir are reused
    from commgnn.netmodel.predict import residual_s, with_overhead
    from commgnn.planner import measured_compute_scale

    loop = ClusterModel.written(1, 2, 1e11, intra_rate_bps=1e11)
    again = {r.name: r for r in plan(base, slow, tolerance=2.0, probe_epochs=6, workdir=tmp_path / "wd",
                                     names=["4-bit halo"], log=lambda *_: None, probe_model=loop)}
    scale = measured_compute_scale(tmp_path / "wd" / "exact", 2)
    for name, d in (("exact", "exact"), ("4-bit halo", "4-bit-halo")):
        expect = scale * residual_s(tmp_path / "wd" / d, loop)
        assert again[name].overhead_s == pytest.approx(expect) and expect > 0
        # nothing pipelined: each epoch's priced link time is the plan's comm_s
        joined = with_overhead(by[name].comm_s, expect) - by[name].comm_s
        assert again[name].epoch_s == pytest.approx(by[name].epoch_s + joined)
        assert expect / 2 - 1e-12 <= joined <= expect + 1e-12  # half overlapping at least: float rounding
    # the CLI reuses the probes in --workdir and writes a config train accepts
    out = tmp_path / "plan.toml"
    assert main(["plan", "--config", str(toml), "--hosts", "2", "--rate", "10mbit", "--tolerance", "2",
                 "--probe-epochs", "6", "--plans", "4-bit halo", "--workdir", str(tmp_path / "wd"),
                 "--out", str(out)]) == 0
    written = json.loads(out.with_suffix(".json").read_text())
    assert [r["name"] for r in written] == [r.name for r in ranked]  # the same probes, ranked as by the API call
    (chosen,) = [r["name"] for r in written if r["chosen"]]
    assert chosen == choose(ranked).name  # the CLI's --min-gain default is choose()'s
    # either plan may win (the ranking includes measured set-up and compute times); the
    # written config must carry the winner's levers. `bits` always resolves to a
    # BitsConfig, so comparing it with the int 32 (as this test once did) was always unequal
    # and failed whenever "exact" won.
    cfg = resolve_config(str(out), {}, {})
    want = BitsConfig(forward=4, backward=4) if chosen == "4-bit halo" else BitsConfig()
    assert cfg.runtime.parts == 2 and cfg.comm.halo.bits == want
    assert f"chosen: {chosen}" in capsys.readouterr().out


@pytest.mark.slow  # four probes of up to 60 epochs; the flag test below runs in CI
@pytest.mark.timeout(240)
def test_auto_probes_run_as_long_as_exact_takes_to_converge(tmp_path):
    toml = tmp_path / "small.toml"
    toml.write_text("[data.synthetic]\nnum_nodes = 600\n[train]\nepochs = 60\n")
    base = resolve_config(str(toml), {}, {})
    lines: list[str] = []
    net = ClusterModel.written(2, 1, 1e9)
    ranked = plan(base, net, tolerance=1.0, probe_epochs=None, probe_patience=3, workdir=tmp_path / "wd",
                  names=["8-bit halo"], log=lines.append)
    by = {r.name: r for r in ranked}
    exact = by["exact"].probe_epochs
    assert 3 < exact < 60  # stopped by the patience, not the cap
    assert by["8-bit halo"].probe_epochs == exact and not by["exact"].still_rising
    assert any(f"stopped after {exact} epochs" in line for line in lines)
    # a rerun in the same workdir reuses both probes; a fixed length different from theirs reruns them
    lines.clear()
    plan(base, net, tolerance=1.0, probe_epochs=None, probe_patience=3, workdir=tmp_path / "wd",
         names=["8-bit halo"], log=lines.append)
    assert not any(line.startswith("probe: exact (") for line in lines)
    short = plan(base, net, tolerance=1.0, probe_epochs=exact - 1, workdir=tmp_path / "wd", names=["8-bit halo"],
                 log=lines.append)
    assert {r.probe_epochs for r in short} == {exact - 1}


def test_a_probe_link_model_must_have_the_clusters_rank_count(tmp_path):
    from commgnn.errors import UserError

    with pytest.raises(UserError, match="--parts 4"):
        plan(resolve_config(None, {}, {}), ClusterModel.written(2, 2, 1e9), tolerance=1.0, probe_epochs=2,
             workdir=tmp_path, probe_model=ClusterModel.written(1, 2, 1e9), log=lambda *_: None)
    assert not any(tmp_path.iterdir())  # refused before any probe ran


def test_still_rising_means_the_best_came_in_the_last_fifth():
    assert still_rising([0.1, 0.2, 0.3, 0.4, 0.5])
    assert not still_rising([0.1, 0.5, 0.5, 0.5, 0.5])  # a plateau since epoch 2
    assert not still_rising([0.5, 0.4, 0.3, 0.2, 0.1])
    assert still_rising([0.1] * 9 + [0.2]) and not still_rising([0.1] * 6 + [0.2] + [0.1] * 4)


@pytest.mark.slow  # two probe runs; the rule itself is tested above
def test_a_probe_still_rising_is_flagged(tmp_path):
    toml = tmp_path / "small.toml"
    toml.write_text("[data.synthetic]\nnum_nodes = 600\n")
    lines: list[str] = []
    ranked = plan(resolve_config(str(toml), {}, {}), ClusterModel.written(2, 1, 1e9), tolerance=1.0, probe_epochs=3,
                  workdir=tmp_path / "wd", names=["8-bit halo"], log=lines.append)
    exact = next(r for r in ranked if r.name == "exact")
    # three epochs from a random start: the best is (almost surely) the last
    assert exact.still_rising == any(line.startswith("warning: the exact probe was still improving") for line in lines)
    assert exact.still_rising


def test_plan_shared_cores_flag_reaches_the_planner(tmp_path, monkeypatch):
    """``--shared-cores`` is passed to :func:`commgnn.planner.plan` (off unless asked)."""
    import commgnn.planner

    seen = []

    def fake_plan(*args, **kwargs):
        seen.append(kwargs["shared_cores"])
        raise commgnn.planner.UserError("stop here")

    monkeypatch.setattr(commgnn.planner, "plan", fake_plan)
    for extra in ([], ["--shared-cores"]):
        assert main(["plan", "--out", str(tmp_path / "p.toml"), "--probe-epochs", "2", *extra]) == 2
    assert seen == [False, True]


def test_plan_cli_writes_the_cheaper_epoch_of_a_near_tie_and_says_why(tmp_path, monkeypatch, capsys):
    """The CLI writes :func:`choose`'s plan: of two plans 1% apart, the cheaper epoch's levers
    (4-bit rows), with a line naming both; ``--min-gain 0`` writes the fastest."""
    import commgnn.planner
    from commgnn.planner import PlanResult

    ranked = [PlanResult("precompute", {"comm.halo.precompute": True}, 0.93, 0.763, 0.5, 31.4, 37e6),
              PlanResult("precompute + 4-bit", {"comm.halo.precompute": True, "comm.halo.bits": 4},
                         0.93, 0.647, 0.4, 31.7, 30e6),
              PlanResult("exact", {}, 0.93, 18.4, 17.4, 609.6, 771e6)]
    monkeypatch.setattr(commgnn.planner, "plan", lambda *a, **k: ranked)
    out = tmp_path / "p.toml"
    assert main(["plan", "--out", str(out), "--probe-epochs", "2"]) == 0
    said = capsys.readouterr().out
    assert "precompute + 4-bit is predicted within 10% of precompute's" in said
    written = tomllib.loads(out.read_text())["comm"]["halo"]
    assert written["bits"] == {"forward": 4, "backward": 4} and written["precompute"] is True
    assert main(["plan", "--out", str(out), "--probe-epochs", "2", "--min-gain", "0"]) == 0
    assert tomllib.loads(out.read_text())["comm"]["halo"]["bits"]["forward"] == 32


@pytest.mark.parametrize("argv, message", [
    (["--tolerance", "-1"], "--tolerance"), (["--probe-epochs", "1"], "--probe-epochs"),
    (["--probe-epochs", "soon"], "'auto'"), (["--probe-patience", "0"], "--probe-patience"),
    (["--hosts", "1"], "at least 2 ranks"), (["--plans", "warp drive"], "unknown plan"),
    (["--probe-net", "no-such-net.json"], "--probe-net no-such-net.json: not a calibrated model"),
])
def test_bad_plan_requests_are_one_line(tmp_path, capsys, argv, message):
    code = main(["plan", "--out", str(tmp_path / "p.toml"), "--probe-epochs", "2", *argv])
    assert code == 2 and message in capsys.readouterr().err


def test_an_auto_probe_cheaper_than_exacts_time_is_probed_again_longer(tmp_path, monkeypatch):
    """A plan that has not reached the target in exact's probe length, but whose predicted
    time there is still under exact's time to the target, is probed again (time-bounded) for
    as many epochs as fit in exact's time (at most the run's); one whose time is already over
    exact's is not. The probes are stand-ins: curves by folder, lengths from the config."""
    import tomllib

    import commgnn.planner as planner
    from commgnn.config import dump_toml, to_dict

    toml = tmp_path / "small.toml"
    toml.write_text("[data.synthetic]\nnum_nodes = 200\n[train]\nepochs = 60\n")
    base = resolve_config(str(toml), {}, {})
    runs: list[tuple[str, int]] = []

    def fake_run(cfg, env):
        out = tmp_path / "wd" / cfg.output.out.rsplit("/", 1)[-1]
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(dump_toml(to_dict(cfg)))
        (out / "summary.json").write_text("{}")
        runs.append((out.name, cfg.train.epochs))

    exact_step = [1.0]

    # exact: 1 s an epoch, best 0.80 at epoch 10 (the patience ends its probe there)
    # 8-bit: 0.1 s an epoch, climbing 0.01 an epoch from 0.50: 0.795 only at epoch 30
    # 4-bit: 2 s an epoch, never above 0.70
    def fake_score(out, model, compute_scale, overhead_s=0.0, shared_cores=False, reference=None):
        n = tomllib.loads((out / "config.toml").read_text())["train"]["epochs"]
        if out.name == "exact":
            n = 10
            vals, step = [0.70 + 0.01 * i for i in range(1, n + 1)], exact_step[0]
        elif out.name.startswith("8-bit"):
            vals, step = [min(0.85, 0.50 + 0.01 * i) for i in range(1, n + 1)], 0.1
        else:
            vals, step = [0.70] * n, 2.0
        return vals, [step * (i + 1) for i in range(n)], 0.0, 1.0, 0.0

    monkeypatch.setattr(planner, "run", fake_run)
    monkeypatch.setattr(planner, "_score", fake_score)
    lines: list[str] = []
    kw = dict(tolerance=0.5, probe_epochs=None, compute_scale=1.0, workdir=tmp_path / "wd",
              names=["8-bit halo", "4-bit halo"], log=lines.append)
    ranked = plan(base, ClusterModel.written(2, 1, 1e9), **kw)
    by = {r.name: r for r in ranked}
    assert ranked[0].name == "8-bit halo" and by["8-bit halo"].probe_epochs == 60  # 10 s / 0.1 s, capped at 60
    assert by["8-bit halo"].time_to_target_s == pytest.approx(3.0)  # 0.795 at epoch 30
    assert by["4-bit halo"].time_to_target_s is None and by["4-bit halo"].probe_epochs == 10  # not extended
    assert ("8-bit-halo-long", 60) in runs and not any(n == "4-bit-halo-long" for n, _ in runs)
    assert any("probed again for 60 epochs" in line for line in lines)
    runs.clear()
    plan(base, ClusterModel.written(2, 1, 1e9), **kw)  # a rerun reuses the short and the long probe
    assert runs == []
    exact_step[0] = 0.5  # exact faster (a faster link): 8-bit needs only 50 epochs, and the 60 serve
    ranked = plan(base, ClusterModel.written(2, 1, 1e9), **kw)
    assert runs == [] and ranked[0].name == "8-bit halo" and ranked[0].probe_epochs == 60


def test_a_longer_fixed_probe_serves_a_shorter_one_but_not_the_reverse(tmp_path):
    """Only with ``or_longer``, only for the epochs, and only when the probe has more of them."""
    from commgnn.planner import _probed

    (tmp_path / "config.toml").write_text("[runtime]\nparts = 4\n[train]\nepochs = 60\npatience = 0\n")
    (tmp_path / "summary.json").write_text("{}")
    want = {"train.epochs": 50, "train.patience": 0}
    assert _probed(tmp_path, want, 4, or_longer=True) and not _probed(tmp_path, want, 4)
    assert not _probed(tmp_path, {**want, "train.epochs": 70}, 4, or_longer=True)
    assert not _probed(tmp_path, {**want, "train.patience": 5}, 4, or_longer=True)
    assert not _probed(tmp_path, want, 8, or_longer=True)
    assert _probed(tmp_path, {**want, "train.epochs": 60}, 4)


def test_a_plan_only_marginally_sooner_than_exact_gives_way_to_exact():
    """``choose``: the leader unless it is predicted less than min_gain sooner than exact;
    plans or an exact that never reach the target change nothing; bad fractions are errors."""
    from commgnn.errors import UserError
    from commgnn.planner import PlanResult, choose

    def r(name: str, t: float | None) -> PlanResult:
        return PlanResult(name, {}, 0.8, 1.0, 0.1, t, 1.0)

    exact = r("exact", 100.0)
    assert choose([r("8-bit halo", 98.5), exact]).name == "exact"  # 1.5% sooner: noise
    assert choose([r("8-bit halo", 89.0), exact]).name == "8-bit halo"  # 11% sooner
    assert choose([r("8-bit halo", 98.5), exact], min_gain=0.0).name == "8-bit halo"
    assert choose([exact, r("4-bit halo", 120.0)]).name == "exact"
    assert choose([r("4-bit halo", 50.0), r("exact", None)]).name == "4-bit halo"
    assert choose([r("4-bit halo", 50.0)]).name == "4-bit halo"  # exact not among the plans
    for bad in (-0.1, 1.0):
        with pytest.raises(UserError, match="fraction"):
            choose([exact], min_gain=bad)


def test_of_plans_predicted_within_min_gain_the_cheaper_epoch_is_chosen():
    """``choose``: lossy plans within ``min_gain`` of the leader's predicted time are a tie,
    broken by the cheaper predicted epoch; outside the margin, or with min_gain 0, the leader
    stays; a plan that never reaches the target and exact never win a tie."""
    from commgnn.planner import PlanResult, choose

    def r(name: str, t: float | None, epoch_s: float) -> PlanResult:
        return PlanResult(name, {}, 0.9, epoch_s, 0.1, t, 1.0)

    exact = r("exact", 600.0, 0.05)  # the cheapest epoch of all, but not in the tie
    lead, cheap = r("precompute", 31.4, 0.763), r("precompute + 4-bit", 31.7, 0.647)
    never = r("pipelined", None, 0.1)
    assert choose([lead, cheap, exact, never]) is cheap  # 1% apart: the cheaper epoch
    assert choose([lead, cheap, exact], min_gain=0.0) is lead
    far = r("precompute + 4-bit", 35.0, 0.647)  # 10.3% later: 31.4 <= 0.9 * 35.0
    assert choose([lead, far, exact]) is lead
    assert choose([lead, r("8-bit", 34.8, 0.9), cheap, exact]) is cheap  # the cheapest of three
    assert choose([cheap, lead, exact]) is cheap  # the leader with the cheaper epoch stays
    near_exact = r("exact", 33.0, 0.05)  # the leader is under 10% sooner than exact: exact
    assert choose([lead, cheap, near_exact]) is near_exact
