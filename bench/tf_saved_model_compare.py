"""Issue 32's figures: TensorFlow SavedModels served by kiln vs TensorFlow itself and vs
onnxruntime on a tf2onnx conversion, same models, same machine, 2 threads each.

    build/venv/bin/python bench/tf_saved_model_compare.py [RUNS=3] [MODEL ...]

Models: scripts/fixtures/gen_tf_saved_models.py's (random weights), written to a temporary
directory. Per model and round, each runtime runs in a fresh process:
  kiln: bench_inference DIR --batches 1,64 (SavedModel::load of the TF directory, then timed
        SavedModel::run calls; KILN_NUM_THREADS=2);
  tf:   tf.saved_model.load, then the serving_default signature (a traced graph) called at
        batch 1 and 64 (intra/inter-op threads 2/1);
  ort:  `python -m tf2onnx.convert --saved-model` once (opset 17), then an InferenceSession
        (intra-op threads 2) run at batch 1 and 64.
Each reports load time, resident memory after the load (VmRSS) and median latency; the table
is the median over RUNS alternating rounds. Correctness: tests/interop/tf_saved_model.py.
Installs tf2onnx into build/venv if missing (bench only). A conversion onnxruntime cannot load
(tf2onnx writes an op ONNX lacks) is n/a in the table, with the reason printed.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable
BIN = os.environ.get("KILN_BENCH_BIN", os.path.join(ROOT, "build", "default", "bin"))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KILN_NUM_THREADS="2", OMP_NUM_THREADS="2")

TF_PEER = r'''
import json, os, sys, time
import numpy as np
def rss():
    for l in open("/proc/self/status"):
        if l.startswith("VmRSS:"): return int(l.split()[1]) / 1024
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(1)
d = sys.argv[1]
t0 = time.perf_counter(); m = tf.saved_model.load(d); load = (time.perf_counter() - t0) * 1e3
f = m.signatures["serving_default"]
print(json.dumps({"runtime": "tf", "load_ms": load, "rss_mib": rss()}))
specs = f.structured_input_signature[1]
for batch in (1, 64):
    args = {}
    for k, s in specs.items():
        shape = [batch] + [int(x) for x in s.shape[1:]]
        args[k] = tf.constant(np.random.default_rng(1).uniform(0, 1, shape).astype(s.dtype.as_numpy_dtype))
    runs = 200 if batch == 1 else 50
    for _ in range(max(10, runs // 10)): f(**args)
    us = []
    for _ in range(runs):
        t0 = time.perf_counter(); f(**args); us.append((time.perf_counter() - t0) * 1e6)
    us.sort()
    print(json.dumps({"runtime": "tf", "batch": batch, "median_us": us[len(us) // 2]}))
'''

ORT_PEER = r'''
import json, sys, time
import numpy as np
def rss():
    for l in open("/proc/self/status"):
        if l.startswith("VmRSS:"): return int(l.split()[1]) / 1024
import onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = 2; o.inter_op_num_threads = 1
t0 = time.perf_counter(); s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
load = (time.perf_counter() - t0) * 1e3
print(json.dumps({"runtime": "ort", "load_ms": load, "rss_mib": rss()}))
for batch in (1, 64):
    feed = {}
    for i in s.get_inputs():
        shape = [batch] + [int(x) for x in i.shape[1:]]
        dt = np.int32 if "int32" in i.type else (np.int64 if "int64" in i.type else np.float32)
        feed[i.name] = np.random.default_rng(1).uniform(0, 1, shape).astype(dt)
    runs = 200 if batch == 1 else 50
    for _ in range(max(10, runs // 10)): s.run(None, feed)
    us = []
    for _ in range(runs):
        t0 = time.perf_counter(); s.run(None, feed); us.append((time.perf_counter() - t0) * 1e6)
    us.sort()
    print(json.dumps({"runtime": "ort", "batch": batch, "median_us": us[len(us) // 2]}))
'''


def lines(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    if r.returncode:
        raise RuntimeError(f"{cmd[:3]} failed: {r.stderr[-2000:]}")
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]


def summarise(records):
    out = {}
    for r in records:
        if "load_ms" in r:
            out["load_ms"], out["rss_mib"] = r["load_ms"], r["rss_mib"]
        else:
            out[f"b{r['batch']}"] = r["median_us"]
    return out


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))
    try:
        import tf2onnx  # noqa: F401
    except ImportError:
        subprocess.run([PY, "-m", "pip", "install", "-q", "tf2onnx"], check=True)
    import gen_tf_saved_models as gen
    import numpy as np
    import tensorflow as tf
    names = sys.argv[2:] or ["mlp", "cnn", "resnet", "mobilenet", "transformer"]
    work = tempfile.mkdtemp(prefix="kiln-tfsm-bench-")
    for k, name in enumerate(names):
        tf.random.set_seed(k + 1)
        rng = np.random.default_rng(k + 1)
        model = gen.MODELS[name]()
        gen.randomise_bn(model, rng)
        gen.write(name, model, work, rng)
        onnx_path = os.path.join(work, name, "model.onnx")
        subprocess.run([PY, "-m", "tf2onnx.convert", "--saved-model", os.path.join(work, name, "1"), "--output",
                        onnx_path, "--opset", "17"], check=True, capture_output=True, env=ENV)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} cores; {runs} alternating rounds, medians; 2 threads each")
    results = {n: {"kiln": [], "tf": [], "ort": []} for n in names}
    for _ in range(runs):
        for name in names:
            d = os.path.join(work, name, "1")
            results[name]["kiln"].append(summarise(lines([os.path.join(BIN, "bench_inference"), d, "--batches", "1,64"])))
            results[name]["tf"].append(summarise(lines([PY, "-c", TF_PEER, d])))
            try:
                results[name]["ort"].append(summarise(lines([PY, "-c", ORT_PEER, os.path.join(work, name, "model.onnx")])))
            except RuntimeError as e:  # a conversion onnxruntime cannot load: n/a, with the reason
                results[name]["ort"].append({})
                print(f"{name}: onnxruntime: {str(e).splitlines()[-1][-200:]}")

    def med(rs, k):
        vals = [r[k] for r in rs if k in r]
        return statistics.median(vals) if vals else float("nan")
    print("| model | kiln load ms | TF load ms | load ratio | kiln RSS MiB | TF RSS MiB | ORT RSS MiB | "
          "kiln b1 us | TF b1 | ORT b1 | kiln b64 us | TF b64 | ORT b64 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        r = results[name]
        kl, tl = med(r["kiln"], "load_ms"), med(r["tf"], "load_ms")
        print(f"| {name} | {kl:.1f} | {tl:.1f} | {tl / kl:.0f}x | {med(r['kiln'], 'rss_mib'):.0f} | "
              f"{med(r['tf'], 'rss_mib'):.0f} | {med(r['ort'], 'rss_mib'):.0f} | "
              f"{med(r['kiln'], 'b1'):.1f} | {med(r['tf'], 'b1'):.1f} | {med(r['ort'], 'b1'):.1f} | "
              f"{med(r['kiln'], 'b64'):.1f} | {med(r['tf'], 'b64'):.1f} | {med(r['ort'], 'b64'):.1f} |")


if __name__ == "__main__":
    main()
