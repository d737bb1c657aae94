#!/usr/bin/env bash
# The GPU check of issue #15 (section 5), as one short prepared script (about 10 minutes at
# most) for a machine with an NVIDIA GPU, such as the device machine a task is sometimes lent.
#
# It prints the GPU, driver, torch, CUDA and NCCL versions; makes the project importable
# without touching the machine's CUDA build of torch (the checkout goes on PYTHONPATH; nothing
# is pip-installed with its dependencies, which would fetch a CPU torch over it); runs the
# gpu tests (pytest -m gpu tests/test_gpu.py tests/test_gpu_levers.py) and then benchmarks/gpu_bench.py. Its log, the
# tests' JUnit XML and the benchmark's dated Markdown and JSON land in $OUT, which the device
# tool returns (elsewhere: runs/gpu-check/).
#
# The device machine reaches no package index. Two packages the project imports are missing
# from its image (pymetis, tomli-w); they travel as wheels. Once per checkout, here (pip needs
# an index), fetch them into .whl/ (kept out of git through .git/info/exclude):
#
#     bash benchmarks/gpu_check.sh --fetch-wheels
#
# then call the device tool with:  command "bash benchmarks/gpu_check.sh", carry [".whl"],
# timeout_s 540. On any other GPU machine: bash benchmarks/gpu_check.sh (wheels optional; a
# missing package is then tried with pip install --no-deps).
#
# Budgets (seconds, environment): PYTEST_BUDGET_S (270), BENCH_BUDGET_S (170) and SCALE_BUDGET_S
# (130: the last step, a 1M-node graph on one GPU, SCALE_NODES and SCALE_HIDDEN); a test
# gets at most TEST_TIMEOUT_S (200). BENCH_ARGS replaces the benchmark's extra arguments
# (default "--models gcn gat": GAT aggregates without the CSR kernel). STEPS picks the steps
# (default "tests bench scale"; STEPS=tests re-checks a change with the gpu tests alone;
# STEPS="tests maxk" also runs the MaxK grid on Computers, see benchmarks/maxk_gpu.sh, in the
# background beside the other steps, which saves device time but slows them: its 24 ranks
# share the machine's cores). PYTEST_K selects gpu tests by name (pytest -k).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
PY=${PYTHON:-python3}
WHEELS=${WHEEL_DIR:-.whl}

if [ "${1:-}" = "--fetch-wheels" ]; then
    if git rev-parse --git-dir >/dev/null 2>&1 && [ "$WHEELS" = ".whl" ]; then
        exclude=$(git rev-parse --git-path info/exclude)
        mkdir -p "$(dirname "$exclude")"
        grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
    fi
    # The device image: CPython ${GPU_PY_VERSION:-3.12} on x86-64 (see the device README).
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version "${GPU_PY_VERSION:-3.12}" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$WHEELS" pymetis==2025.2.2 tomli-w==1.2.0
fi

OUT=${OUT:-$ROOT/runs/gpu-check}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 COMMGNN_ENERGY=0 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
START=$(date +%s)
stamp() { echo; echo "== [$(( $(date +%s) - START ))s] $*"; }

stamp "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $ROOT (commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
nvidia-smi || echo "nvidia-smi: not available"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
df -h /dev/shm 2>/dev/null | tail -1
"$PY" - <<'EOF'
import platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"available {torch.cuda.is_available()}, GPUs {torch.cuda.device_count()}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, sm_{p.major}{p.minor}")
if torch.cuda.is_available():
    print("  NCCL", ".".join(map(str, torch.cuda.nccl.version())))
EOF

stamp "making the project importable (no dependency resolution: the CUDA torch stays)"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/commgnn-site \
        "$WHEELS"/*.whl && export PYTHONPATH=/tmp/commgnn-site
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
missing=$("$PY" - <<'EOF'
import importlib.util
mods = {"torch": "torch", "torch_geometric": "torch_geometric", "pymetis": "pymetis", "numpy": "numpy",
        "scipy": "scipy", "rich": "rich", "psutil": "psutil", "cloudpickle": "cloudpickle", "tomli_w": "tomli-w",
        "networkx": "networkx", "pytest": "pytest", "pytest_timeout": "pytest-timeout"}
print(" ".join(dist for mod, dist in mods.items() if importlib.util.find_spec(mod) is None))
EOF
)
if [ -n "$missing" ]; then
    echo "missing: $missing; trying pip install --no-deps (fails fast without an index)"
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-deps --retries 0 --timeout 10 $missing ||
        echo "could not install: $missing (fetch wheels first: bash benchmarks/gpu_check.sh --fetch-wheels)"
fi
"$PY" -c "import commgnn, commgnn.trainers, commgnn.comm.build; print('commgnn', commgnn.__version__, 'from', commgnn.__file__)"

STEPS=" ${STEPS:-tests bench scale} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
for step in $STEPS; do
    case "$step" in tests | bench | scale | maxk) ;; *) echo "STEPS: unknown step '$step' (tests bench scale maxk)" ;; esac
done

if want maxk; then  # in the background while the other steps run; gathered at the end
stamp "maxk: benchmarks/maxk_computers.toml, one bench per seed, 8 gloo ranks each on GPU 0 (deadline ${DEADLINE_S:-400} s)"
bash benchmarks/maxk_gpu.sh run &
MAXK_PID=$!
fi

if want tests; then
stamp "gpu tests: pytest -m gpu tests/test_gpu*.py (budget ${PYTEST_BUDGET_S:-270} s)"
pytest_flags=()
"$PY" -c "import pytest_timeout" 2>/dev/null && pytest_flags=(--timeout "${TEST_TIMEOUT_S:-200}")
[ -n "${PYTEST_K:-}" ] && pytest_flags+=(-k "$PYTEST_K")
timeout -k 10 "${PYTEST_BUDGET_S:-270}" "$PY" -m pytest -m gpu tests/test_gpu.py tests/test_gpu_levers.py -rs -q -p no:cacheprovider \
    ${pytest_flags[@]+"${pytest_flags[@]}"} --junitxml="$OUT/pytest_gpu.xml" -o junit_family=xunit1
echo "pytest exit status: $?"
fi

if want bench; then

stamp "benchmark: benchmarks/gpu_bench.py --device cuda (budget ${BENCH_BUDGET_S:-170} s)"
# shellcheck disable=SC2086
timeout -k 10 "${BENCH_BUDGET_S:-170}" "$PY" benchmarks/gpu_bench.py --device cuda --out "$OUT" ${BENCH_ARGS:---models gcn gat}
echo "gpu_bench exit status: $?"
fi

if want scale; then

stamp "scale: a ${SCALE_NODES:-1000000}-node CSBM of average degree 20, GCN 3 x ${SCALE_HIDDEN:-128}, exact and lossless, peak GPU memory (budget ${SCALE_BUDGET_S:-130} s)"
# shellcheck disable=SC2086
timeout -k 10 "${SCALE_BUDGET_S:-130}" "$PY" benchmarks/gpu_bench.py --device cuda --out "$OUT" --tag scale --skip spmm \
    --graph-nodes "${SCALE_NODES:-1000000}" --avg-degree 20 --hidden "${SCALE_HIDDEN:-128}" --epochs 5 \
    --settings exact lossless --no-cpu-baseline --models gcn
echo "gpu_bench (scale) exit status: $?"
fi

if want maxk; then
stamp "maxk: waiting for the grid, then gathering its finished runs"
wait "$MAXK_PID"
echo "maxk grid exit status: $? (124: stopped at the deadline)"
bash benchmarks/maxk_gpu.sh gather
fi

stamp "done; files in $OUT:"
ls -la "$OUT"
