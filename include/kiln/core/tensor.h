#pragma once
// Tensor: a dense, row-major n-d array with an explicit dtype, living on a device.
//
// A Tensor is a cheap handle: copying it shares the buffer (reference counted);
// `clone()` copies the data. The buffer comes from the device backend's allocator
// and returns to it when the last handle goes. Tensors are contiguous; ops that
// "view" (reshape) share the buffer, ops that permute (transpose) copy.
//
// Every defined tensor has a non-null buffer, even with zero elements.
//
// Thread-safety: distinct handles may be used from different threads; writing to a
// buffer while another thread reads it is a data race, as with std::vector.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/shape.h"

namespace kiln {

class Storage {
 public:
  Storage(size_t nbytes, Device device);  // allocates from the device's allocator
  // Memory the storage does not own (e.g. a memory-mapped file, kiln/core/mapped_file.h):
  // `owner` keeps it alive as long as the storage; nothing is freed through an allocator.
  Storage(void* data, size_t nbytes, Device device, std::shared_ptr<const void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }
  // False for borrowed memory (the second constructor), which may be read-only.
  bool owns_memory() const { return allocator_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;       // null for borrowed memory
  std::shared_ptr<const void> owner_;    // borrowed memory's owner
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() == false

  // Uninitialised buffer.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  template <typename T>
  static Tensor scalar(T value) { return from_vector<T>({value}, Shape{}); }
  // Copies `bytes` of host memory of the given dtype/shape; size must match.
  static Tensor from_bytes(const void* data, size_t bytes, const Shape& shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_.dim(i); }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  size_t itemsize() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  Device device() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw_data() const;
  // Typed pointer; throws InvalidArgumentError if T does not match dtype().
  template <typename T>
  T* data() const {
    check_dtype(dtype_v<T>);
    return static_cast<T*>(raw_data());
  }
  // The single element of a one-element tensor (any rank), converted to T.
  template <typename T>
  T item() const;
  // All elements converted to T, on the host.
  template <typename T>
  std::vector<T> to_vector() const;
  // Element i (flat index) as double, for printing and tests.
  double get_double(int64_t i) const;

  // Shares the buffer with a new shape (same numel; one -1 is inferred).
  Tensor reshape(const Shape& shape) const;
  Tensor clone() const;
  Tensor to(DType dtype) const;      // dtype conversion (copy unless same dtype)
  Tensor to(Device device) const;    // device transfer (copy unless same device)
  bool is_same(const Tensor& o) const { return storage_ == o.storage_ && offset_ == o.offset_; }
  // Identity of this value for gradient tapes: every tensor made by an op, a
  // constructor or Tensor::reshape gets a fresh id; copies of a handle share it.
  // 0 for an undefined tensor.
  uint64_t id() const { return id_; }

  // NumPy-like printout, eliding the middle of large dimensions.
  std::string str(int max_per_dim = 6) const;
  std::string desc() const;  // "f32[2, 3] on cpu:0"

  // Internal: a tensor over an existing storage at a byte offset.
  Tensor(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape, DType dtype);

 private:
  void check_dtype(DType expected) const;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
  uint64_t id_ = 0;
};

// Converts n host elements between dtypes (static_cast semantics; to bool: != 0;
// 16-bit floats round to nearest even; floating to integer truncates toward zero, with
// NaN -> 0, saturation beyond int64 and the low bits kept in narrower types).
void convert_buffer(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

// True when shapes match and |a-b| <= atol + rtol*|b| elementwise (NaNs equal when
// both are NaN; infinities must match exactly). Dtypes may differ.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
// Exact equality of shape, dtype and every element.
bool array_equal(const Tensor& a, const Tensor& b);
// Largest |a-b| / (atol + rtol*|b|) ratio and where it occurs, for test messages.
std::string describe_mismatch(const Tensor& a, const Tensor& b, double rtol, double atol);

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return from_bytes(bytes.data(), bytes.size(), shape, DType::kBool);
  } else {
    return from_bytes(values.data(), values.size() * sizeof(T), shape, dtype_v<T>);
  }
}

template <typename T>
T Tensor::item() const {
  if (numel() != 1) throw InvalidArgumentError("item() needs a tensor with one element, got " + desc());
  return static_cast<T>(get_double(0));
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu()).to(dtype_v<T>);
  const T* p = static_cast<const T*>(host.raw_data());
  return std::vector<T>(p, p + host.numel());
}

}  // namespace kiln
