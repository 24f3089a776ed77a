// Model-package load time (issue figure: a package with 100 MB of weights loads in
// under 100 ms, memory-mapped). Exports an MLP with ~100 MB of f32 weights, then loads
// it repeatedly from the page cache:
//   kiln (verify):   SavedModel::load with every check, SHA-256 of every file included;
//   kiln (no sha):   LoadOptions::verify_sha256 = false (CRC-32Cs still checked);
//   peer (copy):     reading the same weights file into fresh buffers with full CRC
//                    checks (load_tensor_file: what a copying loader costs), plus the
//                    same graph checks, i.e. load with the mapping replaced by a copy.
// Prints medians of 9 loads and the ratios, and the first run's latency after a load.
// Run: build/release/bin/bench_package [MiB=100] [dir=/tmp/kiln-bench-package]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/core/tensor_file.h"
#include "kiln/kiln.h"

using namespace kiln;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::stoll(argv[1]) : 100;
  const std::string base = argc > 2 ? argv[2] : "/tmp/kiln-bench-package";
  std::filesystem::remove_all(base);
  // Square layers of width w: layers * w * w * 4 bytes ~ mib MiB.
  const int64_t w = 2048, layers = std::max<int64_t>(1, mib * (1 << 20) / (w * w * 4));
  std::vector<Variable> ws;
  for (int64_t i = 0; i < layers; ++i)
    ws.emplace_back(ops::random_uniform({w, w}, -0.02, 0.02, DType::kF32, static_cast<uint64_t>(i + 1)),
                    "layer" + std::to_string(i) + "/kernel");
  package::ExportSignature sig;
  sig.fn = [&](const std::vector<Tensor>& x) {
    Tensor h = x[0];
    for (const Variable& v : ws) h = ops::relu(ops::matmul(h, v.value()));
    return std::vector<Tensor>{h};
  };
  sig.inputs = {{"x", {{-1, w}, DType::kF32}}};
  sig.output_names = {"y"};
  const std::string dir = package::export_package(base, {sig});
  const double bytes = static_cast<double>(std::filesystem::file_size(dir + "/variables.safetensors"));
  std::printf("package %s: %lld layers, %.1f MiB of weights\n", dir.c_str(), static_cast<long long>(layers),
              bytes / (1 << 20));

  const int reps = 9;
  std::vector<double> verify, nosha, copy, first_run;
  package::LoadOptions no_sha;
  no_sha.verify_sha256 = false;
  Tensor x = ops::random_uniform({1, w}, -1, 1, DType::kF32, 7);
  for (int r = 0; r < reps; ++r) {
    auto t0 = clock_type::now();
    auto m = package::SavedModel::load(dir);
    verify.push_back(ms_since(t0));
    t0 = clock_type::now();
    m->run("serving_default", std::vector<Tensor>{x});
    first_run.push_back(ms_since(t0));
    m.reset();
    t0 = clock_type::now();
    auto m2 = package::SavedModel::load(dir, no_sha);
    nosha.push_back(ms_since(t0));
    m2.reset();
    // Peer: a copying loader = the weights read into fresh buffers (CRC-32Cs checked)
    // plus the same graph work as the mapped load without SHA-256.
    t0 = clock_type::now();
    TensorFile copied = load_tensor_file(dir + "/variables.safetensors");
    auto m3 = package::SavedModel::load(dir, no_sha);
    copy.push_back(ms_since(t0));
  }
  const double kv = median(verify), kn = median(nosha), pc = median(copy);
  std::printf("load, median of %d (page cache warm):\n", reps);
  std::printf("  kiln (mmap, SHA-256 + CRC-32C)   %8.1f ms   %.2f GB/s\n", kv, bytes / kv / 1e6);
  std::printf("  kiln (mmap, CRC-32C only)        %8.1f ms\n", kn);
  std::printf("  peer (copying read + the same)   %8.1f ms   peer/kiln = %.2fx (vs mmap CRC-only)\n", pc, pc / kn);
  std::printf("  first run after load (batch 1)   %8.2f ms\n", median(first_run));
  std::printf("target: < 100 ms for 100 MB: %s\n", kv < 100 ? "met" : "NOT met");
  std::filesystem::remove_all(base);
  return 0;
}
