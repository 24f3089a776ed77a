#!/usr/bin/env bash
# `kiln train --strategy mirrored` on two logical CPU devices reaches the same weights as
# one device (the same losses and accuracy within float summation order), for the mlp
# (2 epochs) and the cnn (1 epoch) on real Fashion-MNIST; bad strategy flags are clear errors.
set -euo pipefail
kiln="$1"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
for model in mlp cnn; do
  n=4000 epochs=2; [ "$model" = cnn ] && n=1000 epochs=1
  "$kiln" train --model "$model" --epochs $epochs --max-samples $n --verbose 0 --metrics-json "$d/one.json"
  "$kiln" train --model "$model" --epochs $epochs --max-samples $n --verbose 2 --metrics-json "$d/two.json" \
    --strategy mirrored --devices cpu:0,cpu:1 | tee "$d/two.log"
  grep -q "Strategy: mirrored, 2 replicas (cpu:0, cpu:1)" "$d/two.log"
  python3 - "$d/one.json" "$d/two.json" "$model" <<'PY'
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[1:3])
assert two["replicas"] == 2 and one["replicas"] == 1, (one["replicas"], two["replicas"])
for k in ("train_loss", "test_loss"):
    if abs(one[k] - two[k]) > 1e-4:
        sys.exit(f"{sys.argv[3]}: {k} one device {one[k]} vs mirrored {two[k]}")
if abs(one["test_accuracy"] - two["test_accuracy"]) > 0.002:
    sys.exit(f"{sys.argv[3]}: test_accuracy one device {one['test_accuracy']} vs mirrored {two['test_accuracy']}")
print(f"{sys.argv[3]}: test_loss one device {one['test_loss']:.6f}, mirrored {two['test_loss']:.6f}; "
      f"accuracy {one['test_accuracy']:.4f} / {two['test_accuracy']:.4f}")
PY
done
expect_error() {  # expect_error PATTERN ARGS...: kiln train fails (rc 1) with PATTERN on stderr
  local pattern="$1"; shift
  set +e; "$kiln" train --max-samples 100 --epochs 1 --verbose 0 "$@" 2>"$d/err"; rc=$?; set -e
  if [ $rc -ne 1 ] || ! grep -q -- "$pattern" "$d/err"; then
    echo "kiln train $*: rc=$rc, stderr:"; cat "$d/err"; exit 1
  fi
}
expect_error "cpu:1 is listed twice" --strategy mirrored --devices cpu:1,cpu:1
expect_error "--devices needs --strategy" --devices cpu:0,cpu:1
expect_error "exclude each other" --strategy mirrored --device cpu
expect_error "one kind of device" --strategy mirrored --devices cpu:0,cuda:0
expect_error "cpu:3" --strategy mirrored --devices cpu:0,cpu:3 --logical-devices 0,0
echo "train_mirrored: ok"
