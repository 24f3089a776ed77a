// CPU kernels for the shape ops: reshape (graph copy), transpose, concat, stack,
// split, and one index-map engine shared by strided_slice, pad, tile, broadcast_to.
//
// All kernels move bytes and are registered once for every dtype. Dimensions are
// collapsed first (size-1 dims dropped, neighbours that stay contiguous merged,
// contiguous trailing runs treated as one wide element), then runs are copied with
// memcpy, narrow elements with typed loops, and the 2-d-like transpose in tiles.
#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "../common/axis_view.h"
#include "byte_copy.h"
#include "kernel_util.h"
#include "kiln/core/kernel.h"

namespace kiln::cpu {
namespace {

using bytes::copy_rows;
using bytes::grain_for;
using kiln::parallel_memcpy;

char* out_ptr(const Tensor& t) { return static_cast<char*>(t.raw_data()); }
const char* in_ptr(const Tensor& t) { return static_cast<const char*>(t.raw_data()); }

void k_reshape(OpContext& ctx) { parallel_memcpy(out_ptr(ctx.out[0]), in_ptr(ctx.in[0]), ctx.in[0].nbytes()); }

// ---- transpose ---------------------------------------------------------------------

// Output dims with the input byte stride of each, after collapsing; `elem` is the
// byte size of the unit moved (a contiguous run of input elements).
struct TransposePlan {
  int rank = 0;
  int64_t dims[Shape::kMaxRank];
  int64_t in_stride[Shape::kMaxRank];
  int64_t elem = 0;

