// CPU kernels for reductions: sum, mean, prod, max, min, all, any, var, std,
// logsumexp (policies run by reduce_util.h's engine) and argmax/argmin.
// f16/bf16 run through the f32 kernels (via_f32), except sum and mean, which read them.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "../common/reduction_plan.h"
#include "kernel_util.h"
#include "reduce_util.h"
#include "vecmath.h"
#include "kiln/core/kernel.h"

namespace kiln::cpu {

// ---- view preparation --------------------------------------------------------------

namespace {
// Copies a row-major array of dims[0..rank) into `dst` with its dims reordered as
// perm (dst dim k = src dim perm[k]); perm[rank-1] == rank-1, so rows move whole.
void permute_copy(const char* src, char* dst, size_t es, const int64_t* dims, const int* perm, int rank) {
  int64_t sstride[Shape::kMaxRank];
  int64_t acc = 1;
  for (int i = rank - 1; i >= 0; --i) {
    sstride[i] = acc;
    acc *= dims[i];
  }
  const int64_t run = dims[rank - 1];
  const int64_t rows = acc / run;
  const size_t run_bytes = static_cast<size_t>(run) * es;
  parallel_for(rows, std::max<int64_t>(1, kTaskElems / run), [&](int64_t b, int64_t e) {
    int64_t idx[Shape::kMaxRank] = {};
    int64_t rem = b;
    for (int k = rank - 2; k >= 0; --k) {
      idx[k] = rem % dims[perm[k]];
      rem /= dims[perm[k]];
    }
    for (int64_t r = b; r < e; ++r) {
      int64_t off = 0;
      for (int k = 0; k < rank - 1; ++k) off += idx[k] * sstride[perm[k]];
      std::memcpy(dst + r * run_bytes, src + off * static_cast<int64_t>(es), run_bytes);
      for (int k = rank - 2; k >= 0; --k) {
        if (++idx[k] < dims[perm[k]]) break;
        idx[k] = 0;
      }
    }
  });
}
}  // namespace

ReductionView prepare_reduction(const Tensor& x, const backends::ReductionAxes& axes) {
  const backends::ReductionPlan p = backends::plan_reduction(x.shape(), axes);
  ReductionView v;
  v.data = x.raw_data();
  v.outer = p.outer;
  v.reduced = p.reduced;
  v.inner = p.inner;
  if (p.permute) {  // reduced dims form several blocks: gather them next to each other
    v.holder = Tensor::empty(x.shape(), x.dtype());
    permute_copy(static_cast<const char*>(x.raw_data()), static_cast<char*>(v.holder.raw_data()), x.itemsize(),
                 p.dims, p.perm, p.n);
    v.data = v.holder.raw_data();
  }
  return v;
}

namespace {

// ---- policies ----------------------------------------------------------------------
// Floating sums, means, products and variances accumulate in f64 lanes (f32 inputs
// too: the loops are memory-bound, so the wider lanes cost nothing measurable and the
// result is the correctly rounded sum for all practical sizes). Integer sums and
// products use uint64 lanes: they wrap modulo 2^64 like two's complement int64.
// f16/bf16 sums and means read their 16-bit inputs straight into those lanes (a conv
// bias gradient sums a whole bf16 activation gradient: no widened copy of it) and round
// the f64 total to f32, then to 16 bits, as the widened kernel did.

template <typename T>
inline constexpr bool kIsFloat = std::is_floating_point_v<T> || kIs16<T>;

template <typename T>
using WideAcc = std::conditional_t<kIsFloat<T>, double, uint64_t>;

template <typename T, typename OutT>
struct SumP {
  using In = T;
  using Out = OutT;
  using A = WideAcc<T>;
  using Tot = A;
  using C = A;
  static constexpr bool kCentered = false;
  A identity() const { return A(0); }
  A load(T x, C) const { return static_cast<A>(x); }
  A combine(A a, A b) const { return a + b; }
  Tot tot_identity() const { return Tot(0); }
  Tot flush(Tot t, A a) const { return t + a; }
  Tot tot_combine(Tot a, Tot b) const { return a + b; }
  static double as_double(Tot t) {
    if constexpr (kIsFloat<T>) return t;
    else return static_cast<double>(static_cast<int64_t>(t));
  }
  Out finalize(Tot t, int64_t, C) const {
    if constexpr (kIs16<Out>) return Out(static_cast<float>(t));
    else if constexpr (kIsFloat<T>) return static_cast<Out>(t);
    else return static_cast<Out>(static_cast<int64_t>(t));
  }
};

template <typename T, typename OutT>
struct MeanP : SumP<T, OutT> {
  using typename SumP<T, OutT>::Tot;
  using typename SumP<T, OutT>::C;
  OutT finalize(Tot t, int64_t n, C) const {
    if constexpr (kIs16<OutT>) return OutT(static_cast<float>(SumP<T, OutT>::as_double(t) / n));
    else return static_cast<OutT>(SumP<T, OutT>::as_double(t) / n);
  }
};

template <typename T, typename OutT>
struct ProdP : SumP<T, OutT> {
  using typename SumP<T, OutT>::A;
  using typename SumP<T, OutT>::Tot;
  A identity() const { return A(1); }
  A combine(A a, A b) const { return a * b; }
  Tot tot_identity() const { return Tot(1); }
  Tot flush(Tot t, A a) const { return t * a; }
  Tot tot_combine(Tot a, Tot b) const { return a * b; }
};

// max (Max = true) or min; NaN propagates.
template <typename T, bool Max>
struct ExtremeP {
  using In = T;
  using Out = T;
  using A = T;
  using Tot = T;
  using C = T;
  static constexpr bool kCentered = false;
  A identity() const {
    if constexpr (kIsFloat<T>) return Max ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
    else return Max ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
  }
  A load(T x, C) const { return x; }
  A combine(A a, A b) const {
    if constexpr (Max) return (a > b || a != a) ? a : b;
    else return (a < b || a != a) ? a : b;
  }
  Tot tot_identity() const { return identity(); }
  Tot flush(Tot t, A a) const { return combine(t, a); }
  Tot tot_combine(Tot a, Tot b) const { return combine(a, b); }
  Out finalize(Tot t, int64_t, C) const { return t; }
};

// all (And = true) or any.
template <typename T, bool And>
struct LogicalP {
  using In = T;
  using Out = bool;
  using A = uint8_t;
  using Tot = uint8_t;
  using C = uint8_t;
  static constexpr bool kCentered = false;
  A identity() const { return And ? 1 : 0; }
  A load(T x, C) const { return x != T(0); }
  A combine(A a, A b) const { return And ? (a & b) : (a | b); }
  Tot tot_identity() const { return identity(); }
  Tot flush(Tot t, A a) const { return combine(t, a); }
  Tot tot_combine(Tot a, Tot b) const { return combine(a, b); }
  Out finalize(Tot t, int64_t, C) const { return t != 0; }
};

// sum((x - center)^2) / max(n - ddof, 0), optionally square-rooted (std).
template <typename T>
struct SqDevP {
  using In = T;
  using Out = T;
  using A = double;
  using Tot = double;
  using C = double;
  static constexpr bool kCentered = true;
  int64_t ddof = 0;
  bool root = false;
  A identity() const { return 0; }
  A load(T x, C c) const {
    const double d = static_cast<double>(x) - c;
    return d * d;
  }
  A combine(A a, A b) const { return a + b; }
  Tot tot_identity() const { return 0; }
  Tot flush(Tot t, A a) const { return t + a; }
  Tot tot_combine(Tot a, Tot b) const { return a + b; }
  Out finalize(Tot t, int64_t n, C) const {
    const double v = t / static_cast<double>(std::max<int64_t>(n - ddof, 0));
    return static_cast<Out>(root ? std::sqrt(v) : v);
  }
};

// center + log(sum(exp(x - center))): exp in the input precision, the sum in f64.
template <typename T>
struct ExpShiftP {
  using In = T;
  using Out = T;
  using A = double;
  using Tot = double;
  using C = T;
  static constexpr bool kCentered = true;
  A identity() const { return 0; }
  A load(T x, C c) const { return static_cast<double>(vm::exp(x - c)); }
  A combine(A a, A b) const { return a + b; }
  Tot tot_identity() const { return 0; }
  Tot flush(Tot t, A a) const { return t + a; }
  Tot tot_combine(Tot a, Tot b) const { return a + b; }
  Out finalize(Tot t, int64_t, C c) const { return static_cast<Out>(std::log(t) + static_cast<double>(c)); }
};

// ---- kernels -----------------------------------------------------------------------

template <class P>
void run_policy(OpContext& ctx, const P& p) {
  const Tensor& x = ctx.in[0];
  ReductionView v = prepare_reduction(x, backends::reduction_axes(ctx.attrs, x.rank()));
  reduce_run(p, static_cast<const typename P::In*>(v.data), ctx.out[0].data<typename P::Out>(), v.outer, v.reduced,
             v.inner);
}

template <typename T, typename OutT>
void k_sum(OpContext& ctx) { run_policy(ctx, SumP<T, OutT>{}); }
template <typename T, typename OutT>
void k_mean(OpContext& ctx) { run_policy(ctx, MeanP<T, OutT>{}); }
template <typename T, typename OutT>
void k_prod(OpContext& ctx) { run_policy(ctx, ProdP<T, OutT>{}); }
template <typename T>
void k_max(OpContext& ctx) { run_policy(ctx, ExtremeP<T, true>{}); }
template <typename T>
void k_min(OpContext& ctx) { run_policy(ctx, ExtremeP<T, false>{}); }
template <typename T>
void k_all(OpContext& ctx) { run_policy(ctx, LogicalP<T, true>{}); }
template <typename T>
void k_any(OpContext& ctx) { run_policy(ctx, LogicalP<T, false>{}); }

// Two-pass reductions: a first pass computes one center per output (the mean for
// var/std, the max for logsumexp), the second accumulates around it.
template <typename T, bool Root>
void k_var(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  ReductionView v = prepare_reduction(x, backends::reduction_axes(ctx.attrs, x.rank()));
  const T* data = static_cast<const T*>(v.data);
  std::vector<double> center(static_cast<size_t>(v.outer * v.inner));
  if (v.reduced > 0) reduce_run(MeanP<T, double>{}, data, center.data(), v.outer, v.reduced, v.inner);
  SqDevP<T> p;
  p.ddof = ctx.attrs.get_int("ddof", 0);
  p.root = Root;  // std: the square root of var
  reduce_run(p, data, ctx.out[0].data<T>(), v.outer, v.reduced, v.inner, center.data());
}

template <typename T>
void k_var_only(OpContext& ctx) {
  k_var<T, false>(ctx);
}
template <typename T>
void k_std(OpContext& ctx) {
  k_var<T, true>(ctx);
}

template <typename T>
void k_logsumexp(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  ReductionView v = prepare_reduction(x, backends::reduction_axes(ctx.attrs, x.rank()));
  const T* data = static_cast<const T*>(v.data);
  std::vector<T> center(static_cast<size_t>(v.outer * v.inner), T(0));
  if (v.reduced > 0) {
    reduce_run(ExtremeP<T, true>{}, data, center.data(), v.outer, v.reduced, v.inner);
    for (T& c : center)
      if (!std::isfinite(c)) c = T(0);  // all -inf, some +inf, or NaN: the sum gets it right unshifted
  }
  reduce_run(ExpShiftP<T>{}, data, ctx.out[0].data<T>(), v.outer, v.reduced, v.inner, center.data());
}

// ---- argmax / argmin ---------------------------------------------------------------

// True when a should replace the current best b (strictly better, so ties keep the
// first; NaN beats everything but an earlier NaN).
template <typename T, bool Max>
inline bool arg_better(T a, T b) {
  if constexpr (kIsFloat<T>) return (Max ? a > b : a < b) || (a != a && b == b);
  else return Max ? a > b : a < b;
}

template <typename T>
struct ArgBest {
  T val;
  int64_t idx;
};

// First index of the extreme of x[0, n), n >= 1: the extreme by vector lanes, then a
// blocked search for its first occurrence.
template <typename T, bool Max>
ArgBest<T> arg_contig(const T* x, int64_t n) {
  const T m = reduce_contig(ExtremeP<T, Max>{}, x, n, T{});
  const bool nan = m != m;
  constexpr int64_t kSpan = 64;
  for (int64_t b = 0; b < n; b += kSpan) {
    const int64_t e = std::min(n, b + kSpan);
    int hit = 0;
    if (nan) {
#pragma omp simd reduction(| : hit)
      for (int64_t i = b; i < e; ++i) hit |= (x[i] != x[i]);
    } else {
#pragma omp simd reduction(| : hit)
      for (int64_t i = b; i < e; ++i) hit |= (x[i] == m);
    }
    if (hit)
      for (int64_t i = b; i < e; ++i)
        if (nan ? x[i] != x[i] : x[i] == m) return {m, i};
  }
  return {m, 0};  // unreachable: m occurs in x
}

// Columns: best[i]/idx[i] over rows [r0, r1) of x (rows `stride` apart), w columns.
template <typename T, bool Max>
void arg_columns(const T* x, int64_t stride, int64_t r0, int64_t r1, int64_t w, T* best, int64_t* idx) {
  for (int64_t i = 0; i < w; ++i) {
    best[i] = x[r0 * stride + i];
    idx[i] = r0;
  }
  for (int64_t r = r0 + 1; r < r1; ++r) {
    const T* row = x + r * stride;
#pragma omp simd
    for (int64_t i = 0; i < w; ++i) {
      const bool u = arg_better<T, Max>(row[i], best[i]);
      best[i] = u ? row[i] : best[i];
      idx[i] = u ? r : idx[i];
    }
  }
}

template <typename T, bool Max>
void k_arg(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  const int axis = normalize_axis(ctx.attrs.get_int("axis"), x.rank(), "axis");
  int64_t O = 1, I = 1;
  for (int i = 0; i < axis; ++i) O *= x.dim(i);
  for (int i = axis + 1; i < x.rank(); ++i) I *= x.dim(i);
  const int64_t R = x.dim(axis), nout = O * I;
  if (nout == 0) return;  // R >= 1: the op rejects empty axes
  const T* data = x.data<T>();
  int64_t* out = ctx.out[0].data<int64_t>();
  auto merge = [](ArgBest<T>& cur, const ArgBest<T>& next) {
    if (arg_better<T, Max>(next.val, cur.val)) cur = next;
  };
  if (I == 1) {
    const int64_t C = (R + kRowChunk - 1) / kRowChunk;
    if (C == 1) {
      parallel_for(O, std::max<int64_t>(1, kTaskElems / R), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) out[o] = arg_contig<T, Max>(data + o * R, R).idx;
      });
      return;
    }
    std::unique_ptr<ArgBest<T>[]> part(new ArgBest<T>[static_cast<size_t>(O * C)]);
    parallel_for(O * C, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t o = t / C, s = (t % C) * kRowChunk;
        part[t] = arg_contig<T, Max>(data + o * R + s, std::min(kRowChunk, R - s));
        part[t].idx += s;
      }
    });
    for (int64_t o = 0; o < O; ++o) {
      ArgBest<T> cur = part[o * C];
      for (int64_t k = 1; k < C; ++k) merge(cur, part[o * C + k]);
      out[o] = cur.idx;
    }
    return;
  }
  const int64_t w = std::min(I, kTile), T_ = (I + w - 1) / w;
  const int64_t Rc = std::max<int64_t>(64, kTaskElems / w);
  const int64_t C = (R + Rc - 1) / Rc;
  std::unique_ptr<T[]> pv(new T[static_cast<size_t>(C * nout)]);
  std::unique_ptr<int64_t[]> pi(new int64_t[static_cast<size_t>(C * nout)]);
  parallel_for(C * O * T_, C == 1 ? std::max<int64_t>(1, kTaskElems / (R * w)) : 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t k = t / (O * T_), o = (t / T_) % O, tt = t % T_;
      const int64_t i0 = tt * w, wn = std::min(w, I - i0), j = k * nout + o * I + i0;
      arg_columns<T, Max>(data + o * R * I + i0, I, k * Rc, std::min(R, (k + 1) * Rc), wn, pv.get() + j,
                          pi.get() + j);
    }
  });
  for (int64_t j = 0; j < nout; ++j) {
    ArgBest<T> cur{pv[j], pi[j]};
    for (int64_t k = 1; k < C; ++k) merge(cur, {pv[k * nout + j], pi[k * nout + j]});
    out[j] = cur.idx;
  }
}
template <typename T>
void k_argmax(OpContext& ctx) { k_arg<T, true>(ctx); }
template <typename T>
void k_argmin(OpContext& ctx) { k_arg<T, false>(ctx); }

