#!/usr/bin/env python3
"""Writes a TensorFlow Serving REST predict body for the first N Fashion-MNIST test
images (pixels scaled to [0, 1], as `kiln train` feeds them): {"instances": [[784 floats], ...]}.
Standard library only. Usage: make_request.py OUT.json [N] [DATA_DIR]"""
import gzip
import json
import sys

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2
data = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
with gzip.open(f"{data}/t10k-images-idx3-ubyte.gz") as f:
    raw = f.read(16 + n * 784)[16:]
with gzip.open(f"{data}/t10k-labels-idx1-ubyte.gz") as f:
    labels = list(f.read(8 + n)[8:])
rows = [[round(b / 255.0, 4) for b in raw[i * 784:(i + 1) * 784]] for i in range(n)]
with open(out, "w") as f:
    json.dump({"instances": rows}, f)
print(f"wrote {out}: {n} test images, labels {labels}")
