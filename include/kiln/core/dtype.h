#pragma once
// Element types of kiln tensors and the NumPy-style promotion rules between them.
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "kiln/core/half.h"

namespace kiln {

enum class DType : uint8_t {
  kBool = 0,
  kU8,
  kI8,
  kI32,
  kI64,
  kF16,
  kBF16,
  kF32,
  kF64,
};
inline constexpr int kNumDTypes = 9;

// Short names as NumPy spells them where it can: bool u8 i8 i32 i64 f16 bf16 f32 f64.
std::string_view dtype_name(DType t);
// Parses a name (also accepts numpy's "float32", "int64", "uint8", "bfloat16" ...);
// throws InvalidArgumentError on an unknown name.
DType dtype_from_name(std::string_view name);
size_t dtype_size(DType t);
inline bool is_floating(DType t) { return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32 || t == DType::kF64; }
inline bool is_integral(DType t) { return t == DType::kU8 || t == DType::kI8 || t == DType::kI32 || t == DType::kI64; }
inline bool is_signed(DType t) { return t != DType::kBool && t != DType::kU8; }
// Type promotion for binary ops (a lattice like PyTorch's): bool < ints < floats;
// within floats the wider wins; f16 with bf16 gives f32; u8 with i8 gives i32.
DType promote_types(DType a, DType b);

template <typename T> struct dtype_of;
template <> struct dtype_of<bool> { static constexpr DType value = DType::kBool; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::kI8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct dtype_of<half> { static constexpr DType value = DType::kF16; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::kBF16; };
template <> struct dtype_of<float> { static constexpr DType value = DType::kF32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::kF64; };
template <typename T> inline constexpr DType dtype_v = dtype_of<std::remove_cv_t<T>>::value;

// Calls f(T{}) with T the C++ type of `t`.
template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kBool: return f(bool{});
    case DType::kU8: return f(uint8_t{});
    case DType::kI8: return f(int8_t{});
    case DType::kI32: return f(int32_t{});
    case DType::kI64: return f(int64_t{});
    case DType::kF16: return f(half{});
    case DType::kBF16: return f(bfloat16{});
    case DType::kF32: return f(float{});
    case DType::kF64: return f(double{});
  }
  return f(float{});
}

}  // namespace kiln
