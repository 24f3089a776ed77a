#!/usr/bin/env bash
# The main job: install dependencies, build kiln (release preset), train the default
# model (the Fashion-MNIST MLP, 5 epochs), print its test accuracy, export it as a model
# package version under runs/mlp/export/, show it, and serve it (REST on 127.0.0.1:8501,
# gRPC on 127.0.0.1:8500) until Ctrl-C, printing a curl request that works.
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
# The request's instances take the serving signature's input shape (784, or 28,28,1 for --model cnn).
./build/release/bin/kiln show --dir runs/mlp/export --signature_def serving_default |
  python3 scripts/make_request.py runs/mlp/request.json 2 --signature -
echo
echo "Serving runs/mlp/export as model 'fashion_mnist' (Ctrl-C stops). In another shell:"
echo "  curl -s -X POST http://127.0.0.1:8501/v1/models/fashion_mnist:predict -H 'Content-Type: application/json' -d @runs/mlp/request.json"
echo "  curl -s http://127.0.0.1:8501/v1/models/fashion_mnist          # status"
echo "  curl -s http://127.0.0.1:8501/metrics | grep kiln_requests_total"
exec ./build/release/bin/kiln serve --model_name fashion_mnist --model_base_path "$PWD/runs/mlp/export" \
  --rest_api_port "${KILN_REST_PORT:-8501}" --port "${KILN_GRPC_PORT:-8500}" --enable_batching
