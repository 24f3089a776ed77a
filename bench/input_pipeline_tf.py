"""The tf.data peer of bench_input: the same TFRecord shards, the same pipeline
(read, batch, parse_example, decode_raw, prefetch), the same number of threads.

    python input_pipeline_tf.py DIR --threads 2 --runs 5 --batch 256
"""
import argparse
import glob
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--runs", type=int, default=5)
p.add_argument("--batch", type=int, default=256)
a = p.parse_args()

tf.config.threading.set_intra_op_parallelism_threads(a.threads)
tf.config.threading.set_inter_op_parallelism_threads(a.threads)
files = sorted(glob.glob(os.path.join(a.dir, "train-*.tfrecord")))
spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def parse(batch):
    ex = tf.io.parse_example(batch, spec)
    return {"image": tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), [-1, 28, 28]), "label": ex["label"]}


def pipeline():
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = a.threads
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=a.threads)
    ds = ds.batch(a.batch).map(parse, num_parallel_calls=a.threads).prefetch(tf.data.AUTOTUNE)
    return ds.with_options(opts)


nbytes = 0
for rec in tf.data.TFRecordDataset(files):
    nbytes += len(rec.numpy())
records = 0
times = []
for _ in range(a.runs):
    t0 = time.perf_counter()
    n = 0
    for b in pipeline():
        n += int(b["label"].shape[0])
    times.append(time.perf_counter() - t0)
    records = n
m = statistics.median(times)
print(f"tf.data read+parse+batch: threads={a.threads} batch={a.batch} records={records} median {m:.3f} s over "
      f"{a.runs} runs: {records / m:.0f} records/s, {nbytes / m / 1e6:.1f} MB/s")
print(f"RESULT tf records_per_s={records / m:.0f} mb_per_s={nbytes / m / 1e6:.2f} seen={records}")
