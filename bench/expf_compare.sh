#!/usr/bin/env bash
# Vectorised expf: glibc's libmvec vs SLEEF's GNU-ABI library (if libsleef-dev is
# installed) vs a polynomial (bench/expf_compare.cc). Usage: bash bench/expf_compare.sh [--accuracy]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-std=c++20 -O3 -mavx2 -mfma -fopenmp-simd -fno-math-errno)
g++ "${flags[@]}" "$here/expf_compare.cc" -o "$out/mvec" -lmvec -lm
echo "== libmvec"; "$out/mvec" "$@"
if [ -e /usr/lib/x86_64-linux-gnu/libsleefgnuabi.so ]; then
  g++ "${flags[@]}" "$here/expf_compare.cc" -o "$out/sleef" -lsleefgnuabi -lm
  echo "== SLEEF (the vector-ABI column)"; "$out/sleef"
fi
