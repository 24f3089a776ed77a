#!/usr/bin/env bash
# Issue 4's inference-latency figure: kiln's graph-mode runtime (bench_inference, the
# package's serving signature through SavedModel::run) vs onnxruntime (pip) and PyTorch
# (Debian's python3-torch) running the same weights, batch 1 and 64, mlp and cnn, 2
# threads each. Target: kiln no slower than onnxruntime.
# Peers: bench/inference_peers.py (onnxruntime, ONNX graph built from the package's
# weights; venv) and bench/inference_torch.py (system python3); both check their outputs
# against `kiln run` (max |diff| <= 1e-4) before timing. Each reports its fastest way of
# calling (ORT: run vs io-binding; torch: eager/channels_last/jit/optimize_for_inference).
# RUNS alternating rounds; the table shows the median over rounds of each round's median
# latency (microseconds).
# Usage: bench/inference_compare.sh [RUNS=3] [PACKAGES]
#   PACKAGES: a directory with mlp/ and cnn/ package bases (kiln train --export); without
#   it both models are trained for 1 epoch on 2000 samples into a temporary directory.
#   KILN_BENCH_BIN: the directory with kiln and bench_inference (default build/default/bin).
# Installs onnxruntime and onnx into build/venv if missing (bench only; not a test need).
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
pkgs="${2:-}"
bin="${KILN_BENCH_BIN:-build/default/bin}"
py=build/venv/bin/python
[ -x "$bin/bench_inference" ] && [ -x "$bin/kiln" ] || {
  echo "build first: cmake --build build/default --target kiln bench_inference" >&2; exit 1; }
[ -x "$py" ] || { echo "missing $py (the project venv)" >&2; exit 1; }
"$py" -c "import onnxruntime, onnx" 2>/dev/null || build/venv/bin/pip install -q onnxruntime onnx
have_torch=1
/usr/bin/python3 -c "import torch" 2>/dev/null || {
  have_torch=0; echo "warning: no PyTorch in /usr/bin/python3 (apt-get install python3-torch); torch column empty" >&2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$pkgs" ]; then
  pkgs="$tmp/packages"
  for m in mlp cnn; do
    "$bin/kiln" train --model "$m" --epochs 1 --max-samples 2000 --export "$pkgs/$m" --verbose 0 >/dev/null
  done
fi

builds() { pgrep -f 'cmake --build|ninja|cc1plus' >/dev/null && echo 1 || echo 0; }
res="$tmp/results.jsonl"
: > "$res"
for r in $(seq 1 "$runs"); do
  check=(); [ "$r" -gt 1 ] && check=(--no-check)
  for m in mlp cnn; do
    b0=$(builds)
    KILN_NUM_THREADS=2 "$bin/bench_inference" "$pkgs/$m" >>"$res"
    "$py" bench/inference_peers.py "$pkgs/$m" --threads 2 --kiln "$bin/kiln" "${check[@]}" >>"$res"
    if [ "$have_torch" = 1 ]; then
      # OpenBLAS-based peer: unset this machine's OpenBLAS throttles for the peer alone; one
      # BLAS thread (torch's 2 OpenMP threads plus OpenBLAS's oversubscribe 2 cores).
      env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \
        /usr/bin/python3 bench/inference_torch.py "$pkgs/$m" --threads 2 --kiln "$bin/kiln" "${check[@]}" >>"$res"
    fi
    if [ "$b0" = 1 ] || [ "$(builds)" = 1 ]; then
      echo "warning: a build ran during round $r ($m): its numbers are unreliable, rerun" >&2
    fi
  done
done

"$py" - "$res" "$runs" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
med = collections.defaultdict(list)
var = collections.defaultdict(list)
for r in rows:
    med[r["runtime"], r["model"], r["batch"]].append(r["median_us"])
    if "variant" in r:
        var[r["runtime"], r["model"], r["batch"]].append(r["variant"])
get = lambda rt, m, b: statistics.median(med[rt, m, b]) if med[rt, m, b] else float("nan")
print(f"inference latency, median of {sys.argv[2]} round(s) of per-call medians, microseconds, 2 threads")
print(f"{'model':6} {'batch':>5} {'kiln us':>10} {'ORT us':>10} {'torch us':>10} {'ORT/kiln':>9} {'torch/kiln':>10}")
met = True
for m in ("mlp", "cnn"):
    for b in sorted({k[2] for k in med if k[1] == m}):
        k, o, t = get("kiln", m, b), get("ort", m, b), get("torch", m, b)
        met &= o / k >= 1.0
        print(f"{m:6} {b:5d} {k:10.1f} {o:10.1f} {t:10.1f} {o / k:8.2f}x {t / k:9.2f}x")
print("(ratios > 1: kiln faster)  ORT calls used: " +
      ", ".join(f"{m}/{b}: {collections.Counter(v).most_common(1)[0][0]}" for (rt, m, b), v in var.items() if rt == "ort"))
print("torch variants used: " +
      ", ".join(f"{m}/{b}: {collections.Counter(v).most_common(1)[0][0]}" for (rt, m, b), v in var.items() if rt == "torch"))
print(f"target (kiln no slower than onnxruntime everywhere): {'met' if met else 'NOT met'}")
PY
