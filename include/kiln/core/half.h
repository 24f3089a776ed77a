#pragma once
// 16-bit floating-point storage types: IEEE binary16 (`half`) and bfloat16.
// Both are storage formats: arithmetic converts to float. Conversions round to
// nearest even; NaN stays NaN. Bulk conversions (convert_*) are vectorised.
#include <cstdint>
#include <cstring>
#include <cstddef>

namespace kiln {

struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct half {
  uint16_t bits = 0;
  half() = default;
  explicit half(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

// Bulk conversions between 16-bit types and float; n elements.
void convert_half_to_float(const half* src, float* dst, size_t n);
void convert_float_to_half(const float* src, half* dst, size_t n);
void convert_bf16_to_float(const bfloat16* src, float* dst, size_t n);
void convert_float_to_bf16(const float* src, bfloat16* dst, size_t n);

}  // namespace kiln
