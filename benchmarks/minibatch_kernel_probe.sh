#!/usr/bin/env bash
# Neighbour-sampling epoch time on Coauthor CS (GraphSAGE 2x64, 4 local ranks, seed 0, 3 epochs),
# side by side: an older checkout (optional first argument), this checkout with the default
# kernel, and this checkout with --kernel torch. Prints epochs 2-3 of each (epoch s and the mean
# rank's time split). Needs the mini-batch benchmark's CS partition (benchmarks/minibatch.py).
#   benchmarks/minibatch_kernel_probe.sh [OLD_CHECKOUT]
set -uo pipefail
cd "$(dirname "$0")/.."
HERE=$(pwd)
OLD=${1:-}
ROOT=${COMMGNN_DATA_ROOT:-../shared/datasets}
ARGS=(train --dataset CS --data-root "$ROOT" --parts 4 --partition-dir runs/bench-minibatch/CS/parts4
      --seed 0 --model sage --layers 2 --hidden 64 --quiet --mode minibatch --epochs 3 --patience 0
      --sampler neighbor --fanout 15,10 --batch-size 512)
OUT=$(mktemp -d)
run() { local name=$1 code=$2; shift 2
  PYTHONPATH=$code python -m commgnn "${ARGS[@]}" --out "$OUT/$name" "$@" && echo "$name done"; }
names=()
if [ -n "$OLD" ]; then run old "$OLD" && names+=(old); fi
run default "$HERE" && names+=(default)
run torch "$HERE" --kernel torch && names+=(torch)
for d in "${names[@]}"; do python - "$OUT/$d" "$d" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
for r in rows[1:]:
    print(sys.argv[2], r["epoch"], round(r["epoch_s"], 2), {k: round(v, 2) for k, v in r["time_mean_s"].items()})
PY
done