  TransposePlan(const Shape& in, const std::vector<int64_t>& perm_attr, int64_t itemsize) {
    const int r = in.rank();
    int64_t perm[Shape::kMaxRank];  // (no allocation per call)
    for (int k = 0; k < r; ++k) perm[k] = perm_attr.empty() ? r - 1 - k : perm_attr[static_cast<size_t>(k)];
    int64_t stride[Shape::kMaxRank];
    int64_t acc = itemsize;
    for (int i = r - 1; i >= 0; --i) {
      stride[i] = acc;
      acc *= in[i];
    }
    elem = itemsize;
    for (int k = 0; k < r; ++k) {
      int p = static_cast<int>(perm[k] < 0 ? perm[k] + r : perm[k]);
      if (in[p] == 1) continue;
      if (rank > 0 && in_stride[rank - 1] == stride[p] * in[p]) {
        dims[rank - 1] *= in[p];
        in_stride[rank - 1] = stride[p];
      } else {
        dims[rank] = in[p];
        in_stride[rank] = stride[p];
        ++rank;
      }
    }
    // A last output dim that is contiguous in the input becomes part of the element.
    if (rank > 0 && in_stride[rank - 1] == elem) {
      elem *= dims[rank - 1];
      --rank;
    }
  }
};

// Blocked 2-d transpose, batched: out[.., i, .., j] = in[.. i*elem + j*sj ..] where i
// runs over output dim `bi` (contiguous in the input) and j over the last output dim.
template <typename U>
void transpose_tiled(const TransposePlan& p, const char* in, char* out) {
  constexpr int64_t T = 64;
  constexpr int B = sizeof(U) == 1 ? 16 : 8;
  const int r = p.rank;
  int bi = 0;
  while (p.in_stride[bi] != p.elem) ++bi;  // exists (the input's innermost remaining dim) and is < r - 1
  int64_t out_stride[Shape::kMaxRank];
  int64_t acc = 1;  // in elements
  for (int k = r - 1; k >= 0; --k) {
    out_stride[k] = acc;
    acc *= p.dims[k];
  }
  const int64_t ni = p.dims[bi], nj = p.dims[r - 1];
  const int64_t os_i = out_stride[bi], is_j = p.in_stride[r - 1] / p.elem;
  // Batch dims: all but bi and r-1.
  int nb = 0;
  int64_t bdims[Shape::kMaxRank], bin[Shape::kMaxRank], bout[Shape::kMaxRank];
  for (int k = 0; k < r - 1; ++k) {
    if (k == bi) continue;
    bdims[nb] = p.dims[k];
    bin[nb] = p.in_stride[k] / p.elem;
    bout[nb] = out_stride[k];
    ++nb;
  }
  const int64_t ti = (ni + T - 1) / T, tj = (nj + T - 1) / T;
  const int64_t tasks = acc / (ni * nj) * ti * tj;
  const U* src = reinterpret_cast<const U*>(in);
  U* dst = reinterpret_cast<U*>(out);
  parallel_for(tasks, std::max<int64_t>(1, 16384 / (T * T)), [&](int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) {
      int64_t rem = t;
      const int64_t j0 = rem % tj * T;
      rem /= tj;
      const int64_t i0 = rem % ti * T;
      rem /= ti;
      int64_t io = 0, oo = 0;
      for (int k = nb - 1; k >= 0; --k) {
        int64_t idx = rem % bdims[k];
        rem /= bdims[k];
        io += idx * bin[k];
        oo += idx * bout[k];
      }
      const int64_t i1 = std::min(ni, i0 + T), j1 = std::min(nj, j0 + T);
      const U* s = src + io;
      U* d = dst + oo;
      // B x B blocks through registers/L1 keep few cache lines live (strides are often powers of 2).
      for (int64_t ib = i0; ib < i1; ib += B)
        for (int64_t jb = j0; jb < j1; jb += B) {
          if (ib + B <= i1 && jb + B <= j1) {
            U blk[B][B];
            for (int j = 0; j < B; ++j)
              for (int i = 0; i < B; ++i) blk[j][i] = s[(jb + j) * is_j + ib + i];
            for (int i = 0; i < B; ++i)
              for (int j = 0; j < B; ++j) d[(ib + i) * os_i + jb + j] = blk[j][i];
          } else {
            for (int64_t i = ib; i < std::min(i1, ib + B); ++i)
              for (int64_t j = jb; j < std::min(j1, jb + B); ++j) d[i * os_i + j] = s[j * is_j + i];
          }
        }
    }
  });
}

// Any element size: walk the output in order, one memcpy per (wide) element.
void transpose_generic(const TransposePlan& p, const char* in, char* out) {
  const int r = p.rank;
  int64_t n = 1;
  for (int k = 0; k < r; ++k) n *= p.dims[k];
  const int64_t elem = p.elem;
  parallel_for(n, grain_for(elem), [&](int64_t b, int64_t e) {
    int64_t idx[Shape::kMaxRank];
    int64_t rem = b, off = 0;
    for (int k = r - 1; k >= 0; --k) {
      idx[k] = rem % p.dims[k];
      rem /= p.dims[k];
      off += idx[k] * p.in_stride[k];
    }
    for (int64_t i = b; i < e; ++i) {
      bytes::copy_block(out + i * elem, in + off, elem);
      for (int k = r - 1; k >= 0; --k) {
        off += p.in_stride[k];
        if (++idx[k] < p.dims[k]) break;
        off -= idx[k] * p.in_stride[k];
        idx[k] = 0;
      }
    }
  });
}

void k_transpose(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  if (x.numel() == 0) return;
  const std::vector<int64_t>& perm = ctx.attrs.get_ints_or_empty("perm");  // empty: reverse the dims
  TransposePlan p(x.shape(), perm, static_cast<int64_t>(x.itemsize()));
  if (p.rank == 0) {
    parallel_memcpy(out_ptr(ctx.out[0]), in_ptr(x), x.nbytes());
    return;
  }
  if (!bytes::visit_size(p.elem, [&](auto u) { transpose_tiled<decltype(u)>(p, in_ptr(x), out_ptr(ctx.out[0])); }))
    transpose_generic(p, in_ptr(x), out_ptr(ctx.out[0]));
}

// ---- concat, stack, split ----------------------------------------------------------

// Copies pieces between one "joined" tensor (rows of `joined_row` bytes) and parts
// (rows of part_row[i] bytes, at byte offset part_off[i] within a joined row).
// to_joined: parts -> joined (concat), else joined -> parts (split).
void join_copy(char* joined, std::span<char* const> parts, const std::vector<int64_t>& part_row, int64_t outer,
               bool to_joined) {
  int64_t joined_row = 0;
  std::vector<int64_t> off(part_row.size());
  for (size_t i = 0; i < part_row.size(); ++i) {
    off[i] = joined_row;
    joined_row += part_row[i];
  }
  if (outer <= 0 || joined_row == 0) return;
  if (outer >= 4 * num_threads()) {
    // Many rows: one task handles whole joined rows.
    parallel_for(outer, grain_for(joined_row), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (size_t i = 0; i < parts.size(); ++i) {
          if (part_row[i] == 0) continue;  // empty part: nothing to copy (its pointer may be null)
          char* j = joined + r * joined_row + off[i];
          char* p = parts[i] + r * part_row[i];
          if (to_joined)
            std::memcpy(j, p, part_row[i]);
          else
            std::memcpy(p, j, part_row[i]);
        }
    });
    return;
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (to_joined)
      copy_rows(joined + off[i], joined_row, parts[i], part_row[i], outer, part_row[i]);
    else
      copy_rows(parts[i], part_row[i], joined + off[i], joined_row, outer, part_row[i]);
  }
}

