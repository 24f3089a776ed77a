// CPU kernels for the indexing ops: gather, gather_nd (byte moves, all dtypes),
// scatter_add (numeric; f16/bf16 accumulate in f32), one_hot, top_k.
//
// Index values are validated in one serial pass before any parallel work, so a bad
// index throws OutOfRangeError (naming the index, where it sits and the bound) and
// never reaches the copy loops.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "byte_copy.h"
#include "kernel_util.h"
#include "kiln/core/kernel.h"

namespace kiln::cpu {
namespace {

using bytes::grain_for;

char* out_ptr(const Tensor& t) { return static_cast<char*>(t.raw_data()); }
const char* in_ptr(const Tensor& t) { return static_cast<const char*>(t.raw_data()); }

int64_t prod(const Shape& s, int b, int e) {
  int64_t n = 1;
  for (int i = b; i < e; ++i) n *= s[i];
  return n;
}

// "[1, 2]": the multi-index of flat position `flat` in `s`.
std::string position_str(const Shape& s, int64_t flat) {
  std::vector<int64_t> idx(static_cast<size_t>(s.rank()));
  for (int i = s.rank() - 1; i >= 0; --i) {
    idx[i] = s[i] ? flat % s[i] : 0;
    flat = s[i] ? flat / s[i] : 0;
  }
  std::string out = "[";
  for (size_t i = 0; i < idx.size(); ++i) out += (i ? ", " : "") + std::to_string(idx[i]);
  return out + "]";
}

// Calls f(const I*) with the indices' integer type (i32 or i64).
template <typename F>
void with_indices(const Tensor& t, F&& f) {
  if (t.dtype() == DType::kI32)
    f(static_cast<const int32_t*>(t.raw_data()));
  else
    f(static_cast<const int64_t*>(t.raw_data()));
}

// Throws OutOfRangeError for the first index outside [0, bound); what() names the
// indexed dim in the message (called only then: no formatting per call).
template <typename I, typename What>
void check_indices(const char* op, const I* ix, const Tensor& indices, int64_t bound, What&& what) {
  const int64_t n = indices.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = ix[i];
    if (v < 0 || v >= bound)
      throw OutOfRangeError(kiln::detail::str_cat(op, ": indices", position_str(indices.shape(), i), " = ", v,
                                                  " is out of range [0, ", bound, ") for ", what()));
  }
}

// ---- gather ------------------------------------------------------------------------

void k_gather(OpContext& ctx) {
  const Tensor &P = ctx.in[0], &I = ctx.in[1];
  Tensor& out = ctx.out[0];
  const int64_t bd = [&] {
    int64_t b = ctx.attrs.get_int("batch_dims", 0);
    return b < 0 ? b + I.rank() : b;
  }();
  const int axis = normalize_axis(ctx.attrs.get_int("axis", 0), P.rank());
  const int64_t batch = prod(P.shape(), 0, static_cast<int>(bd));
  const int64_t outer = prod(P.shape(), static_cast<int>(bd), axis);
  const int64_t n = P.dim(axis);
  const int64_t inner = prod(P.shape(), axis + 1, P.rank()) * static_cast<int64_t>(P.itemsize());
  const int64_t ni = prod(I.shape(), static_cast<int>(bd), I.rank());
  with_indices(I, [&](auto* ix) {
    check_indices("gather", ix, I, n, [&] { return kiln::detail::str_cat("axis ", axis, " of params ", P.desc()); });
    if (out.numel() == 0) return;
    const char* src = in_ptr(P);
    char* dst = out_ptr(out);
    // out[b, o, i] = P[b, o, ix[b, i]] (blocks of `inner` bytes); tasks are (row b*o, chunk of i).
    const int64_t rows = batch * outer;
    const int64_t chunks =
        rows >= 4 * num_threads() ? 1 : std::clamp<int64_t>(ni * inner / bytes::kCopyGrainBytes, 1, ni);
    const int64_t clen = (ni + chunks - 1) / chunks;
    parallel_for(rows * chunks, grain_for(clen * inner), [&](int64_t tb, int64_t te) {
      for (int64_t t = tb; t < te; ++t) {
        const int64_t row = t / chunks, i0 = t % chunks * clen, i1 = std::min(ni, i0 + clen);
        const auto* idx = ix + row / outer * ni;
        const char* s = src + row * n * inner;
        char* d = dst + row * ni * inner;
        const bool typed = bytes::visit_size(inner, [&](auto u) {
          using U = decltype(u);
          const U* su = reinterpret_cast<const U*>(s);
          U* du = reinterpret_cast<U*>(d);
          for (int64_t i = i0; i < i1; ++i) du[i] = su[idx[i]];
        });
        if (!typed)
          for (int64_t i = i0; i < i1; ++i) std::memcpy(d + i * inner, s + idx[i] * inner, inner);
      }
    });
  });
}

void k_gather_nd(OpContext& ctx) {
  const Tensor &P = ctx.in[0], &I = ctx.in[1];
  Tensor& out = ctx.out[0];
  const int k = static_cast<int>(I.dim(-1));
  const int64_t tuples = k ? I.numel() / k : prod(I.shape(), 0, I.rank() - 1);
  const int64_t slice = prod(P.shape(), k, P.rank()) * static_cast<int64_t>(P.itemsize());
  std::vector<int64_t> stride(static_cast<size_t>(k));
  int64_t acc = slice;
  for (int j = k - 1; j >= 0; --j) {
    stride[j] = acc;
    acc *= P.dim(j);
  }
  with_indices(I, [&](auto* ix) {
    for (int64_t t = 0; t < tuples; ++t)
      for (int j = 0; j < k; ++j) {
        const int64_t v = ix[t * k + j];
        if (v < 0 || v >= P.dim(j))
          throw OutOfRangeError(kiln::detail::str_cat("gather_nd: indices", position_str(I.shape(), t * k + j),
                                                      " = ", v, " is out of range [0, ", P.dim(j),
                                                      ") for dimension ", j, " of params ", P.desc()));
      }
    if (out.numel() == 0) return;
    const char* src = in_ptr(P);
    char* dst = out_ptr(out);
    parallel_for(tuples, grain_for(slice), [&](int64_t tb, int64_t te) {
      for (int64_t t = tb; t < te; ++t) {
        int64_t off = 0;
        for (int j = 0; j < k; ++j) off += ix[t * k + j] * stride[j];
        bytes::copy_block(dst + t * slice, src + off, slice);
      }
    });
  });
}

// ---- scatter_add -------------------------------------------------------------------

template <typename T>
void k_scatter_add(OpContext& ctx) {
  const Tensor &X = ctx.in[0], &I = ctx.in[1], &U = ctx.in[2];
  Tensor& out = ctx.out[0];
  const int axis = normalize_axis(ctx.attrs.get_int("axis", 0), X.rank());
  const int64_t outer = prod(X.shape(), 0, axis), n = X.dim(axis), inner = prod(X.shape(), axis + 1, X.rank());
  const int64_t ni = I.numel();
  with_indices(I, [&](auto* ix) {
    check_indices("scatter_add", ix, I, n, [&] { return kiln::detail::str_cat("axis ", axis, " of x ", X.desc()); });
    kiln::parallel_memcpy(out.raw_data(), X.raw_data(), static_cast<int64_t>(X.nbytes()));
    if (ni == 0 || inner == 0 || outer == 0) return;
    const T* u = static_cast<const T*>(U.raw_data());
    T* o = static_cast<T*>(out.raw_data());
    // Positions (o, inner chunk) are independent; indices accumulate in order within each.
    const int64_t chunks = outer >= 4 * num_threads() ? 1 : std::max<int64_t>(1, inner / 4096);
    const int64_t clen = (inner + chunks - 1) / chunks;
    parallel_for(outer * chunks, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, ni * clen)),
                 [&](int64_t tb, int64_t te) {
                   for (int64_t t = tb; t < te; ++t) {
                     const int64_t r = t / chunks, c0 = t % chunks * clen, c1 = std::min(inner, c0 + clen);
                     for (int64_t i = 0; i < ni; ++i) {
                       T* dst = o + (r * n + ix[i]) * inner;
                       const T* src = u + (r * ni + i) * inner;
#pragma omp simd
                       for (int64_t c = c0; c < c1; ++c) dst[c] = static_cast<T>(dst[c] + src[c]);
                     }
                   }
                 });
  });
}

