#!/usr/bin/env bash
# The main job: install dependencies, build kiln (release preset), train the default
# model (the Fashion-MNIST MLP, 5 epochs), print its test accuracy, export it as a model
# package version under runs/mlp/export/ and show it. Serving it comes with the server.
# Options are passed to `kiln train` (e.g. `bash scripts/run.sh --model cnn --epochs 3`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/kiln-ccache}" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
./build/release/bin/kiln devices
./build/release/bin/kiln train --model mlp --epochs 5 --logdir runs/mlp --checkpoint-dir runs/mlp/checkpoints \
  --metrics-json runs/mlp/metrics.json --export runs/mlp/export "$@"
./build/release/bin/kiln show --dir runs/mlp/export --all