// ---- registration ------------------------------------------------------------------

#define KILN_HALFS (std::initializer_list<DType>{DType::kF16, DType::kBF16})

// Kernels over every non-16-bit dtype with the output type chosen per input type.
#define KILN_REG_REDUCE_INTS(op, K, OUT_INT)                     \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kBool, (K<bool, OUT_INT>));  \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kU8, (K<uint8_t, OUT_INT>)); \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI8, (K<int8_t, OUT_INT>));  \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI32, (K<int32_t, OUT_INT>)); \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI64, (K<int64_t, OUT_INT>))
#define KILN_REG_REDUCE_FLOATS2(op, K)                                \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF32, (K<float, float>));     \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF64, (K<double, double>));   \
  KILN_REGISTER_KERNEL(op, kCPU, KILN_HALFS, (via_f32<K<float, float>>))
#define KILN_REG_REDUCE_FLOATS(op, K)                     \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF32, K<float>);  \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF64, K<double>); \
  KILN_REGISTER_KERNEL(op, kCPU, KILN_HALFS, via_f32<K<float>>)
#define KILN_REG_REDUCE_ALL(op, K)                          \
  KILN_REG_REDUCE_FLOATS(op, K);                            \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kBool, K<bool>);    \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kU8, K<uint8_t>);   \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI8, K<int8_t>);    \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI32, K<int32_t>);  \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI64, K<int64_t>)

