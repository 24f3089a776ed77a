#!/usr/bin/env bash
# The main job. Until training lands (issue 3) it builds kiln (release preset) and
# runs the op-library demo: a numerical self-check and a matmul timing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/kiln-ccache}" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
./build/release/bin/kiln devices
./build/release/bin/kiln demo
