#!/usr/bin/env python3
"""Writes a TensorFlow Serving REST predict body for the first N Fashion-MNIST test
images (pixels scaled to [0, 1], as `kiln train` feeds them): {"instances": [...]},
each instance 784 floats, or nested lists of the shape given with --shape (the
serving signature's input without its batch dim: 28,28,1 for the cnn) or read from
`kiln show --signature_def serving_default` output with --signature FILE ('-': stdin).
Standard library only.
Usage: make_request.py OUT.json [N] [DATA_DIR] [--shape D1,D2,... | --signature FILE]"""
import argparse
import gzip
import json
import math
import re
import sys

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("n", nargs="?", type=int, default=2)
p.add_argument("data", nargs="?", default="/usr/share/datasets/fashion-mnist")
p.add_argument("--shape", default="784", help="one instance's dims, comma-separated (product 784)")
p.add_argument("--signature", help="`kiln show --signature_def NAME` output: its first input's shape")
a = p.parse_args()
if a.signature:
    text = sys.stdin.read() if a.signature == "-" else open(a.signature).read()
    m = re.search(r"shape: \(-1, ([0-9, ]+)\)", text)
    if not m:
        p.error(f"--signature {a.signature}: no input shape (-1, ...) in it")
    a.shape = m.group(1)
shape = [int(d) for d in a.shape.replace(" ", "").split(",") if d]
if math.prod(shape) != 784:
    p.error(f"--shape {a.shape}: {math.prod(shape)} values, an image has 784")


def nest(values, dims):
    if len(dims) == 1:
        return values
    step = len(values) // dims[0]
    return [nest(values[i * step:(i + 1) * step], dims[1:]) for i in range(dims[0])]


with gzip.open(f"{a.data}/t10k-images-idx3-ubyte.gz") as f:
    raw = f.read(16 + a.n * 784)[16:]
with gzip.open(f"{a.data}/t10k-labels-idx1-ubyte.gz") as f:
    labels = list(f.read(8 + a.n)[8:])
rows = [nest([round(b / 255.0, 4) for b in raw[i * 784:(i + 1) * 784]], shape) for i in range(a.n)]
with open(a.out, "w") as f:
    json.dump({"instances": rows}, f)
print(f"wrote {a.out}: {a.n} test images of shape {shape}, labels {labels}")
