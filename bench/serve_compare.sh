#!/usr/bin/env bash
# The model server's figures (issue 7), all on loopback with the same wrk settings:
#  1. batching: predict with one image per request at 64 connections, batching off vs
#     on: requests/s and p99 latency, ratio on/off (target >= 5x), for the cnn (compute-
#     bound even at batch 1 on a CPU) and a wide MLP (784-2048-2048-10: batch 1 is a
#     memory-bound matrix-vector product, as small batches are on a GPU);
#  2. overhead: REST predict of a tiny model (10-float input) vs nginx serving a static
#     200-byte JSON file (target >= 50%); gRPC predict of the same model (bench_serving grpc).
# Medians of RUNS alternating runs. Usage: bench/serve_compare.sh [RUNS] [SECONDS]
# (KILN_BENCH_BIN: the directory with kiln and bench_serving; default build/release/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
secs="${2:-10}"
bin="${KILN_BENCH_BIN:-build/release/bin}"
conns="${KILN_BENCH_CONNS:-64}"
command -v wrk >/dev/null || { echo "wrk missing: apt-get install wrk" >&2; exit 1; }
[ -x /usr/sbin/nginx ] || { echo "nginx missing: apt-get install nginx-light" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() { for _ in $(seq 200); do curl -sf "http://127.0.0.1:$1/readyz" >/dev/null && return 0; sleep 0.1; done; echo "server on $1 not ready" >&2; exit 1; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# wrk URL [lua] -> "rps p99_ms non2xx"
run_wrk() {
  local out
  out=$(wrk -t2 -c"$conns" -d"${secs}s" --latency ${2:+-s "$2"} "$1")
  local rps p99 non2xx
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out"); non2xx=${non2xx:-0}
  echo "$rps $p99 $non2xx"
}

echo "== packages"
"$bin/kiln" train --model cnn --epochs 1 --max-samples 2048 --export "$tmp/cnn" --verbose 0 >/dev/null
"$bin/bench_serving" export-tiny "$tmp/tiny" >/dev/null
"$bin/bench_serving" export-wide "$tmp/wide" >/dev/null
python3 - "$tmp" <<'PY'
import json, sys
t = sys.argv[1]
json.dump({"instances": [[[[0.5] for _ in range(28)] for _ in range(28)]]}, open(f"{t}/cnn.json", "w"))
json.dump({"instances": [[0.1 * i for i in range(10)]]}, open(f"{t}/tiny.json", "w"))
json.dump({"instances": [[0.5] * 784]}, open(f"{t}/wide.json", "w"))
open(f"{t}/static.json", "w").write(json.dumps({"predictions": [[0.25, 0.25, 0.25, 0.25]], "pad": "x" * 140}))
PY
for b in cnn wide tiny; do
  cat > "$tmp/$b.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = io.open("$tmp/$b.json"):read("*a")
LUA
done
printf 'max_batch_size { value: 64 }\nbatch_timeout_micros { value: 2000 }\nmax_enqueued_batches { value: 1000 }\nnum_batch_threads { value: 2 }\n' > "$tmp/batching.txt"

start_server() {  # name base extra-flags... -> sets port
  port=$(free_port)
  "$bin/kiln" serve --quiet --model_name "$1" --model_base_path "$2" --rest_api_port "$port" --port "${grpc_port:--1}" "${@:3}" &
  pids+=($!)
  server_pid=$!
  wait_ready "$port"
}
stop_server() { kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; }

if [ "${KILN_BENCH_SKIP_BATCHING:-0}" != 1 ]; then
for model in ${KILN_BENCH_MODELS:-cnn wide}; do
  echo "== 1. batching: $model predict, 1 image per request, $conns connections, ${secs}s x $runs"
  : > "$tmp/off"; : > "$tmp/on"
  for r in $(seq "$runs"); do
    for mode in off on; do
      flags=(); [ "$mode" = on ] && flags=(--enable_batching --batching_parameters_file "$tmp/batching.txt")
      start_server "$model" "$tmp/$model" "${flags[@]}"
      curl -sf -X POST "http://127.0.0.1:$port/v1/models/$model:predict" -d @"$tmp/$model.json" >/dev/null
      res=$(run_wrk "http://127.0.0.1:$port/v1/models/$model:predict" "$tmp/$model.lua")
      echo "  run $r batching $mode: rps p99_ms non2xx = $res"
      echo "$res" >> "$tmp/$mode"
      stop_server
    done
  done
  off_rps=$(awk '{print $1}' "$tmp/off" | median); on_rps=$(awk '{print $1}' "$tmp/on" | median)
  off_p99=$(awk '{print $2}' "$tmp/off" | median); on_p99=$(awk '{print $2}' "$tmp/on" | median)
  echo "$model batching off: ${off_rps} req/s p99 ${off_p99} ms | on: ${on_rps} req/s p99 ${on_p99} ms | on/off $(awk -v a="$on_rps" -v b="$off_rps" 'BEGIN {printf "%.2f", a/b}')x"
done
fi

echo "== 2. overhead: tiny REST predict vs nginx static 200-byte JSON, $conns connections, ${secs}s x $runs"
mkdir -p "$tmp/www" "$tmp/nginx"
cp "$tmp/static.json" "$tmp/www/static.json"
chmod 755 "$tmp" "$tmp/www"; chmod 644 "$tmp/www/static.json"  # nginx's workers run as www-data
nport=$(free_port)
cat > "$tmp/nginx.conf" <<NGX
worker_processes 2;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $tmp/nginx; proxy_temp_path $tmp/nginx; fastcgi_temp_path $tmp/nginx;
  uwsgi_temp_path $tmp/nginx; scgi_temp_path $tmp/nginx;
  server { listen 127.0.0.1:$nport; root $tmp/www; default_type application/json; }
}
NGX
/usr/sbin/nginx -c "$tmp/nginx.conf" -p "$tmp/nginx" &
pids+=($!)
nginx_pid=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$nport/static.json" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$nport/static.json" >/dev/null || { cat "$tmp/nginx/error.log" >&2; exit 1; }
grpc_port=$(free_port)
start_server tiny "$tmp/tiny"
: > "$tmp/ng"; : > "$tmp/kr"; : > "$tmp/kg"
for r in $(seq "$runs"); do
  n=$(run_wrk "http://127.0.0.1:$nport/static.json"); echo "$n" >> "$tmp/ng"
  k=$(run_wrk "http://127.0.0.1:$port/v1/models/tiny:predict" "$tmp/tiny.lua"); echo "$k" >> "$tmp/kr"
  g=$("$bin/bench_serving" grpc "$grpc_port" tiny "$secs" "$conns" 10); echo "$g" | sed 's/.*rps=\([0-9.]*\).*p99_ms=\([0-9.]*\).*/\1 \2/' >> "$tmp/kg"
  echo "  run $r: nginx [rps p99 non2xx] $n | kiln REST $k | kiln gRPC $g"
done
stop_server
ng=$(awk '{print $1}' "$tmp/ng" | median); kr=$(awk '{print $1}' "$tmp/kr" | median); kg=$(awk '{print $1}' "$tmp/kg" | median)
echo "nginx static: ${ng} req/s | kiln REST predict: ${kr} req/s ($(awk -v a="$kr" -v b="$ng" 'BEGIN {printf "%.0f", 100*a/b}')% of nginx) | kiln gRPC predict: ${kg} req/s ($(awk -v a="$kg" -v b="$ng" 'BEGIN {printf "%.0f", 100*a/b}')% of nginx)"
