// The one place kiln reads KILN_* environment variables (device configuration aside:
// src/core/device_config.cc).
#include "kiln/core/flags.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <unistd.h>
#include <string_view>
#include <vector>

#include "kiln/core/error.h"

namespace kiln {
namespace {

struct Entry {
  FlagInfo info;
  // Parses a set, non-empty value into the flags and the initial kernel preferences;
  // throws InvalidArgumentError naming the variable.
  void (*parse)(std::string_view name, std::string_view value, Flags& f, KernelPreferences& k);
};

[[noreturn]] void bad(std::string_view name, std::string_view value, std::string_view want) {
  throw InvalidArgumentError(detail::str_cat(name, " must be ", want, ", got '", value, "'"));
}

bool parse_bool(std::string_view name, std::string_view v) {
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  bad(name, v, "0 or 1 (or true/false, on/off)");
}

int64_t parse_int(std::string_view name, std::string_view v, int64_t min) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < min)
    bad(name, v, min == 0 ? "an integer >= 0" : detail::str_cat("an integer >= ", min));
  return x;
}

// clang-format off
const Entry kTable[] = {
  {{"KILN_NUM_THREADS", "N >= 1", "threads of the CPU pool (OpenMP, oneDNN); default: every hardware thread"},
   [](auto n, auto v, Flags& f, KernelPreferences&) { f.num_threads = static_cast<int>(parse_int(n, v, 1)); }},
  {{"KILN_FLUSH_DENORMALS", "0|1", "1 (default): CPU kernels flush denormals to zero (FTZ/DAZ); 0: the program's mode"},
   [](auto n, auto v, Flags& f, KernelPreferences&) { f.flush_denormals = parse_bool(n, v); }},
  {{"KILN_PROFILE", "path", "write a per-node profile of graph runs (JSON) to this file at exit"},
   [](auto, auto v, Flags& f, KernelPreferences&) { f.profile = std::string(v); }},
  {{"KILN_DUMP_GRAPH", "dir", "write every graph before and after each pass as text and Graphviz under dir"},
   [](auto, auto v, Flags& f, KernelPreferences&) { f.dump_graph = std::string(v); }},
  {{"KILN_CUDA_PLUGIN", "path|none", "the CUDA backend plugin to load (default: next to libkiln_runtime); none: no CUDA"},
   [](auto, auto v, Flags& f, KernelPreferences&) { f.cuda_plugin = std::string(v); }},
  {{"KILN_CUDA_ALLOW_TF32", "0|1", "1 (default): f32 matmuls and convolutions on CUDA may use TF32 Tensor Cores"},
   [](auto n, auto v, Flags& f, KernelPreferences&) { f.cuda_allow_tf32 = parse_bool(n, v); }},
  {{"KILN_FASHION_MNIST_DIR", "dir", "where Fashion-MNIST's IDX files are (default: Debian's dataset-fashion-mnist)"},
   [](auto, auto v, Flags& f, KernelPreferences&) { f.fashion_mnist_dir = std::string(v); }},
  {{"KILN_MLFLOW_TRACKING_URI", "file:dir",
    "kiln train records each run in this MLflow file store (default of --mlflow_tracking_uri)"},
   [](auto, auto v, Flags& f, KernelPreferences&) { f.mlflow_tracking_uri = std::string(v); }},
  {{"KILN_CPU_ISA", "avx2|avx512|avx512_vnni|avx512_bf16|amx",
    "cap kiln's own CPU kernels at this instruction set (default: the best the CPU has; tests cover lower paths)"},
   [](auto n, auto v, Flags& f, KernelPreferences&) {
     if (v != "avx2" && v != "avx512" && v != "avx512_vnni" && v != "avx512_bf16" && v != "amx")
       bad(n, v, "avx2, avx512, avx512_vnni, avx512_bf16 or amx");
     f.cpu_isa = std::string(v);
   }},
  {{"KILN_DIRECT_CONV", "0|1|auto", "kernel preference: 0 every convolution on oneDNN; 1 kiln's general tile even "
                                     "where oneDNN runs AVX-512; auto (default)"},
   [](auto n, auto v, Flags&, KernelPreferences& k) {
     if (v == "auto") k.direct_conv = DirectConv::kAuto;
     else k.direct_conv = parse_bool(n, v) ? DirectConv::kForceTile : DirectConv::kOff;
   }},
  {{"KILN_WINOGRAD", "0|1", "kernel preference: 0 turns Winograd F(2x2,3x3) convolutions off"},
   [](auto n, auto v, Flags&, KernelPreferences& k) { k.winograd = parse_bool(n, v); }},
  {{"KILN_SMALL_GEMM", "0|1", "kernel preference: 0 turns the small-M GEMM kernel off (oneDNN instead)"},
   [](auto n, auto v, Flags&, KernelPreferences& k) { k.small_gemm = parse_bool(n, v); }},
  {{"KILN_PACKED_GEMM", "0|1", "kernel preference: 0 turns the packed GEMM kernel off (oneDNN instead)"},
   [](auto n, auto v, Flags&, KernelPreferences& k) { k.packed_gemm = parse_bool(n, v); }},
  {{"KILN_SERIAL_MACS", "N >= 0", "kernel preference: oneDNN problems under N multiply-adds run on the calling "
                                  "thread alone (default 196608)"},
   [](auto n, auto v, Flags&, KernelPreferences& k) { k.serial_macs = parse_int(n, v, 0); }},
  {{"KILN_PARALLEL_BRANCHES", "0|1", "kernel preference: 1 runs independent heavy graph nodes two at a time"},
   [](auto n, auto v, Flags&, KernelPreferences& k) { k.parallel_branches = parse_bool(n, v); }},
};
// clang-format on

