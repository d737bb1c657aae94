"""Smoke test of the peers' bench (``benchmarks/peers/run.py``): commgnn's mini-batch entry
on 2 emulated hosts (the 20,000-node synthetic graph, about 15 s), its bytes counted by the hosts' interface counters and by its own
meter. The peers' own runs (DistDGL, BNS-GCN) need ``setup.sh``'s 5 GB environment and stay
outside CI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_cluster import WHY_NOT

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "peers" / "run.py"


@pytest.mark.timeout(300)
@pytest.mark.skipif(WHY_NOT is not None, reason=f"no network namespaces here: {WHY_NOT}")
def test_commgnn_entry_on_two_emulated_hosts(tmp_path):
    out = tmp_path / "res"
    res = subprocess.run([sys.executable, str(RUN), "--system", "commgnn-mb", "--dataset", "synthetic",
                          "--hosts", "2", "--rate", "1gbit", "--epochs", "4", "--framing", "--timeout", "240",
                          "--out", str(out)], capture_output=True, text=True, timeout=290)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    r = json.loads((out / "result.json").read_text())
    for key in ("test_acc", "best_val_acc", "epoch_time_s", "time_to_target_s", "wire_bytes_per_epoch",
                "meter_bytes_per_epoch", "peak_pss_mb_sum", "versions"):
        assert key in r, key
    assert [c["epoch"] for c in r["curve"]] == [1, 2, 3, 4]
    assert 1.0 <= r["framing"] < 1.2  # frames' headers (and ACKs) on top of the TCP payload
    # the meter counts payload; the counters frames: within 10% once framing is put on the meter
    ratio = r["meter_bytes_per_epoch"] * r["framing"] / r["wire_bytes_per_epoch"]
    assert 0.9 <= ratio <= 1.1, (r["meter_bytes_per_epoch"], r["wire_bytes_per_epoch"], r["framing"])
    assert r["peak_pss_mb_sum"] > 100  # two trainers' processes at least
