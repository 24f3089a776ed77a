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

# The Python venv (pip downloads, mostly waiting on the network) is made while the default preset
# compiles; the tests wait for it. Its log is printed when it is waited for.
mkdir -p build
bash scripts/python-venv.sh >build/python-venv.log 2>&1 &
venv_pid=$!
wait_venv() {
  local rc=0
  wait "$venv_pid" || rc=$?
  cat build/python-venv.log
  if [ "$rc" -ne 0 ]; then echo "scripts/python-venv.sh failed (rc $rc)"; exit "$rc"; fi
}

for preset in default asan tsan; do
  step "configure + build: $preset"
  cmake --preset "$preset" >/dev/null
  # ThreadSanitizer runs the concurrent tests only (core, the data pipeline, packages, the server, the LLM engine,
  # distribution strategies): build just those.
  target=(); [ "$preset" = tsan ] && target=(--target kiln_core_tests kiln_pipeline_tests kiln_package_tests kiln_serving_tests
                                             kiln_llm_engine_tests kiln_distribute_tests)
  cmake --build --preset "$preset" -j "$JOBS" "${target[@]}"
  step "test: $preset"
  # The interop tests read kiln's files with stock Python packages (TensorBoard, TensorFlow, openai ...).
  if [ "$preset" = default ]; then wait_venv; fi
  ctest --preset "$preset"
  if [ "$preset" = asan ] && [ "${KILN_SKIP_FUZZ:-0}" != "1" ]; then
    step "fuzz smoke"
    bash scripts/fuzz-smoke.sh build/asan/fuzz
  fi
done
step "all tests passed"
