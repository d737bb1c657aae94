"""An emulated cluster, ``commgnn plan``, and the planned run.

Run it as ``python examples/cluster_and_plan.py [WORK_DIR]``. It

1. asks ``commgnn plan`` which communication levers reach the exact model's accuracy
   soonest on 2 hosts linked at 50 Mbit/s: the candidate plans are probed for a few epochs
   on local ranks and priced by the network cost model, and the best is written as a
   config file;
2. trains that plan on 2 emulated hosts (``commgnn cluster``: network namespaces joined by
   links shaped to 50 Mbit/s). The emulated cluster needs root (or ``CAP_NET_ADMIN`` and
   ``CAP_SYS_ADMIN``); without them the script says so and trains the plan on local ranks.

The graph is a small synthetic one so that the script runs in about a minute.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def commgnn(*args: str) -> None:
    """Run one ``commgnn`` command, as a shell would."""
    subprocess.run([sys.executable, "-m", "commgnn", *args], check=True)


def can_emulate() -> str | None:
    """Why the emulated cluster cannot run here, or None when it can."""
    if sys.platform != "linux":
        return "the emulated cluster needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the emulated cluster needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"the emulated cluster needs {' and '.join(missing)} (iproute2)" if missing else None


if __name__ == "__main__":
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/example-plan")
    work.mkdir(parents=True, exist_ok=True)

    # %% The job: a small synthetic graph (any TOML keys of `commgnn train` work here)
    (work / "job.toml").write_text(
        "[data.synthetic]\nnum_nodes = 600\nnum_classes = 3\navg_degree = 6.0\n"
        "[model]\nname = \"gcn\"\nhidden = 16\n[energy]\ntrack = false\n")

    # %% 1. Plan: probe candidate levers on local ranks, price them on 2 hosts at 50 Mbit/s
    plan = work / "plan.toml"
    commgnn("plan", "--config", str(work / "job.toml"), "--hosts", "2", "--ranks-per-host", "1",
            "--rate", "50mbit", "--probe-epochs", "5", "--epochs", "20",
            "--plans", "4-bit halo", "precompute + transform-first",
            "--workdir", str(work / "probes"), "--out", str(plan))
    print(plan.read_text().splitlines()[0])  # the comment line names the chosen plan

    # %% 2. The planned run, on the emulated cluster where this machine allows it
    run = work / "run"
    why_not = can_emulate()
    if why_not is None:
        commgnn("cluster", "--hosts", "2", "--ranks-per-host", "1", "--rate", "50mbit", "--",
                "train", "--config", str(plan), "--quiet", "--out", str(run))
    else:
        print(f"skipping the emulated cluster: {why_not}; training the plan on local ranks instead")
        commgnn("train", "--config", str(plan), "--parts", "2", "--quiet", "--out", str(run))

    summary = json.loads((run / "summary.json").read_text())
    print(f"planned run: test accuracy {summary['test_acc']:.3f}, "
          f"{summary['epoch_time_s']:.3f} s per epoch; run folder {run}")
