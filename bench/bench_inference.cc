// Inference latency of a model package through kiln's graph-mode runtime (issue 4's
// figure: batch 1 and 64, mlp and cnn, against onnxruntime and PyTorch running the same
// weights: bench/inference_peers.py, bench/inference_torch.py, driven by
// bench/inference_compare.sh).
//
// Loads the package, then per batch size: a random uniform [0,1) input of the serving
// signature's shape (open sizes = the batch), warm-up calls, then N timed calls of
// SavedModel::run("serving_default", ...); prints a JSON line of the load (its time and
// the process's resident memory after it; DIR may be a TensorFlow SavedModel), then one
// per batch:
//   {"runtime":"kiln","model":"cnn","load_ms":...,"rss_mib":...}
//   {"runtime":"kiln","model":"cnn","batch":64,"runs":50,"median_us":...,"min_us":...,"p90_us":...}
// Threads: KILN_NUM_THREADS (the comparison uses 2).
// Usage: bench_inference DIR [--batches 1,64] [--runs N] [--signature NAME] [--gap_us G]
//                          [--auto_mixed_precision bf16|f16]  (the load-time AMP pass, as kiln serve's)
//   --gap_us: sleep G microseconds before each timed call (a server at low load: the
//   call may find the intra-op pool's threads asleep)
//   (--runs default: 200 for batch 1, 50 for larger batches; DIR: a version directory
//   or its base, the highest version is used)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/kiln.h"

using namespace kiln;
using clock_type = std::chrono::steady_clock;

namespace {
// The resident set (VmRSS of /proc/self/status), MiB.
double rss_mib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmRSS: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib / 1024;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::fprintf(stderr,
                 "usage: %s DIR [--batches 1,64] [--runs N] [--signature NAME] [--gap_us G] "
                 "[--auto_mixed_precision bf16|f16]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = package::resolve_version_dir(argv[1]);
  std::vector<int64_t> batches = {1, 64};
  int runs_flag = 0;
  int64_t gap_us = 0;
  std::string sig_name = package::kDefaultSignature, amp;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batches" && i + 1 < argc) batches = parse_list(argv[++i]);
    else if (a == "--runs" && i + 1 < argc) runs_flag = std::stoi(argv[++i]);
    else if (a == "--signature" && i + 1 < argc) sig_name = argv[++i];
    else if (a == "--gap_us" && i + 1 < argc) gap_us = std::stoll(argv[++i]);
    else if (a == "--auto_mixed_precision" && i + 1 < argc) amp = argv[++i];
    else {
      std::fprintf(stderr, "unknown argument: %s\n", a.c_str());
      return 2;
    }
  }

  package::LoadOptions load;
  if (amp == "bf16") load.passes.auto_mixed_precision = DType::kBF16;
  else if (amp == "f16") load.passes.auto_mixed_precision = DType::kF16;
  else if (!amp.empty()) {
    std::fprintf(stderr, "--auto_mixed_precision takes bf16 or f16, got %s\n", amp.c_str());
    return 2;
  }
  auto model = package::SavedModel::load(dir, load);
  const package::Signature& sig = model->signature(sig_name);
  const std::string name = model->metadata().model_name.empty() ? dir : model->metadata().model_name;
  std::printf("{\"runtime\":\"kiln\",\"model\":\"%s\",\"load_ms\":%.2f,\"rss_mib\":%.1f}\n", name.c_str(),
              model->load_seconds() * 1e3, rss_mib());

  for (int64_t batch : batches) {
    std::vector<Tensor> inputs;
    uint64_t seed = 1;
    for (const package::TensorInfo& in : sig.inputs) {
      std::vector<int64_t> dims = in.spec.shape;
      for (int64_t& d : dims)
        if (d < 0) d = batch;
      inputs.push_back(ops::random_uniform(Shape(dims), 0.0, 1.0, in.spec.dtype, seed++));
    }
    const int runs = runs_flag > 0 ? runs_flag : (batch <= 1 ? 200 : 50);
    const int warmup = std::max(10, runs / 10);
    for (int i = 0; i < warmup; ++i) model->run(sig_name, inputs);
    std::vector<double> us;
    us.reserve(runs);
    for (int i = 0; i < runs; ++i) {
      if (gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
      const auto t0 = clock_type::now();
      std::vector<Tensor> out = model->run(sig_name, inputs);
      us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    std::printf(
        "{\"runtime\":\"kiln\",\"model\":\"%s\",\"batch\":%lld,\"runs\":%d,\"gap_us\":%lld,\"median_us\":%.1f,"
        "\"min_us\":%.1f,\"p90_us\":%.1f}\n",
        name.c_str(), static_cast<long long>(batch), runs, static_cast<long long>(gap_us), percentile(us, 0.5),
        percentile(us, 0.0), percentile(us, 0.9));
    std::fflush(stdout);
  }
  return 0;
}
