#!/usr/bin/env bash
# kiln's input pipeline vs tf.data on the same Fashion-MNIST TFRecord shards.
#   bash bench/input_compare.sh [THREADS] [RUNS]
# Needs a release build (cmake --preset release && cmake --build --preset release;
# KILN_BENCH_BIN=build/default/bin for another preset)
# and the venv with tensorflow-cpu (scripts/python-venv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-2}" runs="${2:-5}"
bin="${KILN_BENCH_BIN:-build/release/bin}/bench_input"
py="${KILN_VENV_PYTHON:-build/venv/bin/python}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" write "$dir" --shards 8
k=$("$bin" read "$dir" --threads "$threads" --runs "$runs" | tee /dev/stderr | sed -n 's/^RESULT kiln records_per_s=\([0-9]*\).*/\1/p')
t=$("$py" bench/input_pipeline_tf.py "$dir" --threads "$threads" --runs "$runs" | tee /dev/stderr | sed -n 's/^RESULT tf records_per_s=\([0-9]*\).*/\1/p')
echo "kiln/tf.data throughput ratio: $(awk -v k="$k" -v t="$t" 'BEGIN { printf "%.2f", k / t }')x (threads=$threads)"
"$bin" fit "$dir" --epochs 2 --threads "$threads"