using backends::outer_size;

// concat and stack: the output's rows before `axis` interleave whole input rows.
void k_concat(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  int axis = normalize_axis(ctx.attrs.get_int("axis"), out.rank());
  int64_t outer = outer_size(out.shape(), axis);
  if (outer == 0) return;
  std::vector<char*> parts;
  std::vector<int64_t> rows;
  for (const Tensor& t : ctx.in) {
    parts.push_back(const_cast<char*>(in_ptr(t)));
    rows.push_back(static_cast<int64_t>(t.nbytes()) / outer);
  }
  join_copy(out_ptr(out), parts, rows, outer, true);
}

void k_split(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  int axis = normalize_axis(ctx.attrs.get_int("axis"), x.rank());
  int64_t outer = outer_size(x.shape(), axis);
  if (outer == 0) return;
  std::vector<char*> parts;
  std::vector<int64_t> rows;
  for (const Tensor& t : ctx.out) {
    parts.push_back(out_ptr(t));
    rows.push_back(static_cast<int64_t>(t.nbytes()) / outer);
  }
  join_copy(const_cast<char*>(in_ptr(x)), parts, rows, outer, false);
}

// ---- index-map copy: strided_slice, pad, tile, broadcast_to ------------------------

// out[o_0, .., o_{r-1}] = in[map_0[o_0], .., map_{r-1}[o_{r-1}]], or the fill value
// where any map entry is -1.
struct IndexMap {
  Shape out;
  std::vector<int64_t> in_stride;          // bytes, per output dim (0 for new dims)
  std::vector<std::vector<int64_t>> map;   // per output dim
  int64_t itemsize = 0;
  std::vector<char> fill;                  // one element (pad constant), else empty
};

// A run of the innermost mapped dimension: out[o0 + t] = in[s0 + t*step] (or fill).
struct Segment {
  int64_t o0, len, s0, step;
  bool fill;
};

