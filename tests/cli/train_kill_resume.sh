#!/usr/bin/env bash
# Crash recovery end to end: `kiln train` killed with SIGKILL mid-epoch, its newest
# backup then truncated, started again with the same command: it must skip the
# corrupted backup (naming it), resume from the previous one, and end with the same
# test accuracy as an uninterrupted run (the resumed run is deterministic, so the band
# is tight).
set -euo pipefail
KILN="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; for f in "$work"/*.log; do echo "--- $f"; tail -n 20 "$f"; done; exit 1; }

args=(train --model mlp --epochs 2 --max-samples 12000 --batch-size 32 --seed 7 --verbose 2 --backup-freq 25)

"$KILN" "${args[@]}" --metrics-json "$work/ref.json" > "$work/ref.log" 2>&1 || fail "reference run failed"

"$KILN" "${args[@]}" --checkpoint-dir "$work/ckpt" --metrics-json "$work/run.json" > "$work/run1.log" 2>&1 &
pid=$!
# Kill once a few backups exist (the first epoch has 375 batches, a backup every 25).
for _ in $(seq 1 3000); do
  backups=$(find "$work/ckpt/backup" -name 'backup-*.ckpt' 2>/dev/null || true)
  n=$(printf '%s' "$backups" | grep -c . || true)
  steps=$(printf '%s\n' "$backups" | sed -n 's/.*backup-\([0-9]*\).ckpt/\1/p' | sort -n | tail -n 1)
  if [ "$n" -ge 2 ] && [ "${steps:-0}" -ge 100 ]; then break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
kill -9 "$pid" 2>/dev/null || true
status=0
wait "$pid" || status=$?
[ "$status" -eq 137 ] || fail "expected the run to die of SIGKILL (status 137), got $status"
[ ! -e "$work/run.json" ] || fail "the run finished before it was killed; nothing was tested"

newest=$(ls "$work/ckpt/backup"/backup-*.ckpt | sort -t- -k2 -n | tail -n 1)
[ -n "$newest" ] || fail "no backup was written before the kill"
echo "killed run $pid; truncating newest backup $newest"
truncate -s 100 "$newest"

"$KILN" "${args[@]}" --checkpoint-dir "$work/ckpt" --metrics-json "$work/run.json" > "$work/run2.log" 2>&1 ||
  fail "resumed run failed"
grep -q "skipping corrupted backup .*$(basename "$newest")" "$work/run2.log" || fail "corrupted backup not reported"
grep -q "resumed from" "$work/run2.log" || fail "the second run did not resume"

python3 - "$work/ref.json" "$work/run.json" <<'PY' || fail "accuracy differs"
import json, sys
ref, run = (json.load(open(p)) for p in sys.argv[1:3])
print(f"uninterrupted test accuracy {ref['test_accuracy']:.4f}, killed+resumed {run['test_accuracy']:.4f}")
assert ref["test_accuracy"] > 0.7, ref
assert abs(ref["test_accuracy"] - run["test_accuracy"]) <= 0.005, (ref, run)
PY
echo "kill-and-resume: OK"
