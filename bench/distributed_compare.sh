#!/usr/bin/env bash
# Data-parallel scaling of `kiln train` on this machine: one replica on one core against
# two replicas on one core each, in one process (--strategy mirrored) and as two worker
# processes (--strategy multi_worker: Gloo over loopback TCP with KILN_WORKERS, MPI's shared
# memory under mpirun), beside one replica using
# both cores (intra-op threads); then kiln's Gloo all-reduce against OpenMPI's
# (bench_allreduce under mpirun: shared memory, and TCP only). Overlap of the gradient
# all-reduce with the backward pass on and off (--overlap), and weak scaling (each replica
# keeps the batch of 128: --batch-size 256 on two). Runs alternate; medians of the mean
# epoch time.
#   bash bench/distributed_compare.sh [rounds] [build dir]
set -euo pipefail
rounds="${1:-3}"
build="${2:-build/default}"
kiln=$(readlink -f "$build/bin/kiln")
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
run() {  # run MODEL CONFIG: prints the mean epoch seconds
  local model="$1" cfg="$2" common=(train --model "$1" --verbose 0)
  if [ "$model" = cnn ]; then common+=(--epochs 2 --max-samples 20000); else common+=(--epochs 3); fi
  # Weak scaling ("-b2x"): each replica keeps the single replica's batch of 128.
  case "$cfg" in *-b2x) common+=(--batch-size 256) ;; esac
  case "$cfg" in gloo-off) common+=(--overlap off) ;; mpirun-on) common+=(--overlap on) ;; esac
  local args=("${common[@]}" --metrics-json "$d/m.json")
  case "$cfg" in
    1x1) KILN_NUM_THREADS=1 "$kiln" "${args[@]}" > /dev/null ;;
    1x2) KILN_NUM_THREADS=2 "$kiln" "${args[@]}" > /dev/null ;;
    mirrored*) KILN_NUM_THREADS=2 "$kiln" "${args[@]}" --strategy mirrored --devices cpu:0,cpu:1 > /dev/null ;;
    gloo*)
      p=$(port)
      KILN_NUM_THREADS=1 KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=1 "$kiln" "${common[@]}" \
        --strategy multi_worker > /dev/null 2>&1 &
      KILN_NUM_THREADS=1 KILN_WORKERS=127.0.0.1:$p,127.0.0.1:$p KILN_RANK=0 "$kiln" "${args[@]}" --strategy multi_worker \
        > /dev/null 2>&1
      wait ;;
    mpirun*)  # the collectives over MPI (shared memory)
      (cd "$d" && mpirun --allow-run-as-root --oversubscribe -np 2 -x KILN_NUM_THREADS=1 \
        sh -c 'exec "$0" "$@" --metrics-json "m.json.$OMPI_COMM_WORLD_RANK"' "$kiln" "${common[@]}" \
        --strategy multi_worker > /dev/null 2>&1)
      mv "$d/m.json.0" "$d/m.json" ;;
  esac
  python3 -c "import json; print(json.load(open('$d/m.json'))['mean_epoch_seconds'])"
}
configs=(1x1 mirrored gloo gloo-off mpirun mpirun-on 1x2 mirrored-b2x mpirun-b2x)
describe() {
  case $1 in
    1x1) echo "1 replica, 1 thread, batch 128";;
    mirrored) echo "mirrored: 2 replicas x 1 thread, global batch 128";;
    gloo) echo "multi_worker: 2 processes x 1 thread, Gloo (KILN_WORKERS), overlap on (auto)";;
    gloo-off) echo "the same, overlap off";;
    mpirun) echo "multi_worker: 2 processes x 1 thread, MPI (mpirun), overlap off (auto)";;
    mpirun-on) echo "the same, overlap on";;
    1x2) echo "1 replica, 2 threads (intra-op), batch 128";;
    mirrored-b2x) echo "weak scaling: mirrored, 2 replicas x 128 rows (global 256)";;
    mpirun-b2x) echo "weak scaling: MPI, 2 processes x 128 rows (global 256)";;
  esac
}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
for model in cnn mlp; do
  declare -A t=()
  for r in $(seq 1 "$rounds"); do
    for cfg in "${configs[@]}"; do t[$cfg]+="$(run "$model" "$cfg") "; done
  done
  med() { echo "$1" | tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  base=$(med "${t[1x1]}")
  echo
  echo "$model: mean epoch seconds (the same samples per epoch in every row), medians of $rounds rounds; scaling"
  echo "efficiency = samples/s over 1 replica x 1 thread's / 2"
  echo "| configuration | epoch s | speedup | efficiency |"
  echo "| --- | --- | --- | --- |"
  for cfg in "${configs[@]}"; do
    m=$(med "${t[$cfg]}")
    python3 -c "b=$base; m=$m; print(f'| $(describe $cfg) | {m:.3f} | {b/m:.2f} | {b/m/2*100:.0f}% |')"
  done
  unset t
done
if [ -x "$build/bin/bench_allreduce" ] && command -v mpirun > /dev/null; then
  echo
  echo "OpenMPI with shared memory (its default on one host):"
  mpirun --allow-run-as-root --oversubscribe -np 2 -x KILN_NUM_THREADS=1 "$build/bin/bench_allreduce" "$rounds" | tail -n +2
  echo
  echo "OpenMPI over TCP only (--mca btl tcp,self), as between hosts:"
  mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self -np 2 -x KILN_NUM_THREADS=1 "$build/bin/bench_allreduce" \
    "$rounds" | tail -n +2
fi
