"""kiln's container image (deploy/Dockerfile), built and run with podman.

container_image.py KILN_CLI BUILD_DIR
  1. scripts/build-image.sh --prebuilt BUILD_DIR builds the image (the Dockerfile's runtime
     stage over BUILD_DIR's installation; the base made by mmdebstrap); its size is printed
     and must stay under 150 MB;
  2. a model exported by `kiln train` is mounted at /models/fashion and the container is
     started with TF Serving's conventions (MODEL_NAME; the ports from GRPC_PORT and
     REST_API_PORT: host networking, ports the test picks);
  3. /readyz, a REST predict (10 probabilities summing to 1), /metrics, and the image's own
     HEALTHCHECK command answer; the server runs as uid 10001, not root;
  4. `podman stop` sends SIGTERM: the server drains and exits 0.
Prints "container image ok". Exits 77 (CTest: skipped, with the reason) where podman or
mmdebstrap is missing or this machine cannot run containers; fails otherwise.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
KILN, BUILD = sys.argv[1], sys.argv[2]
TAG = f"kiln-serving:test-{os.getpid()}"
NAME = f"kiln-test-{os.getpid()}"


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, body=None, timeout=5):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def main():
    for tool in ("podman", "mmdebstrap"):
        if not shutil.which(tool):
            skip(f"{tool} is not installed (scripts/install-deps.sh installs it)")
    work = tempfile.mkdtemp()
    podman = ["podman"]
    try:
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build-image.sh"), "--prebuilt", BUILD, "--tag", TAG],
                           capture_output=True, text=True, timeout=1200)
        if r.returncode == 3:
            skip(r.stderr.strip().splitlines()[-1])
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        print(r.stdout.strip().splitlines()[-1])
        if "using runc without default ulimits" in r.stdout:  # the same podman settings as the build
            conf = os.path.join(work, "containers.conf")
            with open(conf, "w") as f:
                f.write("[containers]\ndefault_ulimits = []\n")
            os.environ["CONTAINERS_CONF"] = conf
            podman = ["podman", "--runtime", "runc"]
        size = int(subprocess.check_output(podman + ["image", "inspect", "--format", "{{.Size}}", TAG], text=True))
        print(f"image {TAG}: {size / 1e6:.1f} MB")
        assert size < 150e6, f"the runtime image is {size / 1e6:.1f} MB (goal < 150 MB)"

        models = os.path.join(work, "models")
        subprocess.run([KILN, "train", "--max-samples", "600", "--epochs", "1", "--verbose", "0",
                        "--export", os.path.join(models, "fashion")], check=True, timeout=300)
        os.chmod(work, 0o755)
        grpc, rest = free_port(), free_port()
        subprocess.run(podman + ["run", "-d", "--name", NAME, "--network=host", "-e", "MODEL_NAME=fashion",
                                 "-e", f"GRPC_PORT={grpc}", "-e", f"REST_API_PORT={rest}", "-v", f"{models}:/models:ro",
                                 TAG, "--shutdown_grace_seconds=5"], check=True, capture_output=True, text=True)
        base = f"http://127.0.0.1:{rest}"
        deadline = time.time() + 90
        while True:
            try:
                if get(base + "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            state = subprocess.check_output(podman + ["inspect", "--format", "{{.State.Status}}", NAME], text=True)
            assert time.time() < deadline and state.strip() == "running", (
                state, subprocess.run(podman + ["logs", NAME], capture_output=True, text=True).stderr[-3000:])
            time.sleep(0.5)
        status, body = get(base + "/v1/models/fashion:predict", json.dumps({"instances": [[0.5] * 784]}).encode())
        probs = json.loads(body)["predictions"][0]
        assert status == 200 and len(probs) == 10 and abs(sum(probs) - 1) < 1e-4, body
        status, metrics = get(base + "/metrics")
        assert status == 200 and "kiln_requests_total{model=\"fashion\"" in metrics, metrics[:500]
        print(f"served /models/fashion from the container: predict {len(probs)} probabilities, /metrics, /readyz")
        # The image's HEALTHCHECK command, run in the container as Docker would.
        test = json.loads(subprocess.check_output(podman + ["inspect", "--format", "{{json .Config.Healthcheck.Test}}",
                                                            NAME], text=True))
        assert test[0] == "CMD", test
        subprocess.run(podman + ["exec", NAME] + test[1:], check=True, timeout=10)
        uid = subprocess.check_output(podman + ["exec", NAME, "id", "-u"], text=True).strip()
        assert uid == "10001", uid
        print(f"HEALTHCHECK passes; the server runs as uid {uid}")
        t0 = time.time()
        subprocess.run(podman + ["stop", "-t", "30", NAME], check=True, capture_output=True)
        code = subprocess.check_output(podman + ["inspect", "--format", "{{.State.ExitCode}}", NAME], text=True).strip()
        logs = subprocess.run(podman + ["logs", NAME], capture_output=True, text=True)
        assert code == "0", (code, logs.stderr[-2000:])
        print(f"SIGTERM: drained and exited 0 in {time.time() - t0:.1f} s")
    finally:
        subprocess.run(podman + ["rm", "-f", NAME], capture_output=True)
        subprocess.run(podman + ["rmi", "-f", TAG], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    print("container image ok")


if __name__ == "__main__":
    main()
