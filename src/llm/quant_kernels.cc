// Quantised kernels: AVX2 (baseline), AVX-512 VNNI and AMX (runtime-selected) integer
// group kernels over packed matrices and row kernels over the file's blocks (q4_0, q4_1, q5_0,
// q5_1, q8_0); an f32 row path for every other type.
#define KILN_LLM_ISA avx2
#include "llm/quant_kernels_impl.h"
#undef KILN_LLM_ISA

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/error.h"
#include "kiln/core/half.h"

namespace kiln::llm::kernels {
namespace avx512 {
RowsFn integer_kernel(GgmlType type);  // quant_kernels_avx512.cc
GroupsFn group_kernel(GgmlType type);
}  // namespace avx512
namespace amx {
GroupsFn group_kernel(GgmlType type);  // quant_kernels_amx.cc
}  // namespace amx
namespace {

using avx2::hsum;

// Any decodable type: each row decoded to f32, then dotted with the float activations.
void rows_f32(const QMatrix& w, const float* x, int64_t n, float* y, int64_t y_stride, int64_t r0, int64_t r1) {
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(w.cols));
  for (int64_t r = r0; r < r1; ++r) {
    dequantize_row(w.type, w.data + r * w.row_bytes, buf.data(), w.cols);
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * w.cols;
      __m256 acc = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 8 <= w.cols; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(buf.data() + i), _mm256_loadu_ps(xt + i), acc);
      float s = hsum(acc);
      for (; i < w.cols; ++i) s += buf[i] * xt[i];
      y[t * y_stride + r] = s;
    }
  }
}

// Chosen per call (an atomic load): tests and benchmarks switch levels with set_cpu_isa_cap.
RowsFn integer_kernel(GgmlType type) {
  return cpu_has(CpuIsa::kAvx512Vnni) ? avx512::integer_kernel(type) : avx2::integer_kernel(type);
}

// AMX from a full tile of 16 tokens on (bit-identical to the others, so the choice may
// follow the batch's size).
GroupsFn group_kernel(GgmlType type, int64_t n) {
  if (n >= kAmxMinTokens && cpu_has(CpuIsa::kAmx)) return amx::group_kernel(type);
  return cpu_has(CpuIsa::kAvx512Vnni) ? avx512::group_kernel(type) : avx2::group_kernel(type);
}

}  // namespace

void quantize_q8(const float* x, Q8Block* out, int64_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    float sum = 0.0f;
    for (int half = 0; half < 2; ++half) {
      const float* xh = x + 16 * half;
      const __m256 m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xh), abs_mask), _mm256_and_ps(_mm256_loadu_ps(xh + 8), abs_mask));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      const float d = _mm_cvtss_f32(h) / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      // Round to nearest even (as nearbyint), then narrow 16 int32 to int8 (|q| <= 127).
      const __m256 vid = _mm256_set1_ps(id);
      const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xh), vid));
      const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xh + 8), vid));
      const __m256i q16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);  // 16 x int16 in order
      const __m128i q8 = _mm_packs_epi16(_mm256_castsi256_si128(q16), _mm256_extracti128_si256(q16, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].q + 16 * half), q8);
      __m256i s32 = _mm256_add_epi32(q0, q1);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      const int isum = _mm_cvtsi128_si32(s4);
      for (int k = 0; k < 4; ++k) out[b].d[4 * half + k] = d;
      out[b].isum[half] = isum;
      sum += d * static_cast<float>(isum);
    }
    out[b].s = sum;
  }
}

void matmul_rows(const QMatrix& w, const Q8Block* xq, const float* x, int64_t n, float* y, int64_t y_stride,
                 int64_t r0, int64_t r1) {
  if (RowsFn fn = integer_kernel(w.type); fn != nullptr && xq != nullptr) {
    fn(w, xq, n, y, y_stride, r0, r1);
    return;
  }
  rows_f32(w, x, n, y, y_stride, r0, r1);
}

void matmul_groups(const PackedMatrix& w, const Q8Block* xq, int64_t n, float* y, int64_t y_stride, int64_t g0, int64_t g1) {
  group_kernel(w.type(), n)(w, xq, n, y, y_stride, g0, g1);
}

bool has_integer_kernel(GgmlType type) { return integer_kernel(type) != nullptr; }

const char* kernel_isa() {
  if (cpu_has(CpuIsa::kAmx)) return "amx from 16 tokens, else avx512_vnni";
  return cpu_has(CpuIsa::kAvx512Vnni) ? "avx512_vnni" : "avx2";
}

}  // namespace kiln::llm::kernels
