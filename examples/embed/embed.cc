// Embedding the kiln runtime: load a model package, list its signatures, run
// serving_default on a batch of zeros (open sizes -1 become 2), then run it from 4
// threads at once and check every result equals the first. Uses the installed public
// headers and links only libkiln_runtime (no training code).
//
//   embed <package version dir, e.g. models/mnist/1>
// Exits 0 and prints "embed: ok" on success, 1 on any failure.
#include <atomic>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/core/version.h"
#include "kiln/package/saved_model.h"

namespace {

std::string sig_str(const kiln::package::TensorInfo& t) {
  return t.name + ": " + kiln::package::spec_str(t.spec);
}

int run(const std::string& dir) {
  using kiln::Tensor;
  std::printf("kiln %s\n", KILN_VERSION_STRING);
  auto model = kiln::package::SavedModel::load(dir);
  std::printf("loaded %s: %lld weights, %lld bytes\n", model->dir().c_str(),
              static_cast<long long>(model->num_weights()), static_cast<long long>(model->weight_bytes()));
  for (const auto& sig : model->signatures()) {
    std::printf("signature %s (%s)\n", sig.name.c_str(), sig.method.c_str());
    for (const auto& in : sig.inputs) std::printf("  input %s\n", sig_str(in).c_str());
    for (const auto& out : sig.outputs) std::printf("  output %s\n", sig_str(out).c_str());
  }

  const auto& sig = model->signature(kiln::package::kDefaultSignature);
  std::map<std::string, Tensor> inputs;
  for (const auto& in : sig.inputs) {
    std::vector<int64_t> dims = in.spec.shape;
    for (auto& d : dims)
      if (d < 0) d = 2;
    inputs[in.name] = Tensor::zeros(kiln::Shape(dims), in.spec.dtype);
  }
  const std::map<std::string, Tensor> ref = model->run(sig.name, inputs);
  for (const auto& [name, t] : ref) std::printf("result %s: %s\n", name.c_str(), t.desc().c_str());
  if (ref.size() != sig.outputs.size()) {
    std::fprintf(stderr, "embed: %zu outputs, the signature has %zu\n", ref.size(), sig.outputs.size());
    return 1;
  }

  constexpr int kThreads = 4, kRuns = 8;
  std::atomic<int> mismatches{0};
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      try {
        for (int r = 0; r < kRuns; ++r) {
          const auto out = model->run(sig.name, inputs);
          for (const auto& [name, t] : ref) {
            auto it = out.find(name);
            if (it == out.end() || !kiln::array_equal(it->second, t)) ++mismatches;
          }
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) std::fprintf(stderr, "embed: thread failed: %s\n", e.c_str());
  if (!errors.empty() || mismatches > 0) {
    std::fprintf(stderr, "embed: %d results differ from the first run\n", mismatches.load());
    return 1;
  }
  std::printf("%d threads x %d runs: identical results\n", kThreads, kRuns);
  std::printf("embed: ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <package version dir>\n", argv[0]);
    return 1;
  }
  try {
    return run(argv[1]);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "embed: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed: unexpected error: %s\n", e.what());
  }
  return 1;
}
