// Small-M GEMM against a packed constant B (small_gemm.h): 64-column panels,
// row groups of 4/2/1 with 8 AVX accumulators each.
#include "small_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kiln/core/flags.h"
#include "kiln/core/parallel.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KILN_SMALL_GEMM_AVX2 1
#endif

namespace kiln::cpu::small_gemm {
namespace {

constexpr int64_t kPanel = 64;                // columns of B per panel
constexpr int64_t kMinMacsPerThread = 32768;  // below this a second thread costs more than it gains
constexpr int64_t kTinyB = 4096;              // floats (16 KiB): a B that stays in L1

bool enabled() { return kernel_preferences().small_gemm; }

#ifdef KILN_SMALL_GEMM_AVX2
// c[r, 0:ncols] = relu?(a[r, :] @ w[:, 0:S] + bias) for r < R; w's rows are
// kPanel apart (a panel, offset to the block's first column); ncols <= S, bias
// may be null.
template <int R, int S>
void block(const float* a, int64_t K, const float* w, const float* bias, bool relu, float* c, int64_t ldc,
           int64_t ncols) {
  constexpr int V = S / 8;
  static_assert(R <= 4 && V <= 8 && R * V <= 8);
  // Named accumulators (an array of them, indexed in the k loop, GCC 12 spills to the
  // stack on every k); the unused ones are dead code.
  const __m256 z = _mm256_setzero_ps();
  __m256 a00 = z, a01 = z, a02 = z, a03 = z, a04 = z, a05 = z, a06 = z, a07 = z;
  __m256 a10 = z, a11 = z, a12 = z, a13 = z, a14 = z, a15 = z, a16 = z, a17 = z;
  __m256 a20 = z, a21 = z, a22 = z, a23 = z, a24 = z, a25 = z, a26 = z, a27 = z;
  __m256 a30 = z, a31 = z, a32 = z, a33 = z, a34 = z, a35 = z, a36 = z, a37 = z;
#pragma GCC unroll 4
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = w + k * kPanel;
    auto load = [&](int v) { return v < V ? _mm256_loadu_ps(wk + 8 * v) : z; };
    const __m256 w0 = load(0), w1 = load(1), w2 = load(2), w3 = load(3), w4 = load(4), w5 = load(5), w6 = load(6),
                 w7 = load(7);
#define KILN_FMA(r, v) \
  if constexpr (V > v) a##r##v = _mm256_fmadd_ps(x, w##v, a##r##v);
#define KILN_ROW(r)                                                                                          \
  if constexpr (R > r) {                                                                                     \
    const __m256 x = _mm256_broadcast_ss(a + r * K + k);                                                     \
    KILN_FMA(r, 0)                                                                                           \
    KILN_FMA(r, 1) KILN_FMA(r, 2) KILN_FMA(r, 3) KILN_FMA(r, 4) KILN_FMA(r, 5) KILN_FMA(r, 6) KILN_FMA(r, 7) \
  }
    KILN_ROW(0) KILN_ROW(1) KILN_ROW(2) KILN_ROW(3)
#undef KILN_ROW
#undef KILN_FMA
  }
  const __m256 acc[4][8] = {{a00, a01, a02, a03, a04, a05, a06, a07},
                            {a10, a11, a12, a13, a14, a15, a16, a17},
                            {a20, a21, a22, a23, a24, a25, a26, a27},
                            {a30, a31, a32, a33, a34, a35, a36, a37}};
  if (ncols == S) {
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) {
        __m256 o = acc[r][v];
        if (bias) o = _mm256_add_ps(o, _mm256_loadu_ps(bias + 8 * v));
        if (relu) o = _mm256_max_ps(z, o);  // NaN stays NaN
        _mm256_storeu_ps(c + r * ldc + 8 * v, o);
      }
    return;
  }
  alignas(32) float tmp[R * S];  // the last panel's partial block: bias and c end at ncols
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm256_store_ps(tmp + r * S + 8 * v, acc[r][v]);
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < ncols; ++j) {
      float o = tmp[r * S + j] + (bias ? bias[j] : 0.0f);
      c[r * ldc + j] = relu ? std::max(o, 0.0f) : o;
    }
}

