#!/usr/bin/env bash
# The MaxK grid on Computers (benchmarks/maxk_computers_gpu.toml) on one GPU, called by
# benchmarks/gpu_check.sh (STEPS containing "maxk") once the project is importable.
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
# `commgnn bench` reruns it from the start next time.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/runs/gpu-check}
GRID=${MAXK_GRID:-benchmarks/maxk_computers_gpu.toml}
DATA_ROOT=${DATA_ROOT:-$ROOT/.devdata}
WORK=${MAXK_WORK:-$ROOT/runs/maxk-gpu}
mkdir -p "$WORK" "$OUT"

grid_for() {  # grid_for SEEDS-LIST FILE: the grid with these seeds and the data root
    sed -e "s/^seeds = .*/seeds = [$1]/" -e "s#^data = .*#data = { root = \"$DATA_ROOT\" }#" "$GRID" >"$2"
}

case "${1:-}" in
run)
    for s in ${SEEDS:-0 1 2}; do
        grid_for "$s" "$WORK/grid-s$s.toml"
        timeout -k 15 "${DEADLINE_S:-400}" "$PY" -m commgnn bench --grid "$WORK/grid-s$s.toml" --out "$WORK/s$s" \
            >"$OUT/maxk-s$s.log" 2>&1 &
    done
    wait
    ;;
gather)
    mkdir -p "$WORK/all/runs"
    for d in "$WORK"/s*/runs/*/; do
        [ -f "$d/summary.json" ] && cp -r "$d" "$WORK/all/runs/"
    done
    grid_for "$(echo "${SEEDS:-0 1 2}" | sed 's/ \+/, /g')" "$WORK/all/grid.toml"
    "$PY" -m commgnn bench --grid "$WORK/all/grid.toml" --out "$WORK/all" --report-only >"$OUT/maxk-report.log" 2>&1
    echo "finished runs: $(ls "$WORK/all/runs" | wc -l)"
    tar czf "$OUT/maxk-gpu-runs.tgz" --exclude=model.pt --exclude=predictions.pt -C "$WORK" all
    ;;
*)
    echo "usage: bash benchmarks/maxk_gpu.sh run|gather" >&2
    exit 2
    ;;
esac
