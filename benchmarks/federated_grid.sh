#!/usr/bin/env bash
# The whole federated grid of issue #16 (benchmarks/federated.py's protocol), in calls that
# resume: a finished run is read back from $RUNS, so rerunning this continues where it stopped.
# Cheap cells first. Two one-thread runs side by side (--jobs 2) on a 2-core machine; every
# call rewrites the dated table (and its -targets table) from all finished runs.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-runs/federated200}
JOBS=${JOBS:-2}
E=(central local fedavg fedprox fedavg+secagg fedavg+secagg+emb8 "dp eps=1" "dp eps=4" "dp eps=8"
   "rank2 3-bit+secagg")
run() { python benchmarks/federated.py --runs "$RUNS" --jobs "$JOBS" "$@"; }
for ds in Cora CiteSeer Computers CS; do
    run --datasets "$ds" --clients 5 10 20 --splits louvain metis --entries "${E[@]}"
    run --datasets "$ds" --clients 20 --splits louvain metis --entries "rank2 3-bit+secagg+k4"
done
run --datasets Cora --clients 5 10 --splits louvain --entries fedavg+neighgen