// R rows of c over one panel's `ncols` columns, S at a time (16 for a partial
// panel).
template <int R, int S>
void panel_rows(const float* a, int64_t K, const float* panel, const float* bias, bool relu, float* c, int64_t ldc,
                int64_t ncols) {
  const bool partial = ncols < kPanel;
  constexpr int SP = 16;
  for (int64_t j = 0; j < ncols; j += partial ? SP : S) {
    const float* b = bias ? bias + j : nullptr;
    if (partial)
      block<R, SP>(a, K, panel + j, b, relu, c + j, ldc, std::min<int64_t>(SP, ncols - j));
    else
      block<R, S>(a, K, panel + j, b, relu, c + j, ldc, S);
  }
}
#endif

}  // namespace

bool supports(int64_t M, int64_t K, int64_t N) {
#ifdef KILN_SMALL_GEMM_AVX2
  if (M < 1 || K < 1 || N < 1 || !enabled()) return false;
  // Any number of rows against a B that fits in L1 (a classifier's last layer, 128x10):
  // there oneDNN's call overhead is most of the time.
  return M <= 3 || (M <= 8 && K * N <= (int64_t{1} << 18)) || K * N <= kTinyB;
#else
  (void)M, (void)K, (void)N;
  return false;
#endif
}

size_t packed_size(int64_t K, int64_t N) { return static_cast<size_t>((N + kPanel - 1) / kPanel * K * kPanel); }

void pack(const float* b, int64_t K, int64_t N, bool trans_b, float* packed) {
  const int64_t panels = (N + kPanel - 1) / kPanel;
  std::memset(packed, 0, packed_size(K, N) * sizeof(float));
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
    float* dst = packed + p * K * kPanel;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < cols; ++j) dst[k * kPanel + j] = trans_b ? b[(n0 + j) * K + k] : b[k * N + n0 + j];
  }
}

void run(const float* a, int64_t M, int64_t K, int64_t N, const float* packed, const float* bias, bool relu, float* c) {
#ifdef KILN_SMALL_GEMM_AVX2
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const int64_t useful_threads = std::max<int64_t>(1, M * K * N / kMinMacsPerThread);
  // Rows [r0, r1) x panel p, in groups of 4, 2, 1.
  auto rows_of_panel = [&](int64_t p, int64_t r0, int64_t r1) {
    const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
    const float* panel = packed + p * K * kPanel;
    const float* b = bias ? bias + n0 : nullptr;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) panel_rows<4, 16>(a + r * K, K, panel, b, relu, c + r * N + n0, N, cols);
    for (; r + 2 <= r1; r += 2) panel_rows<2, 32>(a + r * K, K, panel, b, relu, c + r * N + n0, N, cols);
    for (; r < r1; ++r) panel_rows<1, 64>(a + r * K, K, panel, b, relu, c + r * N + n0, N, cols);
  };
  if (M <= 8 || panels >= num_threads()) {  // by panels: each thread's share of B stays in its L2
    parallel_for(panels, std::max<int64_t>(1, panels / useful_threads), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) rows_of_panel(p, 0, M);
    });
    return;
  }
  // Many rows against a tiny B: by groups of 4 rows.
  const int64_t groups = (M + 3) / 4;
  parallel_for(groups, std::max<int64_t>(1, groups / useful_threads), [&](int64_t lo, int64_t hi) {
    for (int64_t p = 0; p < panels; ++p) rows_of_panel(p, 4 * lo, std::min(M, 4 * hi));
  });
#else
  (void)a, (void)M, (void)K, (void)N, (void)packed, (void)bias, (void)relu, (void)c;
  std::abort();  // supports() is false without AVX2
#endif
}

}  // namespace kiln::cpu::small_gemm
