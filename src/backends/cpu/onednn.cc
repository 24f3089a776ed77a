#include "onednn.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <omp.h>
#include <optional>
#include <unordered_map>

#include "kiln/core/denormals.h"
#include "kiln/core/error.h"
#include "kiln/core/flags.h"
#include "kiln/core/parallel.h"
#include "kiln/core/shape.h"

namespace kiln::cpu::onednn {

dnnl::engine& engine() {
  static dnnl::engine* e = [] {
    (void)num_threads();  // configures the shared OpenMP pool before oneDNN first runs
    return new dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return *e;
}

dnnl::stream& stream() {
  kiln::detail::prepare_denormal_team();  // oneDNN's parallel regions run on this thread's team
  thread_local dnnl::stream s(engine());
  return s;
}

dnnl::memory::data_type to_dnnl(DType t) {
  using dt = dnnl::memory::data_type;
  switch (t) {
    case DType::kF32: return dt::f32;
    case DType::kBF16: return dt::bf16;
    case DType::kF16: return dt::f16;
    case DType::kI32: return dt::s32;
    case DType::kI8: return dt::s8;
    case DType::kU8: return dt::u8;
    default: break;
  }
  throw UnimplementedError(std::string("oneDNN has no data type for ") + std::string(dtype_name(t)));
}

namespace {
// A per-thread map from shape keys to what oneDNN made for them (primitives, prepared
// GEMMs): a primitive runs only on the thread that made it (onednn.h, cached()).
// Bounded: cleared past 4096 entries, so shape churn cannot grow it without limit.
// Looked up by string_view (a key built on the caller's stack: no allocation on a hit).
template <typename V>
class ShapeCache {
 public:
  template <typename Make>
  const V& get(std::string_view key, Make&& make) {
    if (auto it = map_.find(key); it != map_.end()) return it->second;
    V v = make();
    if (map_.size() > 4096) map_.clear();
    return map_.emplace(std::string(key), std::move(v)).first->second;
  }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view k) const { return std::hash<std::string_view>{}(k); }
  };
  std::unordered_map<std::string, V, Hash, std::equal_to<>> map_;
};
}  // namespace

dnnl::primitive cached(const std::string& key, const std::function<dnnl::primitive()>& make) {
  thread_local ShapeCache<dnnl::primitive> cache;
  return cache.get(key, make);
}

int64_t serial_macs() { return kernel_preferences().serial_macs; }

bool runs_avx512() {
  static const bool yes = [] {
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const unsigned core = static_cast<unsigned>(dnnl_cpu_isa_avx512_core);
    return (isa & core) == core;  // the ISA values are nested bit sets
  }();
  return yes;
}

SerialScope::SerialScope(bool on) {
  if (!on || omp_get_max_threads() == 1) return;
  saved_ = omp_get_max_threads();
  omp_set_num_threads(1);
}
SerialScope::~SerialScope() {
  if (saved_ > 0) omp_set_num_threads(saved_);
}

bool is_optimized(const dnnl::primitive_desc_base& pd) {
  std::string impl = pd.impl_info_str();
  return impl.rfind("ref", 0) != 0;
}

