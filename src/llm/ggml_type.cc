// ggml's type table and the scalar dequantisers (block layouts: docs/formats/gguf.md).
#include "kiln/llm/ggml_type.h"

#include <cstring>

#include "kiln/core/error.h"
#include "kiln/core/half.h"

namespace kiln::llm {
namespace {

constexpr int kQK = 32;     // weights per block of the 32-blocks (q4_0 ... q8_1)
constexpr int kQK_K = 256;  // weights per super-block of the K types

struct Entry {
  uint32_t id;
  GgmlTypeInfo info;
};
constexpr Entry kTypes[] = {
    {0, {"f32", 1, 4, true}},         {1, {"f16", 1, 2, true}},
    {2, {"q4_0", kQK, 18, true}},     {3, {"q4_1", kQK, 20, true}},
    {6, {"q5_0", kQK, 22, true}},     {7, {"q5_1", kQK, 24, true}},
    {8, {"q8_0", kQK, 34, true}},     {9, {"q8_1", kQK, 36, false}},
    {10, {"q2_K", kQK_K, 84, false}}, {11, {"q3_K", kQK_K, 110, false}},
    {12, {"q4_K", kQK_K, 144, true}}, {13, {"q5_K", kQK_K, 176, true}},
    {14, {"q6_K", kQK_K, 210, true}}, {15, {"q8_K", kQK_K, 292, false}},
    {16, {"iq2_xxs", kQK_K, 66, false}}, {17, {"iq2_xs", kQK_K, 74, false}},
    {18, {"iq3_xxs", kQK_K, 98, false}}, {19, {"iq1_s", kQK_K, 50, false}},
    {20, {"iq4_nl", kQK, 18, false}},    {21, {"iq3_s", kQK_K, 110, false}},
    {22, {"iq2_s", kQK_K, 82, false}},   {23, {"iq4_xs", kQK_K, 136, false}},
    {24, {"i8", 1, 1, false}},        {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},       {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},       {29, {"iq1_m", kQK_K, 56, false}},
    {30, {"bf16", 1, 2, true}},       {34, {"tq1_0", kQK_K, 54, false}},
    {35, {"tq2_0", kQK_K, 66, false}}, {39, {"mxfp4", kQK, 17, false}},
    {40, {"nvfp4", 64, 36, false}},      {41, {"q1_0", 128, 18, false}},
};

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half::to_float(h);
}

// Scale and min j (0..7) of a q4_K/q5_K super-block: 6 bits each, packed in 12 bytes.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void dq_q4_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += kQK) {
    const float d = f16(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void dq_q4_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 20, y += kQK) {
    const float d = f16(b), m = f16(b + 2);
    const uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
      y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

// q5_0 / q5_1: the fifth bits of the 32 weights in a little-endian u32 (weight j: bit j).
template <bool kMin>
void dq_q5(const uint8_t* b, float* y, int64_t nb) {
  constexpr size_t kBytes = kMin ? 24 : 22;
  for (int64_t i = 0; i < nb; ++i, b += kBytes, y += kQK) {
    const float d = f16(b);
    const float m = kMin ? f16(b + 2) : 0.0f;
    const uint8_t* p = b + (kMin ? 4 : 2);
    uint32_t qh;
    std::memcpy(&qh, p, 4);
    const uint8_t* qs = p + 4;
    for (int j = 0; j < 16; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      const int x0 = (qs[j] & 0xF) | h0;
      const int x1 = (qs[j] >> 4) | h1;
      if constexpr (kMin) {
        y[j] = static_cast<float>(x0) * d + m;
        y[j + 16] = static_cast<float>(x1) * d + m;
      } else {
        y[j] = static_cast<float>(x0 - 16) * d;
        y[j + 16] = static_cast<float>(x1 - 16) * d;
      }
    }
  }
}

void dq_q8_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 34, y += kQK) {
    const float d = f16(b);
    const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

void dq_q4_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 144) {
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    for (int j = 0, is = 0; j < kQK_K; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      scale_min_k4(is, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dq_q5_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 176) {
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQK_K; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      scale_min_k4(is, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

void dq_q6_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 210) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16(b + 208);
    for (int n = 0; n < kQK_K; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is] * q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2] * q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4] * q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6] * q4);
      }
    }
  }
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const Entry& e : kTypes)
    if (e.id == id) return &e.info;
  return nullptr;
}

std::string ggml_type_name(uint32_t id) {
  const GgmlTypeInfo* info = ggml_type_info(id);
  return info ? info->name : "type " + std::to_string(id);
}

size_t ggml_row_bytes(GgmlType type, int64_t elements) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(type));
  if (info == nullptr) throw InvalidArgumentError("ggml_row_bytes: " + ggml_type_name(static_cast<uint32_t>(type)) + " is not a ggml type");
  if (elements < 0 || elements % info->block_elements != 0)
    throw InvalidArgumentError(detail::str_cat("ggml_row_bytes: ", elements, " ", info->name, " weights are not whole blocks of ",
                                               info->block_elements));
  return static_cast<size_t>(elements / info->block_elements) * info->block_bytes;
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const uint32_t id = static_cast<uint32_t>(type);
  const GgmlTypeInfo* info = ggml_type_info(id);
  if (info == nullptr || !info->dequantizable)
    throw UnimplementedError("kiln cannot decode ggml tensor type " + ggml_type_name(id) +
                             " (it decodes f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K)");
  if (n < 0 || n % info->block_elements != 0)
    throw InvalidArgumentError(detail::str_cat("dequantize_row: ", n, " ", info->name, " weights are not whole blocks of ",
                                               info->block_elements));
  if (n == 0) return;  // src and dst may be null for an empty tensor
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t nb = n / info->block_elements;
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case GgmlType::kF16: convert_half_to_float(static_cast<const half*>(src), dst, static_cast<size_t>(n)); return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        dst[i] = bfloat16::to_float(h);
      }
      return;
    case GgmlType::kQ4_0: dq_q4_0(b, dst, nb); return;
    case GgmlType::kQ4_1: dq_q4_1(b, dst, nb); return;
    case GgmlType::kQ5_0: dq_q5<false>(b, dst, nb); return;
    case GgmlType::kQ5_1: dq_q5<true>(b, dst, nb); return;
    case GgmlType::kQ8_0: dq_q8_0(b, dst, nb); return;
    case GgmlType::kQ4_K: dq_q4_K(b, dst, nb); return;
    case GgmlType::kQ5_K: dq_q5_K(b, dst, nb); return;
    case GgmlType::kQ6_K: dq_q6_K(b, dst, nb); return;
    default: break;
  }
  throw InternalError("dequantize_row: " + ggml_type_name(id) + " is marked decodable but has no decoder");
}

}  // namespace kiln::llm
