"""Helpers shared by bench/inference_peers.py (onnxruntime, run by the venv's python) and
bench/inference_torch.py (PyTorch, run by Debian's /usr/bin/python3): reading a kiln
model package's weights without kiln, and timing calls. numpy only."""
import argparse
import glob
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
          "I8": np.int8, "U8": np.uint8}

def resolve_version(d):
    if os.path.exists(os.path.join(d, "manifest.json")):
        return d
    vs = [int(n) for n in os.listdir(d) if re.fullmatch(r"[1-9][0-9]*", n) and os.path.isdir(os.path.join(d, n))]
    if not vs:
        sys.exit(f"no model package at {d}")
    return os.path.join(d, str(max(vs)))

def load_weights(d):
    """variables.safetensors -> {name: np.ndarray} (a safetensors header parser)."""
    with open(os.path.join(d, "variables.safetensors"), "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        out[k] = np.frombuffer(data[base + lo:base + hi], dtype=DTYPES[v["dtype"]]).reshape(v["shape"]).copy()
    return out

def model_kind(w):
    return "cnn" if "conv2d/kernel" in w else "mlp"

def input_shape(kind, batch):
    return [batch, 784] if kind == "mlp" else [batch, 28, 28, 1]

def kiln_reference(kiln, d, x):
    """Runs `kiln run` (serving_default) on x and returns its single output."""
    show = subprocess.run([kiln, "show", "--dir", d, "--all"], check=True, capture_output=True, text=True).stdout
    sig = show[show.index("signature_def['serving_default']"):]
    name = re.search(r"inputs\['([^']+)'\]", sig).group(1)
    with tempfile.TemporaryDirectory() as t:
        np.save(f"{t}/x.npy", x)
        subprocess.run([kiln, "run", "--dir", d, "--input", f"{name}={t}/x.npy",
                        "--output_dir", f"{t}/out"], check=True, capture_output=True)
        outs = glob.glob(f"{t}/out/*.npy")
        if len(outs) != 1:
            sys.exit(f"kiln run wrote {outs}, expected one output")
        return np.load(outs[0])

def time_calls(fn, runs):
    for _ in range(max(10, runs // 10)):
        fn()
    us = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        us.append((time.perf_counter() - t0) * 1e6)
    us.sort()
    return us


def report(runtime, kind, batch, runs, variants, extra):
    """Prints the JSON line of the fastest variant (by median) of `variants` {name: sorted us}."""
    med = {k: v[len(v) // 2] for k, v in variants.items()}
    best = min(med, key=med.get)
    us = variants[best]
    print(json.dumps({"runtime": runtime, "model": kind, "batch": batch, "runs": runs,
                      "median_us": round(med[best], 1), "min_us": round(us[0], 1),
                      "p90_us": round(us[min(len(us) - 1, int(0.9 * len(us)))], 1), "variant": best,
                      "variants_median_us": {k: round(v, 1) for k, v in med.items()}, **extra}), flush=True)


def arguments(extra=()):
    """The peers' command line: DIR [--batches] [--runs] [--threads] [--kiln] [--no-check] + extra flags."""
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--runs", type=int, default=0, help="default: 200 for batch 1, 50 for larger")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kiln", default="build/default/bin/kiln")
    p.add_argument("--no-check", action="store_true")
    for flag in extra:
        p.add_argument(flag, action="store_true")
    return p.parse_args()