// ---- index_copy --------------------------------------------------------------------

// x's bytes, then each index's row replaced (in index order: a repeated index's last row
// stays); x may be the output itself (overwritable), then only the rows move.
void k_index_copy(OpContext& ctx) {
  const Tensor &X = ctx.in[0], &I = ctx.in[1], &R = ctx.in[2];
  Tensor& out = ctx.out[0];
  const int64_t n = X.dim(0), row = X.dim(0) == 0 ? 0 : static_cast<int64_t>(X.nbytes()) / n;
  with_indices(I, [&](auto* ix) {
    check_indices("index_copy", ix, I, n, [&] { return kiln::detail::str_cat("axis 0 of x ", X.desc()); });
    if (out.raw_data() != X.raw_data()) kiln::parallel_memcpy(out.raw_data(), X.raw_data(), static_cast<int64_t>(X.nbytes()));
    auto* o = static_cast<uint8_t*>(out.raw_data());
    const auto* r = static_cast<const uint8_t*>(R.raw_data());
    for (int64_t i = 0; i < I.numel(); ++i)
      std::memcpy(o + ix[i] * row, r + i * row, static_cast<size_t>(row));
  });
}

// ---- one_hot -----------------------------------------------------------------------

void k_one_hot(OpContext& ctx) {
  const Tensor& I = ctx.in[0];
  Tensor& out = ctx.out[0];
  const int64_t depth = ctx.attrs.get_int("depth");
  const int64_t axis_attr = ctx.attrs.get_int("axis", -1);
  const int axis = axis_attr == -1 ? I.rank() : normalize_axis(axis_attr, I.rank() + 1);
  const int64_t outer = prod(I.shape(), 0, axis), inner = prod(I.shape(), axis, I.rank());
  if (out.numel() == 0) return;
  const double vals[2] = {ctx.attrs.get_float("off_value", 0.0), ctx.attrs.get_float("on_value", 1.0)};
  char pattern[2][8] = {};
  for (int v = 0; v < 2; ++v) convert_buffer(&vals[v], DType::kF64, pattern[v], out.dtype(), 1);
  with_indices(I, [&](auto* ix) {
    bytes::visit_size(out.itemsize(), [&](auto u) {
      using Uv = decltype(u);
      Uv off, on;
      std::memcpy(&off, pattern[0], sizeof(Uv));
      std::memcpy(&on, pattern[1], sizeof(Uv));
      Uv* o = reinterpret_cast<Uv*>(out.raw_data());
      // Block r is [depth, inner]: off everywhere, on at (ix[r, i], i). Tasks are (r, chunk of i).
      const int64_t chunks = outer >= 4 * num_threads()
                                 ? 1
                                 : std::clamp<int64_t>(inner * depth * static_cast<int64_t>(sizeof(Uv)) /
                                                           bytes::kCopyGrainBytes, 1, inner);
      const int64_t clen = (inner + chunks - 1) / chunks;
      parallel_for(outer * chunks, grain_for(clen * depth * static_cast<int64_t>(sizeof(Uv))),
                   [&](int64_t tb, int64_t te) {
                     for (int64_t t = tb; t < te; ++t) {
                       const int64_t r = t / chunks, i0 = t % chunks * clen, i1 = std::min(inner, i0 + clen);
                       Uv* blk = o + r * depth * inner;
                       for (int64_t d = 0; d < depth; ++d)
                         for (int64_t i = i0; i < i1; ++i) blk[d * inner + i] = off;
                       const auto* src = ix + r * inner;
                       for (int64_t i = i0; i < i1; ++i) {
                         const int64_t v = src[i];
                         if (v >= 0 && v < depth) blk[v * inner + i] = on;
                       }
                     }
                   });
    });
  });
}

