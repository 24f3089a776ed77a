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
# The instruction sets this CPU has, named one by one rather than GGML_NATIVE: these VMs
# report AMX in CPUID but do not grant its tile state (AMX code dies with SIGILL), so AMX
# stays off; everything else the CPU has (AVX-512, VNNI, BF16, VBMI) is on.
has() { grep -qw "$1" /proc/cpuinfo; }
isa=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
has avx512f && isa+=(-DGGML_AVX512=ON)
has avx512_vnni && isa+=(-DGGML_AVX512_VNNI=ON)
has avx512_bf16 && isa+=(-DGGML_AVX512_BF16=ON)
has avx512vbmi && isa+=(-DGGML_AVX512_VBMI=ON)
has avx_vnni && isa+=(-DGGML_AVX_VNNI=ON)
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF "${isa[@]}" \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DBUILD_SHARED_LIBS=ON >/dev/null
cmake --build "$root/build" -j "$(nproc)" --target llama-tokenize llama-bench llama-perplexity llama-cli llama-server llama
echo "llama.cpp peer: $PWD/$bin"
