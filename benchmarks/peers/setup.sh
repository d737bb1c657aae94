#!/usr/bin/env bash
# Build the peers' environment for benchmarks/peers/run.py; re-running it is a no-op.
#
#   benchmarks/peers/setup.sh [CACHE]      (default: $COMMGNN_PEERS_CACHE or ~/.cache/commgnn-peers)
#
# CACHE/dgl-venv   Python 3.11 venv with requirements-peers.txt (DGL 2.1.0, torch 2.2.1), about 4.9 GB
# CACHE/src/dgl    dgl at tag v2.1.0: examples/distributed/graphsage (DistDGL's example, unmodified)
# CACHE/src/BNS-GCN  GATECH-EIC/BNS-GCN at b4a48bd with patches/bnsgcn-cpu.patch (CPU and gloo only,
#                  a `synthetic` dataset read from a file; nothing else changed)
# CACHE/versions.json  what was installed, for the results
#
# Sources come from GitHub, or from bare git repositories named by DGL_GIT / BNS_GIT (a
# mirror on a machine without GitHub).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:-${COMMGNN_PEERS_CACHE:-$HOME/.cache/commgnn-peers}}
DGL_TAG=v2.1.0
BNS_COMMIT=b4a48bd
mkdir -p "$cache/src"
stamp="$cache/versions.json"
want=$(sha256sum "$here/requirements-peers.txt" "$here/patches/bnsgcn-cpu.patch" | sha256sum | cut -c1-16)
if [[ -f "$stamp" ]] && grep -q "\"recipe\": \"$want\"" "$stamp"; then
  echo "peers' environment in $cache is up to date"; exit 0
fi
python3.11 -m venv "$cache/dgl-venv"
TMPDIR="$cache/tmp" && mkdir -p "$TMPDIR" && export TMPDIR
grep -v '^#' "$here/requirements-peers.txt" > "$cache/tmp/req.txt"
"$cache/dgl-venv/bin/pip" install -q --no-cache-dir --no-deps -r "$cache/tmp/req.txt"

export_tree() {  # export_tree NAME GITURL LOCALGIT REV DEST [PATHS...]
  local name=$1 url=$2 local=$3 rev=$4 dest=$5; shift 5
  rm -rf "$dest" && mkdir -p "$dest"
  if [[ -n "$local" ]]; then
    git --git-dir="$local" archive "$rev" "$@" | tar -x -C "$dest"
  else
    local tmp="$cache/tmp/$name.git"
    rm -rf "$tmp" && git clone -q --bare --filter=blob:none "$url" "$tmp"
    git --git-dir="$tmp" archive "$rev" "$@" | tar -x -C "$dest"
    rm -rf "$tmp"
  fi
}
export_tree dgl https://github.com/dmlc/dgl.git "${DGL_GIT:-}" "$DGL_TAG" "$cache/src/dgl" \
  examples/distributed/graphsage
export_tree bns https://github.com/GATECH-EIC/BNS-GCN.git "${BNS_GIT:-}" "$BNS_COMMIT" "$cache/src/BNS-GCN"
(cd "$cache/src/BNS-GCN" && patch -s -p1 < "$here/patches/bnsgcn-cpu.patch" && mkdir -p checkpoint results)
DGLBACKEND=pytorch "$cache/dgl-venv/bin/python" - "$stamp" "$want" "$DGL_TAG" "$BNS_COMMIT" <<'PY'
import json, sys, dgl, torch
stamp, recipe, tag, bns = sys.argv[1:5]
json.dump({"recipe": recipe, "dgl": dgl.__version__, "torch(peers)": torch.__version__,
           "distdgl_example": f"dmlc/dgl@{tag} examples/distributed/graphsage/node_classification.py",
           "bnsgcn": f"GATECH-EIC/BNS-GCN@{bns} + patches/bnsgcn-cpu.patch"}, open(stamp, "w"), indent=1)
PY
rm -rf "$cache/tmp"
echo "peers' environment ready in $cache"
