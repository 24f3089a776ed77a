#!/usr/bin/env bash
# The test command: installs dependencies, builds and runs the test suite under the
# default preset (RelWithDebInfo, gcc), then AddressSanitizer+UBSan (clang, which also
# builds the libFuzzer targets: a short run of each parser follows), then the concurrent
# tests under ThreadSanitizer (gcc).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# ccache keyed on paths relative to the checkout, so fresh clones hit the cache.
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/kiln-ccache}" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
JOBS="${KILN_JOBS:-$(nproc)}"
start=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - start ))s)"; }

for preset in default asan tsan; do
  step "configure + build: $preset"
  cmake --preset "$preset" >/dev/null
  # ThreadSanitizer runs the concurrent tests only (core, the data pipeline, packages, the server, the LLM engine,
  # distribution strategies): build just those.
  target=(); [ "$preset" = tsan ] && target=(--target kiln_core_tests kiln_pipeline_tests kiln_package_tests kiln_serving_tests
                                             kiln_llm_engine_tests kiln_distribute_tests)
  cmake --build --preset "$preset" -j "$JOBS" "${target[@]}"
  step "test: $preset"
  # The interop tests read kiln's files with stock Python packages (TensorBoard).
  if [ "$preset" = default ]; then bash scripts/python-venv.sh; fi
  ctest --preset "$preset"
  if [ "$preset" = asan ] && [ "${KILN_SKIP_FUZZ:-0}" != "1" ]; then
    step "fuzz smoke"
    bash scripts/fuzz-smoke.sh build/asan/fuzz
  fi
done
step "all tests passed"
