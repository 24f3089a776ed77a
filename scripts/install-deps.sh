#!/usr/bin/env bash
# Installs every build, test and data dependency of kiln from Debian packages.
# Idempotent: does nothing when everything is installed already.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libdnnl-dev              # oneDNN: matmul, convolution, pooling kernels
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev             # the kiln command line
  zlib1g-dev               # gzip IDX files
  libpng-dev libjpeg62-turbo-dev   # image decoding (kiln/data/image.h): PNG, JPEG
  libboost-dev             # Boost.CRC (CRC-32C of TFRecord, ...); Boost.Beast/Asio: the server's HTTP front end
  libprotobuf-dev protobuf-compiler   # TensorBoard Event protos (proto/)
  nlohmann-json3-dev       # checkpoint (safetensors) headers, metrics JSON, package manifests
  libssl-dev               # SHA-256 of model-package files (OpenSSL libcrypto)
  libgrpc++-dev protobuf-compiler-grpc   # the server's gRPC front end (TF Serving's services)
  libsimdjson-dev          # REST request bodies
  libpcre2-dev             # LLM tokenizers: the pre-tokenizer regexes (Unicode classes, look-ahead; JIT)
  libleveldb-dev           # TensorFlow SavedModels: the variables index is a LevelDB table
  libgloo-dev              # multi-worker training: the collectives between processes (TCP)
  openmpi-bin libopenmpi-dev   # multi-worker training launched by mpirun (its test); MPI_Allreduce, Gloo's peer (bench)
  wrk                      # load tests of the server (tests/cli/serve.sh)
  curl                     # the server's CLI tests and the README's example
  clang-14 libclang-rt-14-dev   # libFuzzer targets
  python3 python3-venv     # fixture generators and interop checks (venv in the build tree)
  python3-jinja2           # the chat-template fixtures' reference (scripts/fixtures/gen_chat_templates.py)
  dataset-fashion-mnist    # the default training data set
  prometheus               # deploy/prometheus: promtool checks the rules; the scrape test runs the server
  chromium                 # the built-in dashboard's test (headless: loads /dashboard, takes a screenshot)
  podman runc mmdebstrap   # the container image (deploy/Dockerfile): built from a local Debian base and run in its test
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