// ---- top_k -------------------------------------------------------------------------

template <typename T>
void k_top_k(OpContext& ctx) {
  const Tensor& X = ctx.in[0];
  Tensor &V = ctx.out[0], &Ix = ctx.out[1];
  const int64_t n = X.dim(-1), k = V.dim(-1);
  if (V.numel() == 0) return;
  const int64_t rows = X.numel() / n;
  const bool sorted = ctx.attrs.get_bool("sorted", true);
  using Key = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;
  const T* x = static_cast<const T*>(X.raw_data());
  T* vals = static_cast<T*>(V.raw_data());
  int64_t* idx_out = static_cast<int64_t*>(Ix.raw_data());
  parallel_for(rows, std::max<int64_t>(1, 16384 / n), [&](int64_t rb, int64_t re) {
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::vector<Key> keybuf;
    for (int64_t r = rb; r < re; ++r) {
      const T* row = x + r * n;
      const Key* key;
      if constexpr (std::is_same_v<Key, T>) {
        key = row;
      } else {
        keybuf.resize(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) keybuf[i] = static_cast<float>(row[i]);
        key = keybuf.data();
      }
      // Strict total order: larger first, NaN above everything, ties by lower index.
      auto before = [key](int64_t a, int64_t b) {
        const Key ka = key[a], kb = key[b];
        if (ka > kb) return true;
        if (ka < kb) return false;
        if constexpr (std::is_floating_point_v<Key>) {
          const bool na = std::isnan(ka), nb = std::isnan(kb);
          if (na != nb) return na;
        }
        return a < b;
      };
      if (k <= 16 && k < n) {
        // Small k: insertion into a sorted prefix; most entries fail one comparison.
        int64_t m = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (m == k && !before(i, idx[k - 1])) continue;
          int64_t p = m < k ? m++ : k - 1;
          for (; p > 0 && before(i, idx[p - 1]); --p) idx[p] = idx[p - 1];
          idx[p] = i;
        }
      } else {
        std::iota(idx.begin(), idx.end(), int64_t{0});
        if (k == n) {
          std::sort(idx.begin(), idx.end(), before);
        } else if (k * 8 <= n) {
          std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
        } else {
          std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), before);
          std::sort(idx.begin(), idx.begin() + k, before);
        }
      }
      if (!sorted) std::sort(idx.begin(), idx.begin() + k);
      for (int64_t j = 0; j < k; ++j) {
        vals[r * k + j] = row[idx[j]];
        idx_out[r * k + j] = idx[j];
      }
    }
  });
}

