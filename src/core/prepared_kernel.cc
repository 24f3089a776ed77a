// Two-phase kernels' eager form, and the count of kernel fallbacks (kiln/core/kernel.h).
#include <map>
#include <mutex>
#include <utility>

#include "kiln/core/kernel.h"

namespace kiln {

namespace detail {
void prepare_and_run(PrepareFn prepare, OpContext& ctx) {
  constexpr size_t kInline = 8;
  TensorMeta inline_in[kInline], inline_out[kInline];
  std::vector<TensorMeta> heap_in, heap_out;
  auto metas = [](std::span<const Tensor> ts, TensorMeta* fixed, std::vector<TensorMeta>& heap) {
    TensorMeta* m = fixed;
    if (ts.size() > kInline) {
      heap.resize(ts.size());
      m = heap.data();
    }
    for (size_t i = 0; i < ts.size(); ++i) m[i] = TensorMeta{ts[i].shape(), ts[i].dtype()};
    return std::span<const TensorMeta>(m, ts.size());
  };
  const PrepareContext pc{ctx.op,
                          ctx.out.empty() ? DeviceType::kCPU : ctx.out[0].device().type,
                          metas(ctx.in, inline_in, heap_in),
                          metas(ctx.out, inline_out, heap_out),
                          {},
                          ctx.attrs};
  prepare(pc)->run(ctx);
}
}  // namespace detail

namespace {
struct Fallbacks {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, int64_t> counts;
};
Fallbacks& fallbacks() {
  static Fallbacks* f = new Fallbacks();  // never destroyed: kernels may run during exit
  return *f;
}
}  // namespace

void note_kernel_fallback(const char* op, const char* why) {
  Fallbacks& f = fallbacks();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.counts[{op, why}];
}

std::vector<KernelFallback> kernel_fallbacks() {
  Fallbacks& f = fallbacks();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<KernelFallback> v;
  for (const auto& [k, n] : f.counts) v.push_back({k.first, k.second, n});
  return v;
}

}  // namespace kiln
