"""Peer for bench/bench_package.cc: TensorFlow SavedModel load time for the same model
(6 dense 2048x2048 f32 layers with ReLU, ~96 MiB of weights), median of 9 loads from a
warm page cache, and the first call after a load.
Run: build/venv/bin/python bench/package_load_tf.py
"""
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


class Mlp(tf.Module):
    def __init__(self):
        rng = np.random.default_rng(1)
        self.ws = [tf.Variable(rng.uniform(-0.02, 0.02, (2048, 2048)).astype(np.float32)) for _ in range(6)]

    @tf.function(input_signature=[tf.TensorSpec([None, 2048], tf.float32)])
    def __call__(self, x):
        for w in self.ws:
            x = tf.nn.relu(x @ w)
        return {"y": x}


def main():
    with tempfile.TemporaryDirectory() as d:
        m = Mlp()
        tf.saved_model.save(m, d, signatures=m.__call__)
        x = tf.random.uniform([1, 2048])
        loads, first = [], []
        for _ in range(9):
            t0 = time.perf_counter()
            loaded = tf.saved_model.load(d)
            loads.append((time.perf_counter() - t0) * 1e3)
            f = loaded.signatures["serving_default"]
            t0 = time.perf_counter()
            f(x=x)
            first.append((time.perf_counter() - t0) * 1e3)
            del loaded, f
        print(f"tf {tf.__version__} SavedModel load (96 MiB): median {statistics.median(loads):.1f} ms, "
              f"first call {statistics.median(first):.1f} ms")


if __name__ == "__main__":
    main()
