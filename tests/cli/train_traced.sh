#!/usr/bin/env bash
# `kiln train` runs traced steps by default and eager ones with --run-eagerly: both
# reach the same losses (the fused kernels round within f32), for the mlp and the cnn.
set -euo pipefail
kiln="$1"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
for model in mlp cnn; do
  n=3000; [ "$model" = cnn ] && n=600
  "$kiln" train --model "$model" --epochs 2 --max-samples $n --verbose 0 --metrics-json "$d/traced.json"
  "$kiln" train --model "$model" --epochs 2 --max-samples $n --verbose 0 --run-eagerly --metrics-json "$d/eager.json"
  python3 - "$d/traced.json" "$d/eager.json" "$model" <<'PY'
import json, sys
t, e = (json.load(open(p)) for p in sys.argv[1:3])
for k in ("train_loss", "test_loss", "test_accuracy"):
    if abs(t[k] - e[k]) > 1e-3:
        sys.exit(f"{sys.argv[3]}: {k} traced {t[k]} vs eager {e[k]}")
print(f"{sys.argv[3]}: traced test_loss {t['test_loss']:.5f} = eager {e['test_loss']:.5f}")
PY
done
# A repeated option takes its last value (scripts/run.sh passes defaults before "$@").
"$kiln" train --model cnn --epochs 9 --max-samples 300 --verbose 0 --model mlp --epochs 1 --metrics-json "$d/last.json"
python3 - "$d/last.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
if (m["model"], m["epochs"]) != ("mlp", 1):
    sys.exit(f"repeated options: got model {m['model']} epochs {m['epochs']}, want the last ones (mlp, 1)")
PY
echo "train_traced: ok"