struct Parsed {
  Flags flags;
  KernelPreferences kernels;
};

Parsed parse_environment() {
  Parsed p;
  p.flags = detail::parse_flags([](const char* name) -> const char* { return std::getenv(name); }, &p.kernels);
  return p;
}

const Parsed& parsed() {
  static const Parsed p = parse_environment();  // a throw leaves it unset: the next call parses again
  return p;
}

struct Prefs {
  std::atomic<DirectConv> direct_conv;
  std::atomic<bool> winograd, small_gemm, packed_gemm, parallel_branches, cuda_tf32;
  std::atomic<int64_t> serial_macs;
  explicit Prefs(const Parsed& p)
      : direct_conv(p.kernels.direct_conv),
        winograd(p.kernels.winograd),
        small_gemm(p.kernels.small_gemm),
        packed_gemm(p.kernels.packed_gemm),
        parallel_branches(p.kernels.parallel_branches),
        cuda_tf32(p.flags.cuda_allow_tf32),
        serial_macs(p.kernels.serial_macs) {}
};

Prefs& prefs() {
  static Prefs p(parsed());
  return p;
}

constexpr auto kRelaxed = std::memory_order_relaxed;

}  // namespace

Flags detail::parse_flags(EnvLookup lookup, KernelPreferences* kernels) {
  Flags f;
  KernelPreferences k;
  for (const Entry& e : kTable) {
    const char* v = lookup(e.info.name);
    if (v && *v) e.parse(e.info.name, v, f, k);
  }
  if (kernels) *kernels = k;
  return f;
}

const Flags& flags() { return parsed().flags; }

std::span<const FlagInfo> flag_table() {
  static const std::vector<FlagInfo> infos = [] {
    std::vector<FlagInfo> v;
    for (const Entry& e : kTable) v.push_back(e.info);
    return v;
  }();
  return infos;
}

std::vector<std::pair<std::string, std::string>> kiln_environment() {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    if (kv.substr(0, 5) != "KILN_" && kv.substr(0, 21) != "CUDA_VISIBLE_DEVICES=") continue;
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    out.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

KernelPreferences kernel_preferences() {
  Prefs& p = prefs();
  KernelPreferences k;
  k.direct_conv = p.direct_conv.load(kRelaxed);
  k.winograd = p.winograd.load(kRelaxed);
  k.small_gemm = p.small_gemm.load(kRelaxed);
  k.packed_gemm = p.packed_gemm.load(kRelaxed);
  k.serial_macs = p.serial_macs.load(kRelaxed);
  k.parallel_branches = p.parallel_branches.load(kRelaxed);
  return k;
}

void set_kernel_preferences(const KernelPreferences& k) {
  if (k.serial_macs < 0) throw InvalidArgumentError("KernelPreferences::serial_macs must be >= 0");
  Prefs& p = prefs();
  p.direct_conv.store(k.direct_conv, kRelaxed);
  p.winograd.store(k.winograd, kRelaxed);
  p.small_gemm.store(k.small_gemm, kRelaxed);
  p.packed_gemm.store(k.packed_gemm, kRelaxed);
  p.serial_macs.store(k.serial_macs, kRelaxed);
  p.parallel_branches.store(k.parallel_branches, kRelaxed);
}

bool cuda_allow_tf32() { return prefs().cuda_tf32.load(kRelaxed); }
void set_cuda_allow_tf32(bool on) { prefs().cuda_tf32.store(on, kRelaxed); }

}  // namespace kiln
