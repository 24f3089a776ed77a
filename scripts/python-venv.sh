#!/usr/bin/env bash
# Makes the Python venv that fixture generators and interop tests use: build/venv (or
# the directory given as $1) with numpy, tensorboard and tensorflow-cpu from PyPI. Idempotent: creates
# the venv only when missing and installs only the packages that do not import.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-build/venv}"

if [ -x "$venv/bin/python" ]; then
  echo "python-venv: $venv exists"
else
  echo "python-venv: creating $venv"
  python3 -m venv "$venv"
fi

# module name -> pip requirement
# tensorflow-cpu: the interop tests (TFRecord / tf.train.Example both ways) and the
# tf.data peer of bench/input_compare.sh. pip's cache makes reinstalls cheap.
# safetensors: the model package's weights file read by the reference reader.
declare -A want=([numpy]="numpy>=1.24,<3" [tensorboard]="tensorboard>=2.14,<3" [tensorflow]="tensorflow-cpu>=2.16,<3"
                 [safetensors]="safetensors>=0.4,<1")
export TF_CPP_MIN_LOG_LEVEL=2  # quiet imports
for mod in numpy tensorboard tensorflow safetensors; do
  if "$venv/bin/python" -c "import $mod" 2>/dev/null; then
    echo "python-venv: $mod $("$venv/bin/python" -c "import $mod; print($mod.__version__)") present"
  else
    echo "python-venv: pip install ${want[$mod]}"
    "$venv/bin/pip" install -q "${want[$mod]}"
  fi
done
