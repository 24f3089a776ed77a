"""The Keras peer of bench_mixed_precision: the same cnn (or mlp), optimizer, batch
size and data, trained under each dtype policy with model.fit, alternating policies
run by run. Prints the median epoch time per policy and its speed ratio against
float32, so kiln's ratios can be set beside TensorFlow's on the same CPU.

    build/venv/bin/python bench/mixed_precision_tf.py --model cnn --epochs 1 --runs 3
"""
import argparse
import gzip
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def build(kind):
    L = tf.keras.layers
    if kind == "mlp":
        body = [L.Input((784,)), L.Dense(256, activation="relu"), L.Dense(128, activation="relu")]
    else:
        body = [L.Input((28, 28, 1)), L.Conv2D(32, 3, padding="same", activation="relu"), L.MaxPool2D(),
                L.Conv2D(64, 3, padding="same", activation="relu"), L.MaxPool2D(), L.Flatten(),
                L.Dense(128, activation="relu")]
    # As kiln does by default: the output layer computes in float32.
    return tf.keras.Sequential(body + [L.Dense(10, dtype="float32")])


p = argparse.ArgumentParser()
p.add_argument("--model", default="cnn", choices=["mlp", "cnn"])
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--runs", type=int, default=3)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--policies", default="float32,mixed_bfloat16,mixed_float16")
p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
a = p.parse_args()
tf.config.threading.set_intra_op_parallelism_threads(a.threads)
tf.config.threading.set_inter_op_parallelism_threads(a.threads)
d = a.data_dir
x = read_idx(f"{d}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0
y = read_idx(f"{d}/train-labels-idx1-ubyte.gz").astype(np.int32)
tx = read_idx(f"{d}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0
ty = read_idx(f"{d}/t10k-labels-idx1-ubyte.gz").astype(np.int32)
shape = (-1, 784) if a.model == "mlp" else (-1, 28, 28, 1)
x, tx = x.reshape(shape), tx.reshape(shape)


class EpochTimes(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self.t0)


policies = a.policies.split(",")
times = {p: [] for p in policies}
acc = {p: [] for p in policies}
for r in range(a.runs):
    for pol in policies:
        tf.keras.mixed_precision.set_global_policy(pol)
        tf.keras.utils.set_random_seed(42)
        m = build(a.model)
        m.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        cb = EpochTimes()
        cb.times = []
        m.fit(x, y, batch_size=128, epochs=a.epochs, verbose=0, callbacks=[cb])
        # The first epoch includes tracing: count it only when it is the only one.
        counted = cb.times[1:] if len(cb.times) > 1 else cb.times
        times[pol] += counted
        acc[pol].append(m.evaluate(tx, ty, batch_size=256, verbose=0)[1])
        print(f"run {r + 1} {pol:15s} epoch {statistics.median(counted):.2f} s  test accuracy {acc[pol][-1]:.4f}",
              flush=True)
base = statistics.median(times[policies[0]])
print(f"\nTensorFlow {tf.__version__} {a.model}, {a.epochs} epochs x {a.runs} runs, batch 128, {a.threads} threads")
print(f"{'policy':15s} {'epoch s':>10s} {'speed':>8s} {'test acc':>10s}")
for pol in policies:
    t = statistics.median(times[pol])
    print(f"{pol:15s} {t:10.2f} {base / t:7.2f}x {statistics.median(acc[pol]):10.4f}")