KILN_REG_REDUCE_INTS("sum", k_sum, int64_t);
KILN_REGISTER_KERNEL("sum", kCPU, DType::kF32, (k_sum<float, float>));
KILN_REGISTER_KERNEL("sum", kCPU, DType::kF64, (k_sum<double, double>));
KILN_REGISTER_KERNEL("sum", kCPU, DType::kF16, (k_sum<half, half>));
KILN_REGISTER_KERNEL("sum", kCPU, DType::kBF16, (k_sum<bfloat16, bfloat16>));
KILN_REG_REDUCE_INTS("prod", k_prod, int64_t);
KILN_REG_REDUCE_FLOATS2("prod", k_prod);
KILN_REG_REDUCE_INTS("mean", k_mean, float);
KILN_REGISTER_KERNEL("mean", kCPU, DType::kF32, (k_mean<float, float>));
KILN_REGISTER_KERNEL("mean", kCPU, DType::kF64, (k_mean<double, double>));
KILN_REGISTER_KERNEL("mean", kCPU, DType::kF16, (k_mean<half, half>));
KILN_REGISTER_KERNEL("mean", kCPU, DType::kBF16, (k_mean<bfloat16, bfloat16>));
KILN_REG_REDUCE_ALL("max", k_max);
KILN_REG_REDUCE_ALL("min", k_min);
KILN_REG_REDUCE_ALL("all", k_all);
KILN_REG_REDUCE_ALL("any", k_any);
KILN_REG_REDUCE_ALL("argmax", k_argmax);
KILN_REG_REDUCE_ALL("argmin", k_argmin);
KILN_REG_REDUCE_FLOATS("var", k_var_only);
KILN_REG_REDUCE_FLOATS("std", k_std);
KILN_REG_REDUCE_FLOATS("logsumexp", k_logsumexp);

}  // namespace
}  // namespace kiln::cpu
