#pragma once
// Rotary embedding angles, shared by the CPU kernels' forward (model.cc) and the tensor
// path (tensor_forward.cc) so that both rotate by the same floats.
#include <cmath>
#include <cstdint>

#include "kiln/llm/model.h"

namespace kiln::llm {

// The angles of one position as ggml's rope computes them (theta built by repeated
// multiplication, like ggml's cache; divided by the frequency factor, then scaled):
// cos and sin of n_rot / 2 angles, times the attention factor (ggml's mscale). swa: for
// the sliding-window layers (their own base and scale; no factors).
inline void rope_angles(int64_t pos, const ModelConfig& c, float* cs, float* sn, bool swa = false) {
  const float theta_scale = std::pow(swa ? c.rope_base_swa : c.rope_base, -2.0f / static_cast<float>(c.n_rot));
  const float freq_scale = swa ? c.rope_freq_scale_swa : c.rope_freq_scale;
  const bool factors = !swa && !c.rope_freq_factors.empty();
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < c.n_rot / 2; ++i) {
    const float angle = factors ? theta / c.rope_freq_factors[static_cast<size_t>(i)] * freq_scale : theta * freq_scale;
    cs[i] = std::cos(angle) * c.rope_attn_factor;
    sn[i] = std::sin(angle) * c.rope_attn_factor;
    theta *= theta_scale;
  }
}

}  // namespace kiln::llm
