#!/usr/bin/env bash
# The MaxK grid on Computers (benchmarks/maxk_computers.toml) on one GPU, called by
# benchmarks/gpu_check.sh (STEPS containing "maxk") once the project is importable. The grid
# runs as written (entries, levers, protocol, METIS, 8 ranks, the bytes counted) with one line
# added: [runtime] device = "cuda", backend = "gloo", so that every rank runs on GPU 0 and gloo
# moves the device rows of each exchange through the host. Epoch times are not comparable
# with CPU runs.
#
#   bash benchmarks/maxk_gpu.sh run     one `commgnn bench` per seed, side by side (each seed's
#                                       8 gloo ranks share GPU 0), each stopped after DEADLINE_S
#   bash benchmarks/maxk_gpu.sh gather  the finished runs of every seed in one bench folder,
#                                       tabulated (--report-only), archived without models
#                                       and predictions in $OUT/maxk-gpu-runs.tgz
#
# DATA_ROOT: the folder holding Computers/raw/amazon_electronics_computers.npz (the device
# machine has no ../shared/datasets: copy the file into an ignored folder of the checkout,
# such as .devdata, and name it in the device tool's carry). An interrupted run is dropped;
# `commgnn bench` reruns it from the start next time. To continue a grid, bring the finished
# runs back as $MAXK_WORK/s<seed>/runs/<run> (gather's archive holds them as all/runs/<run>)
# and name that folder in carry: each seed's bench skips the runs it finds there.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/runs/gpu-check}
GRID=${MAXK_GRID:-benchmarks/maxk_computers.toml}
DATA_ROOT=${DATA_ROOT:-$ROOT/.devdata}
WORK=${MAXK_WORK:-$ROOT/runs/maxk-gpu}
mkdir -p "$WORK" "$OUT"

SEED_LIST=$(echo ${SEEDS:-0 1 2})  # word splitting trims and squeezes the spaces
ROOT_SED=$(printf '%s' "$DATA_ROOT" | sed 's/[&#\\]/\\&/g')  # a literal sed replacement

RUNTIME='runtime = { device = "cuda", backend = "gloo", threads = 1, compute_alone = false }'

grid_for() {  # grid_for SEEDS-LIST FILE: the grid with these seeds, the data root and the shared GPU
    sed -e "s/^seeds = .*/seeds = [$1]/" -e "s#^data = .*#data = { root = \"$ROOT_SED\" }\n$RUNTIME#" \
        "$GRID" >"$2"
}

case "${1:-}" in
run)
    pids=()
    for s in $SEED_LIST; do
        grid_for "$s" "$WORK/grid-s$s.toml"
        timeout -k 15 "${DEADLINE_S:-400}" "$PY" -m commgnn bench --grid "$WORK/grid-s$s.toml" --out "$WORK/s$s" \
            >"$OUT/maxk-s$s.log" 2>&1 &
        pids+=($!)
    done
    status=0
    for i in "${!pids[@]}"; do  # 124: stopped at the deadline
        wait "${pids[$i]}"; rc=$?
        echo "maxk bench of seed $(echo $SEED_LIST | cut -d' ' -f$((i + 1))): exit status $rc"
        [ "$rc" -ne 0 ] && status=$rc
    done
    exit "$status"
    ;;
gather)
    mkdir -p "$WORK/all/runs"
    for d in "$WORK"/s*/runs/*/; do
        [ -f "$d/summary.json" ] && cp -r "$d" "$WORK/all/runs/"
    done
    grid_for "${SEED_LIST// /, }" "$WORK/all/grid.toml"
    "$PY" -m commgnn bench --grid "$WORK/all/grid.toml" --out "$WORK/all" --report-only >"$OUT/maxk-report.log" 2>&1
    echo "finished runs: $(ls "$WORK/all/runs" | wc -l)"
    tar czf "$OUT/maxk-gpu-runs.tgz" --exclude=model.pt --exclude=predictions.pt -C "$WORK" all
    ;;
*)
    echo "usage: bash benchmarks/maxk_gpu.sh run|gather" >&2
    exit 2
    ;;
esac
