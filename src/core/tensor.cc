#include "kiln/core/tensor.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "kiln/core/parallel.h"

namespace kiln {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  allocator_ = &backend_for(device).allocator(device.index);
  // Empty tensors still get a (minimal) buffer, so data pointers are never null and
  // kernels may pass them to memcpy/memset with a zero size.
  data_ = allocator_->allocate(nbytes ? nbytes : 1);
}

Storage::Storage(void* data, size_t nbytes, Device device, std::shared_ptr<const void> owner)
    : data_(data), nbytes_(nbytes), device_(device), owner_(std::move(owner)) {
  if (!data_) throw InvalidArgumentError("Storage: borrowed memory is null");
}

Storage::~Storage() {
  if (allocator_) allocator_->deallocate(data_);
}

namespace {
std::atomic<uint64_t> g_next_tensor_id{1};
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape, DType dtype)
    : storage_(std::move(storage)),
      offset_(offset),
      shape_(shape),
      dtype_(dtype),
      id_(g_next_tensor_id.fetch_add(1, std::memory_order_relaxed)) {}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return Tensor(std::make_shared<Storage>(bytes, device), 0, shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.type == DeviceType::kCPU) {
    if (t.nbytes()) std::memset(t.raw_data(), 0, t.nbytes());
  } else {
    std::vector<char> z(t.nbytes(), 0);
    backend_for(device).copy_from_host(t.raw_data(), z.data(), z.size(), device.index);
  }
  return t;
}

Tensor Tensor::from_bytes(const void* data, size_t bytes, const Shape& shape, DType dtype) {
  size_t expect = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (bytes != expect)
    throw InvalidArgumentError("got " + std::to_string(bytes) + " bytes of data for a " + std::string(dtype_name(dtype)) +
                               shape.str() + " tensor, which needs " + std::to_string(expect));
  Tensor t = empty(shape, dtype);
  if (bytes) std::memcpy(t.raw_data(), data, bytes);
  return t;
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_;
}

void Tensor::check_dtype(DType expected) const {
  if (!storage_) throw FailedPreconditionError("use of an undefined tensor");
  if (expected != dtype_)
    throw InvalidArgumentError(std::string("tensor has dtype ") + std::string(dtype_name(dtype_)) + ", accessed as " +
                               std::string(dtype_name(expected)));
}

double Tensor::get_double(int64_t i) const {
  if (!storage_) throw FailedPreconditionError("use of an undefined tensor");
  if (i < 0 || i >= numel()) throw OutOfRangeError("element " + std::to_string(i) + " of " + desc());
  if (device().type != DeviceType::kCPU) return to(Device::cpu()).get_double(i);
  return visit_dtype(dtype_, [&](auto v) -> double {
    using T = decltype(v);
    return static_cast<double>(static_cast<const T*>(raw_data())[i]);
  });
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (shape.numel() != numel())
    throw InvalidArgumentError("cannot reshape " + desc() + " (" + std::to_string(numel()) + " elements) to " +
                               shape.str() + " (" + std::to_string(shape.numel()) + " elements)");
  return Tensor(storage_, offset_, shape, dtype_);
}

Tensor Tensor::clone() const {
  if (!storage_) return {};
  Tensor t = empty(shape_, dtype_, device());
  if (nbytes()) {
    if (device().type == DeviceType::kCPU)
      parallel_memcpy(t.raw_data(), raw_data(), static_cast<int64_t>(nbytes()));
    else
      backend_for(device()).copy_on_device(t.raw_data(), raw_data(), nbytes(), device().index);
  }
  return t;
}

namespace {
// A floating value to an integer type (C++ leaves values out of its range undefined):
// truncated toward zero; NaN is 0, values beyond int64 saturate, and a narrower type
// keeps the int64 value's low bits (-50.5 -> u8 206, as numpy gives on x86).
template <typename D>
D float_to_int(double v) {
  if (std::isnan(v)) return D(0);
  if constexpr (std::is_same_v<D, uint64_t>)
    if (v >= 0x1p63) return v < 0x1p64 ? static_cast<D>(v) : std::numeric_limits<D>::max();
  const int64_t i = v <= -0x1p63 ? std::numeric_limits<int64_t>::min()
                    : v >= 0x1p63 ? std::numeric_limits<int64_t>::max()
                                  : static_cast<int64_t>(v);
  return static_cast<D>(i);
}

template <typename S, typename D>
void convert_loop(const S* s, D* d, int64_t n) {
  constexpr bool kFloatSource = std::is_floating_point_v<S> || std::is_same_v<S, half> || std::is_same_v<S, bfloat16>;
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<D, bool>)
      d[i] = static_cast<float>(s[i]) != 0.0f;
    else if constexpr (std::is_same_v<D, half> || std::is_same_v<D, bfloat16>)
      d[i] = D(static_cast<float>(s[i]));
    else if constexpr (kFloatSource && std::is_integral_v<D>)
      d[i] = float_to_int<D>(static_cast<double>(s[i]));
    else if constexpr (std::is_same_v<S, half> || std::is_same_v<S, bfloat16>)
      d[i] = static_cast<D>(static_cast<float>(s[i]));
    else
      d[i] = static_cast<D>(s[i]);
  }
}
}  // namespace

