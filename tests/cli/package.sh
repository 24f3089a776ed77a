#!/usr/bin/env bash
# `kiln train --export`, `kiln show`, `kiln run` end to end. Usage: package.sh KILN CASE;
# prints what kiln printed and "rc=<exit code>" for ctest's PASS_REGULAR_EXPRESSION.
#   show:     export the MLP, then `show` (list), `show --all`, `show --signature_def`
#   run:      `run` a batch through classify; a wrong input name and a bad file fail
#   corrupt:  a truncated weights file and a newer-format manifest: named errors, rc=1
#   missing:  `show` of a directory without a package
#   convert:  bf16 and int8 conversions with validation on Fashion-MNIST; bad requests
set -uo pipefail
KILN="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export KILN_NUM_THREADS=1

export_mlp() {
  "$KILN" train --model mlp --epochs 1 --max-samples 300 --verbose 0 --export "$work/pkg" > "$work/train.log" 2>&1 ||
    { cat "$work/train.log"; echo "rc=export-failed"; exit 1; }
}

# A [2, 784] f32 .npy of zeros (NumPy format 1.0: magic, version, header length, header).
npy_zeros() {
  local header="{'descr': '<f4', 'fortran_order': False, 'shape': (2, 784), }"
  while [ $(( (10 + ${#header} + 1) % 64 )) -ne 0 ]; do header="$header "; done
  { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $(( (${#header} + 1) % 256 )))\\x$(printf %02x $(( (${#header} + 1) / 256 )))";
    printf '%s\n' "$header"; head -c $((2 * 784 * 4)) /dev/zero; } > "$1"
}

case "$2" in
  show)
    export_mlp
    "$KILN" show --dir "$work/pkg"; echo "rc=$?"
    "$KILN" show --dir "$work/pkg/1" --all; echo "rc=$?"
    "$KILN" show --dir "$work/pkg" --signature_def classify; echo "rc=$?"
    "$KILN" show --dir "$work/pkg" --signature_def nope; echo "rc=$?"
    ;;
  run)
    export_mlp
    npy_zeros "$work/x.npy"
    "$KILN" run --dir "$work/pkg" --signature classify --input "dense_input=$work/x.npy" --output_dir "$work/out"; echo "rc=$?"
    [ -s "$work/out/classes.npy" ] && [ -s "$work/out/scores.npy" ] && echo "npy outputs written"
    "$KILN" run --dir "$work/pkg" --input "pixels=$work/x.npy"; echo "rc=$?"
    printf 'not npy' > "$work/bad.npy"
    "$KILN" run --dir "$work/pkg" --input "dense_input=$work/bad.npy"; echo "rc=$?"
    ;;
  corrupt)
    export_mlp
    w="$work/pkg/1/variables.safetensors"
    head -c 1000 "$w" > "$w.cut" && mv "$w.cut" "$w"
    "$KILN" show --dir "$work/pkg"; echo "rc=$?"
    rm -rf "$work/pkg" && export_mlp
    sed -i 's/"min_consumer_version": 1/"min_consumer_version": 2/' "$work/pkg/1/manifest.json"
    "$KILN" show --dir "$work/pkg"; echo "rc=$?"
    ;;
  convert)
    export_mlp
    "$KILN" convert --dir "$work/pkg" --output_dir "$work/pkg/2" --precision bf16 --validation_data fashion-mnist:500; echo "rc=$?"
    "$KILN" convert --dir "$work/pkg/1" --output_dir "$work/pkg/3" --precision int8 --calibration_data fashion-mnist:300 \
      --validation_data fashion-mnist:500; echo "rc=$?"
    "$KILN" show --dir "$work/pkg" --all | grep -E "precision|converted"
    "$KILN" convert --dir "$work/pkg/1" --output_dir "$work/pkg/4" --precision int8; echo "rc=$?"
    "$KILN" convert --dir "$work/pkg/1" --output_dir "$work/pkg/2" --precision fp32; echo "rc=$?"
    ;;
  missing)
    "$KILN" show --dir "$work/nothing"; echo "rc=$?"
    mkdir -p "$work/empty"
    "$KILN" run --dir "$work/empty" --input x=y.npy; echo "rc=$?"
    ;;
esac 2>&1
