#pragma once
// Byte-moving helpers for the shape and indexing kernels (internal). These kernels
// never look at values, so they work on elements of 1/2/4/8 bytes (as unsigned
// integers) or on arbitrary-size blocks with memcpy, whatever the dtype.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kiln/core/parallel.h"

namespace kiln::cpu::bytes {

// Bytes per parallel task below which splitting costs more than it gains.
inline constexpr int64_t kCopyGrainBytes = int64_t{1} << 16;

// Calls f(U{}) with U the unsigned integer of `size` bytes (1, 2, 4, 8) and returns
// true, or returns false for other sizes.
template <typename F>
bool visit_size(size_t size, F&& f) {
  switch (size) {
    case 1: f(uint8_t{}); return true;
    case 2: f(uint16_t{}); return true;
    case 4: f(uint32_t{}); return true;
    case 8: f(uint64_t{}); return true;
    default: return false;
  }
}

// Tasks of about kCopyGrainBytes each for `n` items of `item_bytes` bytes.
inline int64_t grain_for(int64_t item_bytes) {
  return std::max<int64_t>(1, kCopyGrainBytes / std::max<int64_t>(item_bytes, 1));
}

// memcpy split over the intra-op pool.

// Copies `rows` rows of `row_bytes` bytes between strided row starts, in parallel
// (long rows are split when there are few of them).
inline void copy_rows(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t rows,
                      int64_t row_bytes) {
  if (rows <= 0 || row_bytes <= 0) return;
  if (rows == 1) {
    parallel_memcpy(dst, src, row_bytes);
    return;
  }
  if (dst_stride == row_bytes && src_stride == row_bytes) {
    parallel_memcpy(dst, src, rows * row_bytes);
    return;
  }
  parallel_for(rows, grain_for(row_bytes), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) std::memcpy(dst + r * dst_stride, src + r * src_stride, row_bytes);
  });
}

// Copies one block of `nbytes` (the size is often a small multiple of the element).
inline void copy_block(char* dst, const char* src, int64_t nbytes) {
  switch (nbytes) {
    case 1: *dst = *src; return;
    case 2: std::memcpy(dst, src, 2); return;
    case 4: std::memcpy(dst, src, 4); return;
    case 8: std::memcpy(dst, src, 8); return;
    default: std::memcpy(dst, src, nbytes);
  }
}

// Fills n elements of `elem_bytes` at dst with the pattern at `value`.
inline void fill_pattern(char* dst, int64_t n, const char* value, int64_t elem_bytes) {
  if (n <= 0) return;
  bool done = visit_size(elem_bytes, [&](auto u) {
    using U = decltype(u);
    U v;
    std::memcpy(&v, value, sizeof(U));
    U* o = reinterpret_cast<U*>(dst);
    if constexpr (sizeof(U) == 1) {
      std::memset(o, v, n);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = v;
    }
  });
  if (!done)
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * elem_bytes, value, elem_bytes);
}

}  // namespace kiln::cpu::bytes
