#!/usr/bin/env bash
# Builds llama.cpp, the LLM peer and oracle, from the source inside PyPI's
# llama-cpp-python sdist (scripts/llama-cpp-source.sh): build/peers/llama.cpp/build/bin/
# gets llama-tokenize, llama-bench, llama-perplexity, llama-cli, llama-server and the
# shared libllama. Not part of CI. Idempotent.
#   bench/peers/llama_cpp.sh            # build (about 10 minutes on 2 cores)
#   bench/peers/llama_cpp.sh --print    # print the bin directory
set -euo pipefail
cd "$(dirname "$0")/../.."
root=build/peers/llama.cpp
bin="$root/build/bin"
if [ "${1:-}" = --print ]; then echo "$PWD/$bin"; exit 0; fi
bash scripts/llama-cpp-source.sh
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DBUILD_SHARED_LIBS=ON >/dev/null
cmake --build "$root/build" -j "$(nproc)" --target llama-tokenize llama-bench llama-perplexity llama-cli llama-server llama
echo "llama.cpp peer: $PWD/$bin"