template <typename U>
void strided_elems(char* dst, const char* src, int64_t n, int64_t step) {
  U* d = reinterpret_cast<U*>(dst);
  const U* s = reinterpret_cast<const U*>(src);
  if (step == 0) {
    const U v = s[0];
    for (int64_t i = 0; i < n; ++i) d[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = s[i * step];
  }
}

void run_index_map(const IndexMap& m, const char* in, char* out) {
  const int r = m.out.rank();
  if (m.out.numel() == 0) return;
  // Merge the identity suffix (dims copied whole, in order) into a wide element.
  int k = r;
  int64_t elem = m.itemsize;
  while (k > 0) {
    const auto& mp = m.map[k - 1];
    const int64_t n = static_cast<int64_t>(mp.size());
    bool ident = true;
    for (int64_t o = 0; ident && o < n; ++o) ident = mp[o] == o;
    // A size-1 dim reads index 0 whatever its stride; others must continue the element.
    if (!ident || (n != 1 && m.in_stride[k - 1] != elem)) break;
    elem *= n;
    --k;
  }
  if (k == 0) {
    parallel_memcpy(out, in, elem);
    return;
  }
  // Fill bytes for one inner row.
  const int inner = k - 1;
  const int64_t n_inner = m.out[inner];
  const int64_t row_bytes = n_inner * elem;
  std::vector<char> fill_row;
  if (!m.fill.empty()) {
    fill_row.resize(static_cast<size_t>(row_bytes));
    bytes::fill_pattern(fill_row.data(), row_bytes / m.itemsize, m.fill.data(), m.itemsize);
  }
  // Segments of the inner dim.
  std::vector<Segment> segs;
  const auto& mi = m.map[inner];
  for (int64_t o = 0; o < n_inner;) {
    Segment s{o, 1, mi[o], 0, mi[o] < 0};
    if (!s.fill && o + 1 < n_inner && mi[o + 1] >= 0) {
      s.step = mi[o + 1] - mi[o];
      while (o + s.len < n_inner && mi[o + s.len] >= 0 && mi[o + s.len] - mi[o + s.len - 1] == s.step) ++s.len;
    } else if (s.fill) {
      while (o + s.len < n_inner && mi[o + s.len] < 0) ++s.len;
    }
    segs.push_back(s);
    o += s.len;
  }
  const int64_t stride_inner = m.in_stride[inner];
  // Copies inner positions [ob, oe) of one row whose input row starts at src (null: fill).
  auto copy_range = [&](char* dst, const char* src, int64_t ob, int64_t oe) {
    if (!src) {
      std::memcpy(dst + ob * elem, fill_row.data(), (oe - ob) * elem);
      return;
    }
    for (const Segment& s : segs) {
      int64_t a = std::max(ob, s.o0), b = std::min(oe, s.o0 + s.len);
      if (a >= b) continue;
      char* d = dst + a * elem;
      const int64_t n = b - a;
      if (s.fill) {
        std::memcpy(d, fill_row.data(), n * elem);
        continue;
      }
      const char* sp = src + (s.s0 + (a - s.o0) * s.step) * stride_inner;
      if (s.step == 1 && stride_inner == elem) {
        std::memcpy(d, sp, n * elem);
      } else if (stride_inner != elem ||
                 !bytes::visit_size(elem, [&](auto u) { strided_elems<decltype(u)>(d, sp, n, s.step); })) {
        for (int64_t t = 0; t < n; ++t) bytes::copy_block(d + t * elem, sp + t * s.step * stride_inner, elem);
      }
    }
  };
  int64_t rows = 1;
  for (int d = 0; d < inner; ++d) rows *= m.out[d];
  const int64_t chunks = rows >= 4 * num_threads() ? 1 : std::max<int64_t>(1, row_bytes / bytes::kCopyGrainBytes);
  const int64_t chunk_len = (n_inner + chunks - 1) / chunks;
  parallel_for(rows * chunks, std::max<int64_t>(1, grain_for(row_bytes) / chunks), [&](int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) {
      int64_t row = t / chunks, c = t % chunks;
      int64_t rem = row, off = 0;
      bool filled = false;
      for (int d = inner - 1; d >= 0; --d) {
        int64_t idx = rem % m.out[d];
        rem /= m.out[d];
        int64_t src_idx = m.map[d][idx];
        if (src_idx < 0) filled = true;
        off += src_idx * m.in_stride[d];
      }
      int64_t ob = c * chunk_len, oe = std::min(n_inner, ob + chunk_len);
      if (ob < oe) copy_range(out + row * row_bytes, filled ? nullptr : in + off, ob, oe);
    }
  });
}