// ---- registration ------------------------------------------------------------------

KILN_REGISTER_KERNEL("gather", kCPU, KILN_ALL_DTYPES, k_gather);
KILN_REGISTER_KERNEL("gather_nd", kCPU, KILN_ALL_DTYPES, k_gather_nd);

KILN_REGISTER_KERNEL("scatter_add", kCPU, DType::kU8, k_scatter_add<uint8_t>);
KILN_REGISTER_KERNEL("scatter_add", kCPU, DType::kI8, k_scatter_add<int8_t>);
KILN_REGISTER_KERNEL("scatter_add", kCPU, DType::kI32, k_scatter_add<int32_t>);
KILN_REGISTER_KERNEL("scatter_add", kCPU, DType::kI64, k_scatter_add<int64_t>);
KILN_REGISTER_KERNEL("scatter_add", kCPU, DType::kF32, k_scatter_add<float>);
KILN_REGISTER_KERNEL("scatter_add", kCPU, DType::kF64, k_scatter_add<double>);
KILN_REGISTER_KERNEL("scatter_add", kCPU, (std::initializer_list<DType>{DType::kF16, DType::kBF16}),
                     via_f32<k_scatter_add<float>>);

KILN_REGISTER_KERNEL("index_copy", kCPU, KILN_ALL_DTYPES, k_index_copy);
KILN_REGISTER_KERNEL("one_hot", kCPU, (std::initializer_list<DType>{DType::kI32, DType::kI64}), k_one_hot);

KILN_REGISTER_KERNEL("top_k", kCPU, DType::kU8, k_top_k<uint8_t>);
KILN_REGISTER_KERNEL("top_k", kCPU, DType::kI8, k_top_k<int8_t>);
KILN_REGISTER_KERNEL("top_k", kCPU, DType::kI32, k_top_k<int32_t>);
KILN_REGISTER_KERNEL("top_k", kCPU, DType::kI64, k_top_k<int64_t>);
KILN_REGISTER_KERNEL("top_k", kCPU, DType::kF16, k_top_k<half>);
KILN_REGISTER_KERNEL("top_k", kCPU, DType::kBF16, k_top_k<bfloat16>);
KILN_REGISTER_KERNEL("top_k", kCPU, DType::kF32, k_top_k<float>);
KILN_REGISTER_KERNEL("top_k", kCPU, DType::kF64, k_top_k<double>);

}  // namespace
}  // namespace kiln::cpu
