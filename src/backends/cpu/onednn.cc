#include "onednn.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "kiln/core/error.h"
#include "kiln/core/parallel.h"

namespace kiln::cpu::onednn {

dnnl::engine& engine() {
  static dnnl::engine* e = [] {
    (void)num_threads();  // configures the shared OpenMP pool before oneDNN first runs
    return new dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return *e;
}

dnnl::stream& stream() {
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

dnnl::primitive cached(const std::string& key, const std::function<dnnl::primitive()>& make) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<std::string, dnnl::primitive>();
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache->find(key);
    if (it != cache->end()) return it->second;
  }
  dnnl::primitive p = make();
  std::lock_guard<std::mutex> lock(mu);
  if (cache->size() > 4096) cache->clear();  // bound memory under shape churn
  return cache->emplace(key, p).first->second;
}

int64_t serial_macs() {
  static const int64_t macs = [] {
    const char* env = std::getenv("KILN_SERIAL_MACS");
    return env && *env ? std::max<int64_t>(0, std::atoll(env)) : int64_t{192 * 1024};
  }();
  return macs;
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

std::string dims_key(const dnnl::memory::dims& d) {
  std::string s;
  for (auto x : d) s += std::to_string(x) + ",";
  return s;
}
}  // namespace

bool gemm(const GemmDims& d, DType dtype, const void* a, const void* b, void* c) {
  return gemm(d, dtype, a, b, nullptr, false, c);
}

bool gemm(const GemmDims& d, DType dtype, const void* a, const void* b, const void* bias, bool relu, void* c) {
  auto dt = to_dnnl(dtype);
  int64_t macs = d.M * d.N * d.K;
  for (auto b : d.c_batch) macs *= b;
  const bool serial = runs_serial(macs);
  SerialScope one_thread(serial);
  std::string key = "mm|" + std::to_string(static_cast<int>(dtype)) + "|" + dims_key(d.a_batch) + "|" +
                    dims_key(d.b_batch) + "|" + std::to_string(d.M) + "," + std::to_string(d.N) + "," +
                    std::to_string(d.K) + "|" + std::to_string(d.trans_a) + std::to_string(d.trans_b) + "|" +
                    std::to_string(bias != nullptr) + std::to_string(relu) + serial_tag(serial);
  auto a_md = matrix_desc(d.a_batch, d.M, d.K, d.trans_a, dt);
  auto b_md = matrix_desc(d.b_batch, d.K, d.N, d.trans_b, dt);
  auto c_md = matrix_desc(d.c_batch, d.M, d.N, false, dt);
  // The bias broadcasts over every dim but the last.
  dnnl::memory::dims bias_dims(d.c_batch.size() + 2, 1);
  bias_dims.back() = d.N;
  dnnl::memory::desc bias_md(bias_dims, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
  if (bias) {
    dnnl::memory::dims strides(bias_dims.size(), d.N);
    strides.back() = 1;
    bias_md = dnnl::memory::desc(bias_dims, dnnl::memory::data_type::f32, strides);
  }
  dnnl::primitive prim = cached(key, [&]() -> dnnl::primitive {
    try {
      dnnl::primitive_attr attr;
      if (relu) {
        dnnl::post_ops po;
        po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
        attr.set_post_ops(po);
      }
      auto desc = bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md);
      dnnl::matmul::primitive_desc pd(desc, attr, engine());
      if (dtype != DType::kF32 && !is_optimized(pd)) return dnnl::primitive();
      return dnnl::matmul(pd);
    } catch (const dnnl::error&) {
      if (dtype == DType::kF32) throw;
      return dnnl::primitive();  // no implementation for this dtype on this CPU
    }
  });
  if (!prim) return false;
  dnnl::memory am(a_md, engine(), const_cast<void*>(a));
  dnnl::memory bm(b_md, engine(), const_cast<void*>(b));
  dnnl::memory cm(c_md, engine(), c);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_md, engine(), const_cast<void*>(bias)));
  prim.execute(stream(), args);
  stream().wait();
  return true;
}

}  // namespace kiln::cpu::onednn
