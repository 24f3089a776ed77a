#!/usr/bin/env bash
# Unpacks llama.cpp's source from PyPI's llama-cpp-python sdist into build/peers/llama.cpp
# (the only registry reachable here ships it there). Used twice: the LLM tests read its
# vocabulary-only GGUF files with their expected token ids (models/ggml-vocab-*.gguf,
# .inp/.out) and its chat-template corpus (models/templates/); bench/peers/llama_cpp.sh
# builds the peer from it. Idempotent; pip's cache makes a second download free.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
root=build/peers/llama.cpp
if [ -f "$root/CMakeLists.txt" ] && [ -d "$root/models" ]; then
  echo "llama-cpp-source: $root present"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$version"
tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
mkdir -p "$(dirname "$root")"
rm -rf "$root"
mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$root"
echo "llama-cpp-source: llama-cpp-python $version unpacked to $root"