void convert_buffer(const void* src, DType sd, void* dst, DType dd, int64_t n) {
  if (sd == dd) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(sd));
    return;
  }
  // 16-bit <-> f32 conversions (mixed precision moves activations through them) run
  // vectorised, on every thread for big buffers.
  auto split = [n](auto* s, auto* d, auto convert) {
    parallel_for(n, 1 << 15, [&](int64_t lo, int64_t hi) { convert(s + lo, d + lo, static_cast<size_t>(hi - lo)); });
  };
  if (sd == DType::kF16 && dd == DType::kF32)
    return split(static_cast<const half*>(src), static_cast<float*>(dst), convert_half_to_float);
  if (sd == DType::kF32 && dd == DType::kF16)
    return split(static_cast<const float*>(src), static_cast<half*>(dst), convert_float_to_half);
  if (sd == DType::kBF16 && dd == DType::kF32)
    return split(static_cast<const bfloat16*>(src), static_cast<float*>(dst), convert_bf16_to_float);
  if (sd == DType::kF32 && dd == DType::kBF16)
    return split(static_cast<const float*>(src), static_cast<bfloat16*>(dst), convert_float_to_bf16);
  visit_dtype(sd, [&](auto sv) {
    using S = decltype(sv);
    visit_dtype(dd, [&](auto dv) {
      using D = decltype(dv);
      convert_loop(static_cast<const S*>(src), static_cast<D*>(dst), n);
    });
  });
}

Tensor Tensor::to(DType dtype) const {
  if (!storage_) return {};
  if (dtype == dtype_) return *this;
  if (device().type != DeviceType::kCPU) return to(Device::cpu()).to(dtype).to(device());
  Tensor t = empty(shape_, dtype, device());
  convert_buffer(raw_data(), dtype_, t.raw_data(), dtype, numel());
  return t;
}

Tensor Tensor::to(Device device) const {
  if (!storage_) return {};
  Device here = this->device();
  if (device == here) return *this;
  Tensor t = empty(shape_, dtype_, device);
  if (nbytes() == 0) return t;
  if (here.type == DeviceType::kCPU) {
    backend_for(device).copy_from_host(t.raw_data(), raw_data(), nbytes(), device.index);
  } else if (device.type == DeviceType::kCPU) {
    backend_for(here).copy_to_host(t.raw_data(), raw_data(), nbytes(), here.index);
  } else {
    return to(Device::cpu()).to(device);
  }
  return t;
}

std::string Tensor::desc() const {
  if (!storage_) return "<undefined tensor>";
  return std::string(dtype_name(dtype_)) + shape_.str() + " on " + device().str();
}

namespace {
void print_rec(std::ostringstream& os, const Tensor& t, int dim, int64_t base, int max_per_dim) {
  const Shape& s = t.shape();
  if (dim == s.rank()) {
    double v = t.get_double(base);
    if (t.dtype() == DType::kBool)
      os << (v != 0 ? "true" : "false");
    else if (is_floating(t.dtype()))
      os << v;
    else
      os << static_cast<int64_t>(v);
    return;
  }
  int64_t n = s[dim];
  int64_t stride = 1;
  for (int i = dim + 1; i < s.rank(); ++i) stride *= s[i];
  os << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (n > max_per_dim && i == max_per_dim / 2) {
      os << (i ? ", ..." : "...");  // the next element prints its own ", "
      i = n - max_per_dim / 2 - 1;
      continue;
    }
    if (i) os << ", ";
    print_rec(os, t, dim + 1, base + i * stride, max_per_dim);
  }
  os << ']';
}
}  // namespace

std::string Tensor::str(int max_per_dim) const {
  if (!storage_) return "<undefined tensor>";
  Tensor host = to(Device::cpu());
  std::ostringstream os;
  os.precision(6);
  print_rec(os, host, 0, 0, max_per_dim);
  os << " (" << desc() << ")";
  return os.str();
}

namespace {
bool close_one(double a, double b, double rtol, double atol) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= atol + rtol * std::fabs(b);
}
}  // namespace

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
  Tensor ha = a.to(Device::cpu()).to(DType::kF64), hb = b.to(Device::cpu()).to(DType::kF64);
  const double* pa = ha.numel() ? ha.data<double>() : nullptr;
  const double* pb = hb.numel() ? hb.data<double>() : nullptr;
  for (int64_t i = 0; i < ha.numel(); ++i)
    if (!close_one(pa[i], pb[i], rtol, atol)) return false;
  return true;
}

bool array_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.get_double(i), y = b.get_double(i);
    if (!(x == y || (std::isnan(x) && std::isnan(y)))) return false;
  }
  return true;
}

std::string describe_mismatch(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return "shape mismatch: " + a.desc() + " vs " + b.desc();
  Tensor ha = a.to(Device::cpu()).to(DType::kF64), hb = b.to(Device::cpu()).to(DType::kF64);
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0;
  for (int64_t i = 0; i < ha.numel(); ++i) {
    double x = ha.data<double>()[i], y = hb.data<double>()[i];
    if (!close_one(x, y, rtol, atol)) {
      ++bad;
      double r = std::fabs(x - y) / (atol + rtol * std::fabs(y));
      if (worst < 0 || r > worst_ratio || std::isnan(r)) {
        worst_ratio = r;
        worst = i;
      }
    }
  }
  if (bad == 0) return "all close";
  std::ostringstream os;
  os.precision(9);
  os << bad << " of " << ha.numel() << " elements differ (rtol=" << rtol << ", atol=" << atol << "); worst at flat index "
     << worst << ": got " << ha.data<double>()[worst] << ", expected " << hb.data<double>()[worst];
  return os.str();
}

}  // namespace kiln