namespace {
dnnl::memory::desc matrix_desc(const dnnl::memory::dims& batch, int64_t rows, int64_t cols, bool trans,
                               dnnl::memory::data_type dt) {
  // Logical dims [batch..., rows, cols]; stored as [batch..., cols, rows] when trans.
  dnnl::memory::dims dims = batch, strides(batch.size() + 2);
  dims.push_back(rows);
  dims.push_back(cols);
  int n = static_cast<int>(dims.size());
  if (trans) {
    strides[n - 2] = 1;
    strides[n - 1] = rows;
  } else {
    strides[n - 2] = cols;
    strides[n - 1] = 1;
  }
  int64_t acc = rows * cols;
  for (int i = n - 3; i >= 0; --i) {
    strides[i] = acc;
    acc *= dims[i];
  }
  return dnnl::memory::desc(dims, dt, strides);
}

// A memory object over `data` (the C API: no exceptions wrapper, no argument map).
struct Mem {
  dnnl_memory_t m = nullptr;
  Mem(const dnnl::memory::desc& md, const void* data) {
    dnnl::error::wrap_c_api(dnnl_memory_create(&m, &md.data, engine().get(), const_cast<void*>(data)),
                            "could not create a memory object");
  }
  ~Mem() { dnnl_memory_destroy(m); }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  void point_at(const void* data) const {
    dnnl::error::wrap_c_api(dnnl_memory_set_data_handle(m, const_cast<void*>(data)), "could not set a data handle");
  }
};

// A GEMM's primitive with its operands' descriptors and memory objects, made once per
// shape (per thread, as the cache holding it): a call then only points the memory
// objects at its buffers (no key, descriptor or memory object made: no allocation).
struct PreparedGemm {
  dnnl::primitive prim;  // empty: no optimised implementation for this dtype
  dnnl::memory::desc a_md, b_md, c_md, bias_md;
  std::optional<Mem> a, b, c, bias;
};

// The shapes, flags and dtype as raw bytes in a buffer on the caller's stack.
struct GemmKey {
  int64_t words[5 + 3 * (1 + Shape::kMaxRank)];
  size_t n = 0;
  GemmKey(const GemmDims& d, DType dtype, bool bias, bool relu, bool serial) {
    put(static_cast<int64_t>(dtype));
    put(d.M);
    put(d.N);
    put(d.K);
    put((d.trans_a ? 1 : 0) | (d.trans_b ? 2 : 0) | (bias ? 4 : 0) | (relu ? 8 : 0) | (serial ? 16 : 0));
    for (const auto* dims : {&d.a_batch, &d.b_batch, &d.c_batch}) {
      put(static_cast<int64_t>(dims->size()));
      for (auto x : *dims) put(x);
    }
  }
  void put(int64_t v) {
    if (n == std::size(words)) throw InvalidArgumentError("matmul: too many batch dims for oneDNN");
    words[n++] = v;
  }
  std::string_view view() const { return {reinterpret_cast<const char*>(words), n * sizeof(int64_t)}; }
};

std::shared_ptr<const PreparedGemm> prepare_gemm(const GemmDims& d, DType dtype, bool bias, bool relu) {
  auto ptr = std::make_shared<PreparedGemm>();
  PreparedGemm& g = *ptr;
  const auto dt = to_dnnl(dtype);
  g.a_md = matrix_desc(d.a_batch, d.M, d.K, d.trans_a, dt);
  g.b_md = matrix_desc(d.b_batch, d.K, d.N, d.trans_b, dt);
  g.c_md = matrix_desc(d.c_batch, d.M, d.N, false, dt);
  if (bias) {  // broadcast over every dim but the last
    dnnl::memory::dims bias_dims(d.c_batch.size() + 2, 1), strides(d.c_batch.size() + 2, d.N);
    bias_dims.back() = d.N;
    strides.back() = 1;
    g.bias_md = dnnl::memory::desc(bias_dims, dnnl::memory::data_type::f32, strides);
  }
  g.a.emplace(g.a_md, nullptr);
  g.b.emplace(g.b_md, nullptr);
  g.c.emplace(g.c_md, nullptr);
  if (bias) g.bias.emplace(g.bias_md, nullptr);
  try {
    dnnl::primitive_attr attr;
    if (relu) {
      dnnl::post_ops po;
      po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(po);
    }
    auto desc = bias ? dnnl::matmul::desc(g.a_md, g.b_md, g.bias_md, g.c_md) : dnnl::matmul::desc(g.a_md, g.b_md, g.c_md);
    dnnl::matmul::primitive_desc pd(desc, attr, engine());
    if (dtype == DType::kF32 || is_optimized(pd)) g.prim = dnnl::matmul(pd);
  } catch (const dnnl::error&) {
    if (dtype == DType::kF32) throw;  // no implementation for this dtype on this CPU: prim stays empty
  }
  return ptr;
}

std::shared_ptr<const PreparedGemm> prepared_gemm(const GemmDims& d, DType dtype, bool bias, bool relu, bool serial) {
  thread_local ShapeCache<std::shared_ptr<const PreparedGemm>> cache;  // (per thread: see cached())
  return cache.get(GemmKey(d, dtype, bias, relu, serial).view(), [&] { return prepare_gemm(d, dtype, bias, relu); });
}
}  // namespace

bool gemm(const GemmDims& d, DType dtype, const void* a, const void* b, void* c) {
  return gemm(d, dtype, a, b, nullptr, false, c);
}

bool gemm(const GemmDims& d, DType dtype, const void* a, const void* b, const void* bias, bool relu, void* c) {
  int64_t macs = d.M * d.N * d.K;
  for (auto x : d.c_batch) macs *= x;
  const bool serial = runs_serial(macs);
  SerialScope one_thread(serial);
  const std::shared_ptr<const PreparedGemm> g = prepared_gemm(d, dtype, bias != nullptr, relu, serial);
  if (!g->prim) return false;
  g->a->point_at(a);
  g->b->point_at(b);
  g->c->point_at(c);
  dnnl_exec_arg_t args[4] = {
      {DNNL_ARG_SRC, g->a->m}, {DNNL_ARG_WEIGHTS, g->b->m}, {DNNL_ARG_DST, g->c->m}, {0, nullptr}};
  int n = 3;
  if (bias) {
    g->bias->point_at(bias);
    args[n++] = {DNNL_ARG_BIAS, g->bias->m};
  }
  dnnl::error::wrap_c_api(dnnl_primitive_execute(g->prim.get(), stream().get(), n, args), "could not execute a matmul");
  stream().wait();
  return true;
}

}  // namespace kiln::cpu::onednn
