# Sourced by the LLM benchmarks (llm_serve_compare.sh, llm_json_compare.sh): `start kiln|llama
# [flags]` runs kiln serve or llama-server (the peer, built by bench/peers/llama_cpp.sh when
# missing) on $port with $model and $threads (the caller sets them, and `trap stop EXIT`),
# the extra flags going to that server; `stop` ends it.
llama_bin=$(bash bench/peers/llama_cpp.sh --print)
[ -x "$llama_bin/llama-server" ] || bash bench/peers/llama_cpp.sh >/dev/null
kiln="${KILN_BUILD_DIR:-build/default}/bin/kiln"
pid=
stop() { if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; pid=; fi; }
wait_ready() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not become ready" >&2; exit 1
}
start() {
  local which=$1; shift
  if [ "$which" = kiln ]; then
    KILN_NUM_THREADS=$threads "$kiln" serve --llm_model m="$model" --rest_api_port "$port" --port -1 --quiet "$@" & pid=$!
    wait_ready readyz
  else
    "$llama_bin/llama-server" -m "$model" --port "$port" -t "$threads" -tb "$threads" --log-disable "$@" >/dev/null 2>&1 & pid=$!
    wait_ready health
  fi
}
