#include "kiln/core/random.h"


namespace kiln {

std::array<uint32_t, 4> Philox::block(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

Generator& default_generator() {
  static Generator g(0);
  return g;
}

void set_seed(uint64_t seed) { default_generator().reset(seed); }

uint64_t draw_seed() {
  Generator& g = default_generator();
  const uint64_t counter = g.reserve(4);
  const std::array<uint32_t, 4> w = Philox::block(g.seed(), 0, counter);
  return (static_cast<uint64_t>(w[0]) << 32) | w[1];
}

}  // namespace kiln
