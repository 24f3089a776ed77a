"""Writes tests/fixtures/example/: tf.train.Example / SequenceExample records written by
TensorFlow, and what TensorFlow decodes and parses from them.

usage: /tmp/tfvenv/bin/python scripts/make_example_fixtures.py [OUT_DIR]
(any python with tensorflow and numpy). Outputs:
  examples.tfrecord           Examples, written by tf.io.TFRecordWriter
  sequence_examples.tfrecord  SequenceExamples
  examples.tfrecord.gz / .zz  the same Examples with compression_type GZIP / ZLIB
  expected.json               every record's features as TensorFlow's protobuf reads them,
                              and tf.io.parse_example / parse_single_example /
                              parse_single_sequence_example results for the specs it lists
Floats are stored as their IEEE-754 bit patterns (u32), bytes as hex, so the C++ test
compares exactly. VarLen (SparseTensor) results are stored as tf.sparse.to_dense values
plus per-row lengths, which is what kiln returns instead of a SparseTensor.
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

F = tf.train.Feature


def b(v):
    return F(bytes_list=tf.train.BytesList(value=v))


def f(v):
    return F(float_list=tf.train.FloatList(value=v))


def i(v):
    return F(int64_list=tf.train.Int64List(value=v))


def bits(values):
    return [int(x) for x in np.asarray(values, dtype=np.float32).view(np.uint32).reshape(-1)]


def feature_json(feat):
    kind = feat.WhichOneof("kind")
    if kind is None:
        return {"kind": "none"}
    if kind == "bytes_list":
        return {"kind": kind, "hex": [v.hex() for v in feat.bytes_list.value]}
    if kind == "float_list":
        return {"kind": kind, "bits": bits(list(feat.float_list.value))}
    return {"kind": kind, "values": [int(v) for v in feat.int64_list.value]}


def features_json(features):
    return {k: feature_json(v) for k, v in features.feature.items()}


def tensor_json(t):
    t = np.asarray(t.numpy())  # a scalar string comes back as bytes
    out = {"shape": list(t.shape)}
    if t.dtype == np.float32:
        out["dtype"] = "f32"
        out["bits"] = bits(t)
    elif t.dtype == np.int64:
        out["dtype"] = "i64"
        out["values"] = [int(v) for v in t.reshape(-1)]
    else:
        out["dtype"] = "string"
        out["hex"] = [v.hex() for v in t.reshape(-1)]
    return out


def outputs_json(result, rank_of_rows):
    """FixedLen tensors as they are; a SparseTensor as dense values + '<name>/lengths'."""
    out = {}
    for name, t in result.items():
        if isinstance(t, tf.SparseTensor):
            dense = tf.sparse.to_dense(t)
            out[name] = tensor_json(dense)
            if rank_of_rows:  # batch or sequence: lengths per row
                rows = int(t.dense_shape[0])
                lengths = np.bincount(t.indices[:, 0].numpy(), minlength=rows).astype(np.int64)
                out[name + "/lengths"] = tensor_json(tf.constant(lengths))
        else:
            out[name] = tensor_json(t)
    return out


def spec_json(spec):
    out = {}
    for name, s in spec.items():
        kind = {tf.string: "bytes_list", tf.float32: "float_list", tf.int64: "int64_list"}[s.dtype]
        if isinstance(s, tf.io.VarLenFeature):
            out[name] = {"type": "varlen", "kind": kind}
        elif isinstance(s, tf.io.FixedLenSequenceFeature):
            out[name] = {"type": "fixedlen_sequence", "kind": kind, "shape": list(s.shape),
                         "allow_missing": bool(s.allow_missing)}
        else:
            d = {"type": "fixedlen", "kind": kind, "shape": list(s.shape)}
            if s.default_value is not None:
                dv = np.asarray(s.default_value).reshape(-1)
                d["default"] = feature_json({"bytes_list": b, "float_list": f, "int64_list": i}[kind](list(dv)))
            out[name] = d
    return out


def examples():
    rng = np.random.default_rng(5)
    image = bytes(rng.integers(0, 256, 784, dtype=np.uint8))
    exs = []
    # 0: Fashion-MNIST-like.
    exs.append({"image": b([image]), "label": i([9])})
    # 1: edge values, empty lists, a Feature with no list, a non-ASCII key.
    exs.append({
        "floats": f([0.0, -0.0, 1.5, -2.25, float("inf"), float("-inf"), float("nan"), 1e-45, 3.4028235e38]),
        "ints": i([0, 1, -1, 127, 128, 300, 2**31, -(2**31), 2**63 - 1, -(2**63)]),
        "bytes": b([b"", b"\x00\x01\xff", "héllo".encode(), b"x" * 200]),
        "empty_bytes": b([]), "empty_floats": f([]), "empty_ints": i([]),
        "no_list": F(),
        "ключ": i([42]),
        "": f([1.0]),
    })
    # 2..5: records for the parse spec below (vec is missing from 3, tags/ids vary).
    exs.append({"label": i([1]), "name": b([b"a"]), "vec": f([1, 2, 3]), "tags": b([b"x", b"y"]), "ids": i([5])})
    exs.append({"label": i([2]), "name": b([b"bb"]), "tags": b([]), "ids": i([6, 7, 8])})
    exs.append({"label": i([-3]), "name": b([b""]), "vec": f([-1, 0.5, 1e10]), "ids": i([])})
    exs.append({"label": i([4]), "name": b([b"dddd"]), "vec": f([4, 4, 4]), "tags": b([b"z"]), "ids": i([2**40]),
                "unused": f([9.0] * 10)})
    # 6: empty Example.
    exs.append({})
    return [tf.train.Example(features=tf.train.Features(feature=e)) for e in exs]


PARSE_RECORDS = [2, 3, 4, 5]
PARSE_SPEC = {
    "label": tf.io.FixedLenFeature([], tf.int64),
    "name": tf.io.FixedLenFeature([], tf.string),
    "vec": tf.io.FixedLenFeature([3], tf.float32, default_value=[0.25, 0.5, 0.75]),
    "tags": tf.io.VarLenFeature(tf.string),
    "ids": tf.io.VarLenFeature(tf.int64),
}
SINGLE_RECORD = 3


def sequence_examples():
    def fl(feats):
        return tf.train.FeatureList(feature=feats)

    seqs = []
    seqs.append(tf.train.SequenceExample(
        context=tf.train.Features(feature={"length": i([3]), "name": b([b"first"])}),
        feature_lists=tf.train.FeatureLists(feature_list={
            "tokens": fl([i([1]), i([2]), i([3])]),
            "frames": fl([f([0.5, 1.5]), f([2.5, 3.5]), f([-1, -2])]),
            "words": fl([b([b"a", b"b"]), b([]), b([b"c"])]),
            "opt": fl([i([10]), i([11]), i([12])]),
        })))
    seqs.append(tf.train.SequenceExample(
        context=tf.train.Features(feature={"length": i([1]), "name": b([b"second"]), "extra": f([1.0])}),
        feature_lists=tf.train.FeatureLists(feature_list={
            "tokens": fl([i([7])]),
            "frames": fl([f([9, 8])]),
            "words": fl([b([b"only", b"two"])]),
            "empty_list": fl([]),
        })))
    seqs.append(tf.train.SequenceExample(
        context=tf.train.Features(feature={"length": i([0]), "name": b([b""])}),
        feature_lists=tf.train.FeatureLists(feature_list={
            "tokens": fl([]), "frames": fl([]), "words": fl([]),
        })))
    return seqs


SEQ_CONTEXT_SPEC = {
    "length": tf.io.FixedLenFeature([], tf.int64),
    "name": tf.io.FixedLenFeature([], tf.string),
}
SEQ_SPEC = {
    "tokens": tf.io.FixedLenSequenceFeature([], tf.int64),
    "frames": tf.io.FixedLenSequenceFeature([2], tf.float32),
    "words": tf.io.VarLenFeature(tf.string),
    "opt": tf.io.FixedLenSequenceFeature([], tf.int64, allow_missing=True),
}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "example")
    os.makedirs(out_dir, exist_ok=True)
    exs = examples()
    ser = [e.SerializeToString(deterministic=True) for e in exs]  # map keys sorted: reproducible files
    with tf.io.TFRecordWriter(os.path.join(out_dir, "examples.tfrecord")) as w:
        for s in ser:
            w.write(s)
    for ext, kind in ((".gz", "GZIP"), (".zz", "ZLIB")):
        with tf.io.TFRecordWriter(os.path.join(out_dir, "examples.tfrecord" + ext),
                                  tf.io.TFRecordOptions(compression_type=kind)) as w:
            for s in ser:
                w.write(s)
    seqs = sequence_examples()
    seq_ser = [s.SerializeToString(deterministic=True) for s in seqs]
    with tf.io.TFRecordWriter(os.path.join(out_dir, "sequence_examples.tfrecord")) as w:
        for s in seq_ser:
            w.write(s)

    # Read back through TensorFlow's own TFRecord reader and protobuf parser.
    read = [tf.train.Example.FromString(r.numpy())
            for r in tf.data.TFRecordDataset(os.path.join(out_dir, "examples.tfrecord"))]
    seq_read = [tf.train.SequenceExample.FromString(r.numpy())
                for r in tf.data.TFRecordDataset(os.path.join(out_dir, "sequence_examples.tfrecord"))]
    assert read == exs and seq_read == seqs

    batch = tf.io.parse_example(tf.constant([ser[k] for k in PARSE_RECORDS]), PARSE_SPEC)
    single = tf.io.parse_single_example(ser[SINGLE_RECORD], PARSE_SPEC)
    parsed_seqs = []
    for s in seq_ser:
        ctx, lists = tf.io.parse_single_sequence_example(s, SEQ_CONTEXT_SPEC, SEQ_SPEC)
        o = outputs_json(ctx, False)
        o.update(outputs_json(lists, True))
        parsed_seqs.append(o)

    expected = {
        "tensorflow": tf.__version__,
        "examples": [features_json(e.features) for e in read],
        "sequence_examples": [{
            "context": features_json(s.context),
            "feature_lists": {k: [feature_json(x) for x in v.feature] for k, v in s.feature_lists.feature_list.items()},
        } for s in seq_read],
        "parse": {
            "spec": spec_json(PARSE_SPEC),
            "batch_records": PARSE_RECORDS,
            "batch": outputs_json(batch, True),
            "single_record": SINGLE_RECORD,
            "single": outputs_json(single, False),
        },
        "parse_sequence": {
            "context_spec": spec_json(SEQ_CONTEXT_SPEC),
            "sequence_spec": spec_json(SEQ_SPEC),
            "outputs": parsed_seqs,
        },
    }
    with open(os.path.join(out_dir, "expected.json"), "w") as fp:
        json.dump(expected, fp, indent=1, sort_keys=True, ensure_ascii=True)
        fp.write("\n")
    print(f"wrote {len(ser)} Examples, {len(seq_ser)} SequenceExamples to {out_dir}")


if __name__ == "__main__":
    main()
