"""Reads tf.train.Example / SequenceExample records written by kiln with TensorFlow.

usage: read_examples_tf.py WRITER
Runs WRITER DIR (tests/interop/write_examples_main.cc) into a temporary DIR, then reads
DIR/examples.tfrecord with tf.data.TFRecordDataset and checks every record against
DIR/expected.json three ways: the protobuf message (tf.train.Example.FromString),
tf.io.parse_single_example and the batched tf.io.parse_example. The SequenceExamples
go through tf.train.SequenceExample.FromString and tf.io.parse_single_sequence_example.
Fails (never skips) without tensorflow.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import tensorflow as tf
except ImportError:
    sys.exit(f"FAIL: tensorflow is not installed for {sys.executable}: run scripts/python-venv.sh")


def feature_json(feat):
    kind = feat.WhichOneof("kind")
    if kind is None:
        return {"kind": "none"}
    if kind == "bytes_list":
        return {"kind": kind, "hex": [v.hex() for v in feat.bytes_list.value]}
    if kind == "float_list":
        bits = np.asarray(list(feat.float_list.value), dtype=np.float32).view(np.uint32)
        return {"kind": kind, "bits": [int(b) for b in bits]}
    return {"kind": kind, "values": [int(v) for v in feat.int64_list.value]}


def values(fj, dtype):
    """The values of a feature_json as a numpy array of `dtype` ([] when absent/none)."""
    if fj is None or fj["kind"] == "none":
        return np.array([], dtype=dtype)
    if "hex" in fj:
        return np.array([bytes.fromhex(h) for h in fj["hex"]], dtype=object)
    if "bits" in fj:
        return np.array(fj["bits"], dtype=np.uint32).view(np.float32)
    return np.array(fj["values"], dtype=np.int64)


def same(got, want, what):
    got = np.asarray(got)
    if want.dtype == np.float32:
        ok = got.dtype == np.float32 and got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    elif want.dtype == object:
        ok = got.shape == want.shape and [bytes(x) for x in got.reshape(-1)] == list(want.reshape(-1))
    else:
        ok = got.dtype == want.dtype and np.array_equal(got, want)
    assert ok, f"{what}: got {got!r}, want {want!r}"


SPEC = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "vec": tf.io.FixedLenFeature([3], tf.float32),
    "ids": tf.io.VarLenFeature(tf.int64),
    "tags": tf.io.VarLenFeature(tf.string),
}
DTYPES = {"image": object, "label": np.int64, "vec": np.float32, "ids": np.int64, "tags": object}


def check_examples(path, expected):
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    assert len(records) == len(expected), f"{len(records)} records, expected {len(expected)}"
    for n, (rec, want) in enumerate(zip(records, expected)):
        ex = tf.train.Example.FromString(rec)
        got = {k: feature_json(v) for k, v in ex.features.feature.items()}
        assert got == want, f"record {n}: protobuf reads {got}, expected {want}"
        parsed = tf.io.parse_single_example(rec, SPEC)
        for name, dtype in DTYPES.items():
            t = parsed[name]
            t = t.values if isinstance(t, tf.SparseTensor) else t
            w = values(want.get(name), dtype)
            if name in ("image", "label"):
                w = w.reshape(())
            same(t.numpy(), w, f"record {n} parse_single_example[{name}]")
    batch = tf.io.parse_example(tf.constant(records), SPEC)
    for name, dtype in DTYPES.items():
        t = batch[name]
        if isinstance(t, tf.SparseTensor):
            lengths = np.bincount(t.indices[:, 0].numpy(), minlength=len(records))
            dense = tf.sparse.to_dense(t).numpy()
            for n, want in enumerate(expected):
                w = values(want.get(name), dtype)
                assert lengths[n] == len(w), f"record {n} parse_example[{name}]: {lengths[n]} values, want {len(w)}"
                same(dense[n, :len(w)], w, f"record {n} parse_example[{name}]")
        else:
            w = np.stack([values(e[name], dtype).reshape(t.shape[1:]) for e in expected])
            same(t.numpy(), w, f"parse_example[{name}]")
    return len(records)


def check_sequences(path, expected):
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    assert len(records) == len(expected)
    context_spec = {"length": tf.io.FixedLenFeature([], tf.int64), "name": tf.io.FixedLenFeature([], tf.string)}
    seq_spec = {
        "frames": tf.io.FixedLenSequenceFeature([3], tf.float32, allow_missing=True),
        "tokens": tf.io.FixedLenSequenceFeature([], tf.int64, allow_missing=True),
        "words": tf.io.VarLenFeature(tf.string),
    }
    for n, (rec, want) in enumerate(zip(records, expected)):
        s = tf.train.SequenceExample.FromString(rec)
        got = {
            "context": {k: feature_json(v) for k, v in s.context.feature.items()},
            "feature_lists": {k: [feature_json(f) for f in v.feature] for k, v in s.feature_lists.feature_list.items()},
        }
        assert got == want, f"sequence record {n}: protobuf reads {got}, expected {want}"
        ctx, lists = tf.io.parse_single_sequence_example(rec, context_spec, seq_spec)
        same(ctx["length"].numpy(), values(want["context"]["length"], np.int64).reshape(()), f"seq {n} length")
        same(ctx["name"].numpy(), values(want["context"]["name"], object).reshape(()), f"seq {n} name")
        steps = want["feature_lists"]
        frames = [values(f, np.float32) for f in steps.get("frames", [])]
        same(lists["frames"].numpy(), np.array(frames, dtype=np.float32).reshape(-1, 3), f"seq {n} frames")
        tokens = [values(f, np.int64) for f in steps.get("tokens", [])]
        same(lists["tokens"].numpy(), np.array(tokens, dtype=np.int64).reshape(-1), f"seq {n} tokens")
        words = lists["words"]
        want_words = [values(f, object) for f in steps.get("words", [])]
        flat = np.array([w for step in want_words for w in step], dtype=object)
        same(words.values.numpy(), flat, f"seq {n} words")
    return len(records)


def main():
    writer = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="kiln_examples.") as d:
        subprocess.run([writer, d], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(d, "expected.json")) as fp:
            expected = json.load(fp)
        n = check_examples(os.path.join(d, "examples.tfrecord"), expected["examples"])
        for ext, kind in ((".gz", "GZIP"), (".zz", "ZLIB")):
            plain = [r.numpy() for r in tf.data.TFRecordDataset(os.path.join(d, "examples.tfrecord"))]
            packed = [r.numpy() for r in
                      tf.data.TFRecordDataset(os.path.join(d, "examples.tfrecord" + ext), compression_type=kind)]
            assert packed == plain, f"{kind}: TensorFlow reads {len(packed)} records, not the {len(plain)} plain ones"
        m = check_sequences(os.path.join(d, "sequence_examples.tfrecord"), expected["sequence_examples"])
    print(f"tensorflow {tf.__version__}: {n} Examples (plain, GZIP, ZLIB) and {m} SequenceExamples written by kiln "
          "read back ok")


if __name__ == "__main__":
    main()
