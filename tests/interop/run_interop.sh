#!/bin/sh
# ctest driver: run_interop.sh VENV_PYTHON WRITER SCRIPT
# Fails (never skips) when the venv is missing: stock TensorBoard must read kiln's files.
set -eu
python="$1" writer="$2" script="$3"
if [ ! -x "$python" ]; then
  echo "FAIL: $python not found: run scripts/python-venv.sh (creates build/venv with numpy and tensorboard)" >&2
  exit 1
fi
if ! "$python" -c "import tensorboard" 2>/dev/null; then
  echo "FAIL: tensorboard is not installed in $python's venv: run scripts/python-venv.sh" >&2
  exit 1
fi
logdir=$(mktemp -d "${TMPDIR:-/tmp}/kiln_interop.XXXXXX")
trap 'rm -rf "$logdir"' EXIT
"$python" "$script" "$writer" "$logdir"
