#pragma once
// Runtime flags: every KILN_* environment variable kiln reads, parsed once, in one
// place, with one table of names, defaults and meanings (flag_table(); `kiln devices`
// prints the ones set). A malformed value is an InvalidArgumentError that names the
// variable, raised by the first flags() call. The device variables (KILN_VISIBLE_DEVICES,
// KILN_*_MEMORY_LIMIT, KILN_MEMORY_GROWTH, KILN_*_LOGICAL_DEVICES) are the device
// configuration's (kiln/core/device_config.h), which validates them the same way; the
// multi-worker launcher's (KILN_WORKERS, KILN_RANK, KILN_COORDINATOR, KILN_WORKER_HOST)
// are the cluster spec's (kiln/distribute/cluster.h), read with TF_CONFIG and OpenMPI's.
//
// Environment variables set defaults for operational choices (threads, profiling,
// graph dumps, where the CUDA plugin and the Fashion-MNIST files are). Choices of
// numerics are API options, never environment-only: automatic mixed precision is
// graph::PassOptions (kiln/graph/pass_options.h), denormal flushing
// set_flush_denormals (kiln/core/denormals.h), TF32 on CUDA set_cuda_allow_tf32 below.
// Kernel preferences choose between kernels that compute the same result (to compare
// them, or to work around a slow one); tests and benchmarks set them through
// set_kernel_preferences, not the environment.
//
// Thread-safety: flags() is immutable once parsed; kernel preferences may be read and
// set from any thread (set them between runs: a kernel running meanwhile sees either).
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

struct Flags {
  int num_threads = 0;             // KILN_NUM_THREADS: the CPU pool's size; 0: every hardware thread
  bool flush_denormals = true;     // KILN_FLUSH_DENORMALS: 0 leaves the program's FP mode (denormals.h)
  std::string profile;             // KILN_PROFILE: write a per-node profile (JSON) to this path at exit
  std::string dump_graph;          // KILN_DUMP_GRAPH: dump every optimised graph under this directory
  std::string cuda_plugin;         // KILN_CUDA_PLUGIN: the CUDA plugin's path; "none": no CUDA backend
  bool cuda_allow_tf32 = true;     // KILN_CUDA_ALLOW_TF32: f32 matmuls/convolutions on TF32 Tensor Cores
  std::string fashion_mnist_dir;   // KILN_FASHION_MNIST_DIR: where load_fashion_mnist looks by default
  std::string cpu_isa;             // KILN_CPU_ISA: cap kiln's own CPU kernels at this level (kiln/core/cpu_isa.h)
  std::string mlflow_tracking_uri; // KILN_MLFLOW_TRACKING_URI: `kiln train` records runs there (kiln/train/mlflow.h)
};

// The flags, parsed from the environment on first call.
const Flags& flags();

// One row per variable, in the order of the table (docs, `kiln devices`).
struct FlagInfo {
  const char* name;
  const char* values;  // what it accepts, e.g. "0|1"
  const char* meaning;
};
std::span<const FlagInfo> flag_table();

// Every KILN_* variable (this table's, the device configuration's, and any other) and
// CUDA_VISIBLE_DEVICES set in the environment now, as (name, value), sorted by name
// (diagnostics: `kiln devices`).
std::vector<std::pair<std::string, std::string>> kiln_environment();

// Which of two kernels that compute the same result runs. Defaults are the fastest
// measured on this project's machines (docs/perf-decisions/); the environment variable
// named on each field sets the process's initial value.
enum class DirectConv : uint8_t {
  kOff,        // KILN_DIRECT_CONV=0: every convolution on oneDNN
  kAuto,       // default: kiln's kernels where they win (Winograd, small channels; the general
               // tile only where oneDNN lacks AVX-512)
  kForceTile,  // KILN_DIRECT_CONV=1: the general tile where oneDNN would run AVX-512 too
};
struct KernelPreferences {
  DirectConv direct_conv = DirectConv::kAuto;
  bool winograd = true;           // KILN_WINOGRAD=0: no Winograd F(2x2,3x3) convolutions
  bool small_gemm = true;         // KILN_SMALL_GEMM=0: no small-M GEMM kernel (oneDNN instead)
  bool packed_gemm = true;        // KILN_PACKED_GEMM=0: no packed GEMM kernel (oneDNN instead)
  int64_t serial_macs = 192 * 1024;  // KILN_SERIAL_MACS: oneDNN problems below this many
                                     // multiply-adds run on the calling thread alone
  bool parallel_branches = false;    // KILN_PARALLEL_BRANCHES=1: the executor runs independent
                                     // heavy nodes two at a time (read when it plans a new
                                     // input signature)
};
KernelPreferences kernel_preferences();
void set_kernel_preferences(const KernelPreferences& p);

namespace detail {
// What flags() does with the environment, on any lookup (tests): the flags and the
// initial kernel preferences; throws InvalidArgumentError naming a malformed variable.
using EnvLookup = const char* (*)(const char* name);
Flags parse_flags(EnvLookup lookup, KernelPreferences* kernels);
}  // namespace detail

// TF32 for f32 matmuls and convolutions on CUDA (default: flags().cuda_allow_tf32).
bool cuda_allow_tf32();
void set_cuda_allow_tf32(bool on);

}  // namespace kiln
