"""Interop: stock Python reads a kiln model package, and numpy recomputes its answers.

read_package.py KILN_CLI
  1. `kiln train --export` writes a package of the Fashion-MNIST MLP (one short epoch);
  2. the manifest's sizes and SHA-256s are checked with hashlib;
  3. the weights are read with the `safetensors` package (the reference reader);
  4. `kiln run` answers a batch; numpy's forward pass of the same weights must agree.
Fails (never skips) when the venv lacks numpy or safetensors.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file


def main():
    kiln = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, KILN_NUM_THREADS="1")
        subprocess.run([kiln, "train", "--model", "mlp", "--epochs", "1", "--max-samples", "1000",
                        "--verbose", "0", "--export", f"{tmp}/pkg"], check=True, env=env)
        version = f"{tmp}/pkg/1"
        manifest = json.load(open(f"{version}/manifest.json"))
        assert manifest["format"] == "kiln-model-1", manifest
        paths = [f["path"] for f in manifest["files"]]
        assert paths == sorted(paths) and "model.pb" in paths and "variables.safetensors" in paths, paths
        for f in manifest["files"]:
            data = open(f"{version}/{f['path']}", "rb").read()
            assert len(data) == f["bytes"], (f, len(data))
            assert hashlib.sha256(data).hexdigest() == f["sha256"], f
        weights = load_file(f"{version}/variables.safetensors")
        want = {"dense/kernel": (784, 256), "dense/bias": (256,), "dense_1/kernel": (256, 128),
                "dense_1/bias": (128,), "dense_2/kernel": (128, 10), "dense_2/bias": (10,)}
        assert {k: v.shape for k, v in weights.items()} == want, {k: v.shape for k, v in weights.items()}
        assert all(v.dtype == np.float32 for v in weights.values())

        x = np.random.default_rng(0).random((7, 784), dtype=np.float32)
        np.save(f"{tmp}/x.npy", x)
        subprocess.run([kiln, "run", "--dir", f"{tmp}/pkg", "--input", f"dense_input={tmp}/x.npy",
                        "--output_dir", f"{tmp}/out"], check=True, env=env, stdout=subprocess.DEVNULL)
        got = np.load(f"{tmp}/out/dense_2.npy")
        h = np.maximum(x @ weights["dense/kernel"] + weights["dense/bias"], 0)
        h = np.maximum(h @ weights["dense_1/kernel"] + weights["dense_1/bias"], 0)
        logits = h @ weights["dense_2/kernel"] + weights["dense_2/bias"]
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        ref = e / e.sum(axis=1, keepdims=True)
        err = np.abs(got - ref).max()
        assert got.shape == (7, 10) and err < 1e-5, (got.shape, err)
        subprocess.run([kiln, "run", "--dir", f"{tmp}/pkg", "--signature", "classify", "--input",
                        f"dense_input={tmp}/x.npy", "--output_dir", f"{tmp}/out"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        assert (np.load(f"{tmp}/out/classes.npy") == ref.argmax(axis=1)).all()
        print(f"package interop ok: {len(weights)} weights read by safetensors, max |kiln - numpy| = {err:.2e}")


if __name__ == "__main__":
    main()
