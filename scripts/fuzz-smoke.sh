#!/usr/bin/env bash
# A short run of every libFuzzer target over its committed seed corpus (fuzz/corpus/<name>):
# a fixed seed and a fixed number of inputs, so runs on different machines mostly explore
# the same inputs (a time cap guards slow machines; some of libFuzzer's path still depends
# on timing). Longer campaigns: run a fuzzer by hand with another -seed and no -runs.
# Usage: scripts/fuzz-smoke.sh [build/asan/fuzz]; KILN_FUZZ_RUNS, KILN_FUZZ_SECONDS, KILN_FUZZ_SEED.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build/asan/fuzz}"
runs="${KILN_FUZZ_RUNS:-60000}" secs="${KILN_FUZZ_SECONDS:-10}" seed="${KILN_FUZZ_SEED:-1}"
work=$(mktemp -d)
status=0
for f in "$dir"/*_fuzzer; do
  name=$(basename "$f" _fuzzer)
  mkdir -p "$work/$name/new" "$work/$name/crash"
  # New inputs go to a scratch dir (the first corpus dir); the seed corpus stays as committed.
  if "$f" -seed="$seed" -runs="$runs" -max_total_time="$secs" -rss_limit_mb=2048 \
         -artifact_prefix="$work/$name/crash/" "$work/$name/new" "fuzz/corpus/$name" >"$work/$name/log" 2>&1; then
    echo "$name: $(grep -E '^Done [0-9]+ runs' "$work/$name/log" || tail -n 1 "$work/$name/log")"
  else
    status=1
    echo "$name: FAILED; the report (full log $work/$name/log):"
    grep -v -E '^#[0-9]+ +(NEW|REDUCE|pulse|INITED)' "$work/$name/log" | tail -n 40
    for c in "$work/$name"/crash/*; do
      [ -e "$c" ] || continue
      echo "input $c (base64; add it to fuzz/corpus/$name once fixed):"
      base64 -w 0 "$c" | head -c 4096; echo
    done
  fi
done
exit "$status"
