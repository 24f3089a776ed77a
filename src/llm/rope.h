#pragma once
// Rotary embedding angles, shared by the CPU kernels' forward (model.cc) and the tensor
// path (tensor_forward.cc) so that both rotate by the same floats.
#include <cmath>
#include <cstdint>

#include "kiln/llm/model.h"

namespace kiln::llm {

// The angles of one position as ggml's rope computes them (theta built by repeated
// multiplication, like ggml's cache; divided by the frequency factor, then scaled):
// cos and sin of n_rot / 2 angles, times the attention factor (ggml's mscale).
inline void rope_angles(int64_t pos, const ModelConfig& c, float* cs, float* sn) {
  const float theta_scale = std::pow(c.rope_base, -2.0f / static_cast<float>(c.n_rot));
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < c.n_rot / 2; ++i) {
    const float angle = c.rope_freq_factors.empty() ? theta * c.rope_freq_scale
                                                    : theta / c.rope_freq_factors[static_cast<size_t>(i)] * c.rope_freq_scale;
    cs[i] = std::cos(angle) * c.rope_attn_factor;
    sn[i] = std::sin(angle) * c.rope_attn_factor;
    theta *= theta_scale;
  }
}

}  // namespace kiln::llm