std::vector<int64_t> byte_strides(const Shape& s, int64_t itemsize) {
  std::vector<int64_t> st(static_cast<size_t>(s.rank()));
  int64_t acc = itemsize;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

IndexMap base_map(OpContext& ctx) {
  IndexMap m;
  m.out = ctx.out[0].shape();
  m.itemsize = static_cast<int64_t>(ctx.in[0].itemsize());
  m.in_stride = byte_strides(ctx.in[0].shape(), m.itemsize);
  m.map.resize(static_cast<size_t>(m.out.rank()));
  return m;
}

void k_strided_slice(OpContext& ctx) {
  IndexMap m = base_map(ctx);
  const auto &begin = ctx.attrs.get_ints("begin"), &strides = ctx.attrs.get_ints("strides");
  for (int d = 0; d < m.out.rank(); ++d)
    for (int64_t o = 0; o < m.out[d]; ++o) m.map[d].push_back(begin[d] + o * strides[d]);
  run_index_map(m, in_ptr(ctx.in[0]), out_ptr(ctx.out[0]));
}

void k_pad(OpContext& ctx) {
  IndexMap m = base_map(ctx);
  const Shape& s = ctx.in[0].shape();
  const auto& p = ctx.attrs.get_ints("paddings");
  const std::string& mode = ctx.attrs.get_string("mode");
  for (int d = 0; d < m.out.rank(); ++d) {
    const int64_t n = s[d];
    for (int64_t o = 0; o < m.out[d]; ++o) {
      int64_t i = o - p[2 * d];
      if (i < 0 || i >= n) {
        if (mode == "constant")
          i = -1;
        else if (mode == "edge")
          i = i < 0 ? 0 : n - 1;
        else
          i = i < 0 ? -i : 2 * (n - 1) - i;
      }
      m.map[d].push_back(i);
    }
  }
  if (mode == "constant") {
    m.fill.resize(static_cast<size_t>(m.itemsize));
    double v = ctx.attrs.get_float("value", 0.0);
    convert_buffer(&v, DType::kF64, m.fill.data(), ctx.in[0].dtype(), 1);
  }
  run_index_map(m, in_ptr(ctx.in[0]), out_ptr(ctx.out[0]));
}

void k_tile(OpContext& ctx) {
  IndexMap m = base_map(ctx);
  const Shape& s = ctx.in[0].shape();
  for (int d = 0; d < m.out.rank(); ++d)
    for (int64_t o = 0; o < m.out[d]; ++o) m.map[d].push_back(o % s[d]);
  run_index_map(m, in_ptr(ctx.in[0]), out_ptr(ctx.out[0]));
}

void k_broadcast_to(OpContext& ctx) {
  IndexMap m = base_map(ctx);
  const Shape& s = ctx.in[0].shape();
  const int lead = m.out.rank() - s.rank();
  std::vector<int64_t> st = m.in_stride;
  m.in_stride.assign(static_cast<size_t>(m.out.rank()), 0);
  for (int d = 0; d < m.out.rank(); ++d) {
    const bool bcast = d < lead || s[d - lead] == 1;
    if (d >= lead) m.in_stride[d] = st[d - lead];
    for (int64_t o = 0; o < m.out[d]; ++o) m.map[d].push_back(bcast ? 0 : o);
  }
  run_index_map(m, in_ptr(ctx.in[0]), out_ptr(ctx.out[0]));
}

KILN_REGISTER_KERNEL("reshape", kCPU, KILN_ALL_DTYPES, k_reshape);
KILN_REGISTER_KERNEL("transpose", kCPU, KILN_ALL_DTYPES, k_transpose);
KILN_REGISTER_KERNEL("concat", kCPU, KILN_ALL_DTYPES, k_concat);
KILN_REGISTER_KERNEL("stack", kCPU, KILN_ALL_DTYPES, k_concat);
KILN_REGISTER_KERNEL("split", kCPU, KILN_ALL_DTYPES, k_split);
KILN_REGISTER_KERNEL("strided_slice", kCPU, KILN_ALL_DTYPES, k_strided_slice);
KILN_REGISTER_KERNEL("pad", kCPU, KILN_ALL_DTYPES, k_pad);
KILN_REGISTER_KERNEL("tile", kCPU, KILN_ALL_DTYPES, k_tile);
KILN_REGISTER_KERNEL("broadcast_to", kCPU, KILN_ALL_DTYPES, k_broadcast_to);

}  // namespace
}  // namespace kiln::cpu
