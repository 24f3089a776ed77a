#!/usr/bin/env bash
# Issue 6's int8 figure: latency of a cnn package and its int8 conversion through
# kiln's runtime (bench_inference: SavedModel::run of serving_default), batch 64 and 1,
# in alternating rounds (the VM's speed drifts: each round runs both once). Prints each
# round's medians and the median over rounds of the fp32 / int8 ratio. Target: >= 2x at
# batch 64.
# Usage: bench/int8_compare.sh [ROUNDS=7] [FP32_PACKAGE INT8_PACKAGE]
#   Without packages: trains the built-in cnn for 1 epoch on 10,000 images and converts
#   it (calibration: 1,000 training images) into a temporary directory.
#   KILN_BENCH_BIN: the directory with kiln and bench_inference (default build/default/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-7}"
bin="${KILN_BENCH_BIN:-build/default/bin}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ $# -ge 3 ]; then
  f32="$2"; i8="$3"
else
  f32="$tmp/cnn"; i8="$tmp/cnn_int8"
  "$bin/kiln" train --model cnn --epochs 1 --max-samples 10000 --export "$f32" --verbose 0 >/dev/null
  "$bin/kiln" convert --dir "$f32" --output_dir "$i8" --precision int8 --calibration_data fashion-mnist:1000 >/dev/null
fi
for r in $(seq 1 "$rounds"); do
  for p in f32 i8; do
    dir=${!p}
    KILN_NUM_THREADS=2 "$bin/bench_inference" "$dir" --batches 64,1 | sed "s/^/$p /" >>"$tmp/results"
  done
done
python3 - "$tmp/results" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    tag, js = line.split(" ", 1)
    d = json.loads(js)
    rows.setdefault((d["batch"], tag), []).append(d["median_us"])
for batch in sorted({b for b, _ in rows}, reverse=True):
    f, q = rows[(batch, "f32")], rows[(batch, "i8")]
    ratios = [a / b for a, b in zip(f, q)]
    print(f"batch {batch}: fp32 {statistics.median(f):.0f} us, int8 {statistics.median(q):.0f} us, "
          f"fp32/int8 median of {len(ratios)} rounds {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f})")
PY
