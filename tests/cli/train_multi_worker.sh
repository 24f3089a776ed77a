#!/usr/bin/env bash
# `kiln train --strategy multi_worker`: two processes on loopback reach the same losses as
# one process (the global batch split across the workers), launched with KILN_WORKERS,
# TF_CONFIG and mpirun (MPI or Gloo collectives); a worker killed with SIGKILL, stopped, absent or configured
# differently makes the others fail with a clear error within --worker-timeout.
set -euo pipefail
kiln="$1"
d=$(mktemp -d)
pids=()
trap 'kill -9 "${pids[@]}" 2>/dev/null || true; rm -rf "$d"' EXIT
export KILN_NUM_THREADS=1  # two workers on the machine's cores
common=(train --model mlp --epochs 2 --max-samples 4000 --verbose 0)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
compare() {  # compare NAME: the chief's metrics against one process
  python3 - "$d/one.json" "$d/w0.json" "$1" <<'PY'
import json, sys
one, chief = (json.load(open(p)) for p in sys.argv[1:3])
assert chief["replicas"] == 2, chief["replicas"]
for k in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
    if abs(one[k] - chief[k]) > 1e-4:
        sys.exit(f"{sys.argv[3]}: {k} one process {one[k]} vs two workers {chief[k]}")
print(f"{sys.argv[3]}: test_loss one process {one['test_loss']:.6f}, two workers {chief['test_loss']:.6f}")
PY
}
"$kiln" "${common[@]}" --metrics-json "$d/one.json"

# KILN_WORKERS + KILN_RANK
p=$(port)
KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=1 "$kiln" "${common[@]}" --strategy multi_worker --metrics-json "$d/w1.json" &
pids+=($!)
KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=0 "$kiln" "${common[@]}" --strategy multi_worker --metrics-json "$d/w0.json"
wait "${pids[-1]}"
compare KILN_WORKERS

# TF_CONFIG
p=$(port)
tf() { echo "{\"cluster\": {\"worker\": [\"127.0.0.1:$p\", \"127.0.0.1:$p\"]}, \"task\": {\"type\": \"worker\", \"index\": $1}}"; }
TF_CONFIG=$(tf 1) "$kiln" "${common[@]}" --strategy multi_worker &
pids+=($!)
TF_CONFIG=$(tf 0) "$kiln" "${common[@]}" --strategy multi_worker --metrics-json "$d/w0.json"
wait "${pids[-1]}"
compare TF_CONFIG

# mpirun (OpenMPI sets the ranks): the collectives over MPI where kiln has its MPI plugin
# (auto), and over Gloo (the workers meet through files of the job).
want=gloo
[ -n "${2:-}" ] && want=mpi  # the MPI plugin was built
for collectives in auto gloo; do
  mpirun --allow-run-as-root --oversubscribe -np 2 -x KILN_NUM_THREADS \
    sh -c 'exec "$0" "$@" --metrics-json "$1.$OMPI_COMM_WORLD_RANK"' "$kiln" "${common[@]}" --strategy multi_worker \
    --collectives $collectives >"$d/mpirun.out" 2>&1 || { cat "$d/mpirun.out"; exit 1; }
  # (sh -c's $1 is "train": the files are train.0 and train.1 in the working directory)
  mv train.0 "$d/w0.json" && rm -f train.1
  grep -q "worker 0 of 2: collectives over $want" "$d/mpirun.out" || { echo "want $want:"; cat "$d/mpirun.out"; exit 1; }
  compare "mpirun, --collectives $collectives ($want)"
  want=gloo
done

# Failures: each survivor exits 1 with the cause, within the timeout (10 s here).
fails() {  # fails PATTERN SECONDS: the last command's stderr ($d/err) and time
  if ! grep -q -- "$1" "$d/err" || [ "$2" -gt 20 ]; then echo "expected '$1' within 20 s, got after $2 s:"; cat "$d/err"; exit 1; fi
  echo "ok: $(grep -o -- "$1.*" "$d/err" | head -c 160) ($2 s)"
}
long=(train --model mlp --epochs 100 --verbose 0 --strategy multi_worker --worker-timeout 10)
for how in KILL STOP; do
  p=$(port)
  KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=1 "$kiln" "${long[@]}" 2>/dev/null &
  victim=$!; pids+=($victim)
  (sleep 3; kill -$how $victim) &
  t0=$(date +%s)
  set +e; KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=0 "$kiln" "${long[@]}" 2>"$d/err"; rc=$?; set -e
  [ $rc -eq 1 ] || { echo "SIG$how: worker 0 rc=$rc"; cat "$d/err"; exit 1; }
  # Gloo's error names the peer's address (or nothing, for some timeouts); kiln names its
  # rank (with two workers, the other one).
  fails "worker 1 died, hangs or lost the network" $(( $(date +%s) - t0 - 3 ))
  kill -9 $victim 2>/dev/null || true
