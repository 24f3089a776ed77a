#!/usr/bin/env bash
# kiln eager training vs PyTorch (Debian's python3-torch) on Fashion-MNIST: same model,
# Adam 1e-3, batch 128, inputs in [0, 1], 2 threads. Prints accuracy and epoch-time ratios.
# Usage: bench/train_compare.sh [mlp|cnn] [epochs] [runs]
#   KILN_BENCH_BIN: the directory with kiln (default build/release/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-mlp}"; epochs="${2:-5}"; runs="${3:-1}"
kiln="${KILN_BENCH_BIN:-build/release/bin}/kiln"
[ -x "$kiln" ] || { echo "build first: cmake --preset release && cmake --build --preset release"; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || {
  echo "needs Debian's PyTorch: apt-get install python3-torch libopenblas0-pthread"; exit 1; }
# Without an optimised BLAS, Debian's torch falls back to the reference BLAS (~2 GFLOP/s).
update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep -q "^Value:.*openblas" ||
  echo "warning: libblas.so.3 is not OpenBLAS; PyTorch's Linear layers will be slow (apt-get install libopenblas0-pthread)"
out=$(mktemp -d)
for r in $(seq 1 "$runs"); do
  KILN_NUM_THREADS=2 "$kiln" train --model "$model" --epochs "$epochs" --verbose 2 --metrics-json "$out/kiln-$r.json"
  # OpenBLAS-based peer: unset this machine's OpenBLAS throttles for the peer alone.
  # One BLAS thread: torch's own 2 OpenMP threads plus OpenBLAS threads oversubscribe 2 cores
  # (16 ms/step instead of 6.6 for the MLP).
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/fashion_mnist_torch.py --model "$model" \
    --epochs "$epochs" --threads 2 --metrics-json "$out/torch-$r.json"
done
/usr/bin/python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
k = [json.load(open(f"{out}/kiln-{r}.json")) for r in range(1, runs + 1)]
t = [json.load(open(f"{out}/torch-{r}.json")) for r in range(1, runs + 1)]
med = lambda xs, key: statistics.median(x[key] for x in xs)
ke, te = med(k, "mean_epoch_seconds"), med(t, "mean_epoch_seconds")
print(f"model {k[0]['model']}, {k[0]['epochs']} epochs, {runs} run(s), medians")
print(f"  kiln : test accuracy {med(k, 'test_accuracy'):.4f}, {ke:.2f} s/epoch")
print(f"  torch: test accuracy {med(t, 'test_accuracy'):.4f}, {te:.2f} s/epoch ({t[0]['torch']})")
print(f"  speed ratio torch/kiln epoch time: {te / ke:.2f}x (> 1: kiln faster)")
PY
