#!/usr/bin/env python3
"""onnxruntime peer of bench/bench_inference.cc (issue 4: inference latency, batch 1 and
64, mlp and cnn): reads a kiln model package's variables.safetensors with numpy, builds
the same model as an ONNX graph by hand (onnx.helper) and times onnxruntime on it.

  mlp: x[N,784] -> Gemm 256 -> Relu -> Gemm 128 -> Relu -> Gemm 10 -> Softmax
  cnn: x[N,28,28,1] (NHWC, as kiln) -> Transpose NCHW -> Conv 3x3 32 pad 1 -> Relu ->
       MaxPool 2 -> Conv 3x3 64 pad 1 -> Relu -> MaxPool 2 -> Flatten (C,H,W order; the
       first dense kernel's rows are permuted from kiln's NHWC flatten order to match) ->
       Gemm 128 -> Relu -> Gemm 10 -> Softmax

Session: intra_op_num_threads=2 (--threads), inter_op 1, sequential execution, all graph
optimisations. Two ways to call it are timed and the faster reported: plain
session.run(numpy) and run_with_iobinding (input bound once as an OrtValue). Outputs are
checked against `kiln run` on the same package (max |diff| <= 1e-4) before timing.
Prints one JSON line per batch:
  {"runtime":"ort","model":"cnn","batch":1,"runs":200,"median_us":...,"variant":"iobinding",...}
Run: build/venv/bin/python bench/inference_peers.py DIR [--batches 1,64] [--runs N]
     [--kiln build/default/bin/kiln]   (needs `pip install onnxruntime onnx` in the venv)
"""
import sys

import numpy as np

from inference_common import arguments, resolve_version, load_weights, model_kind, input_shape, kiln_reference, report, time_calls


def build_onnx(kind, w):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []

    def init(name, a):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(a, dtype=np.float32), name))
        return name

    def dense(x, layer, out, kernel=None):
        k = w[f"{layer}/kernel"] if kernel is None else kernel
        nodes.append(helper.make_node("Gemm", [x, init(f"{layer}/kernel", k), init(f"{layer}/bias", w[f"{layer}/bias"])],
                                      [out]))
        return out

    def relu(x, out):
        nodes.append(helper.make_node("Relu", [x], [out]))
        return out

    if kind == "mlp":
        shape = ["N", 784]
        h = relu(dense("x", "dense", "d0"), "r0")
        h = relu(dense(h, "dense_1", "d1"), "r1")
        logits = dense(h, "dense_2", "d2")
    else:
        shape = ["N", 28, 28, 1]
        nodes.append(helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]))
        h = "xc"
        for i, layer in enumerate(["conv2d", "conv2d_1"]):
            k = w[f"{layer}/kernel"].transpose(3, 2, 0, 1)  # HWIO -> OIHW
            nodes.append(helper.make_node("Conv", [h, init(f"{layer}/kernel", k), init(f"{layer}/bias", w[f"{layer}/bias"])],
                                          [f"c{i}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
            relu(f"c{i}", f"cr{i}")
            nodes.append(helper.make_node("MaxPool", [f"cr{i}"], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2]))
            h = f"p{i}"
        nodes.append(helper.make_node("Flatten", [h], ["flat"], axis=1))
        # kiln flattens NHWC (h, w, c); ONNX's Flatten of NCHW is (c, h, w): permute rows.
        k = w["dense/kernel"].reshape(7, 7, 64, 128).transpose(2, 0, 1, 3).reshape(3136, 128)
        h = relu(dense("flat", "dense", "d0", kernel=k), "r0")
        logits = dense(h, "dense_1", "d1")
    nodes.append(helper.make_node("Softmax", [logits], ["y"], axis=-1))
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def main():
    a = arguments(())
    import onnxruntime as ort

    d = resolve_version(a.dir)
    w = load_weights(d)
    kind = model_kind(w)
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(build_onnx(kind, w), so, providers=["CPUExecutionProvider"])

    rng = np.random.default_rng(0)
    check = {}
    if not a.no_check:
        xc = rng.random(input_shape(kind, 8), dtype=np.float32)
        ref = kiln_reference(a.kiln, d, xc)
        got = sess.run(["y"], {"x": xc})[0]
        diff = float(np.max(np.abs(got - ref)))
        check = {"max_abs_diff_vs_kiln": diff}
        if not diff <= 1e-4:
            sys.exit(f"ort {kind}: output differs from kiln run by {diff} (> 1e-4)")

    for batch in [int(b) for b in a.batches.split(",") if b]:
        runs = a.runs or (200 if batch <= 1 else 50)
        x = rng.random(input_shape(kind, batch), dtype=np.float32)
        variants = {}
        variants["run"] = time_calls(lambda: sess.run(["y"], {"x": x}), runs)
        binding = sess.io_binding()
        binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x))
        binding.bind_output("y")
        variants["iobinding"] = time_calls(lambda: sess.run_with_iobinding(binding), runs)
        report("ort", kind, batch, runs, variants, {"onnxruntime": ort.__version__, **check})


if __name__ == "__main__":
    main()
