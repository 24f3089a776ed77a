"""Interop: unchanged TensorFlow Serving clients against `kiln serve`.

serving_client.py KILN_CLI
  1. `kiln train --export` writes two versions of the Fashion-MNIST MLP (seeds 42 and 7) into one
     base path; a ModelServerConfig text proto serves both, labelled stable=1 and canary=2;
  2. `kiln serve --port 0 --rest_api_port 0` starts; the ports come from its server_started log line;
  3. the stock clients of PyPI's tensorflow-serving-api (PredictionServiceStub, ModelServiceStub,
     tf.make_tensor_proto / tf.make_ndarray) call Predict (versions, labels, output_filter, the
     classify signature), GetModelMetadata, Classify, Regress, GetModelStatus and
     HandleReloadConfigRequest; answers are checked against numpy's forward pass of the weights
     (read by `safetensors`, as in read_package.py); error codes are TF Serving's;
  4. REST (urllib only): :predict in row and columnar form agrees with gRPC; status and metadata
     JSON have TF Serving's layout;
  5. SIGTERM: the server exits 0 within 15 s.
Prints "serving interop ok" at the end; any failure raises. Fails (never skips) when the venv lacks
tensorflow, tensorflow_serving, grpcio or safetensors.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from tensorflow.core.framework import tensor_shape_pb2, types_pb2  # noqa: E402
from tensorflow.core.protobuf import error_codes_pb2  # noqa: E402
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2,  # noqa: E402
                                     get_model_status_pb2, model_management_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc, regression_pb2)
from tensorflow_serving.config import model_server_config_pb2  # noqa: E402

MODEL = "mlp"
TIMEOUT = 30  # seconds, every RPC and HTTP call


def forward(weights, x):
    """The MLP's forward pass in numpy (as read_package.py): softmax probabilities [N, 10]."""
    h = np.maximum(x @ weights["dense/kernel"] + weights["dense/bias"], 0)
    h = np.maximum(h @ weights["dense_1/kernel"] + weights["dense_1/bias"], 0)
    logits = h @ weights["dense_2/kernel"] + weights["dense_2/bias"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def close(got, ref, what, tol=1e-5):
    got = np.asarray(got)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    err = float(np.abs(got - ref).max())
    assert err < tol, (what, err)
    return err


def rpc_error(call, *args, **kwargs):
    """The grpc.RpcError a call raises (AssertionError when it answers)."""
    try:
        call(*args, **kwargs)
    except grpc.RpcError as e:
        return e
    raise AssertionError(f"{call} answered, expected an error")


def same_as_tf_serving(ok, what):
    """A check of an answer TensorFlow Serving gives in its own words (code or no action)."""
    if not ok:
        raise AssertionError(f"kiln serve differs from TF Serving: {what}")


def predict_request(x, version=None, label=None, signature="", output_filter=()):
    req = predict_pb2.PredictRequest()
    req.model_spec.name = MODEL
    if version is not None:
        req.model_spec.version.value = version
    if label is not None:
        req.model_spec.version_label = label
    req.model_spec.signature_name = signature
    req.inputs["dense_input"].CopyFrom(tf.make_tensor_proto(x))
    req.output_filter.extend(output_filter)
    return req


def http(method, url, body=None):
    """(HTTP status, parsed JSON body) of a urllib request; error statuses too."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class Server:
    """`kiln serve` in a subprocess; stderr (logfmt) kept in `log` by a reader thread."""

    def __init__(self, kiln, config_file):
        self.proc = subprocess.Popen([kiln, "serve", "--model_config_file", config_file, "--port", "0",
                                      "--rest_api_port", "0", "--file_system_poll_wait_seconds", "0"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, KILN_NUM_THREADS="1"))
        self.log = []
        started = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                if "event=server_started" in line:
                    started.set()
            started.set()  # EOF: the server died

        threading.Thread(target=read, daemon=True).start()
        if not started.wait(60) or self.proc.poll() is not None:
            self.stop()
            raise AssertionError("kiln serve did not start:\n" + "\n".join(self.log))
        line = next(l for l in self.log if "event=server_started" in l)
        m = re.search(r"grpc=([\d.]+):(\d+) rest=([\d.]+):(\d+)", line)
        assert m and "ready=true" in line, line
        self.grpc = f"{m.group(1)}:{m.group(2)}"
        self.rest = f"http://{m.group(3)}:{m.group(4)}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def check_grpc(channel, config_text, weights, x):
    pred = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    models = model_service_pb2_grpc.ModelServiceStub(channel)
    ref = {v: forward(w, x) for v, w in weights.items()}
    assert np.abs(ref[1] - ref[2]).max() > 1e-3, "the two versions should answer differently"
    answers = {}

    # Predict: the latest version by default, a version, a label; tensor_content and float_val inputs.
    for version, label, want in [(None, None, 2), (1, None, 1), (2, None, 2), (None, "stable", 1),
                                 (None, "canary", 2)]:
        resp = pred.Predict(predict_request(x, version, label), timeout=TIMEOUT)
        assert resp.model_spec.name == MODEL and resp.model_spec.version.value == want, resp.model_spec
        assert resp.model_spec.signature_name == "serving_default", resp.model_spec
        assert list(resp.outputs) == ["dense_2"], list(resp.outputs)
        got = tf.make_ndarray(resp.outputs["dense_2"])
        assert got.dtype == np.float32
        err = close(got, ref[want], f"Predict version={version} label={label}")
        answers[want] = got
    print(f"grpc Predict: default -> v2, version 1/2, labels stable/canary; max |kiln - numpy| = {err:.2e}")
    req = predict_pb2.PredictRequest()
    req.model_spec.name = MODEL
    t = req.inputs["dense_input"]
    t.dtype = types_pb2.DT_FLOAT
    t.tensor_shape.CopyFrom(tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in x.shape]))
    t.float_val.extend(x.ravel().tolist())
    close(tf.make_ndarray(pred.Predict(req, timeout=TIMEOUT).outputs["dense_2"]), ref[2], "Predict float_val")

    # The classify signature through Predict, and output_filter.
    resp = pred.Predict(predict_request(x, 1, signature="classify"), timeout=TIMEOUT)
    assert sorted(resp.outputs) == ["classes", "scores"], list(resp.outputs)
    close(tf.make_ndarray(resp.outputs["scores"]), ref[1], "Predict classify scores")
    classes = tf.make_ndarray(resp.outputs["classes"])
    assert resp.outputs["classes"].dtype == types_pb2.DT_INT64, resp.outputs["classes"].dtype
    assert (classes == ref[1].argmax(axis=1)).all(), classes
    resp = pred.Predict(predict_request(x, 1, signature="classify", output_filter=["classes"]), timeout=TIMEOUT)
    assert list(resp.outputs) == ["classes"], list(resp.outputs)
    e = rpc_error(pred.Predict, predict_request(x, signature="classify", output_filter=["nope"]), timeout=TIMEOUT)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
    print("grpc Predict: float_val input, classify signature, output_filter")

    # GetModelMetadata: signature_def packed in an Any as a SignatureDefMap.
    req = get_model_metadata_pb2.GetModelMetadataRequest()
    req.model_spec.name = MODEL
    req.metadata_field.append("signature_def")
    resp = pred.GetModelMetadata(req, timeout=TIMEOUT)
    assert resp.model_spec.name == MODEL and resp.model_spec.version.value == 2, resp.model_spec
    sigs = get_model_metadata_pb2.SignatureDefMap()
    assert resp.metadata["signature_def"].Unpack(sigs), resp.metadata["signature_def"].type_url
    assert sorted(sigs.signature_def) == ["classify", "serving_default"], list(sigs.signature_def)
    sd = sigs.signature_def["serving_default"]
    assert sd.method_name == "tensorflow/serving/predict", sd.method_name
    inp = sd.inputs["dense_input"]
    assert inp.dtype == types_pb2.DT_FLOAT, inp.dtype
    assert [d.size for d in inp.tensor_shape.dim] == [-1, 784], inp.tensor_shape
    assert [d.size for d in sd.outputs["dense_2"].tensor_shape.dim] == [-1, 10], sd.outputs
    cd = sigs.signature_def["classify"]
    assert cd.method_name == "tensorflow/serving/classify", cd.method_name
    assert cd.outputs["classes"].dtype == types_pb2.DT_INT64, cd.outputs["classes"]
    print("grpc GetModelMetadata: SignatureDefMap unpacked, dense_input DT_FLOAT -1x784")

    # Classify: tf.train.Example inputs (feature dense_input, 784 floats each).
    req = classification_pb2.ClassificationRequest()
    req.model_spec.name = MODEL
    req.model_spec.version.value = 1
    req.model_spec.signature_name = "classify"
    for row in x:
        req.input.example_list.examples.add().features.feature["dense_input"].float_list.value.extend(row.tolist())
    resp = pred.Classify(req, timeout=TIMEOUT)
    assert resp.model_spec.version.value == 1 and resp.model_spec.signature_name == "classify", resp.model_spec
    assert len(resp.result.classifications) == len(x)
    scores = np.array([[c.score for c in cl.classes] for cl in resp.result.classifications], dtype=np.float32)
    labels = [[c.label for c in cl.classes] for cl in resp.result.classifications]
    assert all(ls == [str(k) for k in range(10)] for ls in labels), labels[0]
    close(scores, ref[1], "Classify scores")
    # The same through the examples' shared context: the feature may come from there.
    req2 = classification_pb2.ClassificationRequest()
    req2.model_spec.CopyFrom(req.model_spec)
    req2.input.example_list_with_context.context.features.feature["dense_input"].float_list.value.extend(
        x[0].tolist())
    req2.input.example_list_with_context.examples.add()
    resp = pred.Classify(req2, timeout=TIMEOUT)
    close([[c.score for c in resp.result.classifications[0].classes]], ref[1][:1], "Classify with context")
    # Classify on a predict signature: TF Serving refuses it (method_name mismatch).
    req.model_spec.signature_name = "serving_default"
    e = rpc_error(pred.Classify, req, timeout=TIMEOUT)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
    print(f"grpc Classify: {len(x)} examples, labels 0..9, scores = numpy's; with context; predict signature refused")

    # Regress: only when the package has a regress signature (the MLP has none).
    regress = [n for n, s in sigs.signature_def.items() if s.method_name == "tensorflow/serving/regress"]
    if regress:
        req = regression_pb2.RegressionRequest()
        req.model_spec.name = MODEL
        req.model_spec.signature_name = regress[0]
        for row in x:
            req.input.example_list.examples.add().features.feature["dense_input"].float_list.value.extend(
                row.tolist())
        resp = pred.Regress(req, timeout=TIMEOUT)
        assert len(resp.result.regressions) == len(x)
        print(f"grpc Regress: signature {regress[0]}, {len(x)} values")
    else:
        print("grpc Regress: skipped, the package has no tensorflow/serving/regress signature")
    req = regression_pb2.RegressionRequest()
    req.model_spec.name = MODEL
    req.model_spec.signature_name = "classify"
    req.input.example_list.examples.add().features.feature["dense_input"].float_list.value.extend(x[0].tolist())
    e = rpc_error(pred.Regress, req, timeout=TIMEOUT)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())

    # GetModelStatus: both versions AVAILABLE (30), status OK; one version; a label.
    req = get_model_status_pb2.GetModelStatusRequest()
    req.model_spec.name = MODEL
    resp = models.GetModelStatus(req, timeout=TIMEOUT)
    got = sorted((s.version, s.state, s.status.error_code) for s in resp.model_version_status)
    assert got == [(1, 30, error_codes_pb2.OK), (2, 30, error_codes_pb2.OK)], resp
    assert get_model_status_pb2.ModelVersionStatus.AVAILABLE == 30
    req.model_spec.version.value = 1
    resp = models.GetModelStatus(req, timeout=TIMEOUT)
    assert [(s.version, s.state) for s in resp.model_version_status] == [(1, 30)], resp
    # By label: kiln's extension (TF Serving ignores version_label here and lists every version).
    req.model_spec.version_label = "canary"
    resp = models.GetModelStatus(req, timeout=TIMEOUT)
    assert [(s.version, s.state) for s in resp.model_version_status] == [(2, 30)], resp
    print("grpc GetModelStatus: versions 1 and 2 AVAILABLE (30), by version and by label")

    # HandleReloadConfigRequest: the same config again (OK), then a custom_model_config (refused)
    # and a config that does not parse as a model list; the server keeps serving.
    req = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(config_text, req.config)
    resp = models.HandleReloadConfigRequest(req, timeout=TIMEOUT)
    assert resp.status.error_code == error_codes_pb2.OK, resp
    close(tf.make_ndarray(pred.Predict(predict_request(x, label="stable"), timeout=TIMEOUT).outputs["dense_2"]),
          ref[1], "Predict after reload")
    bad = model_management_pb2.ReloadConfigRequest()
    bad.config.custom_model_config.type_url = "type.googleapis.com/example.Custom"
    try:
        resp = models.HandleReloadConfigRequest(bad, timeout=TIMEOUT)
        code = resp.status.error_code  # a server may answer the error in the response only
        assert code != error_codes_pb2.OK, resp
        detail = resp.status.error_message
    except grpc.RpcError as e:  # TF Serving answers it in the gRPC status too
        assert e.code() != grpc.StatusCode.OK, e
        code, detail = e.code(), e.details()
    bad = model_management_pb2.ReloadConfigRequest()
    bad.config.model_config_list.config.add(name=MODEL, base_path="/nonexistent/kiln/base",
                                            model_platform="onnx")
    onnx = rpc_error(models.HandleReloadConfigRequest, bad, timeout=TIMEOUT).code()
    assert onnx != grpc.StatusCode.OK, onnx
    close(tf.make_ndarray(pred.Predict(predict_request(x), timeout=TIMEOUT).outputs["dense_2"]), ref[2],
          "Predict after a refused reload")
    # As TF Serving: TF Serving takes no action on a ReloadConfigRequest whose config is not set
    # (ServerCore::ReloadConfig: "Taking no action for empty config", OK).
    resp = models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(), timeout=TIMEOUT)
    assert resp.status.error_code == error_codes_pb2.OK, resp
    try:
        pred.Predict(predict_request(x), timeout=TIMEOUT)
        served = "still served"
    except grpc.RpcError as e:
        served = f"{e.code().name}: {e.details()}"
    same_as_tf_serving(served == "still served", f"after an empty ReloadConfigRequest, Predict: {served}")
    if served != "still served":  # back to the config, for the checks that follow
        req = model_management_pb2.ReloadConfigRequest()
        text_format.Parse(config_text, req.config)
        assert models.HandleReloadConfigRequest(req, timeout=TIMEOUT).status.error_code == error_codes_pb2.OK
    print(f"grpc HandleReloadConfigRequest: same config OK; custom_model_config refused ({code}: {detail}); "
          f"platform onnx refused ({onnx.name}); still serving")

    # Errors with TF Serving's codes.
    req = predict_request(x)
    req.model_spec.name = "nope"
    e = rpc_error(pred.Predict, req, timeout=TIMEOUT)
    assert e.code() == grpc.StatusCode.NOT_FOUND, (e.code(), e.details())
    e = rpc_error(pred.Predict, predict_request(x, version=9), timeout=TIMEOUT)
    assert e.code() == grpc.StatusCode.NOT_FOUND, (e.code(), e.details())
    e = rpc_error(pred.Predict, predict_request(x[:, :783]), timeout=TIMEOUT)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
    e = rpc_error(pred.Predict, predict_request(x.astype(np.int32)), timeout=TIMEOUT)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
    req = predict_request(x)
    req.inputs["pixels"].CopyFrom(req.inputs.pop("dense_input"))
    e = rpc_error(pred.Predict, req, timeout=TIMEOUT)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
    big = np.random.default_rng(1).random((8192, 784), dtype=np.float32)
    try:
        resp = pred.Predict(predict_request(big), timeout=0.001)
        deadline = "OK"
        assert tf.make_ndarray(resp.outputs["dense_2"]).shape == (8192, 10)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (e.code(), e.details())
        deadline = e.code().name
    close(tf.make_ndarray(pred.Predict(predict_request(x), timeout=TIMEOUT).outputs["dense_2"]), ref[2],
          "Predict after a deadline")
    # As TF Serving: TF Serving answers an unknown version label with INVALID_ARGUMENT ("Unrecognized
    # servable version label: nope", ServerCore::GetModelVersionForLabel).
    e = rpc_error(pred.Predict, predict_request(x, label="nope"), timeout=TIMEOUT)
    same_as_tf_serving(e.code() == grpc.StatusCode.INVALID_ARGUMENT,
             f"Predict with version_label 'nope': want INVALID_ARGUMENT, got {e.code().name} ({e.details()})")
    # As TF Serving: an unknown signature_name is FAILED_PRECONDITION in TF Serving's Predict ("Serving
    # signature key \"nope\" not found.") and INVALID_ARGUMENT in Classify / Regress ("No signature was
    # found with the name: nope").
    e = rpc_error(pred.Predict, predict_request(x, signature="nope"), timeout=TIMEOUT)
    same_as_tf_serving(e.code() == grpc.StatusCode.FAILED_PRECONDITION,
             f"Predict with signature_name 'nope': want FAILED_PRECONDITION, got {e.code().name} ({e.details()})")
    req = classification_pb2.ClassificationRequest()
    req.model_spec.name = MODEL
    req.model_spec.signature_name = "nope"
    req.input.example_list.examples.add().features.feature["dense_input"].float_list.value.extend(x[0].tolist())
    e = rpc_error(pred.Classify, req, timeout=TIMEOUT)
    same_as_tf_serving(e.code() == grpc.StatusCode.INVALID_ARGUMENT,
             f"Classify with signature_name 'nope': want INVALID_ARGUMENT, got {e.code().name} ({e.details()})")
    print(f"grpc errors: unknown model/version NOT_FOUND, wrong shape/dtype/input INVALID_ARGUMENT, "
          f"1 ms deadline on 8192 rows: {deadline}")
    return answers


def check_rest(base, x, answers):
    url = f"{base}/v1/models/{MODEL}"
    status, body = http("POST", f"{url}:predict", {"instances": x.tolist()})
    assert status == 200, body
    close(np.array(body["predictions"], dtype=np.float32), answers[2], "REST instances", tol=1e-6)
    status, body = http("POST", f"{url}/versions/1:predict", {"inputs": {"dense_input": x.tolist()}})
    assert status == 200, body
    close(np.array(body["outputs"], dtype=np.float32), answers[1], "REST inputs", tol=1e-6)
    status, body = http("POST", f"{url}/labels/canary:predict", {"signature_name": "serving_default",
                                                                 "instances": [{"dense_input": r} for r in
                                                                               x.tolist()]})
    assert status == 200, body
    close(np.array(body["predictions"], dtype=np.float32), answers[2], "REST label, named instances", tol=1e-6)
    status, body = http("POST", f"{url}/versions/1:predict", {"signature_name": "classify", "instances": x.tolist()})
    assert status == 200, body
    assert [p["classes"] for p in body["predictions"]] == answers[1].argmax(axis=1).tolist(), body
    close(np.array([p["scores"] for p in body["predictions"]], dtype=np.float32), answers[1], "REST classify sig")
    print("REST :predict: instances (rows, named), inputs (columnar), labels, versions agree with gRPC")

    status, body = http("POST", f"{url}/versions/1:classify",
                        {"signature_name": "classify", "examples": [{"dense_input": r} for r in x.tolist()]})
    assert status == 200, body
    assert len(body["results"]) == len(x) and [lbl for lbl, _ in body["results"][0]] == [str(k) for k in range(10)]
    close(np.array([[s for _, s in r] for r in body["results"]], dtype=np.float32), answers[1], "REST :classify")
    print("REST :classify: results [[label, score], ...] agree with gRPC")

    status, body = http("GET", url)
    assert status == 200, body
    got = sorted(body["model_version_status"], key=lambda s: s["version"])
    assert got == [{"version": v, "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
                   for v in ("1", "2")], body
    status, body = http("GET", f"{url}/versions/1")
    assert status == 200 and [s["version"] for s in body["model_version_status"]] == ["1"], body
    status, body = http("GET", f"{url}/metadata")
    assert status == 200, body
    assert body["model_spec"] == {"name": MODEL, "signature_name": "", "version": "2"}, body["model_spec"]
    sd = body["metadata"]["signature_def"]["signature_def"]
    assert sorted(sd) == ["classify", "serving_default"], list(sd)
    inp = sd["serving_default"]["inputs"]["dense_input"]
    assert inp["dtype"] == "DT_FLOAT", inp
    assert [d["size"] for d in inp["tensor_shape"]["dim"]] == ["-1", "784"], inp
    assert sd["serving_default"]["method_name"] == "tensorflow/serving/predict", sd["serving_default"]
    print("REST GET status / metadata: TF Serving's JSON (model_version_status AVAILABLE, signature_def)")

    status, body = http("POST", f"{base}/v1/models/nope:predict", {"instances": x.tolist()})
    assert status == 404 and "error" in body, (status, body)
    status, body = http("POST", f"{url}:predict", {"instances": x[:, :783].tolist()})
    assert status == 400 and "error" in body, (status, body)
    # As TF Serving: TF Serving maps INVALID_ARGUMENT and FAILED_PRECONDITION to 400: an unknown label
    # or signature_name is a 400 (the gRPC codes above).
    status, body = http("POST", f"{url}/labels/nope:predict", {"instances": x.tolist()})
    same_as_tf_serving(status == 400, f"REST /labels/nope:predict: want 400, got {status} {body}")
    status, body = http("POST", f"{url}:predict", {"signature_name": "nope", "instances": x.tolist()})
    same_as_tf_serving(status == 400, f"REST :predict signature_name 'nope': want 400, got {status} {body}")
    print("REST errors: unknown model 404, wrong shape 400, {\"error\": ...}")


def main():
    kiln = sys.argv[1]
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, KILN_NUM_THREADS="1")
        base = f"{tmp}/{MODEL}"
        for seed in (42, 7):  # versions 1 and 2
            subprocess.run([kiln, "train", "--model", "mlp", "--epochs", "1", "--max-samples", "300", "--seed",
                            str(seed), "--verbose", "0", "--export", base], check=True, env=env,
                           stdout=subprocess.DEVNULL)
        weights = {v: load_file(f"{base}/{v}/variables.safetensors") for v in (1, 2)}
        config_text = f"""
model_config_list {{
  config {{
    name: "{MODEL}"
    base_path: "{base}"
    model_platform: "tensorflow"
    model_version_policy {{ specific {{ versions: 1 versions: 2 }} }}
    version_labels {{ key: "stable" value: 1 }}
    version_labels {{ key: "canary" value: 2 }}
  }}
}}
"""
        text_format.Parse(config_text, model_server_config_pb2.ModelServerConfig())  # TF's parser takes it
        with open(f"{tmp}/models.config", "w") as f:
            f.write(config_text)

        server = Server(kiln, f"{tmp}/models.config")
        try:
            print(f"kiln serve: grpc {server.grpc}, rest {server.rest}")
            x = np.random.default_rng(0).random((5, 784), dtype=np.float32)
            with grpc.insecure_channel(server.grpc, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
                answers = check_grpc(ch, config_text, weights, x)
            check_rest(server.rest, x, answers)

            t = time.time()
            server.proc.send_signal(signal.SIGTERM)
            rc = server.proc.wait(timeout=15)
            assert rc == 0, (rc, "\n".join(server.log[-20:]))
            print(f"SIGTERM: exit 0 after {time.time() - t:.2f} s")
        except BaseException:
            print("server log:\n" + "\n".join(server.log[-40:]), file=sys.stderr)
            raise
        finally:
            server.stop()
    print(f"serving interop ok ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