done
# The same under mpirun over MPI: a killed rank ends the job (mpirun names it); a stopped
# one makes the others' watchdog end it (MPI_Abort) within --worker-timeout.
if [ -n "${2:-}" ]; then
  for how in KILL STOP; do
    rm -f "$d"/pid.*
    (for _ in $(seq 1 100); do [ -s "$d/pid.1" ] && break; sleep 0.1; done; sleep 3; kill -$how "$(cat "$d/pid.1")") &
    t0=$(date +%s)
    set +e
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x KILN_NUM_THREADS \
      sh -c 'echo $$ > "$0.$OMPI_COMM_WORLD_RANK"; exec "$@"' "$d/pid" "$kiln" "${long[@]}" --worker-timeout 5 \
      >"$d/err" 2>&1
    rc=$?
    set -e
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "mpirun, SIG$how: rc=$rc"; cat "$d/err"; exit 1; }
    if [ $how = KILL ]; then want="process rank 1 .* exited on signal 9"; else
      want="worker 0 of 2: [a-z_]* did not complete within 5 s over MPI: another worker died, hangs"; fi
    fails "$want" $(( $(date +%s) - t0 - 3 ))
    kill -9 "$(cat "$d/pid.1")" 2>/dev/null || true
  done
fi
p=$(port)
t0=$(date +%s)
set +e; KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=0 "$kiln" "${long[@]}" --worker-timeout 3 2>"$d/err"; set -e
fails "worker 1 did not reach the rendezvous" $(( $(date +%s) - t0 ))
# Different configurations: both workers refuse to train.
p=$(port)
KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=1 "$kiln" "${common[@]}" --strategy multi_worker --batch-size 64 2>"$d/err1" &
pids+=($!)
set +e; KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=0 "$kiln" "${common[@]}" --strategy multi_worker 2>"$d/err"; rc=$?; set -e
[ $rc -eq 1 ] || { echo "mismatch: worker 0 rc=$rc"; exit 1; }
set +e; wait "${pids[-1]}"; rc1=$?; set -e
[ $rc1 -eq 1 ] || { echo "mismatch: worker 1 rc=$rc1"; cat "$d/err1"; exit 1; }
fails "worker 1's model and batch differs from the chief's: batch of 64 rows" 0
set +e; "$kiln" "${common[@]}" --strategy multi_worker 2>"$d/err"; set -e
fails "no workers in the environment" 0

# Kill one worker mid-epoch (SIGKILL): the other stops; the same launch again resumes both
# from the chief's last backup and ends where an uninterrupted run ends.
ft=(train --model mlp --epochs 2 --max-samples 12000 --batch-size 32 --verbose 0 --backup-freq 25 --strategy multi_worker
    --worker-timeout 20)
launch() {  # launch TAG: both workers; worker 1 in the background ($w1), worker 0 too ($w0)
  p=$(port)
  KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=1 "$kiln" "${ft[@]}" "$@" 2>"$d/w1.err" & w1=$!; pids+=($w1)
  KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=0 "$kiln" "${ft[@]}" "$@" --metrics-json "$d/w0.json" \
    2>"$d/w0.err" & w0=$!; pids+=($w0)
}
launch
wait $w0 && wait $w1 || { echo "uninterrupted run failed"; cat "$d/w0.err" "$d/w1.err"; exit 1; }
mv "$d/w0.json" "$d/ref.json"
launch --checkpoint-dir "$d/ckpt"
for _ in $(seq 1 3000); do  # until a few backups exist (375 batches an epoch, a backup every 25)
  steps=$(ls "$d/ckpt/backup" 2>/dev/null | sed -n 's/^backup-\([0-9]*\)\.ckpt$/\1/p' | sort -n | tail -n 1 || true)
  [ "${steps:-0}" -ge 100 ] && break
  kill -0 $w0 2>/dev/null || break
  sleep 0.01
done
kill -9 $w1
set +e; wait $w0; rc=$?; set -e
[ $rc -eq 1 ] || { echo "after the kill: worker 0 rc=$rc (want 1)"; cat "$d/w0.err"; exit 1; }
[ ! -e "$d/w0.json" ] || { echo "the run finished before the kill; nothing was tested"; exit 1; }
grep -q "worker 1 died, hangs" "$d/w0.err" || { echo "worker 0 did not say why it stopped"; cat "$d/w0.err"; exit 1; }
echo "killed worker 1 after backup step $steps; relaunching both"
launch --checkpoint-dir "$d/ckpt"
wait $w0 && wait $w1 || { echo "resumed run failed"; cat "$d/w0.err" "$d/w1.err"; exit 1; }
grep -q "resumed from" "$d/w0.err" && grep -q "resumed from" "$d/w1.err" || {
  echo "a worker did not resume"; cat "$d/w0.err" "$d/w1.err"; exit 1; }
python3 - "$d/ref.json" "$d/w0.json" <<'PY'
import json, sys
ref, run = (json.load(open(p)) for p in sys.argv[1:3])
print(f"uninterrupted test_loss {ref['test_loss']:.6f}, killed + resumed {run['test_loss']:.6f}")
assert abs(ref["test_loss"] - run["test_loss"]) <= 1e-4 and abs(ref["test_accuracy"] - run["test_accuracy"]) <= 0.002, (ref, run)
PY
echo "train_multi_worker: ok"
